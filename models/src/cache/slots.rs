//! One layer's key/value storage over a slot axis: `[batch, kv_heads, capacity, head_dim]` floats,
//! or the same slots group-quantized along `head_dim` (KV-cache compression).
//!
//! These are the storage pieces of [`ContiguousKvCache`](super::ContiguousKvCache), public so that
//! a cache keeping layers elsewhere (another device, or outside memory between steps) can reuse
//! them: the variants and their fields are the quantized layout such a cache reads and writes.

use std::ops::Range;

use burn::tensor::{DType, Device, Int, Tensor};
use burn_llm_kernels::{GroupQuantized, QuantSpec, dequantize, quantize};

use super::KvLayout;

/// One layer's keys or values.
#[allow(clippy::large_enum_variant)] // one per layer and K/V, never moved in hot loops
#[derive(Debug, Clone)]
pub enum Slots {
    /// Floats, `[batch, kv_heads, capacity, head_dim]`.
    Dense(Tensor<4>),
    /// Group-quantized along `head_dim`.
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

impl Slots {
    /// Zeroed slots of `shape` (`[batch, kv_heads, capacity, head_dim]`) on `device`, as `dtype`
    /// floats or as `quant` codes (with `dtype` scales and minimums).
    pub fn zeros(shape: [usize; 4], quant: Option<QuantSpec>, dtype: DType, device: &Device) -> Self {
        match quant {
            None => Slots::Dense(Tensor::zeros(shape, (device, dtype))),
            Some(spec) => {
                let [b, h, cap, d] = shape;
                let groups = [b, h, cap, d / spec.group_size()];
                Slots::Quantized {
                    codes: Tensor::zeros([b, h, cap, d / spec.per_word()], (device, DType::U32)),
                    scale: Tensor::zeros(groups, (device, dtype)),
                    min: Tensor::zeros(groups, (device, dtype)),
                    spec,
                }
            }
        }
    }

    /// Writes `new` (`[b, h, s, d]`, `s = step.len()`) at slots `step` and returns slots
    /// `0..step.end` as floats for attention. Taken by value so the write can happen in place.
    pub fn store(self, new: Tensor<4>, step: Range<usize>) -> (Self, Tensor<4>) {
        let slots = self.write(new, step.start);
        let visible = slots.prefix(step.end);
        let [b, h, _, d] = visible.dims();
        (slots, visible.slice([0..b, 0..h, 0..step.end, 0..d]))
    }

    /// Writes `new` (`[b, h, s, d]`) at slots `start..start + s`: in place when no other tensor
    /// shares the storage (the caller holds no view of it).
    pub fn write(self, new: Tensor<4>, start: usize) -> Self {
        let [b, h, s, _] = new.dims();
        let write = |t: usize| [0..b, 0..h, start..start + s, 0..t];
        match self {
            Slots::Dense(full) => {
                let d = new.dims()[3];
                Slots::Dense(full.slice_assign(write(d), new))
            }
            Slots::Quantized { codes, scale, min, spec } => {
                // The spec was validated against this head width by `check_kv_quant` when the
                // cache was built, and the layout of `new` is the cache's own.
                let q = quantize(new, spec).expect("KV quantization spec validated for the head width");
                let (words, groups) = (q.codes.dims()[1], q.scale.dims()[1]);
                let codes = codes.slice_assign(write(words), q.codes.reshape([b, h, s, words]));
                let scale = scale.slice_assign(write(groups), q.scale.reshape([b, h, s, groups]));
                let min = min.slice_assign(write(groups), q.min.reshape([b, h, s, groups]));
                Slots::Quantized { codes, scale, min, spec }
            }
        }
    }

    /// Floats holding slots `0..len` for attention, without copying dense slots: dense storage is
    /// returned whole (`[b, h, capacity, d]`, a shared handle: read its first `len` slots, as
    /// [`prefix_attention`](burn_llm_kernels::prefix_attention) does), quantized slots are
    /// dequantized (`[b, h, len, d]`).
    pub fn prefix(&self, len: usize) -> Tensor<4> {
        match self {
            Slots::Dense(full) => full.clone(),
            Slots::Quantized { codes, scale, min, spec } => {
                let [b, h, _, words] = codes.dims();
                let groups = scale.dims()[3];
                let read = |t: usize| [0..b, 0..h, 0..len, 0..t];
                let rows = b * h * len;
                dequantize(&GroupQuantized {
                    codes: codes.clone().slice(read(words)).reshape([rows, words]),
                    scale: scale.clone().slice(read(groups)).reshape([rows, groups]),
                    min: min.clone().slice(read(groups)).reshape([rows, groups]),
                    shape: [b, h, len, words * spec.per_word()],
                    spec: *spec,
                })
            }
        }
    }
}

/// One layer's keys and values.
#[derive(Debug, Clone)]
pub struct LayerSlots {
    /// Keys.
    pub keys: Slots,
    /// Values.
    pub values: Slots,
}

impl LayerSlots {
    /// Zeroed keys and values for `batch` sequences of `capacity` slots of a model with `layout`,
    /// in its dtype.
    pub fn zeros(layout: KvLayout, batch: usize, capacity: usize, quant: Option<QuantSpec>, device: &Device) -> Self {
        let shape = [batch, layout.num_kv_heads, capacity, layout.head_dim];
        let dtype = layout.dtype.dtype();
        Self { keys: Slots::zeros(shape, quant, dtype, device), values: Slots::zeros(shape, quant, dtype, device) }
    }

    /// Writes this step's keys `k` and values `v` at slots `step` and returns slots `0..step.end`
    /// of both as floats (see [`Slots::store`]).
    pub fn store(self, k: Tensor<4>, v: Tensor<4>, step: Range<usize>) -> (Self, Tensor<4>, Tensor<4>) {
        let (keys, k) = self.keys.store(k, step.clone());
        let (values, v) = self.values.store(v, step);
        (Self { keys, values }, k, v)
    }

    /// Writes this step's keys `k` and values `v` at slots `start..` (see [`Slots::write`]).
    pub fn write(self, k: Tensor<4>, v: Tensor<4>, start: usize) -> Self {
        Self { keys: self.keys.write(k, start), values: self.values.write(v, start) }
    }
}
