//! LLaMA (Touvron et al., 2023) and models with its layout (SmolLM2, TinyLlama, Mistral-style
//! GQA): RMSNorm, rotary positions with optional scaling, SwiGLU MLP, grouped-query attention, tied
//! or untied LM head.

use serde::Deserialize;

use super::{QkvNames, TensorNames};
use crate::config::{Activation, Architecture, DecoderSpec, DecoderVariants, NormKind, PositionKind, SpecialIds};
use crate::layers::linear::WeightLayout;
use crate::layers::rope::{RopeScaling, RopeSpec};
use crate::precision::Precision;

/// LLaMA's `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA); equal to `num_attention_heads` when absent.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head width; `hidden_size / num_attention_heads` when absent.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Context length.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    /// RoPE base (older configs keep it here, newer ones in `rope_parameters`).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// RoPE scaling (transformers 4 name).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// RoPE parameters (transformers 5 name).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// LM head tied to the embedding.
    #[serde(default, deserialize_with = "crate::config::null_as_default")]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o.
    #[serde(default, deserialize_with = "crate::config::null_as_default")]
    pub attention_bias: bool,
    /// Biases on the MLP.
    #[serde(default, deserialize_with = "crate::config::null_as_default")]
    pub mlp_bias: bool,
    /// Gate activation.
    #[serde(default = "silu")]
    pub hidden_act: String,
    /// BOS/EOS ids.
    #[serde(flatten)]
    pub ids: SpecialIds,
}

fn eps() -> f64 {
    1e-6
}
fn silu() -> String {
    "silu".into()
}

impl LlamaConfig {
    /// Lowers to the shared decoder description.
    pub fn to_spec(&self) -> Result<DecoderSpec, String> {
        let heads = self.num_attention_heads;
        let head_dim = self.head_dim.unwrap_or(self.hidden_size.checked_div(heads).unwrap_or(0));
        let activation = Activation::from_hf(&self.hidden_act)
            .ok_or_else(|| format!("unsupported hidden_act `{}`", self.hidden_act))?;
        Ok(DecoderSpec {
            arch: Architecture::Llama,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            embed_dim: self.hidden_size,
            num_layers: self.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim,
            intermediate_size: self.intermediate_size,
            max_positions: self.max_position_embeddings,
            norm: NormKind::Rms { eps: self.rms_norm_eps },
            pre_norm: true,
            final_norm: true,
            activation,
            gated_mlp: true,
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            positions: PositionKind::Rotary(self.rope_spec(head_dim)?),
            tie_word_embeddings: self.tie_word_embeddings,
            scale_attn_by_inverse_layer_idx: false,
            bos_token_id: self.ids.bos_token_id,
            eos_token_ids: self.ids.eos_token_id.to_vec(),
            dtype: Precision::F32,
            variants: DecoderVariants::default(),
        })
    }

    /// The RoPE parameters object (`rope_parameters`, or transformers 4's `rope_scaling`), if any.
    pub fn rope_params(&self) -> Option<&serde_json::Value> {
        self.rope_parameters.as_ref().or(self.rope_scaling.as_ref()).filter(|v| !v.is_null())
    }

    fn rope_spec(&self, head_dim: usize) -> Result<RopeSpec, String> {
        rope_spec(self.rope_params(), self.rope_theta, self.max_position_embeddings, head_dim)
    }
}

/// Lowers an HF RoPE parameters object (`rope_type`, `factor`…; `rope_theta` inside it or given
/// as `rope_theta`) for heads `head_dim` wide.
pub fn rope_spec(
    params: Option<&serde_json::Value>,
    rope_theta: Option<f64>,
    max_positions: usize,
    head_dim: usize,
) -> Result<RopeSpec, String> {
    let field = |name: &str| params.and_then(|p| p.get(name));
    let number = |name: &str| -> Result<f64, String> {
        field(name).and_then(|v| v.as_f64()).ok_or_else(|| format!("rope scaling needs a numeric `{name}`"))
    };
    let theta = rope_theta.or_else(|| field("rope_theta").and_then(|v| v.as_f64())).unwrap_or(10_000.0);
    let kind = field("rope_type").or_else(|| field("type")).and_then(|v| v.as_str()).unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: number("factor")? },
        "dynamic" => RopeScaling::Dynamic { factor: number("factor")?, max_positions },
        "llama3" => RopeScaling::Llama3 {
            factor: number("factor")?,
            low_freq_factor: number("low_freq_factor")?,
            high_freq_factor: number("high_freq_factor")?,
            original_max_positions: number("original_max_position_embeddings")?,
        },
        other => {
            return Err(format!(
                "unsupported rope scaling type `{other}` (supported: default, linear, dynamic, llama3)"
            ));
        }
    };
    Ok(RopeSpec { theta, dim: head_dim, scaling })
}

/// Where LLaMA checkpoints keep their tensors.
pub const NAMES: TensorNames = TensorNames {
    embed_tokens: "model.embed_tokens.weight",
    embed_positions: None,
    project_in: None,
    project_out: None,
    final_norm: "model.norm",
    lm_head: "lm_head",
    layer: "model.layers.{i}",
    attn_norm: "input_layernorm",
    qkv: QkvNames::Separate("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    o_proj: "self_attn.o_proj",
    mlp_norm: "post_attention_layernorm",
    up: "mlp.up_proj",
    gate: Some("mlp.gate_proj"),
    down: "mlp.down_proj",
    layout: WeightLayout::OutIn,
    gate_up: None,
    q_norm: None,
    k_norm: None,
    post_attn_norm: None,
    post_mlp_norm: None,
};
