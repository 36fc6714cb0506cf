//! The gate of SwiGLU MLPs: `silu(gate) · up`.

use burn::tensor::Tensor;
use burn::tensor::activation::silu;

/// `silu(gate) · up = gate / (1 + e^(−gate)) · up`, elementwise over tensors of one shape. On Flex
/// it runs in one pass, in place over `gate`'s buffer when no other tensor shares it.
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&gate) && super::flex::on_flex(&up) && gate.dims() == up.dims() {
        use super::flex::{for_rows, from_flex, into_flex, slice, slice_mut};
        let width = gate.dims()[D - 1];
        let mut gate = into_flex(gate);
        let up = into_flex(up);
        let up = slice(&up);
        for_rows(slice_mut(&mut gate), width, width, |i, row| silu_mul_rows(row, &up[i * width..(i + 1) * width]));
        return from_flex(gate);
    }
    silu(gate) * up
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// `gate ← silu(gate) · up`, with AVX2/FMA when the CPU has them.
    fn silu_mul_rows(gate: &mut [f32], up: &[f32]) => silu_mul_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn silu_mul_portable(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + super::exp::exp(-*g)) * u;
    }
}
