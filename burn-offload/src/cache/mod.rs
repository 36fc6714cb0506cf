//! The offloaded KV cache as the models see it: an implementation of [`KvCache`] over the
//! contiguous cache's public pieces (the shared slot axis [`StepSlots`], per-layer [`LayerSlots`],
//! the models' attention), with each layer's slots where the policy put them.
//!
//! - **Placement** ([`KvPlacement`]): a layer's slots live on the compute device or on the host.
//!   The step's new keys and values go to them; attention runs where they are (FlexGen's CPU
//!   attention delegation: only queries, new keys/values and the output cross the link), or the
//!   visible slots come to the device for the step.
//! - **Disk**: a layer kept on disk holds no slots between its steps; the engine puts them in
//!   ([`OffloadKvCache::put_layer`]) before the layer runs and takes them out
//!   ([`OffloadKvCache::take_layer`]) after, writing only the step's new slots ([`parts`]).
//! - **Top-K sparsity** ([`sparse`]): decode queries keep only their highest-scoring keys.
//!
//! A layer that attends while its slots are out is a schedule error: `attend` returns it, and the
//! forward pass stops there.

pub mod parts;
pub mod sparse;

use burn::tensor::{Device, Tensor};
use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::{LayerSlots, StepSlots, check_kv_quant};
use burn_llm_models::{KvCache, KvLayout, ModelError, StepInput};

use crate::error::{OffloadError, Result};
use sparse::{keys_kept, sparse_attention};

/// Where one layer's keys and values are stored and where its attention runs.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPlacement {
    /// Device holding the slots (the compute device, or the host for an offloaded cache).
    pub device: Device,
    /// Run attention where the slots are (only queries, new keys/values and the output cross the
    /// link) instead of moving the visible slots to the queries' device every step.
    pub attend_there: bool,
    /// The slots are kept on disk between steps: none are allocated, the engine puts them in
    /// before the layer runs and takes them out after.
    pub on_disk: bool,
}

/// Keys and values of a GPU batch, each layer on its own placement.
pub struct OffloadKvCache {
    layout: KvLayout,
    quant: Option<QuantSpec>,
    steps: StepSlots,
    /// `None` for a disk layer between its steps.
    layers: Vec<Option<LayerSlots>>,
    placement: Vec<KvPlacement>,
    /// Fraction of keys each decode query keeps (Top-K sparse attention), if set.
    sparsity: Option<f32>,
}

impl std::fmt::Debug for OffloadKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadKvCache")
            .field("layout", &self.layout)
            .field("batch", &self.steps.batch())
            .field("capacity", &self.steps.capacity())
            .field("quant", &self.quant)
            .field("placement", &self.placement)
            .finish()
    }
}

impl OffloadKvCache {
    /// Allocates `capacity` slots for `batch` sequences of a model with `layout`, layer `j`'s on
    /// `placement[j]` (none for a disk layer), as group codes when `quant` is given (checked against the heads); `device`
    /// is where the model runs (token ids, positions and attention outputs live there).
    pub fn new(
        layout: KvLayout,
        batch: usize,
        capacity: usize,
        device: &Device,
        quant: Option<QuantSpec>,
        placement: Vec<KvPlacement>,
    ) -> Result<Self> {
        if placement.len() != layout.num_layers {
            return Err(OffloadError::Config(format!(
                "{} KV placements for a model of {} layers",
                placement.len(),
                layout.num_layers
            )));
        }
        if let Some(spec) = quant {
            check_kv_quant(layout, spec)?;
        }
        let layers = placement
            .iter()
            .map(|home| (!home.on_disk).then(|| LayerSlots::zeros(layout, batch, capacity, quant, &home.device)))
            .collect();
        Ok(Self { layout, quant, steps: StepSlots::new(batch, capacity, device), layers, placement, sparsity: None })
    }

    /// Keeps only the `fraction` highest-scoring keys of each decode query (FlexGen §5's Top-K
    /// sparse attention; prompts always attend densely). `fraction` must be in (0, 1].
    pub fn with_attention_sparsity(mut self, fraction: f32) -> Result<Self> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(OffloadError::Config(format!("attention sparsity must be in (0, 1], got {fraction}")));
        }
        self.sparsity = Some(fraction);
        Ok(self)
    }

    /// The per-layer shape of the keys and values.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The shared slot axis: batch, capacity, slots in use, the current step's slots.
    pub fn steps(&self) -> &StepSlots {
        &self.steps
    }

    /// The cache's quantization, if it stores codes.
    pub fn quantization(&self) -> Option<QuantSpec> {
        self.quant
    }

    /// Bytes one layer's keys and values hold (codes plus `f32` scales and minimums when
    /// quantized).
    pub fn layer_bytes(&self) -> usize {
        self.layout.storage_bytes(self.steps.batch() * self.steps.capacity(), self.quant)
            / self.layout.num_layers.max(1)
    }

    /// Lays out the next step: `new_tokens[b]` are the tokens sequence `b` adds (possibly none).
    pub fn begin_step(&mut self, new_tokens: &[&[u32]]) -> Result<StepInput> {
        Ok(self.steps.begin_step(new_tokens)?)
    }

    /// Takes `layer`'s keys and values out (`None` if they are out already). The layer cannot
    /// attend until they are put back.
    pub fn take_layer(&mut self, layer: usize) -> Option<LayerSlots> {
        self.layers.get_mut(layer)?.take()
    }

    /// Puts `layer`'s keys and values (as taken, or rebuilt with [`parts::from_slot_data`]) in.
    pub fn put_layer(&mut self, layer: usize, slots: LayerSlots) -> Result<()> {
        let num_layers = self.layout.num_layers;
        let home = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| OffloadError::Internal(format!("layer {layer} of a {num_layers}-layer KV cache")))?;
        *home = Some(slots);
        Ok(())
    }
}

impl KvCache for OffloadKvCache {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.attend_masked(layer, q, k, v, scale, window)
    }
}

impl OffloadKvCache {
    /// Stores the step's keys and values of `layer` where its policy keeps them and attends over
    /// its slots, through a sliding `window` for local layers.
    fn attend_masked(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        let step = self.steps.range_for(&self.layout, &k);
        let home = self.placement.get(layer);
        let slots = home.and(self.layers.get_mut(layer)).and_then(Option::take);
        let (Some(home), Some(slots)) = (home, slots) else {
            let missing =
                OffloadError::Internal(format!("the KV cache of layer {layer} was not loaded when the layer ran"));
            return Err(ModelError::KvCache(Box::new(missing)));
        };
        let here = q.device();
        let away = home.device != here;
        let (k, v) = if away { (k.to_device(&home.device), v.to_device(&home.device)) } else { (k, v) };
        let (slots, keys, values) = slots.store(k, v, step.clone());
        self.layers[layer] = Some(slots);
        let bias = match window {
            None => self.steps.bias(),
            Some(window) => self.steps.window_bias(window),
        };
        // Top-K sparsity applies to decode steps (one new token per sequence).
        let keep = self.sparsity.filter(|_| step.len() == 1).map(|f| keys_kept(f, step.end));
        if !away {
            return Ok(sparse_attention(q, keys, values, bias, scale, keep));
        }
        if home.attend_there {
            // CPU-attention delegation: the query goes to the cache, the output comes back.
            let (q, bias) = (q.to_device(&home.device), bias.to_device(&home.device));
            return Ok(sparse_attention(q, keys, values, bias, scale, keep).to_device(&here));
        }
        // The visible slots are loaded to the compute device for this step.
        Ok(sparse_attention(q, keys.to_device(&here), values.to_device(&here), bias, scale, keep))
    }
}

#[cfg(test)]
mod tests;
