//! RMSNorm: `x / sqrt(mean(x²) + ε) · γ` over the last dimension.

use burn::tensor::Tensor;

/// RMSNorm of `x` (`[..., d]`) with weights `gamma` (`[d]`), as `burn::nn::RmsNorm` computes it
/// (in `f32`): one pass per row on Flex instead of six ops.
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, epsilon: f64) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&x) && super::flex::on_flex(&gamma) {
        return flex_rms_norm(x, gamma, epsilon as f32);
    }
    let rms = (x.clone().square().mean_dim(D - 1) + epsilon).sqrt();
    (x / rms) * gamma.unsqueeze()
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
    fn normalize(x: &[f32], gamma: &[f32], epsilon: f32, out: &mut [f32]) => normalize_portable
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
