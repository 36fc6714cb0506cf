//! GPT-2 (Radford et al., 2019): learned positions, pre-LayerNorm, `gelu_new` MLP, `Conv1D`
//! weights stored `[in, out]`, fused `c_attn` holding q, k and v, LM head tied to `wte`.

use serde::Deserialize;

use super::{QkvNames, TensorNames};
use crate::config::{Activation, Architecture, DecoderSpec, NormKind, PositionKind, SpecialIds};
use crate::layers::linear::WeightLayout;
use crate::precision::Precision;

/// GPT-2's `config.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Gpt2Config {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Residual width.
    pub n_embd: usize,
    /// Decoder layers.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Context length.
    pub n_positions: usize,
    /// MLP inner width (`4 · n_embd` when absent).
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// MLP activation name.
    #[serde(default = "gelu_new")]
    pub activation_function: String,
    /// LayerNorm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_epsilon: f64,
    /// Divide scores by `sqrt(head_dim)`.
    #[serde(default = "crate::config::default_true")]
    pub scale_attn_weights: bool,
    /// Also divide scores of layer `i` by `i + 1`.
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// LM head tied to `wte`.
    #[serde(default = "crate::config::default_true")]
    pub tie_word_embeddings: bool,
    /// BOS/EOS ids.
    #[serde(flatten)]
    pub ids: SpecialIds,
}

fn eps() -> f64 {
    1e-5
}
fn gelu_new() -> String {
    "gelu_new".into()
}

impl Gpt2Config {
    /// Lowers to the shared decoder description.
    pub fn to_spec(&self) -> Result<DecoderSpec, String> {
        if !self.scale_attn_weights {
            return Err("scale_attn_weights = false is not supported".into());
        }
        let activation = Activation::from_hf(&self.activation_function)
            .ok_or_else(|| format!("unsupported activation_function `{}`", self.activation_function))?;
        Ok(DecoderSpec {
            arch: Architecture::Gpt2,
            vocab_size: self.vocab_size,
            hidden_size: self.n_embd,
            embed_dim: self.n_embd,
            num_layers: self.n_layer,
            num_heads: self.n_head,
            num_kv_heads: self.n_head,
            head_dim: self.n_embd.checked_div(self.n_head).unwrap_or(0),
            intermediate_size: self.n_inner.unwrap_or(4 * self.n_embd),
            max_positions: self.n_positions,
            norm: NormKind::Layer { eps: self.layer_norm_epsilon },
            pre_norm: true,
            final_norm: true,
            activation,
            gated_mlp: false,
            attention_bias: true,
            mlp_bias: true,
            positions: PositionKind::Learned { rows: self.n_positions, offset: 0 },
            tie_word_embeddings: self.tie_word_embeddings,
            scale_attn_by_inverse_layer_idx: self.scale_attn_by_inverse_layer_idx,
            bos_token_id: self.ids.bos_token_id,
            eos_token_ids: self.ids.eos_token_id.to_vec(),
            dtype: Precision::F32,
            variants: Default::default(),
        })
    }
}

/// Where GPT-2 checkpoints keep their tensors (a bare `GPT2Model` checkpoint without the
/// `transformer.` prefix is accepted too).
pub const NAMES: TensorNames = TensorNames {
    embed_tokens: "transformer.wte.weight",
    embed_positions: Some("transformer.wpe.weight"),
    project_in: None,
    project_out: None,
    final_norm: "transformer.ln_f",
    lm_head: "lm_head",
    layer: "transformer.h.{i}",
    attn_norm: "ln_1",
    qkv: QkvNames::Fused("attn.c_attn"),
    o_proj: "attn.c_proj",
    mlp_norm: "ln_2",
    up: "mlp.c_fc",
    gate: None,
    down: "mlp.c_proj",
    layout: WeightLayout::InOut,
    gate_up: None,
    q_norm: None,
    k_norm: None,
    post_attn_norm: None,
    post_mlp_norm: None,
};
