//! Per-architecture knowledge: how each HF `config.json` dialect lowers to a
//! [`DecoderSpec`](crate::config::DecoderSpec), and how each checkpoint names its tensors.
//! The forward pass itself is shared ([`crate::model`]).

pub mod gemma;
pub mod gpt2;
pub mod llama;
pub mod opt;
pub mod phi3;
pub mod qwen;

/// Where a checkpoint keeps each tensor the shared decoder needs. `{i}` in `layer` is the layer
/// index; the per-layer names are relative to it.
#[derive(Debug, Clone, Copy)]
pub struct TensorNames {
    /// Token embedding `[vocab, embed_dim]`.
    pub embed_tokens: &'static str,
    /// Learned position table, when the architecture has one.
    pub embed_positions: Option<&'static str>,
    /// `embed_dim → hidden` projection (OPT-350m).
    pub project_in: Option<&'static str>,
    /// `hidden → embed_dim` projection (OPT-350m).
    pub project_out: Option<&'static str>,
    /// Final norm.
    pub final_norm: &'static str,
    /// Untied LM head.
    pub lm_head: &'static str,
    /// Prefix of layer `{i}`.
    pub layer: &'static str,
    /// Norm before (pre-norm) or after (post-norm) attention.
    pub attn_norm: &'static str,
    /// Query, key and value projections.
    pub qkv: QkvNames,
    /// Attention output projection.
    pub o_proj: &'static str,
    /// Norm around the MLP.
    pub mlp_norm: &'static str,
    /// `fc1` / `up_proj`.
    pub up: &'static str,
    /// `gate_proj` of gated MLPs.
    pub gate: Option<&'static str>,
    /// `fc2` / `down_proj`.
    pub down: &'static str,
    /// `gate_proj` and `up_proj` fused along the output (gate first; Phi-3's `gate_up_proj`),
    /// used instead of `gate` and `up` when set.
    pub gate_up: Option<&'static str>,
    /// Per-head RMSNorm of the queries (QK-norm).
    pub q_norm: Option<&'static str>,
    /// Per-head RMSNorm of the keys (QK-norm).
    pub k_norm: Option<&'static str>,
    /// Norm after attention, before the residual add (Gemma).
    pub post_attn_norm: Option<&'static str>,
    /// Norm after the MLP, before the residual add (Gemma).
    pub post_mlp_norm: Option<&'static str>,
    /// How projection matrices are stored.
    pub layout: crate::layers::linear::WeightLayout,
}

/// Query/key/value projections: three tensors, or one fused along the output dimension.
#[derive(Debug, Clone, Copy)]
pub enum QkvNames {
    /// Separate `q`, `k`, `v` projections.
    Separate(&'static str, &'static str, &'static str),
    /// One `[in, 3·out]` projection (GPT-2's `c_attn`).
    Fused(&'static str),
    /// One `[q_out + 2·kv_out, in]` projection, q then k then v rows (Phi-3's `qkv_proj`).
    FusedOutIn(&'static str),
}

impl crate::config::Architecture {
    /// The checkpoint layout of this architecture.
    pub fn tensor_names(self) -> TensorNames {
        match self {
            Self::Opt => opt::NAMES,
            Self::Gpt2 => gpt2::NAMES,
            Self::Llama | Self::Mistral => llama::NAMES,
            Self::Qwen2 | Self::Qwen3 => qwen::NAMES,
            Self::Gemma3 => gemma::NAMES,
            Self::Phi3 => phi3::NAMES,
        }
    }
}
