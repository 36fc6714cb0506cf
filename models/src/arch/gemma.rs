//! Gemma 3's text model (`model_type: "gemma3_text"`): LLaMA's skeleton with QK-norm, norms
//! before and after both attention and MLP, `(1 + w)` RMSNorm gains, embeddings scaled by
//! `√hidden`, GeGLU (tanh GELU), a head width of its own, `query_pre_attn_scalar` for the score
//! scale, and local (sliding-window, RoPE base 10 000) layers between global ones (RoPE base 1e6).

use serde::Deserialize;

use super::llama::{LlamaConfig, rope_spec};
use super::{QkvNames, TensorNames};
use crate::config::{Activation, Architecture, DecoderSpec, PositionKind, SlidingWindow};

/// Gemma 3's `config.json`, in transformers 4's dialect (`rope_theta`, `rope_local_base_freq`,
/// `sliding_window_pattern`) or 5's (`rope_parameters` per layer type, `layer_types`).
#[derive(Debug, Clone, Deserialize)]
pub struct Gemma3Config {
    /// The fields LLaMA shares.
    #[serde(flatten)]
    pub base: LlamaConfig,
    /// MLP activation (Gemma's name for `hidden_act`).
    #[serde(default)]
    pub hidden_activation: Option<String>,
    /// Scores are scaled by `query_pre_attn_scalar^-½`.
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// Keys a local layer's query sees.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Every `n`-th layer is global (transformers 4).
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// Per-layer attention kind (transformers 5).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// RoPE base of local layers (transformers 4).
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    /// Per-layer-type RoPE parameters (transformers 5: `full_attention`, `sliding_attention`).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Softcapping of the final logits.
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    /// Softcapping of attention scores (none in Gemma 3's checkpoints).
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    /// Gemma ties its head unless told otherwise.
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
}

/// Gemma 3's global/local RoPE bases when the config names none.
const GLOBAL_THETA: f64 = 1_000_000.0;
const LOCAL_THETA: f64 = 10_000.0;
/// transformers' default `sliding_window_pattern`.
const PATTERN: usize = 6;

impl Gemma3Config {
    /// Lowers to the shared decoder description.
    pub fn to_spec(&self) -> Result<DecoderSpec, String> {
        if let Some(cap) = self.attn_logit_softcapping {
            return Err(format!("attention logit softcapping ({cap}) is not supported; Gemma 3 checkpoints have none"));
        }
        let mut spec = self.base.to_spec()?;
        spec.arch = Architecture::Gemma3;
        let act = self.hidden_activation.as_deref().unwrap_or("gelu_pytorch_tanh");
        spec.activation = Activation::from_hf(act).ok_or_else(|| format!("unsupported hidden_activation `{act}`"))?;
        spec.tie_word_embeddings = self.tie_word_embeddings.unwrap_or(true);
        let head_dim = spec.head_dim;
        let params = |kind: &str| self.rope_parameters.as_ref().and_then(|p| p.get(kind)).filter(|v| !v.is_null());
        let theta = |params: Option<&serde_json::Value>, top: Option<f64>, default: f64| {
            params.and_then(|p| p.get("rope_theta")).and_then(|v| v.as_f64()).or(top).unwrap_or(default)
        };
        let max = self.base.max_position_embeddings;
        let global_params = params("full_attention").or(self.base.rope_params());
        let global_theta = theta(global_params, self.base.rope_theta, GLOBAL_THETA);
        let global = rope_spec(global_params, Some(global_theta), max, head_dim)?;
        let local_params = params("sliding_attention");
        let local_theta = theta(local_params, self.rope_local_base_freq, LOCAL_THETA);
        let local = rope_spec(local_params, Some(local_theta), max, head_dim)?;
        spec.positions = PositionKind::Rotary(global);
        let layers = match (&self.layer_types, self.sliding_window_pattern) {
            (Some(types), _) => SlidingWindow::layers_from_types(types)?,
            (None, Some(0)) => return Err("`sliding_window_pattern` must be positive".into()),
            (None, pattern) => {
                let pattern = pattern.unwrap_or(PATTERN);
                (0..spec.num_layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        let v = &mut spec.variants;
        v.qk_norm = true;
        v.sandwich_norms = true;
        v.norm_weight_offset = 1.0;
        v.embed_scale = Some((spec.hidden_size as f64).sqrt());
        v.attention_scale = Some(1.0 / self.query_pre_attn_scalar.unwrap_or(head_dim as f64).sqrt());
        v.final_logit_softcap = self.final_logit_softcapping;
        if layers.iter().any(|&local| local) {
            let size = self.sliding_window.ok_or("Gemma 3 has sliding layers but `sliding_window` is null")?;
            v.sliding_window = Some(SlidingWindow { size, layers, local_rope: Some(local) });
        }
        Ok(spec)
    }
}

/// Where Gemma 3 checkpoints keep their tensors: `input_layernorm` before attention,
/// `post_attention_layernorm` after it, `pre_feedforward_layernorm` before the MLP and
/// `post_feedforward_layernorm` after it.
pub const NAMES: TensorNames = TensorNames {
    mlp_norm: "pre_feedforward_layernorm",
    post_attn_norm: Some("post_attention_layernorm"),
    post_mlp_norm: Some("post_feedforward_layernorm"),
    q_norm: Some("self_attn.q_norm"),
    k_norm: Some("self_attn.k_norm"),
    qkv: QkvNames::Separate("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ..super::llama::NAMES
};

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{DecoderSpec, PositionKind};

    /// Gemma 3 270M's `config.json` in transformers 4's dialect (`rope_theta`,
    /// `rope_local_base_freq`, `sliding_window_pattern`).
    const GEMMA3_270M: &str = r#"{
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": false,
        "attn_logit_softcapping": null, "final_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
        "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 18,
        "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 512,
        "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144
    }"#;

    #[test]
    fn transformers_4_config_lowers_to_five_local_layers_per_global_one() {
        let spec = DecoderSpec::from_json(GEMMA3_270M, Path::new("config.json")).unwrap();
        assert_eq!((spec.head_dim, spec.num_kv_heads), (256, 1));
        let windows: Vec<Option<usize>> = (0..spec.num_layers).map(|i| spec.window(i)).collect();
        assert_eq!(windows.iter().filter(|w| w.is_none()).count(), 3);
        assert_eq!(windows[5], None);
        assert_eq!(windows[4], Some(512));
        let PositionKind::Rotary(global) = &spec.positions else { panic!("rotary expected") };
        assert_eq!(global.theta, 1e6);
        let local = spec.variants.sliding_window.as_ref().and_then(|w| w.local_rope.as_ref()).unwrap();
        assert_eq!(local.theta, 10_000.0);
        assert!(spec.tie_word_embeddings);
        assert_eq!(spec.variants.attention_scale, Some(1.0 / 16.0));
        assert_eq!(spec.variants.embed_scale, Some(640f64.sqrt()));
        assert_eq!(spec.variants.norm_weight_offset, 1.0);
    }

    #[test]
    fn attention_softcapping_is_refused() {
        let text = GEMMA3_270M.replace(r#""attn_logit_softcapping": null"#, r#""attn_logit_softcapping": 50.0"#);
        let err = DecoderSpec::from_json(&text, Path::new("config.json")).unwrap_err();
        assert!(err.to_string().contains("softcapping"), "{err}");
    }
}
