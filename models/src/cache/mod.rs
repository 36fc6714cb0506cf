//! The attention/KV-cache abstraction every architecture runs through.
//!
//! A model never touches key/value storage itself. For each layer it projects queries, keys and
//! values of the step's new tokens and calls [`KvCache::attend`], which must (1) store the new keys
//! and values wherever this cache keeps them and (2) return the attention of the queries over every
//! token each sequence has cached, the new ones included. Which tokens a query may see (causality,
//! padding, sequence boundaries) is the cache's business, because only the cache knows the layout.
//!
//! The engine that owns a cache also decides the step layout: it hands the cache each sequence's
//! new token ids and receives a [`StepInput`] (token ids, positions, and where each sequence's last
//! token ended up) to run the model on.
//!
//! How the caches implement the same trait without touching model code:
//! - **Contiguous** ([`ContiguousKvCache`], this crate): one preallocated
//!   `[batch, kv_heads, capacity, head_dim]` tensor pair per layer ([`LayerSlots`], dense or
//!   group-quantized [`Slots`]) on the model's device, or on each layer's own device
//!   ([`LayerDevices`], pipeline stages), sequences left-padded within a step on a
//!   shared slot axis ([`StepSlots`]), an additive mask that hides padding and future slots.
//! - **Paged** (vLLM, `burn-paged`): `attend` writes the new K/V into their block slots with a
//!   reshape-and-cache kernel and runs PagedAttention through the block tables prepared by the
//!   scheduler at `begin_step` time; `StepInput` carries per-token positions, so sequences at
//!   different lengths share one launch.
//! - **Offloaded** (FlexGen, `burn-offload`): builds on the contiguous cache's public pieces
//!   ([`StepSlots`], [`LayerSlots`], [`attention_with`]) to keep each layer's slots where its
//!   policy says and to compute attention there.
//!
//! The layer index lets a cache keep per-layer state; the model calls `attend` once per layer, in
//! layer order, for each step.

mod attention;
mod contiguous;
mod placement;
mod quant;
mod slots;
mod steps;

pub use attention::{MASKED, attention, attention_with, causal_bias};
pub use contiguous::ContiguousKvCache;
pub use placement::LayerDevices;
pub use quant::{KV_QUANT_AXIS, check_kv_quant, default_kv_group_size, fit_kv_quant, kv_quant};
pub use slots::{LayerSlots, Slots};
pub use steps::StepSlots;

use burn::tensor::{Int, Tensor};
use burn_llm_kernels::QuantSpec;

use crate::config::DecoderSpec;
use crate::error::Result;
use crate::precision::Precision;

/// The storage and attention side of a decoder's self-attention.
pub trait KvCache {
    /// Stores this step's keys and values for `layer` and attends the queries over everything each
    /// sequence has cached, the new tokens included.
    ///
    /// Shapes: `q` is `[batch, heads, seq, head_dim]`; `k` and `v` are
    /// `[batch, kv_heads, seq, head_dim]` (`heads` a multiple of `kv_heads`); the result has the
    /// shape of `q`. `scale` multiplies the raw `q·kᵀ` scores. With a `window` (a local,
    /// sliding-window layer) a query at position `p` sees only the keys at positions
    /// `p - window + 1..=p` of its sequence; a cache that cannot restrict attention that way must
    /// refuse with an error, so that a model with local layers never silently attends globally.
    ///
    /// A cache that cannot serve the call (a step it was not prepared for, a kernel that refuses
    /// its arguments) returns the error, usually as
    /// [`ModelError::KvCache`](crate::ModelError::KvCache), and the forward pass stops there.
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Tensor<4>>;
}

/// The model input of one step, laid out by the cache that will serve it.
#[derive(Debug, Clone)]
pub struct StepInput {
    /// Token ids, `[batch, seq]` (padding where a sequence has fewer new tokens).
    pub tokens: Tensor<2, Int>,
    /// Position of each token within its own sequence, `[batch, seq]`.
    pub positions: Tensor<2, Int>,
    /// The largest position in this step (dynamic RoPE depends on it).
    pub max_position: usize,
    /// For each row, the column of its last new token (`None` for rows with no new token).
    pub last: Vec<Option<usize>>,
}

/// The per-layer shape of a model's keys and values, which is all a cache needs to know about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Decoder layers.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Floating-point type keys and values are stored in (the model's).
    pub dtype: Precision,
}

impl KvLayout {
    /// The layout of a model of `spec`'s shape and dtype.
    pub fn of(spec: &DecoderSpec) -> Self {
        Self {
            num_layers: spec.num_layers,
            num_kv_heads: spec.num_kv_heads,
            head_dim: spec.head_dim,
            dtype: spec.dtype,
        }
    }

    /// Bytes of one token's keys and values over all layers, in [`KvLayout::dtype`].
    pub fn bytes_per_token(&self) -> usize {
        self.values_per_token() * self.dtype.size_bytes()
    }

    /// Values of one token's keys and values over all layers.
    pub fn values_per_token(&self) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim
    }

    /// Bytes `slots` token slots (sequences × slots each) take over all layers: in
    /// [`KvLayout::dtype`], or `quant` codes plus a scale and minimum per group.
    pub fn storage_bytes(&self, slots: usize, quant: Option<QuantSpec>) -> usize {
        match quant {
            None => self.bytes_per_token() * slots,
            Some(spec) => spec.storage_bytes(self.values_per_token() * slots),
        }
    }
}

#[cfg(test)]
mod tests;
