//! A preallocated, contiguous per-layer KV cache for a static batch of sequences of different
//! lengths (the layout HF transformers uses for batched generation).

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_llm_kernels::{dequantize, quantize, GroupQuantized, QuantSpec};

use super::{causal_bias, check_kv_quant, sparse_attention, KvCache, KvLayout, StepInput, MASKED};
use crate::error::{ModelError, Result};

/// One layer's keys or values: `[batch, kv_heads, capacity, head_dim]` floats, or the same slots
/// group-quantized along `head_dim` (FlexGen's KV-cache compression).
#[allow(clippy::large_enum_variant)] // one per layer and K/V, never moved in hot loops
#[derive(Debug, Clone)]
pub enum Slots {
    /// Floats.
    Dense(Tensor<4>),
    /// Group-quantized.
    Quantized {
        /// `[batch, kv_heads, capacity, head_dim · bits / 32]`, `U32`.
        codes: Tensor<4, Int>,
        /// `[batch, kv_heads, capacity, head_dim / group]`.
        scale: Tensor<4>,
        /// Per-group minimum, like `scale`.
        min: Tensor<4>,
        /// The quantization.
        spec: QuantSpec,
    },
}

/// One layer's keys and values taken out of a [`ContiguousKvCache`] (see
/// [`ContiguousKvCache::take_layer`]), e.g. to keep them on disk between steps.
#[derive(Debug, Clone)]
pub struct LayerSlots {
    /// Keys.
    pub keys: Slots,
    /// Values.
    pub values: Slots,
}

impl LayerSlots {
    /// The slots `range` of every stored tensor (keys first), each `[batch, kv_heads, range, w]`
    /// with 4-byte elements (`f32`, or `u32` codes).
    pub fn slot_data(&self, range: std::ops::Range<usize>) -> Vec<TensorData> {
        [&self.keys, &self.values].into_iter().flat_map(|s| s.slot_data(range.clone())).collect()
    }

    /// Rebuilds slots from `parts` laid out as [`LayerSlots::slot_data`] returns them over the
    /// whole capacity; `quant` is the cache's quantization ([`ContiguousKvCache::quantization`]).
    pub fn from_slot_data(parts: Vec<TensorData>, quant: Option<QuantSpec>, device: &Device) -> Result<Self> {
        let per = if quant.is_some() { 3 } else { 1 };
        if parts.len() != 2 * per {
            return Err(ModelError::BatchMismatch(format!("{} KV parts for a layer that stores {}", parts.len(), 2 * per)));
        }
        let mut parts = parts.into_iter();
        let mut next = || Slots::from_slot_data(parts.by_ref().take(per).collect(), quant, device);
        Ok(Self { keys: next(), values: next() })
    }
}

impl Slots {
    fn slot_data(&self, range: std::ops::Range<usize>) -> Vec<TensorData> {
        let slots = |t: [usize; 4]| [0..t[0], 0..t[1], range.clone(), 0..t[3]];
        match self {
            Slots::Dense(t) => vec![t.clone().slice(slots(t.dims())).into_data()],
            Slots::Quantized { codes, scale, min, .. } => vec![
                codes.clone().slice(slots(codes.dims())).into_data(),
                scale.clone().slice(slots(scale.dims())).into_data(),
                min.clone().slice(slots(min.dims())).into_data(),
            ],
        }
    }

    fn from_slot_data(mut parts: Vec<TensorData>, quant: Option<QuantSpec>, device: &Device) -> Self {
        match quant {
            None => Slots::Dense(Tensor::from_data(parts.remove(0), device)),
            Some(spec) => {
                let min = Tensor::from_data(parts.remove(2), device);
                let scale = Tensor::from_data(parts.remove(1), device);
                let codes = Tensor::from_data(parts.remove(0), (device, DType::U32));
                Slots::Quantized { codes, scale, min, spec }
            }
        }
    }

    fn new(shape: [usize; 4], quant: Option<QuantSpec>, device: &Device) -> Self {
        match quant {
            None => Slots::Dense(Tensor::zeros(shape, device)),
            Some(spec) => {
                let [b, h, cap, d] = shape;
                let groups = [b, h, cap, d / spec.group_size()];
                Slots::Quantized {
                    codes: Tensor::zeros([b, h, cap, d / spec.per_word()], (device, DType::U32)),
                    scale: Tensor::zeros(groups, device),
                    min: Tensor::zeros(groups, device),
                    spec,
                }
            }
        }
    }

    /// Writes `new` (`[b, h, s, d]`) at slots `start..start + s` and returns slots `0..used` as
    /// floats for attention.
    fn store(self, new: Tensor<4>, start: usize, used: usize) -> (Self, Tensor<4>) {
        let [b, h, s, d] = new.dims();
        let write = |t: usize| [0..b, 0..h, start..start + s, 0..t];
        let read = |t: usize| [0..b, 0..h, 0..used, 0..t];
        match self {
            Slots::Dense(full) => {
                let full = full.slice_assign(write(d), new);
                let visible = full.clone().slice(read(d));
                (Slots::Dense(full), visible)
            }
            Slots::Quantized { codes, scale, min, spec } => {
                let q = quantize(new, spec).expect("KV quantization spec checked when the cache was built");
                let (words, groups) = (q.codes.dims()[1], q.scale.dims()[1]);
                let codes = codes.slice_assign(write(words), q.codes.reshape([b, h, s, words]));
                let scale = scale.slice_assign(write(groups), q.scale.reshape([b, h, s, groups]));
                let min = min.slice_assign(write(groups), q.min.reshape([b, h, s, groups]));
                let rows = b * h * used;
                let visible = dequantize(&GroupQuantized {
                    codes: codes.clone().slice(read(words)).reshape([rows, words]),
                    scale: scale.clone().slice(read(groups)).reshape([rows, groups]),
                    min: min.clone().slice(read(groups)).reshape([rows, groups]),
                    shape: [b, h, used, d],
                    spec,
                });
                (Slots::Quantized { codes, scale, min, spec }, visible)
            }
        }
    }
}

/// Keys and values of a batch in `[batch, kv_heads, capacity, head_dim]` tensors, one pair per
/// layer.
///
/// All sequences share the slot axis. Each step appends `max(new tokens)` slots; a sequence with
/// fewer new tokens is left-padded within the step, and padded slots are masked out for good. A
/// sequence may also sit a step out (no new tokens), e.g. once it has finished.
pub struct ContiguousKvCache {
    layout: KvLayout,
    batch: usize,
    capacity: usize,
    keys: Vec<Option<Slots>>,
    values: Vec<Option<Slots>>,
    quant: Option<QuantSpec>,
    /// `valid[b][slot]`: slot holds a real token of sequence `b`.
    valid: Vec<Vec<bool>>,
    /// Next position of each sequence (= tokens it has cached).
    next_position: Vec<usize>,
    /// Slots in use after the current step.
    used: usize,
    /// First slot of the current step.
    step_start: usize,
    /// Bias of the current step, `[batch, 1, step, used]`.
    bias: Option<Tensor<4>>,
    device: Device,
    /// Where each layer's slots live and where its attention runs.
    placement: Vec<KvPlacement>,
    /// Fraction of keys each decode query keeps (Top-K sparse attention), if set.
    sparsity: Option<f32>,
}

/// Where one layer's keys and values are stored, and where its attention runs (FlexGen's cache
/// placement and CPU-attention delegation).
#[derive(Debug, Clone, PartialEq)]
pub struct KvPlacement {
    /// Device holding the slots (the compute device, or the host for an offloaded cache).
    pub device: Device,
    /// Run attention where the slots are (only queries, new keys/values and the output cross
    /// the link) instead of moving the visible slots to the queries' device every step.
    pub attend_there: bool,
    /// The slots are kept outside the cache (FlexGen's disk tier): none are allocated, and the
    /// owner puts them in ([`ContiguousKvCache::put_layer`]) before the layer runs and takes them
    /// out ([`ContiguousKvCache::take_layer`]) after.
    pub detached: bool,
}

impl ContiguousKvCache {
    /// Allocates `capacity` slots for `batch` sequences of a model with `layout`.
    pub fn new(layout: KvLayout, batch: usize, capacity: usize, device: &Device) -> Self {
        Self::build(layout, batch, capacity, device, None)
    }

    /// Like [`ContiguousKvCache::new`], storing keys and values as group-quantized codes exactly
    /// as `spec` says (along the head dimension, see [`check_kv_quant`]).
    pub fn quantized(layout: KvLayout, batch: usize, capacity: usize, device: &Device, spec: QuantSpec) -> Result<Self> {
        check_kv_quant(layout, spec)?;
        Ok(Self::build(layout, batch, capacity, device, Some(spec)))
    }

    /// Like [`ContiguousKvCache::new`] (or [`ContiguousKvCache::quantized`] with `quant`), with
    /// each layer's slots on the device `placement[layer]` names; `device` is where the model
    /// runs (token ids, positions and attention outputs live there).
    pub fn with_placement(
        layout: KvLayout,
        batch: usize,
        capacity: usize,
        device: &Device,
        quant: Option<QuantSpec>,
        placement: Vec<KvPlacement>,
    ) -> Result<Self> {
        if placement.len() != layout.num_layers {
            return Err(ModelError::BatchMismatch(format!(
                "{} KV placements for a model of {} layers",
                placement.len(),
                layout.num_layers
            )));
        }
        if let Some(spec) = quant {
            check_kv_quant(layout, spec)?;
        }
        let mut cache = Self::build(layout, batch, capacity, device, quant);
        let shape = [batch, layout.num_kv_heads, capacity, layout.head_dim];
        for (layer, home) in placement.iter().enumerate() {
            if home.detached {
                cache.keys[layer] = None;
                cache.values[layer] = None;
            } else if home.device != *device {
                cache.keys[layer] = Some(Slots::new(shape, quant, &home.device));
                cache.values[layer] = Some(Slots::new(shape, quant, &home.device));
            }
        }
        cache.placement = placement;
        Ok(cache)
    }

    fn build(layout: KvLayout, batch: usize, capacity: usize, device: &Device, quant: Option<QuantSpec>) -> Self {
        let shape = [batch, layout.num_kv_heads, capacity, layout.head_dim];
        let zeros = || Some(Slots::new(shape, quant, device));
        let home = KvPlacement { device: device.clone(), attend_there: true, detached: false };
        Self {
            placement: vec![home; layout.num_layers],
            sparsity: None,
            quant,
            layout,
            batch,
            capacity,
            keys: (0..layout.num_layers).map(|_| zeros()).collect(),
            values: (0..layout.num_layers).map(|_| zeros()).collect(),
            valid: vec![Vec::with_capacity(capacity); batch],
            next_position: vec![0; batch],
            used: 0,
            step_start: 0,
            bias: None,
            device: device.clone(),
        }
    }

    /// Keeps only the `fraction` highest-scoring keys of each decode query (FlexGen §5's Top-K
    /// sparse attention; prompts always attend densely). `fraction` must be in (0, 1].
    pub fn with_attention_sparsity(mut self, fraction: f32) -> Result<Self> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(ModelError::InvalidSampling(format!("attention sparsity must be in (0, 1], got {fraction}")));
        }
        self.sparsity = Some(fraction);
        Ok(self)
    }

    /// The per-layer shape of the keys and values.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Slots allocated per sequence.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots in use (the same for every sequence, padding included).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Tokens cached for sequence `b`.
    pub fn len(&self, b: usize) -> usize {
        self.next_position[b]
    }

    /// Bytes held by keys and values on all devices (codes plus `f32` scales and minimums when
    /// quantized).
    pub fn memory_bytes(&self) -> usize {
        let dense = self.layout.bytes_per_token() * self.batch * self.capacity;
        match self.quant {
            None => dense,
            Some(spec) => spec.storage_bytes(dense / std::mem::size_of::<f32>()),
        }
    }

    /// Bytes one layer's keys and values hold (see [`ContiguousKvCache::memory_bytes`]).
    pub fn layer_bytes(&self) -> usize {
        self.memory_bytes() / self.layout.num_layers.max(1)
    }

    /// The cache's quantization, if it stores codes.
    pub fn quantization(&self) -> Option<QuantSpec> {
        self.quant
    }

    /// The slots written by the current step: `step_start..used`.
    pub fn step_slots(&self) -> std::ops::Range<usize> {
        self.step_start..self.used
    }

    /// Takes `layer`'s keys and values out of the cache (`None` if they are out already). The
    /// layer cannot attend until they are put back.
    pub fn take_layer(&mut self, layer: usize) -> Option<LayerSlots> {
        let keys = self.keys.get_mut(layer)?.take();
        let values = self.values.get_mut(layer)?.take();
        keys.zip(values).map(|(keys, values)| LayerSlots { keys, values })
    }

    /// Puts `layer`'s keys and values (as taken, or rebuilt with [`LayerSlots::from_slot_data`])
    /// back into the cache.
    pub fn put_layer(&mut self, layer: usize, slots: LayerSlots) -> Result<()> {
        if layer >= self.layout.num_layers {
            return Err(ModelError::BatchMismatch(format!("layer {layer} of a {}-layer cache", self.layout.num_layers)));
        }
        self.keys[layer] = Some(slots.keys);
        self.values[layer] = Some(slots.values);
        Ok(())
    }

    /// Lays out the next step: `new_tokens[b]` are the tokens sequence `b` adds (possibly none).
    pub fn begin_step(&mut self, new_tokens: &[&[u32]]) -> Result<StepInput> {
        if new_tokens.len() != self.batch {
            return Err(ModelError::BatchMismatch(format!(
                "{} sequences given to a cache built for {}",
                new_tokens.len(),
                self.batch
            )));
        }
        let width = new_tokens.iter().map(|t| t.len()).max().unwrap_or(0);
        if width == 0 {
            return Err(ModelError::BatchMismatch("a step needs at least one token".into()));
        }
        let needed = self.used + width;
        if needed > self.capacity {
            return Err(ModelError::CacheFull {
                needed,
                capacity: self.capacity,
            });
        }
        let mut tokens = vec![0i64; self.batch * width];
        let mut positions = vec![0i64; self.batch * width];
        let mut last = Vec::with_capacity(self.batch);
        let mut max_position = 0;
        for (b, new) in new_tokens.iter().enumerate() {
            let pad = width - new.len();
            self.valid[b].extend(std::iter::repeat_n(false, pad));
            self.valid[b].extend(std::iter::repeat_n(true, new.len()));
            for (i, &token) in new.iter().enumerate() {
                let position = self.next_position[b] + i;
                tokens[b * width + pad + i] = token as i64;
                positions[b * width + pad + i] = position as i64;
                max_position = max_position.max(position);
            }
            self.next_position[b] += new.len();
            last.push((!new.is_empty()).then_some(width - 1));
        }
        self.step_start = self.used;
        self.used = needed;

        let mut key_bias = vec![0f32; self.batch * self.used];
        for (b, valid) in self.valid.iter().enumerate() {
            for (slot, ok) in valid.iter().enumerate() {
                if !ok {
                    key_bias[b * self.used + slot] = MASKED;
                }
            }
        }
        let key_bias: Tensor<4> =
            Tensor::from_data(TensorData::new(key_bias, [self.batch, 1, 1, self.used]), &self.device);
        let bias = if width > 1 {
            key_bias + causal_bias(self.step_start, width, self.used, &self.device)
        } else {
            key_bias
        };
        self.bias = Some(bias);

        let shape = [self.batch, width];
        Ok(StepInput {
            tokens: Tensor::<2, Int>::from_data(TensorData::new(tokens, shape), &self.device),
            positions: Tensor::<2, Int>::from_data(TensorData::new(positions, shape), &self.device),
            max_position,
            last,
        })
    }
}

impl KvCache for ContiguousKvCache {
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, scale: f32) -> Tensor<4> {
        debug_assert_eq!(
            k.dims(),
            [self.batch, self.layout.num_kv_heads, self.used - self.step_start, self.layout.head_dim],
            "attend called outside begin_step's layout"
        );
        let (start, used) = (self.step_start, self.used);
        let home = self.placement[layer].clone();
        let here = q.device();
        let away = home.device != here;
        let (k, v) = if away { (k.to_device(&home.device), v.to_device(&home.device)) } else { (k, v) };
        let store = |slot: &mut Option<Slots>, new: Tensor<4>| {
            let (full, visible) = slot
                .take()
                .expect("a detached layer's slots must be put back before it attends")
                .store(new, start, used);
            *slot = Some(full);
            visible
        };
        let keys = store(&mut self.keys[layer], k);
        let values = store(&mut self.values[layer], v);
        let bias = self
            .bias
            .clone()
            .expect("begin_step must be called before the model runs");
        // Top-K sparsity applies to decode steps (one new token per sequence).
        let keep = self
            .sparsity
            .filter(|_| start + 1 == used)
            .map(|f| ((f * used as f32).ceil() as usize).max(1));
        if !away {
            return sparse_attention(q, keys, values, bias, scale, keep);
        }
        if home.attend_there {
            // CPU-attention delegation: the query goes to the cache, the output comes back.
            let (q, bias) = (q.to_device(&home.device), bias.to_device(&home.device));
            return sparse_attention(q, keys, values, bias, scale, keep).to_device(&here);
        }
        // The visible slots are loaded to the compute device for this step.
        sparse_attention(q, keys.to_device(&here), values.to_device(&here), bias, scale, keep)
    }
}
