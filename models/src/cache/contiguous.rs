//! A preallocated, contiguous per-layer KV cache for a static batch of sequences of different
//! lengths (the layout HF transformers uses for batched generation).

use burn::tensor::{Device, Tensor};
use burn_llm_kernels::QuantSpec;

use super::{KvCache, KvLayout, LayerSlots, StepInput, StepSlots, attention, check_kv_quant};
use crate::error::Result;

/// Keys and values of a batch in `[batch, kv_heads, capacity, head_dim]` tensors, one pair per
/// layer, on the device the model runs on, over the slot axis of a [`StepSlots`].
pub struct ContiguousKvCache {
    layout: KvLayout,
    quant: Option<QuantSpec>,
    steps: StepSlots,
    layers: Vec<LayerSlots>,
}

impl ContiguousKvCache {
    /// Allocates `capacity` slots for `batch` sequences of a model with `layout`.
    pub fn new(layout: KvLayout, batch: usize, capacity: usize, device: &Device) -> Self {
        Self::build(layout, batch, capacity, device, None)
    }

    /// Like [`ContiguousKvCache::new`], storing keys and values as group-quantized codes exactly
    /// as `spec` says (along the head dimension, see [`check_kv_quant`]).
    pub fn quantized(
        layout: KvLayout,
        batch: usize,
        capacity: usize,
        device: &Device,
        spec: QuantSpec,
    ) -> Result<Self> {
        check_kv_quant(layout, spec)?;
        Ok(Self::build(layout, batch, capacity, device, Some(spec)))
    }

    fn build(layout: KvLayout, batch: usize, capacity: usize, device: &Device, quant: Option<QuantSpec>) -> Self {
        Self {
            layout,
            quant,
            steps: StepSlots::new(batch, capacity, device),
            layers: (0..layout.num_layers).map(|_| LayerSlots::zeros(layout, batch, capacity, quant, device)).collect(),
        }
    }

    /// The per-layer shape of the keys and values.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The shared slot axis: batch, capacity, slots in use, tokens per sequence.
    pub fn steps(&self) -> &StepSlots {
        &self.steps
    }

    /// Bytes held by keys and values (codes plus `f32` scales and minimums when quantized).
    pub fn memory_bytes(&self) -> usize {
        self.layout.storage_bytes(self.steps.batch() * self.steps.capacity(), self.quant)
    }

    /// The cache's quantization, if it stores codes.
    pub fn quantization(&self) -> Option<QuantSpec> {
        self.quant
    }

    /// Lays out the next step: `new_tokens[b]` are the tokens sequence `b` adds (possibly none).
    pub fn begin_step(&mut self, new_tokens: &[&[u32]]) -> Result<StepInput> {
        self.steps.begin_step(new_tokens)
    }
}

impl KvCache for ContiguousKvCache {
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32) -> Tensor<4> {
        let step = self.steps.range_for(&self.layout, &k);
        // Moved out and back (never cloned) so the writes can happen in place: `swap_remove`
        // takes the layer out, `push` and `swap` put it back where it was.
        let slots = self.layers.swap_remove(layer);
        let (slots, keys, values) = slots.store(k, v, step);
        self.layers.push(slots);
        let last = self.layers.len() - 1;
        self.layers.swap(layer, last);
        attention(q, keys, values, self.steps.bias(), scale)
    }
}
