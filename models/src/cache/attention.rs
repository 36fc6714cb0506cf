//! Masked scaled-dot-product attention with grouped-query heads, shared by the caches that compute
//! attention with ordinary tensor ops.

use burn::tensor::activation::softmax;
use burn::tensor::{DType, Device, Tensor, TensorData};

/// Additive bias of a masked score. Finite on purpose: a query that sees no key at all (a padding
/// row) gets a uniform, finite distribution instead of NaNs that would leak into later layers.
pub const MASKED: f32 = -1.0e30;

/// `softmax(q·kᵀ·scale + bias)·v` where `q` is `[b, heads, s, d]`, `k`/`v` are
/// `[b, kv_heads, t, d]` and `bias` broadcasts to `[b, 1, s, t]`.
///
/// Grouped-query attention folds the query heads that share a key/value head into the sequence
/// axis (`[b, kv_heads, group · s, d]`), so keys and values are never repeated in memory.
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, bias: Tensor<4>, scale: f32) -> Tensor<4> {
    attention_with(q, k, v, bias, scale, |scores| scores)
}

/// [`attention`] with `adjust` applied to the biased scores before the softmax, for a cache that
/// changes which keys a query weighs (e.g. drops low scores). The scores are
/// `[b, kv_heads, group · s, t]`, keys on the last axis.
pub fn attention_with(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    scale: f32,
    adjust: impl FnOnce(Tensor<4>) -> Tensor<4>,
) -> Tensor<4> {
    let [b, heads, s, d] = q.dims();
    let [_, kv_heads, _, _] = k.dims();
    let group = heads / kv_heads;
    let q = q.reshape([b, kv_heads, group * s, d]);
    // Scores, mask and softmax in `f32` (a no-op for `f32` models): half precision would round
    // the scores and overflow the mask; the products with `q`, `k` and `v` stay in their dtype.
    let dtype = v.dtype();
    let scores = q.matmul(k.swap_dims(2, 3)).cast(DType::F32) * scale;
    let bias = if group > 1 { bias.repeat_dim(2, group) } else { bias };
    let probs = softmax(adjust(scores + bias.cast(DType::F32)), 3).cast(dtype);
    probs.matmul(v).reshape([b, heads, s, d])
}

/// Bias `[1, 1, s, t]` that lets query `i` (at absolute slot `start + i`) see key slots
/// `0..=start + i` only.
pub fn causal_bias(start: usize, s: usize, t: usize, device: &Device) -> Tensor<4> {
    let mut values = vec![0f32; s * t];
    for i in 0..s {
        for j in (start + i + 1).min(t)..t {
            values[i * t + j] = MASKED;
        }
    }
    Tensor::from_data(TensorData::new(values, [1, 1, s, t]), device)
}
