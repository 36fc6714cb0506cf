//! The fused decoder-step ops that run as one GPU kernel each, as a Burn backend extension: a
//! CubeCL kernel for every GPU runtime ([`super::cube`]) and a twin for Flex
//! ([`super::flex_ops`]) built on the same row loops the public wrappers run on Flex.
//!
//! These are unchecked: the public wrappers ([`super::rms_norm`], [`super::add_rms_norm`],
//! [`super::rotate_half_qk`], [`super::gated_mul_fused`]) check shapes before calling them.
//! Every op computes in `f32` whatever the storage dtype and returns its first input's dtype;
//! `gamma`, `cos` and `sin` may have a dtype of their own (norm weights stay `f32`).

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};

/// `half` of the last dimension of `shape`: the output of [`FusedOps::fused_gated_mul`].
pub(crate) fn halved(shape: &burn::tensor::Shape) -> burn::tensor::Shape {
    let mut s = shape.clone();
    let last = s.num_dims() - 1;
    s[last] /= 2;
    s
}

/// Fused ops of a decoder step.
#[backend_extension(
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Fusion: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Flex: cfg(feature = "flex"),
    Remote: cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))
)]
pub trait FusedOps: Backend {
    /// RMSNorm over the last dimension of `x` (`[..., d]`, contiguous or not): `x / sqrt(mean(x²)
    /// + ε) · γ`, `gamma` `[d]`.
    #[fusion(dtype = x, shape = x)]
    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self>;

    /// `s = x + residual` (rounded to `x`'s dtype) and RMSNorm of `s`: returns `(norm(s), s)`.
    #[fusion(meta = |x, _residual, _gamma, _epsilon| (x.clone(), x.clone()))]
    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Rotate-half RoPE of `q` (`[b, s, heads, d]`) and `k` (`[b, s, kv_heads, d]`), either a
    /// strided view (of a fused q|k|v projection), by `cos`/`sin` (`[b, s, 1, d / 2]`, views
    /// allowed): returns both rotated, contiguous.
    #[fusion(meta = |q, k, _cos, _sin| (q.clone(), k.clone()))]
    fn fused_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `rms_norm(x) · γ + residual`, the normalized value rounded to `x`'s dtype before the add
    /// (a post-norm and the residual add after it, Gemma 3's sandwich norms).
    #[fusion(dtype = x, shape = x)]
    fn fused_rms_norm_add(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self>;

    /// `s = residual + rms_norm(x) · γ₁` (rounded as stored) and `rms_norm(s) · γ₂`: returns
    /// `(norm₂(s), s)`.
    #[fusion(meta = |x, _residual, _gamma_first, _gamma_second, _epsilon_first, _epsilon_second| (x.clone(), x.clone()))]
    fn fused_norm_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma_first: FloatTensor<Self>,
        gamma_second: FloatTensor<Self>,
        epsilon_first: f32,
        epsilon_second: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`FusedOps::fused_rotate_half_qk`] of each head RMS-normalized first (QK-norm), by
    /// `q_gamma` / `k_gamma` (`[d]`), the normalized values rounded to `q`'s dtype.
    #[fusion(meta = |q, k, _q_gamma, _k_gamma, _cos, _sin, _epsilon| (q.clone(), k.clone()))]
    fn fused_norm_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        q_gamma: FloatTensor<Self>,
        k_gamma: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `act(gate) · up` where `gate_up` (`[..., 2f]`, contiguous) holds `gate` in its first `f`
    /// columns and `up` in its last: returns `[..., f]`. `act` is 0 for SiLU, 1 for GELU's tanh
    /// approximation ([`super::Gate::code`]).
    #[fusion(dtype = gate_up, shape = halved(gate_up))]
    fn fused_gated_mul(gate_up: FloatTensor<Self>, act: u32) -> FloatTensor<Self>;

    /// `softmax(q·kᵀ·scale + bias)·v` over slots `0..len` of `k`/`v` (`[b, kv_heads, slots, d]`),
    /// `q` `[b, heads, s, d]`, `bias` `[b or 1, 1, s or 1, len]`, any strides: returns the
    /// contiguous `[b, s, heads, d]` (the output projection's layout).
    #[fusion(dtype = q, shape = {
        let mut s = q.clone();
        s.swap(1, 2);
        s
    })]
    fn fused_prefix_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        len: usize,
        scale: f32,
    ) -> FloatTensor<Self>;
}
