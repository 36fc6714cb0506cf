//! A preallocated, contiguous per-layer KV cache for a static batch of sequences of different
//! lengths (the layout HF transformers uses for batched generation). Each layer may live on its
//! own device ([`LayerDevices`]); the step's mask is then copied once per step to each device.

use burn::tensor::{Device, Tensor};
use burn_llm_kernels::{QuantSpec, prefix_attention};

use super::{KvCache, KvLayout, LayerDevices, LayerSlots, StepInput, StepSlots, check_kv_quant};
use crate::error::Result;

/// Keys and values of a batch in `[batch, kv_heads, capacity, head_dim]` tensors, one pair per
/// layer, on the device the model runs on (or each on its own, [`ContiguousKvCache::placed`]),
/// over the slot axis of a [`StepSlots`].
pub struct ContiguousKvCache {
    layout: KvLayout,
    quant: Option<QuantSpec>,
    steps: StepSlots,
    layers: Vec<LayerSlots>,
    placement: LayerDevices,
    /// The current step's mask on each of `placement`'s distinct devices.
    biases: Vec<Tensor<4>>,
    /// The current step's masks of local layers, by window size, like `biases`.
    window_biases: Vec<(usize, Vec<Tensor<4>>)>,
}

impl ContiguousKvCache {
    /// Allocates `capacity` slots for `batch` sequences of a model with `layout`.
    pub fn new(layout: KvLayout, batch: usize, capacity: usize, device: &Device) -> Self {
        Self::build(layout, batch, capacity, device, LayerDevices::uniform(device, layout.num_layers), None)
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
        Ok(Self::build(layout, batch, capacity, device, LayerDevices::uniform(device, layout.num_layers), Some(spec)))
    }

    /// Like [`ContiguousKvCache::new`] (dense, or quantized as `quant` says), with cache layer `i`
    /// on `placement.device(i)`; token ids and positions are laid out on `input` (where the model
    /// embeds them). Errors when the placement does not name one device per layer.
    pub fn placed(
        layout: KvLayout,
        batch: usize,
        capacity: usize,
        input: &Device,
        placement: LayerDevices,
        quant: Option<QuantSpec>,
    ) -> Result<Self> {
        placement.check(&layout)?;
        if let Some(spec) = quant {
            check_kv_quant(layout, spec)?;
        }
        Ok(Self::build(layout, batch, capacity, input, placement, quant))
    }

    fn build(
        layout: KvLayout,
        batch: usize,
        capacity: usize,
        input: &Device,
        placement: LayerDevices,
        quant: Option<QuantSpec>,
    ) -> Self {
        let layers = (0..layout.num_layers)
            .map(|i| LayerSlots::zeros(layout, batch, capacity, quant, placement.device(i)))
            .collect();
        Self {
            layout,
            quant,
            steps: StepSlots::new(batch, capacity, input),
            layers,
            placement,
            biases: Vec::new(),
            window_biases: Vec::new(),
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
        let input = self.steps.begin_step(new_tokens)?;
        let bias = self.steps.bias();
        self.biases = self.placement.distinct().iter().map(|d| bias.clone().to_device(d)).collect();
        self.window_biases.clear();
        Ok(input)
    }

    /// Stores the step's keys and values of `layer` and attends over its slots with the step's
    /// mask, or for a local layer its `window`'s mask (built once per step and window size).
    fn attend_with(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> Tensor<4> {
        let step = self.steps.range_for(&self.layout, &k);
        // Moved out and back (never cloned) so the writes can happen in place: `swap_remove`
        // takes the layer out, `push` and `swap` put it back where it was.
        let slots = self.layers.swap_remove(layer).write(k, v, step.start);
        self.layers.push(slots);
        let last = self.layers.len() - 1;
        self.layers.swap(layer, last);
        let device = self.placement.slot(layer);
        let bias = match window {
            None => self.biases[device].clone(),
            Some(window) => {
                let at = match self.window_biases.iter().position(|(w, _)| *w == window) {
                    Some(at) => at,
                    None => {
                        let bias = self.steps.window_bias(window);
                        let per_device = self.placement.distinct().iter().map(|d| bias.clone().to_device(d)).collect();
                        self.window_biases.push((window, per_device));
                        self.window_biases.len() - 1
                    }
                };
                self.window_biases[at].1[device].clone()
            }
        };
        // Attention reads slots `0..step.end` where they are stored (no copy of the visible
        // slots for dense storage); the handles are dropped before the next step writes.
        let slots = &self.layers[layer];
        let (keys, values) = (slots.keys.prefix(step.end), slots.values.prefix(step.end));
        prefix_attention(q, keys, values, bias, step.end, scale)
    }

    /// The device of each cache layer.
    pub fn placement(&self) -> &LayerDevices {
        &self.placement
    }
}

impl KvCache for ContiguousKvCache {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Tensor<4>> {
        Ok(self.attend_with(layer, q, k, v, scale, window))
    }
}
