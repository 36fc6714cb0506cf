//! Which heads and columns each rank of a tensor-parallel layer holds, and the checks that a
//! degree fits a model.

use std::ops::Range;

use burn_llm_models::{DecoderSpec, KvLayout, ModelError};

/// Why a layer cannot be split over the ranks asked for.
#[derive(Debug, thiserror::Error)]
pub enum TensorParallelError {
    /// No devices were given.
    #[error("tensor parallelism needs at least one device; list one device per rank")]
    NoDevices,
    /// The degree does not divide a dimension that is split.
    #[error("tensor-parallel degree {degree} does not divide the {count} {what}; use a degree that divides {count}")]
    Indivisible {
        /// The tensor-parallel degree.
        degree: usize,
        /// The size of the split dimension.
        count: usize,
        /// What is split ("query heads", "MLP columns").
        what: &'static str,
    },
    /// The key/value heads can be neither divided among the ranks nor replicated evenly.
    #[error(
        "tensor-parallel degree {degree} neither divides the {kv_heads} key/value heads nor is a multiple of \
         them (heads are replicated across ranks only when the degree is a multiple of their count); use a \
         degree that divides {kv_heads}, or a multiple of {kv_heads} that divides the {heads} query heads"
    )]
    KvHeads {
        /// The tensor-parallel degree.
        degree: usize,
        /// Key/value heads of the model.
        kv_heads: usize,
        /// Query heads of the model.
        heads: usize,
    },
    /// The layer index is not one of the model's layers.
    #[error("layer {layer} does not exist: the model has {layers} layers (0..{layers})")]
    NoSuchLayer {
        /// The index asked for.
        layer: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// Loading or cutting a weight failed (a missing tensor, a quantized weight whose shard is not
    /// whole groups, …).
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// How one decoder layer's heads and MLP columns are divided over `degree` ranks (Megatron):
/// rank `r` holds query heads `r·heads/degree ..`, the key/value heads those queries read, and
/// MLP columns `r·ffn/degree ..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPlan {
    /// Ranks.
    pub degree: usize,
    /// Query heads of the whole layer.
    pub heads: usize,
    /// Key/value heads of the whole layer.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// MLP inner width of the whole layer.
    pub ffn: usize,
}

impl ShardPlan {
    /// Checks that `degree` splits the layer: it must divide the query heads and the MLP width,
    /// and divide the key/value heads or be a multiple of them (then each kv head is replicated
    /// on `degree / kv_heads` ranks, as vLLM does).
    pub fn new(
        degree: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        ffn: usize,
    ) -> Result<Self, TensorParallelError> {
        if degree == 0 {
            return Err(TensorParallelError::NoDevices);
        }
        if !heads.is_multiple_of(degree) {
            return Err(TensorParallelError::Indivisible { degree, count: heads, what: "query heads" });
        }
        if !(kv_heads.is_multiple_of(degree) || (kv_heads > 0 && degree.is_multiple_of(kv_heads))) {
            return Err(TensorParallelError::KvHeads { degree, kv_heads, heads });
        }
        if !ffn.is_multiple_of(degree) {
            return Err(TensorParallelError::Indivisible {
                degree,
                count: ffn,
                what: "MLP columns (intermediate size)",
            });
        }
        Ok(Self { degree, heads, kv_heads, head_dim, ffn })
    }

    /// The plan for a model described by `spec`.
    pub fn for_spec(spec: &DecoderSpec, degree: usize) -> Result<Self, TensorParallelError> {
        Self::new(degree, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size)
    }

    /// Query heads per rank.
    pub fn heads_per_rank(&self) -> usize {
        self.heads / self.degree
    }

    /// Key/value heads per rank: `kv_heads / degree`, or one replicated head when there are fewer
    /// kv heads than ranks.
    pub fn kv_heads_per_rank(&self) -> usize {
        (self.kv_heads / self.degree).max(1)
    }

    /// Columns of the query projection (and rows of the output projection) rank `r` holds.
    pub fn q_range(&self, r: usize) -> Range<usize> {
        let width = self.heads_per_rank() * self.head_dim;
        r * width..(r + 1) * width
    }

    /// Columns of the key and value projections rank `r` holds: the kv heads its query heads
    /// read (the same head on several ranks when kv heads are replicated).
    pub fn kv_range(&self, r: usize) -> Range<usize> {
        let first = r * self.kv_heads / self.degree;
        first * self.head_dim..(first + self.kv_heads_per_rank()) * self.head_dim
    }

    /// MLP columns (up/gate outputs, down inputs) rank `r` holds.
    pub fn ffn_range(&self, r: usize) -> Range<usize> {
        let width = self.ffn / self.degree;
        r * width..(r + 1) * width
    }

    /// `spec` as one rank sees it: its share of heads and MLP columns (what
    /// [`CausalLm::load_layer`](burn_llm_models::CausalLm::load_layer) builds a rank from).
    pub fn rank_spec(&self, spec: &DecoderSpec) -> DecoderSpec {
        DecoderSpec {
            num_heads: self.heads_per_rank(),
            num_kv_heads: self.kv_heads_per_rank(),
            intermediate_size: self.ffn / self.degree,
            ..spec.clone()
        }
    }
}

/// The KV layout a cache needs for a model of `layout` run with tensor-parallel degree `degree`:
/// `num_layers · degree` cache layers (rank `r` of layer `l` is cache layer `l · degree + r`) of
/// the per-rank kv heads.
pub fn rank_kv_layout(layout: KvLayout, degree: usize) -> KvLayout {
    let per_rank = (layout.num_kv_heads / degree.max(1)).max(1);
    KvLayout { num_layers: layout.num_layers * degree, num_kv_heads: per_rank, ..layout }
}
