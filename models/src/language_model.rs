//! The interface engines run a model through ([`LanguageModel`]): the whole decoder on one device
//! ([`CausalLm`]) or split into pipeline stages on several (`burn_parallel::pipeline::PipelineLm`).
//!
//! A forward pass is `embed`, then every stage in order, then `finish` and `logits`. Engines that
//! only need logits call the provided [`LanguageModel::forward_last_logits`]; an engine that
//! splits a step into micro-batches calls [`LanguageModel::forward_micro_batches`], which issues
//! them in pipeline order (micro-batch `m` enters stage `s` at tick `m + s`) so that stages on
//! asynchronous devices work on different micro-batches at once. A model whose stages can run on
//! threads of their own (`burn_parallel::pipeline::PipelineLm`) overrides it, splitting the cache
//! into per-stage views with [`MicroBatchCache::split_layers`]; [`forward_micro_batches_in_turn`]
//! is the one-thread order it falls back to.

use std::ops::Range;

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::cache::{KvCache, KvLayout, LayerDevices, StepInput};
use crate::config::DecoderSpec;
use crate::error::Result;
use crate::model::{CausalLm, Hidden};

/// A cache that holds the metadata of several micro-batches of one step and serves the one
/// selected last (the paged cache under pipeline parallelism).
pub trait MicroBatchCache: KvCache {
    /// Makes later `attend` calls use micro-batch `index`'s layout.
    fn select_micro_batch(&mut self, index: usize);

    /// Splits the cache into one view per range of cache layers of `layers` (in order, disjoint),
    /// so that pipeline stages can attend on threads of their own: view `i` serves only the
    /// layers of `layers[i]`, addressed by their index in the whole cache, selects its
    /// micro-batch on its own (micro-batch 0 at first), and writes the same slots the whole cache
    /// would. `None` when the cache cannot be split (the default) or the ranges overlap, are out
    /// of order or out of bounds; callers then run the stages in turn on one thread.
    fn split_layers(&mut self, layers: &[Range<usize>]) -> Option<Vec<StageCache<'_>>> {
        let _ = layers;
        None
    }
}

/// One stage's view of a [`MicroBatchCache`] split by [`MicroBatchCache::split_layers`], movable
/// to the stage's thread.
pub type StageCache<'a> = Box<dyn MicroBatchCache + Send + 'a>;

/// Whether `layers` are non-empty ranges in order, disjoint and within `num_layers` cache layers
/// (what [`MicroBatchCache::split_layers`] accepts).
pub fn splittable(layers: &[Range<usize>], num_layers: usize) -> bool {
    let mut end = 0;
    for range in layers {
        if range.start < end || range.end <= range.start || range.end > num_layers {
            return false;
        }
        end = range.end;
    }
    true
}

/// [`LanguageModel::forward_micro_batches`]'s default: micro-batch `m` enters stage `s` at tick
/// `m + s`, every stage run in turn on the calling thread.
pub fn forward_micro_batches_in_turn<M: LanguageModel + ?Sized>(
    model: &M,
    steps: &[StepInput],
    cache: &mut dyn MicroBatchCache,
) -> Result<Vec<Tensor<3>>> {
    let stages = model.num_stages();
    let mut hidden: Vec<Option<Hidden>> = steps.iter().map(|_| None).collect();
    let mut out: Vec<Option<Tensor<3>>> = steps.iter().map(|_| None).collect();
    for tick in 0..steps.len() + stages - 1 {
        for (m, step) in steps.iter().enumerate() {
            let Some(stage) = tick.checked_sub(m).filter(|&s| s < stages) else { continue };
            let h = match hidden[m].take() {
                Some(h) => h,
                None => model.embed(step),
            };
            cache.select_micro_batch(m);
            let h = model.run_stage(stage, h, &mut *cache)?;
            if stage + 1 == stages {
                out[m] = Some(model.finish(h));
            } else {
                hidden[m] = Some(h);
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// A causal language model as engines see it.
pub trait LanguageModel: Send + std::fmt::Debug {
    /// The architecture description.
    fn spec(&self) -> &DecoderSpec;

    /// What a KV cache for this model must hold: one cache layer per decoder layer, or per
    /// (layer, tensor-parallel rank).
    fn kv_layout(&self) -> KvLayout;

    /// The device of each cache layer of [`LanguageModel::kv_layout`].
    fn kv_devices(&self) -> LayerDevices;

    /// The device token ids and positions go to (the embeddings').
    fn device(&self) -> Device;

    /// Bytes of weights one decode step reads.
    fn decode_weight_bytes(&self) -> usize;

    /// Pipeline stages (1 for a model on one device).
    fn num_stages(&self) -> usize {
        1
    }

    /// Token and position embeddings of a step, on [`LanguageModel::device`].
    fn embed(&self, step: &StepInput) -> Hidden;

    /// Runs stage `stage`'s layers (moving `hidden` to the stage's device first); fails when the
    /// cache cannot serve a layer.
    fn run_stage(&self, stage: usize, hidden: Hidden, cache: &mut dyn KvCache) -> Result<Hidden>;

    /// Final norm and output projection: `[batch, seq, embed_dim]` on the last stage's device.
    fn finish(&self, hidden: Hidden) -> Tensor<3>;

    /// LM head: `[n, embed_dim] → [n, vocab]` logits.
    fn logits(&self, states: Tensor<2>) -> Tensor<2>;

    /// Bytes handed from one stage to the next and between tensor-parallel ranks so far (0 on one
    /// device).
    fn stage_transfer_bytes(&self) -> u64 {
        0
    }

    /// Which devices run which layers, for outputs (`None` on one device).
    fn placement_summary(&self) -> Option<String> {
        None
    }

    /// The same as a structured plan for `--json` (stages with their layers and devices, and what
    /// a planner predicted for them); `None` on one device.
    fn placement_plan(&self) -> Option<serde_json::Value> {
        None
    }

    /// The whole stack for one step: final hidden states `[batch, seq, embed_dim]`.
    fn forward(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        let mut hidden = self.embed(step);
        for stage in 0..self.num_stages() {
            hidden = self.run_stage(stage, hidden, cache)?;
        }
        Ok(self.finish(hidden))
    }

    /// Logits of each row's token at column `last[row]` of `states` `[batch, seq, embed_dim]`
    /// (column 0 for rows without one), `[batch, vocab]`.
    fn last_logits(&self, states: Tensor<3>, last: &[Option<usize>]) -> Tensor<2> {
        let [b, s, e] = states.dims();
        let rows: Vec<i64> = last.iter().enumerate().map(|(row, last)| (row * s + last.unwrap_or(0)) as i64).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(rows, [b]), &states.device());
        self.logits(states.reshape([b * s, e]).select(0, index))
    }

    /// Logits of each row's last new token, `[batch, vocab]`.
    fn forward_last_logits(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<2>> {
        let states = self.forward(step, cache)?;
        Ok(self.last_logits(states, &step.last))
    }

    /// Runs several micro-batches of one step (each laid out by `cache`, selected with
    /// [`MicroBatchCache::select_micro_batch`]) through the stages in pipeline order and returns
    /// each one's final hidden states, in order. The result equals running them one after the
    /// other: only the order in which work is issued changes.
    fn forward_micro_batches(&self, steps: &[StepInput], cache: &mut dyn MicroBatchCache) -> Result<Vec<Tensor<3>>> {
        forward_micro_batches_in_turn(self, steps, cache)
    }
}

impl LanguageModel for CausalLm {
    fn spec(&self) -> &DecoderSpec {
        CausalLm::spec(self)
    }

    fn kv_layout(&self) -> KvLayout {
        CausalLm::kv_layout(self)
    }

    fn kv_devices(&self) -> LayerDevices {
        LayerDevices::uniform(&CausalLm::device(self), self.spec.num_layers)
    }

    fn device(&self) -> Device {
        CausalLm::device(self)
    }

    fn decode_weight_bytes(&self) -> usize {
        CausalLm::decode_weight_bytes(self)
    }

    fn embed(&self, step: &StepInput) -> Hidden {
        CausalLm::embed(self, step)
    }

    fn run_stage(&self, _stage: usize, mut hidden: Hidden, cache: &mut dyn KvCache) -> Result<Hidden> {
        for layer in 0..self.layers.len() {
            hidden = self.run_layer(layer, hidden, cache)?;
        }
        Ok(hidden)
    }

    fn finish(&self, hidden: Hidden) -> Tensor<3> {
        CausalLm::finish(self, hidden)
    }

    fn logits(&self, states: Tensor<2>) -> Tensor<2> {
        CausalLm::logits(self, states)
    }
}

/// One model shared by several engines (the paged engine's virtual engines over one pipeline,
/// vLLM's): every call goes to the shared model, whose weights stay loaded once.
impl<M: LanguageModel + Sync + ?Sized> LanguageModel for std::sync::Arc<M> {
    fn spec(&self) -> &DecoderSpec {
        (**self).spec()
    }

    fn kv_layout(&self) -> KvLayout {
        (**self).kv_layout()
    }

    fn kv_devices(&self) -> LayerDevices {
        (**self).kv_devices()
    }

    fn device(&self) -> Device {
        (**self).device()
    }

    fn decode_weight_bytes(&self) -> usize {
        (**self).decode_weight_bytes()
    }

    fn num_stages(&self) -> usize {
        (**self).num_stages()
    }

    fn embed(&self, step: &StepInput) -> Hidden {
        (**self).embed(step)
    }

    fn run_stage(&self, stage: usize, hidden: Hidden, cache: &mut dyn KvCache) -> Result<Hidden> {
        (**self).run_stage(stage, hidden, cache)
    }

    fn finish(&self, hidden: Hidden) -> Tensor<3> {
        (**self).finish(hidden)
    }

    fn logits(&self, states: Tensor<2>) -> Tensor<2> {
        (**self).logits(states)
    }

    fn stage_transfer_bytes(&self) -> u64 {
        (**self).stage_transfer_bytes()
    }

    fn placement_summary(&self) -> Option<String> {
        (**self).placement_summary()
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        (**self).placement_plan()
    }

    fn forward(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        (**self).forward(step, cache)
    }

    fn forward_micro_batches(&self, steps: &[StepInput], cache: &mut dyn MicroBatchCache) -> Result<Vec<Tensor<3>>> {
        (**self).forward_micro_batches(steps, cache)
    }
}
