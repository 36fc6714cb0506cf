//! Qwen2/Qwen2.5 (biases on q, k and v, none on o), Qwen3 (QK-norm, no biases) and Mistral
//! (LLaMA's layout with a sliding window): `config.json` lowers like LLaMA's, then the family's
//! differences are set as [`DecoderVariants`](crate::config::DecoderVariants).

use serde::Deserialize;

use super::llama::LlamaConfig;
use super::{QkvNames, TensorNames};
use crate::config::{Architecture, DecoderSpec, SlidingWindow};

/// The `config.json` of Mistral, Qwen2 and Qwen3: LLaMA's fields plus the sliding window.
#[derive(Debug, Clone, Deserialize)]
pub struct QwenConfig {
    /// The fields LLaMA shares.
    #[serde(flatten)]
    pub base: LlamaConfig,
    /// Keys a local layer's query sees.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen's switch for the window (off in every released Qwen2/3 checkpoint).
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Qwen: layers from this index on are local when `use_sliding_window` is set.
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// Per-layer attention kind (transformers 5).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

impl QwenConfig {
    /// Lowers to the shared decoder description of `arch` (Mistral, Qwen2 or Qwen3).
    pub fn to_spec(&self, arch: Architecture) -> Result<DecoderSpec, String> {
        let mut spec = self.base.to_spec()?;
        spec.arch = arch;
        match arch {
            Architecture::Qwen2 => {
                spec.attention_bias = true;
                spec.variants.o_bias = Some(false);
            }
            Architecture::Qwen3 => spec.variants.qk_norm = true,
            _ => {}
        }
        let layers = match (&self.layer_types, arch) {
            (Some(types), _) => SlidingWindow::layers_from_types(types)?,
            // Mistral's window covers every layer whenever it is set.
            (None, Architecture::Mistral) => vec![true; spec.num_layers],
            (None, _) if self.use_sliding_window == Some(true) => {
                let first = self.max_window_layers.unwrap_or(0);
                (0..spec.num_layers).map(|i| i >= first).collect()
            }
            (None, _) => vec![],
        };
        if arch != Architecture::Mistral && self.use_sliding_window != Some(true) {
            // Qwen keeps `sliding_window` in its config but attends globally unless told to.
            return Ok(spec);
        }
        if layers.iter().any(|&local| local) {
            let size = self.sliding_window.ok_or("`layer_types` names sliding layers but `sliding_window` is null")?;
            spec.variants.sliding_window = Some(SlidingWindow { size, layers, local_rope: None });
        }
        Ok(spec)
    }
}

/// Where Qwen2 and Qwen3 checkpoints keep their tensors (LLaMA's names, plus QK-norm).
pub const NAMES: TensorNames = TensorNames {
    q_norm: Some("self_attn.q_norm"),
    k_norm: Some("self_attn.k_norm"),
    qkv: QkvNames::Separate("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ..super::llama::NAMES
};
