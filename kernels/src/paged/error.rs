//! [`PagedKernelError`], what is wrong with a paged-cache or paged-attention request.

use burn::tensor::DType;

/// What is wrong with a paged-cache or paged-attention request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagedKernelError {
    /// A cache is not `[num_blocks, num_kv_heads, block_size, head_dim]` with non-zero heads,
    /// block size and head size.
    #[error("a paged cache needs non-zero kv heads, block size and head size, got shape {0:?}")]
    CacheShape([usize; 4]),
    /// Two tensors that must agree in shape do not.
    #[error("{what}: expected shape {expected:?}, got {found:?}")]
    Shape {
        /// Which tensor.
        what: &'static str,
        /// Shape the cache (or the other operand) implies.
        expected: Vec<usize>,
        /// Shape received.
        found: Vec<usize>,
    },
    /// A host slice has the wrong length.
    #[error("{what}: expected {expected} entries, got {found}")]
    Length {
        /// Which argument.
        what: &'static str,
        /// Length the tensors imply.
        expected: usize,
        /// Length received.
        found: usize,
    },
    /// A physical block id is outside the cache.
    #[error("{what}: block {block} is out of range (the cache has {num_blocks} blocks)")]
    Block {
        /// Which argument it came from.
        what: &'static str,
        /// The offending id.
        block: u32,
        /// Blocks in the cache.
        num_blocks: usize,
    },
    /// A slot is outside the cache (and is not [`SKIP_SLOT`](super::SKIP_SLOT)).
    #[error("slot {slot} is out of range (the cache has {num_slots} slots)")]
    Slot {
        /// The (largest) offending slot.
        slot: u32,
        /// `num_blocks · block_size`.
        num_slots: usize,
    },
    /// Two writes of one launch target the same place (the result would depend on thread order).
    #[error("{what}: {index} is written twice")]
    Duplicate {
        /// Which argument.
        what: &'static str,
        /// The slot or block written twice.
        index: u32,
    },
    /// A block is both copied from and copied to in one [`copy_blocks`](super::copy_blocks) call.
    #[error("copy_blocks: block {0} is both a source and a destination")]
    CopyOverlap(u32),
    /// A query names a block-table row that does not exist.
    #[error("query {query} uses block-table row {row}, but there are {rows} rows")]
    Sequence {
        /// Query index.
        query: usize,
        /// Requested row.
        row: u32,
        /// Rows in the block table.
        rows: usize,
    },
    /// A context is longer than a block-table row can map.
    #[error("query {query} has context length {len}, more than max_blocks · block_size = {max}")]
    Context {
        /// Query index.
        query: usize,
        /// Its context length.
        len: u32,
        /// `max_blocks · block_size`.
        max: usize,
    },
    /// The block table is not `rows × max_blocks` (or `max_blocks` is 0 with queries present).
    #[error("block table of {len} entries is not a whole number of rows of max_blocks = {max_blocks}")]
    BlockTable {
        /// Entries received.
        len: usize,
        /// Row length.
        max_blocks: usize,
    },
    /// Query heads are not a multiple of kv heads (grouped-query attention needs whole groups).
    #[error("{heads} query heads are not a multiple of {kv_heads} kv heads")]
    Heads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// Float operands of one op have different dtypes, or a dtype the kernels do not handle.
    #[error("dtype mismatch or unsupported: {0:?} (use one of F32, F16, BF16, F64 throughout)")]
    DType(Vec<DType>),
    /// Operands live on different devices.
    #[error("operands of a paged op live on different devices")]
    Device,
    /// A quantized cache's groups do not fit its heads.
    #[error("quantized KV blocks: {0}")]
    Quant(crate::quant::KernelError),
    /// Keys and values, or a pool and blocks written into it, are stored differently (float vs
    /// group-quantized, or other groups).
    #[error("KV storage mismatch: {pool:?} and {blocks:?} (both must be float or quantized alike)")]
    Storage {
        /// The quantization of the pool (or the keys); `None`: floats.
        pool: Option<crate::quant::QuantSpec>,
        /// The quantization of the blocks (or the values).
        blocks: Option<crate::quant::QuantSpec>,
    },
    /// A write that the pool's layout does not take: per-token writes into per-channel key
    /// blocks, or whole-block per-channel writes into blocks grouped along the head.
    #[error("quantized KV blocks: {0}")]
    Layout(&'static str),
}
