//! Rotary position embeddings in HF's rotate-half form: dimension `i` of a head pairs with
//! `i + d/2`.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use super::ops::FusedOps;

/// Rotates every head of `x` (`[batch, seq, heads, d]`, the layout a projection's output reshapes
/// to) by the angles whose `cos` and `sin` are given per token (`[batch, seq, 1, d / 2]`):
/// `(x₁, x₂) ↦ (x₁·cos − x₂·sin, x₂·cos + x₁·sin)` for the two halves of each head. On Flex it
/// runs in place over `x`'s buffer when no other tensor shares it.
pub fn rotate_half(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&x) && super::flex::on_flex(cos) && super::flex::on_flex(sin) {
        return flex_rotate_half(x, cos.clone(), sin.clone());
    }
    let [b, s, h, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..s, 0..h, 0..half]);
    let x2 = x.slice([0..b, 0..s, 0..h, half..d]);
    let out1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let out2 = x2 * cos.clone() + x1 * sin.clone();
    Tensor::cat(vec![out1, out2], 3)
}

/// [`rotate_half`] of the queries `q` (`[batch, seq, heads, d]`) and the keys `k` (`[batch, seq,
/// kv_heads, d]`) together: on a GPU one kernel launch for both, reading `q` and `k` through their
/// strides (views into a fused q|k|v projection's output need no copy) and writing them
/// contiguous; on Flex the in-place loops of [`rotate_half`]. `cos`/`sin` may be views too.
pub fn rotate_half_qk(q: Tensor<4>, k: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> (Tensor<4>, Tensor<4>) {
    if !kernel_fits(&q, &k, cos, sin) {
        return (rotate_half(q, cos, sin), rotate_half(k, cos, sin));
    }
    let (q, k) = <Dispatch as FusedOps>::fused_rotate_half_qk(
        q.into_dispatch(),
        k.into_dispatch(),
        cos.clone().into_dispatch(),
        sin.clone().into_dispatch(),
    );
    (Tensor::from_dispatch(q), Tensor::from_dispatch(k))
}

/// [`rotate_half_qk`] of `q` and `k` each RMS-normalized per head first (QK-norm: Gemma 3,
/// Qwen3) by `q_gamma` / `k_gamma` (`[d]`), with `epsilon`: on a GPU one kernel launch for the
/// norms and the rotation of both (the normalized values rounded to `q`'s dtype, as the unfused
/// norm stores them); elsewhere [`super::rms_norm`] then [`rotate_half_qk`].
pub fn norm_rotate_half_qk(
    (q, q_gamma): (Tensor<4>, Tensor<1>),
    (k, k_gamma): (Tensor<4>, Tensor<1>),
    epsilon: f64,
    cos: &Tensor<4>,
    sin: &Tensor<4>,
) -> (Tensor<4>, Tensor<4>) {
    let d = q.dims()[3];
    let gammas_fit = q_gamma.dims() == [d]
        && k_gamma.dims() == [d]
        && q_gamma.device() == q.device()
        && k_gamma.device() == q.device()
        && k_gamma.dtype() == q_gamma.dtype();
    if !gammas_fit || !kernel_fits(&q, &k, cos, sin) {
        let (q, k) = (super::rms_norm(q, q_gamma, epsilon), super::rms_norm(k, k_gamma, epsilon));
        return rotate_half_qk(q, k, cos, sin);
    }
    let (q, k) = <Dispatch as FusedOps>::fused_norm_rotate_half_qk(
        q.into_dispatch(),
        k.into_dispatch(),
        q_gamma.into_dispatch(),
        k_gamma.into_dispatch(),
        cos.clone().into_dispatch(),
        sin.clone().into_dispatch(),
        epsilon as f32,
    );
    (Tensor::from_dispatch(q), Tensor::from_dispatch(k))
}

/// Whether the RoPE kernels take these arguments: queries `[b, s, heads, d]` and keys
/// `[b, s, kv_heads, d]` of one dtype, `cos`/`sin` `[b, s, 1, d / 2]`, all on one device that
/// is not Flex (whose loops run in place instead).
fn kernel_fits(q: &Tensor<4>, k: &Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> bool {
    let [b, s, _, d] = q.dims();
    let [kb, ks, _, kd] = k.dims();
    let fits = [kb, ks, kd] == [b, s, d]
        && d % 2 == 0
        && cos.dims() == [b, s, 1, d / 2]
        && sin.dims() == cos.dims()
        && [k.device(), cos.device(), sin.device()].iter().all(|dev| *dev == q.device())
        && k.dtype() == q.dtype()
        && sin.dtype() == cos.dtype();
    #[cfg(feature = "flex")]
    let fits = fits && q.device() != burn::tensor::Device::flex();
    fits
}

#[cfg(feature = "flex")]
fn flex_rotate_half(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>) -> Tensor<4> {
    use super::flex::{from_flex, into_flex, slice, slice_mut};
    let [_, _, heads, d] = x.dims();
    let half = d / 2;
    let (cos, sin) = (into_flex(cos), into_flex(sin));
    let (cos, sin) = (slice(&cos), slice(&sin));
    let mut x = into_flex(x);
    let values = slice_mut(&mut x);
    if half > 0 {
        for (token, (c, s)) in
            values.chunks_exact_mut(heads * d).zip(cos.chunks_exact(half).zip(sin.chunks_exact(half)))
        {
            for head in token.chunks_exact_mut(d) {
                rotate(head, c, s);
            }
        }
    }
    from_flex(x)
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// One head of [`rotate_half`], with AVX2/FMA when the CPU has them.
    pub(super) fn rotate(head: &mut [f32], cos: &[f32], sin: &[f32]) => rotate_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn rotate_portable(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let (x1, x2) = head.split_at_mut(cos.len());
    for (((a, b), c), s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
        let (u, v) = (*a, *b);
        *a = u * c - v * s;
        *b = v * c + u * s;
    }
}
