//! RMSNorm: `x / sqrt(mean(x²) + ε) · γ` over the last dimension.

use burn::backend::Dispatch;
use burn::tensor::{DType, Tensor};

use super::ops::FusedOps;

/// RMSNorm of `x` (`[..., d]`) with weights `gamma` (`[d]`), as `burn::nn::RmsNorm` computes it,
/// in `f32` whatever the dtypes of `x` and `gamma`, returning `x`'s dtype: one pass per row on
/// Flex, one kernel launch on a GPU ([`FusedOps::fused_rms_norm`]) instead of six ops.
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f64) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&x) && super::flex::on_flex(&gamma) {
        return flex_rms_norm(x, gamma, epsilon as f32);
    }
    if !fits(&x, &gamma) {
        return composed(x, gamma, epsilon);
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::fused_rms_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        epsilon as f32,
    ))
}

/// `(rms_norm(x + residual), x + residual)`: the residual add of a pre-norm decoder fused with the
/// norm that follows it (one pass per row on Flex, one kernel launch on a GPU). The sum is rounded
/// to `x`'s dtype before it is normalized, as the unfused add would leave it.
pub fn add_rms_norm<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    gamma: Tensor<1>,
    epsilon: f64,
) -> (Tensor<D>, Tensor<D>) {
    if !fits(&x, &gamma) || x.dims() != residual.dims() || x.dtype() != residual.dtype() {
        let sum = x + residual;
        return (composed(sum.clone(), gamma, epsilon), sum);
    }
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&x) && super::flex::on_flex(&residual) && super::flex::on_flex(&gamma) {
        let sum = x + residual;
        return (flex_rms_norm(sum.clone(), gamma, epsilon as f32), sum);
    }
    let (out, sum) = <Dispatch as FusedOps>::fused_add_rms_norm(
        x.into_dispatch(),
        residual.into_dispatch(),
        gamma.into_dispatch(),
        epsilon as f32,
    );
    (Tensor::from_dispatch(out), Tensor::from_dispatch(sum))
}

/// `rms_norm(x) + residual`: a post-norm and the residual add after it (Gemma 3's sandwich
/// norms), one kernel launch on a GPU. The normalized value is rounded to `x`'s dtype before the
/// add, as the unfused ops store it.
pub fn rms_norm_add<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f64, residual: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    let on_host = super::flex::on_flex(&x) && super::flex::on_flex(&residual);
    #[cfg(not(feature = "flex"))]
    let on_host = false;
    if on_host || !fits(&x, &gamma) || x.dims() != residual.dims() || x.dtype() != residual.dtype() {
        return rms_norm(x, gamma, epsilon) + residual;
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::fused_rms_norm_add(
        x.into_dispatch(),
        gamma.into_dispatch(),
        residual.into_dispatch(),
        epsilon as f32,
    ))
}

/// `s = residual + rms_norm(x, γ₁)` and `rms_norm(s, γ₂)`: returns `(rms_norm(s, γ₂), s)`. A
/// post-norm, the residual add and the next block's norm (Gemma 3's post-attention norm, residual
/// and pre-MLP norm), one kernel launch on a GPU; the intermediate values are rounded to `x`'s
/// dtype as the unfused ops store them.
pub fn norm_add_norm<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    (gamma_first, epsilon_first): (Tensor<1>, f64),
    (gamma_second, epsilon_second): (Tensor<1>, f64),
) -> (Tensor<D>, Tensor<D>) {
    #[cfg(feature = "flex")]
    let on_host = super::flex::on_flex(&x) && super::flex::on_flex(&residual);
    #[cfg(not(feature = "flex"))]
    let on_host = false;
    if on_host
        || !fits(&x, &gamma_first)
        || !fits(&x, &gamma_second)
        || x.dims() != residual.dims()
        || x.dtype() != residual.dtype()
    {
        let sum = residual + rms_norm(x, gamma_first, epsilon_first);
        return (rms_norm(sum.clone(), gamma_second, epsilon_second), sum);
    }
    let (out, sum) = <Dispatch as FusedOps>::fused_norm_add_norm(
        x.into_dispatch(),
        residual.into_dispatch(),
        gamma_first.into_dispatch(),
        gamma_second.into_dispatch(),
        epsilon_first as f32,
        epsilon_second as f32,
    );
    (Tensor::from_dispatch(out), Tensor::from_dispatch(sum))
}

/// Whether `gamma` has one weight per value of `x`'s rows, on `x`'s device: what the fused op
/// expects.
fn fits<const D: usize>(x: &Tensor<D>, gamma: &Tensor<1>) -> bool {
    x.dims()[D - 1] == gamma.dims()[0] && x.device() == gamma.device()
}

/// RMSNorm as Burn ops, in `f32`: what the fused op computes, for arguments it does not take
/// (Burn's own checks then report what is wrong with them).
fn composed<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f64) -> Tensor<D> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let rms = (x.clone().square().mean_dim(D - 1) + epsilon).sqrt();
    ((x / rms) * gamma.cast(DType::F32).unsqueeze()).cast(dtype)
}

#[cfg(feature = "flex")]
fn flex_rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f32) -> Tensor<D> {
    use super::flex::{for_rows, from_vec, into_flex, slice};
    let dims = x.dims();
    let d = dims[D - 1];
    let (x, gamma) = (into_flex(x), into_flex(gamma));
    let (xs, gamma) = (slice(&x), slice(&gamma));
    let mut out = vec![0f32; xs.len()];
    for_rows(&mut out, d, d, |i, row| normalize(&xs[i * d..(i + 1) * d], gamma, epsilon, row));
    from_vec(out, dims)
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// One row of [`rms_norm`], with AVX2/FMA when the CPU has them.
    pub(super) fn normalize(x: &[f32], gamma: &[f32], epsilon: f32, out: &mut [f32]) => normalize_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn normalize_portable(x: &[f32], gamma: &[f32], epsilon: f32, out: &mut [f32]) {
    let mean = crate::quant::q8::dot(x, x) / x.len() as f32;
    let rms = (mean + epsilon).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(gamma) {
        *o = v / rms * g;
    }
}
