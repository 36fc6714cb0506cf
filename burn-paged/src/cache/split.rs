//! A [`PagedKvCache`] split by layers into per-stage views ([`MicroBatchCache::split_layers`]),
//! so that pipeline stages attend on threads of their own (TeraPipe's token slices through
//! stages, or micro-batches of a step). Each view borrows its layers' pools mutably and the
//! step's uploaded layouts shared, and selects its micro-batch on its own; a view writes exactly
//! the slots the whole cache would, so a split run equals the same work done in turn.
//!
//! The whole cache attends through a view over all its layers ([`LayerView::attend_paged`]):
//! one attention path for both.

use std::ops::Range;

use burn::tensor::Tensor;
use burn_llm_kernels::paged::{KvPool, paged_attention_pool};
use burn_llm_models::cache::LayerDevices;
use burn_llm_models::language_model::splittable;
use burn_llm_models::{KvCache, MicroBatchCache, ModelError, StageCache};

use super::tails::{KeyPlan, write_keys};
use super::{DeviceStep, PagedKvCache};
use crate::error::{PagedError, Result};

/// The pools of cache layers `first..first + keys.len()` and the step's layouts.
pub(super) struct LayerView<'a> {
    first: usize,
    keys: &'a mut [KvPool],
    values: &'a mut [KvPool],
    /// The layers' float key tails (empty unless keys are per channel).
    tails: &'a mut [Tensor<4>],
    key_plans: &'a [KeyPlan],
    steps: &'a [Vec<DeviceStep>],
    host_steps: &'a [super::PagedStep],
    placement: &'a LayerDevices,
    /// The micro-batch `attend` serves.
    current: usize,
}

impl PagedKvCache {
    /// A view over every layer, serving the selected micro-batch.
    pub(super) fn whole_view(&mut self) -> LayerView<'_> {
        LayerView {
            first: 0,
            keys: &mut self.keys,
            values: &mut self.values,
            tails: &mut self.tail_pools,
            key_plans: &self.key_plans,
            steps: &self.steps,
            host_steps: &self.host_steps,
            placement: &self.placement,
            current: self.current,
        }
    }
}

impl LayerView<'_> {
    /// [`KvCache::attend`] in this crate's error: a step laid out without
    /// [`PagedKvCache::begin_step`], a layer outside the view, or a kernel that refuses the
    /// step's slots or block tables is an error, never a panic.
    pub(super) fn attend_paged(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Tensor<4>> {
        let [_, heads, tokens, head_dim] = q.dims();
        let to_rows = |t: Tensor<4>| -> Tensor<3> {
            let [_, h, s, d] = t.dims();
            t.reshape([h, s, d]).swap_dims(0, 1)
        };
        let local = layer.checked_sub(self.first).filter(|&i| i < self.keys.len()).ok_or_else(|| {
            let end = self.first + self.keys.len();
            PagedError::Internal(format!(
                "layer {layer} attended through the paged KV cache's layers {}..{end}",
                self.first
            ))
        })?;
        let (slots, batch) =
            self.steps.get(self.current).and_then(|per_device| per_device.get(self.placement.slot(layer))).ok_or_else(
                || {
                    PagedError::Internal(format!(
                        "layer {layer} attended in micro-batch {} before begin_step laid it out",
                        self.current
                    ))
                },
            )?;
        match self.tails.get_mut(local) {
            Some(tails) => {
                let plan = self
                    .key_plans
                    .get(self.current)
                    .ok_or_else(|| PagedError::Internal(format!("micro-batch {} has no key plan", self.current)))?;
                write_keys(&mut self.keys[local], tails, plan, self.placement.slot(layer), to_rows(k))?;
            }
            None => self.keys[local].write(to_rows(k), slots)?,
        }
        self.values[local].write(to_rows(v), slots)?;
        let out = match window {
            None => paged_attention_pool(to_rows(q), &self.keys[local], &self.values[local], batch, scale)?,
            Some(window) => {
                let step = self
                    .host_steps
                    .get(self.current)
                    .ok_or_else(|| PagedError::Internal(format!("micro-batch {} has no host layout", self.current)))?;
                let pools = (&self.keys[local], &self.values[local]);
                super::window::windowed_attention(to_rows(q), pools, step, scale, window)?
            }
        };
        Ok(out.swap_dims(0, 1).reshape([1, heads, tokens, head_dim]))
    }
}

impl KvCache for LayerView<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.attend_paged(layer, q, k, v, scale, window).map_err(|e| ModelError::KvCache(Box::new(e)))
    }
}

impl MicroBatchCache for LayerView<'_> {
    fn select_micro_batch(&mut self, index: usize) {
        self.current = index;
    }
}

impl MicroBatchCache for PagedKvCache {
    fn select_micro_batch(&mut self, index: usize) {
        self.current = index;
    }

    fn split_layers(&mut self, layers: &[Range<usize>]) -> Option<Vec<StageCache<'_>>> {
        if !splittable(layers, self.keys.len()) {
            return None;
        }
        let (steps, host_steps, placement, key_plans) =
            (&self.steps, &self.host_steps, &self.placement, &self.key_plans);
        let (mut keys, mut values) = (&mut self.keys[..], &mut self.values[..]);
        let mut tails = &mut self.tail_pools[..];
        let mut at = 0;
        let mut views: Vec<StageCache<'_>> = Vec::with_capacity(layers.len());
        for range in layers {
            let skip = range.start - at;
            let (_, rest_k) = keys.split_at_mut(skip);
            let (_, rest_v) = values.split_at_mut(skip);
            let (view_k, rest_k) = rest_k.split_at_mut(range.len());
            let (view_v, rest_v) = rest_v.split_at_mut(range.len());
            (keys, values, at) = (rest_k, rest_v, range.end);
            // Tails are per layer like the pools, or there are none.
            let view_t = if tails.is_empty() {
                &mut [][..]
            } else {
                let (_, rest_t) = std::mem::take(&mut tails).split_at_mut(skip);
                let (view_t, rest_t) = rest_t.split_at_mut(range.len());
                tails = rest_t;
                view_t
            };
            views.push(Box::new(LayerView {
                first: range.start,
                keys: view_k,
                values: view_v,
                tails: view_t,
                key_plans,
                steps,
                host_steps,
                placement,
                current: 0,
            }));
        }
        Some(views)
    }
}
