//! Phi-3 (`model_type: "phi3"`): LLaMA's layout with q, k and v fused into one `qkv_proj` and
//! gate and up into one `gate_up_proj` (gate first), split at load; a sliding window over every
//! layer when the config sets one.

use serde::Deserialize;

use super::llama::LlamaConfig;
use super::{QkvNames, TensorNames};
use crate::config::{Architecture, DecoderSpec, SlidingWindow};

/// Phi-3's `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Phi3Config {
    /// The fields LLaMA shares.
    #[serde(flatten)]
    pub base: LlamaConfig,
    /// Keys each query sees.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Fraction of each head RoPE rotates.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

impl Phi3Config {
    /// Lowers to the shared decoder description.
    pub fn to_spec(&self) -> Result<DecoderSpec, String> {
        let nested = self.base.rope_params().and_then(|p| p.get("partial_rotary_factor")).and_then(|v| v.as_f64());
        if let Some(f) = self.partial_rotary_factor.or(nested).filter(|f| *f != 1.0) {
            return Err(format!("partial rotary embeddings (partial_rotary_factor {f}) are not supported"));
        }
        let mut spec = self.base.to_spec()?;
        spec.arch = Architecture::Phi3;
        if let Some(size) = self.sliding_window {
            spec.variants.sliding_window = Some(SlidingWindow { size, layers: vec![], local_rope: None });
        }
        Ok(spec)
    }
}

/// Where Phi-3 checkpoints keep their tensors.
pub const NAMES: TensorNames = TensorNames {
    qkv: QkvNames::FusedOutIn("self_attn.qkv_proj"),
    gate_up: Some("mlp.gate_up_proj"),
    ..super::llama::NAMES
};
