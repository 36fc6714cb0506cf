//! A preallocated, contiguous per-layer KV cache for a static batch of sequences of different
//! lengths (the layout HF transformers uses for batched generation).

use burn::tensor::{Device, Int, Tensor, TensorData};

use super::{attention, causal_bias, KvCache, KvLayout, StepInput, MASKED};
use crate::error::{ModelError, Result};

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
    keys: Vec<Option<Tensor<4>>>,
    values: Vec<Option<Tensor<4>>>,
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
}

impl ContiguousKvCache {
    /// Allocates `capacity` slots for `batch` sequences of a model with `layout`.
    pub fn new(layout: KvLayout, batch: usize, capacity: usize, device: &Device) -> Self {
        let shape = [batch, layout.num_kv_heads, capacity, layout.head_dim];
        let zeros = || Some(Tensor::zeros(shape, device));
        Self {
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

    /// Bytes held on the device by keys and values.
    pub fn memory_bytes(&self) -> usize {
        self.layout.bytes_per_token() * self.batch * self.capacity
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
        let [b, kv_heads, s, d] = k.dims();
        debug_assert_eq!([b, kv_heads, d], [self.batch, self.layout.num_kv_heads, self.layout.head_dim]);
        debug_assert_eq!(s, self.used - self.step_start, "attend called outside begin_step's layout");
        let write = [0..b, 0..kv_heads, self.step_start..self.used, 0..d];
        let read = [0..b, 0..kv_heads, 0..self.used, 0..d];
        let store = |slot: &mut Option<Tensor<4>>, new: Tensor<4>| {
            let full = slot
                .take()
                .expect("cache tensors are only taken inside attend")
                .slice_assign(write.clone(), new);
            let visible = full.clone().slice(read.clone());
            *slot = Some(full);
            visible
        };
        let keys = store(&mut self.keys[layer], k);
        let values = store(&mut self.values[layer], v);
        let bias = self
            .bias
            .clone()
            .expect("begin_step must be called before the model runs");
        attention(q, keys, values, bias, scale)
    }
}
