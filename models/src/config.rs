//! Model configuration: HF `config.json` parsed per architecture and lowered to one
//! [`DecoderSpec`] that the shared decoder is built from.
//!
//! OPT, LLaMA, GPT-2, Mistral, Qwen2/3, Gemma 3 and Phi-3 are all pre- or post-norm decoder stacks
//! that differ only in a handful of choices (norm kind, position scheme, activation, gating,
//! biases, tied head, projections, and the newer families' [`DecoderVariants`]: QK-norm, sandwich
//! norms, sliding windows…). Each architecture module parses its own `config.json` dialect and
//! states those choices here, so the forward pass exists once.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::arch::{
    gemma::Gemma3Config, gpt2::Gpt2Config, llama::LlamaConfig, opt::OptConfig, phi3::Phi3Config, qwen::QwenConfig,
};
use crate::error::{ModelError, Result};
use crate::layers::rope::RopeSpec;
use crate::precision::Precision;

/// The architectures burn-llm implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Meta's OPT (`model_type: "opt"`).
    Opt,
    /// LLaMA and its relatives with the same layout (`model_type: "llama"`, SmolLM2, TinyLlama…).
    Llama,
    /// OpenAI's GPT-2 (`model_type: "gpt2"`).
    Gpt2,
    /// Mistral (`model_type: "mistral"`): LLaMA's layout with a sliding window.
    Mistral,
    /// Qwen2 and Qwen2.5 (`model_type: "qwen2"`): biases on q, k and v.
    Qwen2,
    /// Qwen3 (`model_type: "qwen3"`): QK-norm, no biases.
    Qwen3,
    /// Gemma 3's text model (`model_type: "gemma3_text"`).
    Gemma3,
    /// Phi-3 (`model_type: "phi3"`): fused `qkv_proj` and `gate_up_proj`.
    Phi3,
}

impl Architecture {
    /// The `model_type` string of HF configs.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Opt => "opt",
            Architecture::Llama => "llama",
            Architecture::Gpt2 => "gpt2",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3_text",
            Architecture::Phi3 => "phi3",
        }
    }
}

/// Normalization layer kind and its epsilon.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum NormKind {
    /// LayerNorm with learned scale and bias.
    Layer {
        /// Added to the variance.
        eps: f64,
    },
    /// RMSNorm with learned scale.
    Rms {
        /// Added to the mean square.
        eps: f64,
    },
}

/// Pointwise activation of the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// `max(x, 0)` (OPT).
    Relu,
    /// Exact GELU with erf.
    Gelu,
    /// GELU with the tanh approximation (GPT-2's `gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// `x · sigmoid(x)` (LLaMA's SwiGLU gate).
    Silu,
}

impl Activation {
    /// Parses an HF activation name (`activation_function`, `hidden_act`).
    pub fn from_hf(name: &str) -> Option<Self> {
        match name {
            "relu" => Some(Self::Relu),
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Self::GeluTanh),
            "silu" | "swish" => Some(Self::Silu),
            _ => None,
        }
    }
}

/// How token positions enter the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PositionKind {
    /// A learned table added to the embeddings; row = position + `offset` (OPT uses 2).
    Learned {
        /// Rows in the table.
        rows: usize,
        /// Added to every position before the lookup.
        offset: usize,
    },
    /// Rotary embeddings applied to queries and keys.
    Rotary(RopeSpec),
}

/// Everything the shared decoder needs to know, lowered from an architecture's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecoderSpec {
    /// Which architecture this came from (decides weight names).
    pub arch: Architecture,
    /// Tokens in the vocabulary (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the token embedding when it differs from `hidden_size` (OPT-350m's
    /// `word_embed_proj_dim`); the model then has `project_in`/`project_out`.
    pub embed_dim: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (smaller than `num_heads` with grouped-query attention).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Inner width of the MLP.
    pub intermediate_size: usize,
    /// Positions the model was trained for; prompts longer than this are rejected.
    pub max_positions: usize,
    /// Norm layer kind.
    pub norm: NormKind,
    /// `true`: norm before attention and MLP (GPT-2, LLaMA, most OPT); `false`: after (OPT-350m).
    pub pre_norm: bool,
    /// Whether a final norm follows the last layer.
    pub final_norm: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Gated MLP (`down(act(gate(x)) * up(x))`, LLaMA) instead of `fc2(act(fc1(x)))`.
    pub gated_mlp: bool,
    /// Biases on q/k/v/o projections.
    pub attention_bias: bool,
    /// Biases on MLP projections.
    pub mlp_bias: bool,
    /// Position scheme.
    pub positions: PositionKind,
    /// LM head shares the token embedding.
    pub tie_word_embeddings: bool,
    /// Multiply attention scores of layer `i` by `1 / (i + 1)` too (GPT-2's
    /// `scale_attn_by_inverse_layer_idx`).
    pub scale_attn_by_inverse_layer_idx: bool,
    /// BOS id from `config.json`, if any.
    pub bos_token_id: Option<u32>,
    /// EOS ids from `config.json`, if any.
    pub eos_token_ids: Vec<u32>,
    /// Floating-point type the weights are stored and multiplied in (`f32` unless the loader is
    /// told otherwise, see [`crate::PretrainedFiles::with_precision`]); the file's own dtype is
    /// cast to it when loading.
    #[serde(default)]
    pub dtype: Precision,
    /// What the newer architectures (Gemma 3, Qwen, Mistral, Phi-3) change; all off for OPT,
    /// LLaMA and GPT-2.
    #[serde(default)]
    pub variants: DecoderVariants,
}

/// The choices of the newer decoder families, as data: each is off by default.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DecoderVariants {
    /// RMSNorm over each head of the queries and keys, before RoPE (Gemma 3, Qwen3).
    pub qk_norm: bool,
    /// Norms after attention and after the MLP too, before their residual adds (Gemma's
    /// `post_attention_layernorm` / `post_feedforward_layernorm`).
    pub sandwich_norms: bool,
    /// Added to every norm weight at load: Gemma's safetensors store `w` for a `(1 + w)` gain
    /// (llama.cpp's converter bakes the `+1` into GGUF files).
    pub norm_weight_offset: f64,
    /// Token embeddings multiplied by this (Gemma's `√hidden`, rounded to the weights' dtype).
    pub embed_scale: Option<f64>,
    /// Attention score multiplier replacing `1/√head_dim` (Gemma's `query_pre_attn_scalar^-½`).
    pub attention_scale: Option<f64>,
    /// Bias on the output projection when it differs from
    /// [`DecoderSpec::attention_bias`] (Qwen2: q, k and v only).
    pub o_bias: Option<bool>,
    /// Local attention of some or all layers.
    pub sliding_window: Option<SlidingWindow>,
    /// Final logits become `cap · tanh(logits / cap)` (Gemma's `final_logit_softcapping`).
    pub final_logit_softcap: Option<f64>,
}

/// Sliding-window attention: a query at position `p` sees keys at positions `p - size + 1..=p`
/// (HF's `sliding_window`, the key itself included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlidingWindow {
    /// Keys a query sees, itself included.
    pub size: usize,
    /// `layers[i]`: layer `i` is local; empty means every layer is (Mistral, Phi-3).
    pub layers: Vec<bool>,
    /// RoPE of the local layers when it differs from the global one (Gemma 3's
    /// `rope_local_base_freq`).
    pub local_rope: Option<RopeSpec>,
}

impl SlidingWindow {
    /// Whether layer `i` is local.
    pub fn is_local(&self, layer: usize) -> bool {
        self.layers.is_empty() || self.layers.get(layer).copied().unwrap_or(false)
    }

    /// The per-layer flags of HF's `layer_types` (`"sliding_attention"` / `"full_attention"`).
    pub fn layers_from_types(types: &[String]) -> std::result::Result<Vec<bool>, String> {
        types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(format!(
                    "unsupported layer type `{other}` in `layer_types` (sliding_attention, full_attention are)"
                )),
            })
            .collect()
    }
}

impl DecoderSpec {
    /// Reads `config.json` in `dir`, detects the architecture and lowers it.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile { what: "config.json", path });
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        Self::from_json(&text, &path)
    }

    /// Parses a `config.json` text; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::config(path, e.to_string()))?;
        let arch = detect_architecture(&value).map_err(|found| match found {
            Some(name) => ModelError::UnsupportedArchitecture(name),
            None => ModelError::config(path, "no `model_type` or `architectures` field: is this an HF config.json?"),
        })?;
        let parse_err = |e: serde_json::Error| ModelError::config(path, e.to_string());
        let spec = match arch {
            Architecture::Opt => OptConfig::deserialize(&value).map_err(parse_err)?.to_spec(),
            Architecture::Llama => LlamaConfig::deserialize(&value)
                .map_err(parse_err)?
                .to_spec()
                .map_err(|m| ModelError::config(path, m))?,
            Architecture::Gpt2 => Gpt2Config::deserialize(&value)
                .map_err(parse_err)?
                .to_spec()
                .map_err(|m| ModelError::config(path, m))?,
            Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => QwenConfig::deserialize(&value)
                .map_err(parse_err)?
                .to_spec(arch)
                .map_err(|m| ModelError::config(path, m))?,
            Architecture::Gemma3 => Gemma3Config::deserialize(&value)
                .map_err(parse_err)?
                .to_spec()
                .map_err(|m| ModelError::config(path, m))?,
            Architecture::Phi3 => Phi3Config::deserialize(&value)
                .map_err(parse_err)?
                .to_spec()
                .map_err(|m| ModelError::config(path, m))?,
        };
        spec.validate().map_err(|m| ModelError::config(path, m))?;
        Ok(spec)
    }

    /// Checks the invariants the decoder relies on.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate size", self.intermediate_size),
            ("max_position_embeddings", self.max_positions),
            ("embedding width", self.embed_dim),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be positive"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if matches!(self.positions, PositionKind::Rotary(_)) && !self.head_dim.is_multiple_of(2) {
            return Err(format!("rotary embeddings need an even head_dim, got {}", self.head_dim));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err("vocab_size does not fit in u32 token ids".into());
        }
        if let Some(window) = &self.variants.sliding_window {
            if window.size == 0 {
                return Err("`sliding_window` must be positive".into());
            }
            if !window.layers.is_empty() && window.layers.len() != self.num_layers {
                return Err(format!(
                    "`layer_types` names {} layers but the model has {} (num_hidden_layers)",
                    window.layers.len(),
                    self.num_layers
                ));
            }
        }
        if let Some(cap) = self.variants.final_logit_softcap
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(format!("final_logit_softcapping must be a positive number, got {cap}"));
        }
        Ok(())
    }

    /// The sliding window of layer `i`, if it attends locally.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.variants.sliding_window.as_ref().filter(|w| w.is_local(layer)).map(|w| w.size)
    }

    /// Queries per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// Finds the architecture of an HF config: `Ok(arch)`, `Err(Some(name))` for one we do not
/// implement, `Err(None)` when the JSON names none.
fn detect_architecture(value: &serde_json::Value) -> std::result::Result<Architecture, Option<String>> {
    let model_type = value.get("model_type").and_then(|v| v.as_str());
    let from_type = |t: &str| match t {
        "opt" => Some(Architecture::Opt),
        "llama" => Some(Architecture::Llama),
        "gpt2" => Some(Architecture::Gpt2),
        "mistral" => Some(Architecture::Mistral),
        "qwen2" => Some(Architecture::Qwen2),
        "qwen3" => Some(Architecture::Qwen3),
        "gemma3_text" => Some(Architecture::Gemma3),
        "phi3" => Some(Architecture::Phi3),
        _ => None,
    };
    if let Some(t) = model_type {
        return from_type(t).ok_or_else(|| Some(t.to_string()));
    }
    let first = value.get("architectures").and_then(|a| a.as_array()).and_then(|a| a.first()).and_then(|a| a.as_str());
    match first {
        Some(name) if name.starts_with("OPT") => Ok(Architecture::Opt),
        Some(name) if name.starts_with("Llama") => Ok(Architecture::Llama),
        Some(name) if name.starts_with("GPT2") => Ok(Architecture::Gpt2),
        Some(name) if name.starts_with("Mistral") => Ok(Architecture::Mistral),
        Some(name) if name.starts_with("Qwen2") => Ok(Architecture::Qwen2),
        Some(name) if name.starts_with("Qwen3") => Ok(Architecture::Qwen3),
        Some("Gemma3ForCausalLM") => Ok(Architecture::Gemma3),
        Some(name) if name.starts_with("Phi3") => Ok(Architecture::Phi3),
        Some(name) => Err(Some(name.to_string())),
        None => Err(None),
    }
}

/// An id field that HF writes either as one integer or as a list (`eos_token_id`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// Absent or `null`.
    #[default]
    None,
    /// A single id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl OneOrMany {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            OneOrMany::None => vec![],
            OneOrMany::One(id) => vec![*id],
            OneOrMany::Many(ids) => ids.clone(),
        }
    }
}

/// Special-token ids that every HF `config.json` may carry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SpecialIds {
    /// Beginning-of-sequence id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence id(s).
    #[serde(default)]
    pub eos_token_id: OneOrMany,
}

/// Deserializes a field HF may write as `null` (transformers 5 writes unset flags so) as its
/// default.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Serde default for flags that HF configs default to `true`.
pub(crate) fn default_true() -> bool {
    true
}
