//! The gates of gated MLPs fused with their product: `silu(gate) · up` (SwiGLU) and
//! `gelu_tanh(gate) · up` (GeGLU, Gemma).

use burn::backend::Dispatch;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu_approximate, silu};

use super::ops::FusedOps;

/// The activation applied to a gated MLP's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `x · σ(x)`.
    Silu,
    /// GELU's tanh approximation, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
}

impl Gate {
    /// The op code of [`FusedOps::fused_gated_mul`].
    pub(crate) fn code(self) -> u32 {
        match self {
            Gate::Silu => 0,
            Gate::GeluTanh => 1,
        }
    }
}

/// `act(gate) · up` where `gate_up` (`[..., 2f]`) is a fused gate|up projection's output, `gate`
/// its first `f` columns and `up` its last `f`: returns `[..., f]`. On a GPU one kernel launch
/// ([`FusedOps::fused_gated_mul`]); on Flex the one-pass loops of [`gated_mul`]. The last
/// dimension is a fused projection's, so even: an odd one goes to [`gated_mul`] with halves of
/// unequal widths, whose shape check reports it.
pub fn gated_mul_fused<const D: usize>(act: Gate, gate_up: Tensor<D>) -> Tensor<D> {
    let width = gate_up.dims()[D - 1];
    let split = |t: Tensor<D>| {
        let half = width / 2;
        (t.clone().narrow(D - 1, 0, half), t.narrow(D - 1, half, width - half))
    };
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&gate_up) {
        let (gate, up) = split(gate_up);
        return gated_mul(act, gate, up);
    }
    if !width.is_multiple_of(2) {
        let (gate, up) = split(gate_up);
        return gated_mul(act, gate, up);
    }
    Tensor::from_dispatch(<Dispatch as FusedOps>::fused_gated_mul(gate_up.into_dispatch(), act.code()))
}

/// `act(gate) · up` elementwise over tensors of one shape. On Flex it runs in one pass, in place
/// over `gate`'s buffer when no other tensor shares it, with an exponential that vectorizes
/// (Burn's ops run each step as a separate pass, with a libm call per element for GELU's `tanh`
/// and cube).
pub fn gated_mul<const D: usize>(act: Gate, gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&gate) && super::flex::on_flex(&up) && gate.dims() == up.dims() {
        use super::flex::{for_rows, from_flex, into_flex, slice, slice_mut};
        let width = gate.dims()[D - 1];
        let mut gate = into_flex(gate);
        let up = into_flex(up);
        let up = slice(&up);
        let rows = match act {
            Gate::Silu => silu_mul_rows,
            Gate::GeluTanh => gelu_tanh_mul_rows,
        };
        for_rows(slice_mut(&mut gate), width, width, |i, row| rows(row, &up[i * width..(i + 1) * width]));
        return from_flex(gate);
    }
    match act {
        Gate::Silu => silu(gate) * up,
        Gate::GeluTanh => gelu_approximate(gate) * up,
    }
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// `gate ← silu(gate) · up`, with AVX2/FMA when the CPU has them.
    pub(super) fn silu_mul_rows(gate: &mut [f32], up: &[f32]) => silu_mul_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn silu_mul_portable(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + super::exp::exp(-*g)) * u;
    }
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// `gate ← gelu_tanh(gate) · up`, with AVX2/FMA when the CPU has them.
    pub(super) fn gelu_tanh_mul_rows(gate: &mut [f32], up: &[f32]) => gelu_tanh_mul_portable
}

/// `½(1 + tanh z) = σ(2z)`, so `gelu_tanh(x) = x / (1 + e^(−2z))` with `z = √(2/π)(x + 0.044715x³)`:
/// one exponential, as SiLU.
#[cfg(feature = "flex")]
#[inline(always)]
fn gelu_tanh_mul_portable(gate: &mut [f32], up: &[f32]) {
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = TWO_SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = x / (1.0 + super::exp::exp(-z)) * u;
    }
}
