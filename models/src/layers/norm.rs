//! LayerNorm or RMSNorm, chosen by the architecture and loaded from HF names.

use burn::module::Module;
use burn::module::Param;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm};
use burn::tensor::{Device, Tensor};
use burn_llm_kernels::{add_rms_norm, norm_add_norm, rms_norm, rms_norm_add};

use crate::config::NormKind;
use crate::error::Result;
use crate::precision::in_f32;
use crate::weights::TensorSource;

/// A normalization layer of either kind.
#[derive(Module, Debug)]
pub enum Norm {
    /// `(x − mean) / sqrt(var + eps) · γ + β`.
    Layer(LayerNorm),
    /// `x / sqrt(mean(x²) + eps) · γ`.
    Rms(RmsNorm),
}

impl Norm {
    /// Loads `{prefix}.weight` (and `{prefix}.bias` for LayerNorm), `offset` added to the weight
    /// (Gemma's `(1 + w)` gains are stored as `w`).
    pub fn load(
        ckpt: &impl TensorSource,
        prefix: &str,
        kind: NormKind,
        dim: usize,
        offset: f64,
        device: &Device,
    ) -> Result<Self> {
        let mut gamma: Tensor<1> = ckpt.tensor(&format!("{prefix}.weight"), [dim], device)?;
        if offset != 0.0 {
            gamma = gamma.add_scalar(offset);
        }
        Ok(match kind {
            NormKind::Layer { eps } => {
                let mut norm = LayerNormConfig::new(dim).with_epsilon(eps).init(device);
                norm.gamma = Param::from_tensor(gamma);
                norm.beta = Some(Param::from_tensor(ckpt.tensor(&format!("{prefix}.bias"), [dim], device)?));
                Norm::Layer(norm)
            }
            NormKind::Rms { eps } => Norm::Rms(RmsNorm { gamma: Param::from_tensor(gamma), epsilon: eps }),
        })
    }

    /// Normalizes over the last dimension, computing in `f32` (the parameters stay `f32`, see
    /// [`crate::precision`]) and returning `x`'s dtype; RMSNorm is one fused pass on Flex.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Norm::Layer(n) => in_f32(x, |x| n.forward(x)),
            // Computes in f32 and returns x's dtype by itself (one GPU kernel, no casts around it).
            Norm::Rms(n) => rms_norm(x, n.gamma.val(), n.epsilon),
        }
    }

    /// `(norm(x + residual), x + residual)`: a residual add and the norm after it, one pass for
    /// RMSNorm ([`add_rms_norm`]).
    pub fn forward_add<const D: usize>(&self, x: Tensor<D>, residual: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
        match self {
            Norm::Layer(_) => {
                let sum = x + residual;
                (self.forward(sum.clone()), sum)
            }
            Norm::Rms(n) => add_rms_norm(x, residual, n.gamma.val(), n.epsilon),
        }
    }

    /// `norm(y) + residual`: a post-norm and the residual add after it, one pass for RMSNorm
    /// ([`rms_norm_add`]).
    pub fn forward_then_add<const D: usize>(&self, y: Tensor<D>, residual: Tensor<D>) -> Tensor<D> {
        match self {
            Norm::Rms(n) => rms_norm_add(y, n.gamma.val(), n.epsilon, residual),
            Norm::Layer(_) => residual + self.forward(y),
        }
    }

    /// `s = residual + self(y)` and `(next(s), s)`: a post-norm, the residual add and the next
    /// block's norm, one pass when both are RMSNorms ([`norm_add_norm`]).
    pub fn forward_add_norm<const D: usize>(
        &self,
        next: &Norm,
        y: Tensor<D>,
        residual: Tensor<D>,
    ) -> (Tensor<D>, Tensor<D>) {
        match (self, next) {
            (Norm::Rms(first), Norm::Rms(second)) => {
                norm_add_norm(y, residual, (first.gamma.val(), first.epsilon), (second.gamma.val(), second.epsilon))
            }
            _ => next.forward_add(residual, self.forward(y)),
        }
    }

    /// The RMSNorm's weights and epsilon (`None` for a LayerNorm).
    pub fn rms(&self) -> Option<(Tensor<1>, f64)> {
        match self {
            Norm::Rms(n) => Some((n.gamma.val(), n.epsilon)),
            Norm::Layer(_) => None,
        }
    }
}
