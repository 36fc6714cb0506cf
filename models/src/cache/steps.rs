//! The slot axis a contiguous batch shares: which slots hold real tokens of which sequence, and
//! the slots and attention mask of the current step.
//!
//! All sequences share the slot axis. Each step appends `max(new tokens)` slots; a sequence with
//! fewer new tokens is left-padded within the step, and padded slots are masked out for good. A
//! sequence may also sit a step out (no new tokens), e.g. once it has finished.

use std::ops::Range;

use burn::tensor::{Device, Int, Tensor, TensorData};

use super::{KvLayout, MASKED, StepInput, causal_bias};
use crate::error::{ModelError, Result};

/// Step layout of [`ContiguousKvCache`](super::ContiguousKvCache), public for caches that store
/// the same slots elsewhere.
#[derive(Debug, Clone)]
pub struct StepSlots {
    batch: usize,
    capacity: usize,
    /// `valid[b][slot]`: slot holds a real token of sequence `b`.
    valid: Vec<Vec<bool>>,
    /// Next position of each sequence (= tokens it has cached).
    next_position: Vec<usize>,
    /// Slots in use after the current step.
    used: usize,
    /// First slot of the current step.
    step_start: usize,
    /// Additive mask of the current step, `[batch, 1, step, used]` (empty before the first step).
    bias: Tensor<4>,
    device: Device,
}

impl StepSlots {
    /// An empty slot axis of `capacity` slots for `batch` sequences; token ids, positions and
    /// masks are built on `device`.
    pub fn new(batch: usize, capacity: usize, device: &Device) -> Self {
        Self {
            batch,
            capacity,
            valid: vec![Vec::with_capacity(capacity); batch],
            next_position: vec![0; batch],
            used: 0,
            step_start: 0,
            bias: Tensor::empty([batch, 1, 0, 0], device),
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

    /// The slots written by the current step: `start..used`.
    pub fn range(&self) -> Range<usize> {
        self.step_start..self.used
    }

    /// [`StepSlots::range`], for a layer's new keys `k` (checked against the step's layout in
    /// debug builds: a model attends only between `begin_step` calls, with every new token).
    pub fn range_for(&self, layout: &KvLayout, k: &Tensor<4>) -> Range<usize> {
        debug_assert_eq!(
            k.dims(),
            [self.batch, layout.num_kv_heads, self.used - self.step_start, layout.head_dim],
            "attend called outside begin_step's layout"
        );
        self.range()
    }

    /// The current step's additive mask, `[batch, 1, step, used]`: it hides padding and, within
    /// a multi-token step, later tokens.
    pub fn bias(&self) -> Tensor<4> {
        self.bias.clone()
    }

    /// The current step's mask for a local layer, `[batch, 1, step, used]`: [`StepSlots::bias`]
    /// that also hides, from a query at position `p`, the keys of its sequence at positions
    /// `p - window` and earlier (sliding-window attention).
    pub fn window_bias(&self, window: usize) -> Tensor<4> {
        let (used, step) = (self.used, self.used - self.step_start);
        let mut values = vec![0f32; self.batch * step * used];
        for (b, valid) in self.valid.iter().enumerate() {
            // Position of each slot within its sequence (the number of real tokens before it).
            let positions: Vec<usize> = valid
                .iter()
                .scan(0, |next, &ok| {
                    let p = *next;
                    *next += usize::from(ok);
                    Some(p)
                })
                .collect();
            for i in 0..step {
                let query = self.step_start + i;
                let row = &mut values[(b * step + i) * used..(b * step + i + 1) * used];
                for (key, bias) in row.iter_mut().enumerate() {
                    let hidden =
                        !valid[key] || key > query || (valid[query] && positions[key] + window <= positions[query]);
                    if hidden {
                        *bias = MASKED;
                    }
                }
            }
        }
        Tensor::from_data(TensorData::new(values, [self.batch, 1, step, used]), &self.device)
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
            return Err(ModelError::CacheFull { needed, capacity: self.capacity });
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
        self.bias =
            if width > 1 { key_bias + causal_bias(self.step_start, width, self.used, &self.device) } else { key_bias };

        let shape = [self.batch, width];
        Ok(StepInput {
            tokens: Tensor::<2, Int>::from_data(TensorData::new(tokens, shape), &self.device),
            positions: Tensor::<2, Int>::from_data(TensorData::new(positions, shape), &self.device),
            max_position,
            last,
        })
    }
}

impl StepInput {
    /// This step with its token ids taken from `ids` (`[batch, seq]`, on any device) instead of
    /// the ids it was laid out with: for an engine that feeds a step the ids the previous step
    /// sampled while they are still on the device. The layout (positions, padding, mask) stays
    /// the one `begin_step` made from the placeholder tokens, so `ids` must have its shape; ids at
    /// padded places are masked like any padding.
    pub fn with_tokens(self, ids: Tensor<2, Int>) -> Result<Self> {
        if ids.dims() != self.tokens.dims() {
            return Err(ModelError::BatchMismatch(format!(
                "a step laid out for tokens of shape {:?} was given ids of shape {:?}",
                self.tokens.dims(),
                ids.dims()
            )));
        }
        let ids = ids.to_device(&self.tokens.device());
        // Only when the kinds differ: some backends (remote workers) implement no integer cast.
        let ids = if ids.dtype() == self.tokens.dtype() { ids } else { ids.cast(self.tokens.dtype()) };
        Ok(Self { tokens: ids, ..self })
    }
}
