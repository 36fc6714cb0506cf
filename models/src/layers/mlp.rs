//! The feed-forward block: `fc2(act(fc1(x)))`, or gated `down(act(gate(x)) · up(x))` (SwiGLU).

use crate::layers::projection::Projection;
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};
use burn_llm_kernels::{Gate, gated_mul};

use crate::config::Activation;

/// Feed-forward block of one decoder layer.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `fc1` / `c_fc` / `up_proj`.
    pub up: Projection,
    /// `gate_proj` of gated MLPs.
    pub gate: Option<Projection>,
    /// `fc2` / `c_proj` / `down_proj`.
    pub down: Projection,
    /// Pointwise activation.
    #[module(skip)]
    pub activation: Activation,
}

impl Mlp {
    /// Applies the block to `[batch, seq, hidden]` (SwiGLU's `silu(gate) · up` and GeGLU's
    /// `gelu_tanh(gate) · up` as one fused pass on Flex).
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let fused = match self.activation {
            Activation::Silu => Some(Gate::Silu),
            Activation::GeluTanh => Some(Gate::GeluTanh),
            Activation::Relu | Activation::Gelu => None,
        };
        let inner = match (&self.gate, fused) {
            (Some(gate), Some(act)) => gated_mul(act, gate.forward(x.clone()), self.up.forward(x)),
            (Some(gate), None) => activate(self.activation, gate.forward(x.clone())) * self.up.forward(x),
            (None, _) => activate(self.activation, self.up.forward(x)),
        };
        self.down.forward(inner)
    }
}

/// Applies `activation` elementwise.
pub fn activate<const D: usize>(activation: Activation, x: Tensor<D>) -> Tensor<D> {
    match activation {
        Activation::Relu => relu(x),
        Activation::Gelu => gelu(x),
        Activation::GeluTanh => gelu_approximate(x),
        Activation::Silu => silu(x),
    }
}
