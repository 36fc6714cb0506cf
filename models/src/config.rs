//! Model configuration: HF `config.json` parsed per architecture and lowered to one
//! [`DecoderSpec`] that the shared decoder is built from.
//!
//! OPT, LLaMA and GPT-2 are all pre- or post-norm decoder stacks that differ only in a handful of
//! choices (norm kind, position scheme, activation, gating, biases, tied head, projections). Each
//! architecture module parses its own `config.json` dialect and states those choices here, so the
//! forward pass exists once.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::arch::{gpt2::Gpt2Config, llama::LlamaConfig, opt::OptConfig};
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
}

impl Architecture {
    /// The `model_type` string of HF configs.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Opt => "opt",
            Architecture::Llama => "llama",
            Architecture::Gpt2 => "gpt2",
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
        Ok(())
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

/// Serde default for flags that HF configs default to `true`.
pub(crate) fn default_true() -> bool {
    true
}
