//! The feed-forward block: `fc2(act(fc1(x)))`, or gated `down(act(gate(x)) · up(x))` (SwiGLU).

use crate::layers::projection::Projection;
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};
use burn_llm_kernels::{Gate, gated_mul, gated_mul_fused};

use crate::config::Activation;

/// Feed-forward block of one decoder layer.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `fc1` / `c_fc` / `up_proj`; after [`Mlp::fused`] (with `gate_up` set), `gate_proj` and
    /// `up_proj` in one, the gate's outputs first.
    pub up: Projection,
    /// `gate_proj` of gated MLPs; `None` once fused into `up`.
    pub gate: Option<Projection>,
    /// Whether `up` holds the gate and up projections fused.
    #[module(skip)]
    pub gate_up: bool,
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
            (None, Some(act)) if self.gate_up => gated_mul_fused(act, self.up.forward(x)),
            (None, None) if self.gate_up => {
                let gate_up = self.up.forward(x);
                let width = gate_up.dims()[2] / 2;
                activate(self.activation, gate_up.clone().narrow(2, 0, width)) * gate_up.narrow(2, width, width)
            }
            (None, _) => activate(self.activation, self.up.forward(x)),
        };
        self.down.forward(inner)
    }

    /// The block with its gate and up projections fused into one (see [`Projection::concat`]),
    /// or as it is when it has no gate or they cannot be fused.
    pub fn fused(self) -> Self {
        let Some(gate) = &self.gate else { return self };
        match Projection::concat(&[gate, &self.up]) {
            Some(gate_up) => Mlp { up: gate_up, gate: None, gate_up: true, ..self },
            None => self,
        }
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
