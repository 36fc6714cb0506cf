//! [`ModelShape`] and [`OffloadWorkload`]: the model and request constants of the cost model
//! (FlexGen Table 6: `l, s, n, h1, h2, nh`), generalized beyond OPT.
//!
//! FlexGen writes its formulas for OPT with fp16: `8h1² + 4h1·h2` bytes of weights per layer
//! (= 2 bytes × (4h1² + 2h1·h2) parameters), `4·(s+n)·h1` bytes of KV cache per sequence and
//! layer (K and V, 2 bytes each) and `2·h1` bytes of activation per token. Here each of those is a
//! method computed from explicit shapes:
//!
//! - attention weights are `h1·q + 2·h1·kv + q·h1` with `q = heads·head_dim` and
//!   `kv = kv_heads·head_dim`, so grouped-query attention (LLaMA-3, Mistral) shrinks K/V
//!   projections and the KV cache; with `q = kv = h1` this is FlexGen's `4h1²`;
//! - the MLP is `2·h1·h2` (OPT: fc1, fc2) or `3·h1·h2` for gated MLPs (LLaMA: gate, up, down);
//! - biases and norm weights, which FlexGen ignores, are counted in bytes (not FLOPs) through
//!   `extra_params_per_layer`; set it to 0 to get the paper's numbers exactly;
//! - `bytes_per_element` replaces the paper's hard-coded 2 (fp16).

use serde::{Deserialize, Serialize};

use super::error::PolicyError;

/// Shape of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// Two projections `h1 → h2 → h1` (OPT, GPT-2): `2·h1·h2` parameters.
    Standard,
    /// Gated: gate and up `h1 → h2`, down `h2 → h1` (LLaMA SwiGLU): `3·h1·h2` parameters.
    Gated,
}

/// The per-layer shapes of a decoder-only transformer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    /// Free-form model name.
    #[serde(default)]
    pub name: String,
    /// Number of transformer layers `l`.
    pub num_layers: u32,
    /// Hidden size `h1`.
    pub hidden: u64,
    /// Feed-forward inner size `h2`.
    pub ffn: u64,
    /// Query heads `nh`.
    pub num_heads: u64,
    /// Key/value heads (equal to `num_heads` without GQA).
    pub num_kv_heads: u64,
    /// Size of one head.
    pub head_dim: u64,
    /// Vocabulary size (embeddings are outside the cost model, as in FlexGen's footnote 1).
    pub vocab_size: u64,
    /// Bytes per element of weights, activations and the uncompressed KV cache (2 for fp16/bf16).
    pub bytes_per_element: u64,
    /// Feed-forward shape.
    pub mlp: MlpKind,
    /// Parameters per layer outside the matrices (biases, norm weights): counted in bytes moved
    /// and stored, not in FLOPs.
    #[serde(default)]
    pub extra_params_per_layer: u64,
    /// Whether the output projection shares the input embedding.
    #[serde(default)]
    pub tied_embeddings: bool,
}

impl ModelShape {
    /// An OPT model as FlexGen's formulas see it: `q = kv = h1`, standard MLP, fp16, and no
    /// biases or norms (`extra_params_per_layer = 0`), so per-layer weight bytes are exactly
    /// `8h1² + 4h1·h2`.
    pub fn paper_opt(num_layers: u32, hidden: u64, ffn: u64, num_heads: u64) -> Self {
        Self {
            name: format!("paper-OPT l={num_layers} h1={hidden}"),
            num_layers,
            hidden,
            ffn,
            num_heads,
            num_kv_heads: num_heads,
            head_dim: hidden / num_heads.max(1),
            vocab_size: 50272,
            bytes_per_element: 2,
            mlp: MlpKind::Standard,
            extra_params_per_layer: 0,
            tied_embeddings: true,
        }
    }

    /// An OPT model with its biases and LayerNorms counted (`9·h1 + h2` extra parameters/layer).
    pub fn opt(name: &str, num_layers: u32, hidden: u64, ffn: u64, num_heads: u64) -> Self {
        Self {
            name: name.into(),
            extra_params_per_layer: hidden.saturating_mul(9).saturating_add(ffn),
            ..Self::paper_opt(num_layers, hidden, ffn, num_heads)
        }
    }

    /// OPT-6.7B (32 layers, h1 = 4096).
    pub fn opt_6_7b() -> Self {
        Self::opt("OPT-6.7B", 32, 4096, 16384, 32)
    }

    /// OPT-30B (48 layers, h1 = 7168).
    pub fn opt_30b() -> Self {
        Self::opt("OPT-30B", 48, 7168, 28672, 56)
    }

    /// OPT-175B (96 layers, h1 = 12288).
    pub fn opt_175b() -> Self {
        Self::opt("OPT-175B", 96, 12288, 49152, 96)
    }

    /// A LLaMA-style model: gated MLP, RMSNorm (`2·h1` extra parameters/layer), no biases,
    /// untied embeddings, fp16.
    pub fn llama(
        name: &str,
        num_layers: u32,
        hidden: u64,
        ffn: u64,
        num_heads: u64,
        num_kv_heads: u64,
        vocab_size: u64,
    ) -> Self {
        Self {
            name: name.into(),
            num_layers,
            hidden,
            ffn,
            num_heads,
            num_kv_heads,
            head_dim: hidden / num_heads.max(1),
            vocab_size,
            bytes_per_element: 2,
            mlp: MlpKind::Gated,
            extra_params_per_layer: hidden.saturating_mul(2),
            tied_embeddings: false,
        }
    }

    /// LLaMA-2-7B (multi-head attention).
    pub fn llama2_7b() -> Self {
        Self::llama("LLaMA-2-7B", 32, 4096, 11008, 32, 32, 32000)
    }

    /// LLaMA-3-8B (grouped-query attention, 8 KV heads).
    pub fn llama3_8b() -> Self {
        Self::llama("LLaMA-3-8B", 32, 4096, 14336, 32, 8, 128256)
    }

    /// Check sizes are non-zero and heads divide evenly.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let fields = [
            ("num_layers", u64::from(self.num_layers)),
            ("hidden", self.hidden),
            ("ffn", self.ffn),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("bytes_per_element", self.bytes_per_element),
        ];
        for (name, v) in fields {
            if v == 0 {
                return Err(PolicyError::InvalidModel(format!("{name} = 0")));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(PolicyError::InvalidModel(format!(
                "num_heads = {} is not a multiple of num_kv_heads = {}",
                self.num_heads, self.num_kv_heads
            )));
        }
        if self.bytes_per_element > 8 {
            return Err(PolicyError::InvalidModel(format!(
                "bytes_per_element = {} (expected 1..=8)",
                self.bytes_per_element
            )));
        }
        Ok(())
    }

    /// Query width `heads · head_dim` (= h1 for OPT and LLaMA).
    pub fn q_dim(&self) -> f64 {
        self.num_heads as f64 * self.head_dim as f64
    }

    /// Key (or value) width `kv_heads · head_dim` (< h1 with GQA).
    pub fn kv_dim(&self) -> f64 {
        self.num_kv_heads as f64 * self.head_dim as f64
    }

    /// Parameters of one layer's weight matrices: `h1·q + 2·h1·kv + q·h1` for attention plus
    /// `2·h1·h2` (standard) or `3·h1·h2` (gated) for the MLP. OPT: `4h1² + 2h1·h2`.
    pub fn matrix_params_per_layer(&self) -> f64 {
        let h1 = self.hidden as f64;
        let h2 = self.ffn as f64;
        let attention = 2.0 * h1 * self.q_dim() + 2.0 * h1 * self.kv_dim();
        let mlp = match self.mlp {
            MlpKind::Standard => 2.0 * h1 * h2,
            MlpKind::Gated => 3.0 * h1 * h2,
        };
        attention + mlp
    }

    /// All parameters of one layer (matrices plus biases and norms).
    pub fn params_per_layer(&self) -> f64 {
        self.matrix_params_per_layer() + self.extra_params_per_layer as f64
    }

    /// Bytes of one layer's weights uncompressed (FlexGen: `8h1² + 4h1·h2`).
    pub fn layer_weight_bytes(&self) -> f64 {
        self.params_per_layer() * self.bytes_per_element as f64
    }

    /// Bytes of all layers' weights uncompressed.
    pub fn total_weight_bytes(&self) -> f64 {
        self.layer_weight_bytes() * f64::from(self.num_layers)
    }

    /// Bytes of the KV cache for one token in one layer, uncompressed: `2 · kv · bytes` (FlexGen,
    /// OPT fp16: `4h1`).
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * self.kv_dim() * self.bytes_per_element as f64
    }

    /// Bytes of the hidden activation of one token: `h1 · bytes` (FlexGen: `2h1`).
    pub fn activation_bytes_per_token(&self) -> f64 {
        self.hidden as f64 * self.bytes_per_element as f64
    }

    /// FLOPs of one layer's matrix multiplications for one token: `2 ·` matrix parameters
    /// (FlexGen: `8h1² + 4h1·h2`).
    pub fn linear_flops_per_token(&self) -> f64 {
        2.0 * self.matrix_params_per_layer()
    }

    /// Bytes of the input embedding and the output projection (not part of the cost model; the
    /// caller can reserve them with [`super::SearchSpace::reserved_bytes`]).
    pub fn embedding_bytes(&self) -> f64 {
        let one = self.vocab_size as f64 * self.hidden as f64 * self.bytes_per_element as f64;
        if self.tied_embeddings { one } else { 2.0 * one }
    }
}

/// The generation request: FlexGen pads all prompts to `s` tokens and generates `n` tokens for
/// each (§6 "Workload").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OffloadWorkload {
    /// Prompt length `s` (tokens, after padding).
    pub prompt_len: u64,
    /// Generated tokens per prompt `n` (≥ 1; the first comes out of prefill).
    pub gen_len: u64,
    /// Number of prompts available, if bounded; the block size `bls` never exceeds it. FlexGen
    /// assumes an unbounded dataset (`None`).
    #[serde(default)]
    pub num_prompts: Option<u64>,
}

impl OffloadWorkload {
    /// `s` prompt tokens, `n` generated tokens, unbounded number of prompts.
    pub fn new(prompt_len: u64, gen_len: u64) -> Self {
        Self { prompt_len, gen_len, num_prompts: None }
    }

    /// Check `s ≥ 1`, `n ≥ 1` and a non-zero prompt count.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.prompt_len == 0 {
            return Err(PolicyError::InvalidWorkload("prompt_len = 0".into()));
        }
        if self.gen_len == 0 {
            return Err(PolicyError::InvalidWorkload("gen_len = 0".into()));
        }
        if self.num_prompts == Some(0) {
            return Err(PolicyError::InvalidWorkload("num_prompts = 0".into()));
        }
        Ok(())
    }
}
