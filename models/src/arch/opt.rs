//! OPT (Zhang et al., 2022): learned positions offset by 2, LayerNorm before or after each block
//! (`do_layer_norm_before`), ReLU MLP, optional `project_in`/`project_out` when the embedding width
//! differs from the hidden size, LM head tied to the token embedding.

use serde::Deserialize;

use super::{QkvNames, TensorNames};
use crate::config::{Activation, Architecture, DecoderSpec, NormKind, PositionKind, SpecialIds};
use crate::layers::linear::WeightLayout;
use crate::precision::Precision;

/// OPT's `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct OptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// MLP inner width.
    pub ffn_dim: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Context length.
    pub max_position_embeddings: usize,
    /// Pre-norm (`true`, all OPT but 350m) or post-norm.
    #[serde(default = "crate::config::default_true")]
    pub do_layer_norm_before: bool,
    /// Embedding width; differs from `hidden_size` in OPT-350m.
    #[serde(default)]
    pub word_embed_proj_dim: Option<usize>,
    /// Biases on linear layers.
    #[serde(default = "crate::config::default_true")]
    pub enable_bias: bool,
    /// MLP activation name.
    #[serde(default = "relu")]
    pub activation_function: String,
    /// Drops the final LayerNorm (a few converted checkpoints).
    #[serde(default, rename = "_remove_final_layer_norm")]
    pub remove_final_layer_norm: bool,
    /// LM head tied to the embedding.
    #[serde(default = "crate::config::default_true")]
    pub tie_word_embeddings: bool,
    /// BOS/EOS ids.
    #[serde(flatten)]
    pub ids: SpecialIds,
}

fn relu() -> String {
    "relu".into()
}

impl OptConfig {
    /// Lowers to the shared decoder description.
    pub fn to_spec(&self) -> DecoderSpec {
        let head_dim = self.hidden_size.checked_div(self.num_attention_heads).unwrap_or(0);
        DecoderSpec {
            arch: Architecture::Opt,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            embed_dim: self.word_embed_proj_dim.unwrap_or(self.hidden_size),
            num_layers: self.num_hidden_layers,
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_attention_heads,
            head_dim,
            intermediate_size: self.ffn_dim,
            max_positions: self.max_position_embeddings,
            norm: NormKind::Layer { eps: 1e-5 },
            pre_norm: self.do_layer_norm_before,
            final_norm: self.do_layer_norm_before && !self.remove_final_layer_norm,
            activation: Activation::from_hf(&self.activation_function).unwrap_or(Activation::Relu),
            gated_mlp: false,
            attention_bias: self.enable_bias,
            mlp_bias: self.enable_bias,
            positions: PositionKind::Learned { rows: self.max_position_embeddings + 2, offset: 2 },
            tie_word_embeddings: self.tie_word_embeddings,
            scale_attn_by_inverse_layer_idx: false,
            bos_token_id: self.ids.bos_token_id,
            eos_token_ids: self.ids.eos_token_id.to_vec(),
            dtype: Precision::F32,
            variants: Default::default(),
        }
    }
}

/// Where OPT checkpoints keep their tensors.
pub const NAMES: TensorNames = TensorNames {
    embed_tokens: "model.decoder.embed_tokens.weight",
    embed_positions: Some("model.decoder.embed_positions.weight"),
    project_in: Some("model.decoder.project_in"),
    project_out: Some("model.decoder.project_out"),
    final_norm: "model.decoder.final_layer_norm",
    lm_head: "lm_head",
    layer: "model.decoder.layers.{i}",
    attn_norm: "self_attn_layer_norm",
    qkv: QkvNames::Separate("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    o_proj: "self_attn.out_proj",
    mlp_norm: "final_layer_norm",
    up: "fc1",
    gate: None,
    down: "fc2",
    layout: WeightLayout::OutIn,
    gate_up: None,
    q_norm: None,
    k_norm: None,
    post_attn_norm: None,
    post_mlp_norm: None,
};
