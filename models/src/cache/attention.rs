//! Masked scaled-dot-product attention with grouped-query heads, shared by the caches that compute
//! attention with ordinary tensor ops.

use burn::tensor::{Device, Tensor, TensorData};
pub use burn_llm_kernels::attention_with;
use burn_llm_kernels::prefix_attention;

/// Additive bias of a masked score. Finite on purpose: a query that sees no key at all (a padding
/// row) gets a uniform, finite distribution instead of NaNs that would leak into later layers.
pub const MASKED: f32 = -1.0e30;

/// `softmax(q·kᵀ·scale + bias)·v` where `q` is `[b, heads, s, d]`, `k`/`v` are
/// `[b, kv_heads, t, d]` and `bias` broadcasts to `[b, 1, s, t]` (grouped-query heads fold into
/// the sequence axis, see [`attention_with`]; on Flex a decode step runs as one fused loop, see
/// [`prefix_attention`]).
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, bias: Tensor<4>, scale: f32) -> Tensor<4> {
    let len = k.dims()[2];
    prefix_attention(q, k, v, bias, len, scale)
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
