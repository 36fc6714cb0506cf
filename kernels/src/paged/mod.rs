//! # PagedAttention kernels (vLLM, Kwon et al. SOSP '23; thesis §5.4.1 and §5.5.1)
//!
//! The KV cache of one layer is a pool of fixed-size *blocks* instead of one contiguous tensor
//! per sequence, so memory is committed a block at a time and blocks can be shared between
//! sequences (copy-on-write). This module holds the three fused kernels of §5.5.1 plus the block
//! I/O a swapping engine needs, each a CubeCL kernel for every GPU runtime with a pure-Rust twin
//! for Burn's Flex CPU backend:
//!
//! - [`reshape_and_cache`]: *fused reshape and block write*: each new token's K (or V) goes to
//!   its slot in one launch.
//! - [`paged_attention`]: *fused block read and attention*: `softmax(q·Kᵀ·scale)·V` with the keys
//!   and values read through per-sequence block tables, decode and prefill queries in one launch.
//! - [`copy_blocks`]: *fused block copy* for copy-on-write, every `(src, dst)` pair in one launch.
//! - [`write_blocks`] / [`read_blocks`]: whole blocks in and out (swap-in / swap-out).
//!
//! ## Layout
//!
//! One layer's paged K (or V) storage is a float tensor `[num_blocks, num_kv_heads, block_size,
//! head_dim]`: the `block_size × head_dim` values of one head in one block are contiguous, so a
//! block is one contiguous read per head. Token position `p` of a sequence lives in logical block
//! `p / block_size` at offset `p % block_size`; the block table maps the logical block to a
//! physical one, and the token's *slot* is `physical_block · block_size + offset` (see
//! [`slot`]).
//!
//! ## Ownership and in-place writes
//!
//! The cache can be gigabytes and is rewritten every step, so the writing ops never copy it when
//! it is uniquely owned: they write into the buffer they were given and hand it back. A cache
//! that is shared (another `Tensor` clone is alive) is copied first, so clones keep their old
//! contents (ordinary value semantics). Two forms exist for each write:
//!
//! - by value ([`reshape_and_cache`], [`copy_blocks`], [`write_blocks`]): the cache moves in and
//!   comes back; on an argument error it is dropped;
//! - by `&mut` ([`reshape_and_cache_mut`], [`copy_blocks_mut`], [`write_blocks_mut`]): the form to
//!   use on a cache held in a struct; arguments are checked before the cache is touched, so an
//!   error leaves it as it was.
//!
//! ## Per-step inputs
//!
//! The index arrays (slots, block tables, query rows, context lengths) are the same for every
//! layer of a step. The slice-taking functions upload them on each call; a model builds a
//! [`SlotMapping`] and a [`PagedBatch`] once per step and passes them to
//! [`reshape_and_cache_with`] and [`paged_attention_with`] for every layer instead.
//!
//! Arguments are validated on the host (lengths, block ids, slots, context lengths, head counts,
//! dtypes, devices) and reported as [`PagedKernelError`]; nothing here panics on bad input.

mod error;
mod in_place;
pub mod ops;
mod quant;

pub use error::PagedKernelError;

pub use quant::{KvPool, QuantizedBlocks, paged_attention_pool};

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube_v2;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
pub(crate) use cube_v2::lane_sum;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
pub(crate) mod remote;

use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use self::ops::PagedKvOps;

/// Slot value telling [`reshape_and_cache`] to skip a token (padding, or a token whose K/V is
/// not to be cached).
pub const SKIP_SLOT: u32 = u32::MAX;

/// The slot of offset `offset` in physical block `block`: `block · block_size + offset`.
pub fn slot(block: u32, offset: u32, block_size: u32) -> u32 {
    block * block_size + offset
}

/// Uploads host indices as a `U32` vector on `device`.
fn upload(values: Vec<u32>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), (device, DType::U32))
}

/// Uploads host indices as a `U32` `[rows, cols]` matrix on `device`.
fn upload2(values: Vec<u32>, rows: usize, cols: usize, device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), (device, DType::U32))
}

/// The cache's dims, checked to be a usable paged layout.
fn cache_dims(cache: &Tensor<4>) -> Result<[usize; 4], PagedKernelError> {
    let dims = cache.dims();
    if dims[1] == 0 || dims[2] == 0 || dims[3] == 0 {
        return Err(PagedKernelError::CacheShape(dims));
    }
    Ok(dims)
}

/// All float operands share one supported dtype.
fn same_dtype(dtypes: &[DType]) -> Result<(), PagedKernelError> {
    let supported = |d: &DType| matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::F64);
    if dtypes.iter().all(supported) && dtypes.windows(2).all(|w| w[0] == w[1]) {
        Ok(())
    } else {
        Err(PagedKernelError::DType(dtypes.to_vec()))
    }
}

/// All operands live on `devices[0]`.
fn same_device(devices: &[Device]) -> Result<(), PagedKernelError> {
    if devices.windows(2).all(|w| w[0] == w[1]) { Ok(()) } else { Err(PagedKernelError::Device) }
}

/// Cache rows and the new rows they take of a quantized write (see [`SlotMapping::code_rows`]).
type CodeRows = (Tensor<1, Int>, Option<Tensor<1, Int>>);

/// The slots of one step's new tokens, checked and uploaded once and then shared by the K and V
/// caches of every layer (vLLM's slot mapping). See [`reshape_and_cache_with`].
#[derive(Debug, Clone)]
pub struct SlotMapping {
    /// `None` when every token is skipped (nothing to launch).
    slots: Option<Tensor<1, Int>>,
    /// The slots on the host (quantized caches derive their code rows from them).
    host: Vec<u32>,
    /// The code rows of quantized writes for one `(kv_heads, block_size)`, built by the first.
    code_rows: std::sync::OnceLock<((usize, usize), Option<CodeRows>)>,
    tokens: usize,
    /// Largest slot written.
    max_slot: Option<u32>,
}

impl SlotMapping {
    /// Checks and uploads `slots` (one per new token; [`SKIP_SLOT`] skips a token) to `device`.
    ///
    /// Errors: a slot written twice. Slots are checked against the cache when used.
    pub fn new(slots: &[u32], device: &Device) -> Result<Self, PagedKernelError> {
        let mut seen = std::collections::HashSet::with_capacity(slots.len());
        for &slot in slots.iter().filter(|&&s| s != SKIP_SLOT) {
            if !seen.insert(slot) {
                return Err(PagedKernelError::Duplicate { what: "slots", index: slot });
            }
        }
        let max_slot = seen.iter().copied().max();
        Ok(Self {
            slots: max_slot.map(|_| upload(slots.to_vec(), device)),
            host: slots.to_vec(),
            code_rows: std::sync::OnceLock::new(),
            tokens: slots.len(),
            max_slot,
        })
    }

    /// The code rows a quantized cache of `kv_heads` heads and `block_size` slots per block
    /// writes (see [`quant`]), built once per geometry and then shared by every layer.
    fn code_rows(&self, kv_heads: usize, block_size: usize) -> Option<CodeRows> {
        let device = || self.slots.as_ref().map(Tensor::device);
        let build = || device().and_then(|d| quant::code_rows(&self.host, kv_heads, block_size, &d));
        let (geometry, rows) = self.code_rows.get_or_init(|| ((kv_heads, block_size), build()));
        if *geometry == (kv_heads, block_size) { rows.clone() } else { build() }
    }

    /// Number of tokens `T` (skipped ones included).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Checks that these slots are for `tokens` tokens.
    fn check_tokens(&self, tokens: usize) -> Result<(), PagedKernelError> {
        if self.tokens == tokens {
            Ok(())
        } else {
            Err(PagedKernelError::Length { what: "slots", expected: tokens, found: self.tokens })
        }
    }

    /// Checks these slots against `cache` and `new`.
    fn check(&self, cache: &Tensor<4>, new: &Tensor<3>) -> Result<(), PagedKernelError> {
        let [num_blocks, kv_heads, block_size, head_dim] = cache_dims(cache)?;
        let [tokens, h, d] = new.dims();
        if [h, d] != [kv_heads, head_dim] {
            return Err(PagedKernelError::Shape {
                what: "new",
                expected: vec![tokens, kv_heads, head_dim],
                found: vec![tokens, h, d],
            });
        }
        self.check_tokens(tokens)?;
        same_dtype(&[cache.dtype(), new.dtype()])?;
        let mut devices = vec![cache.device(), new.device()];
        devices.extend(self.slots.as_ref().map(Tensor::device));
        same_device(&devices)?;
        let num_slots = num_blocks * block_size;
        if let Some(slot) = self.max_slot.filter(|&s| s as usize >= num_slots) {
            return Err(PagedKernelError::Slot { slot, num_slots });
        }
        Ok(())
    }

    /// The unchecked launch.
    fn write(&self, cache: Tensor<4>, new: Tensor<3>) -> Tensor<4> {
        let Some(slots) = &self.slots else { return cache };
        Tensor::from_dispatch(<Dispatch as PagedKvOps>::reshape_and_cache(
            cache.into_dispatch(),
            new.into_dispatch(),
            slots.clone().into_dispatch(),
        ))
    }
}

/// Writes token `t`'s key (or value) vectors `new[t]` (`[T, num_kv_heads, head_dim]`) into slot
/// `slots[t]` of `cache` (`[num_blocks, num_kv_heads, block_size, head_dim]`) in one launch and
/// returns the cache; tokens whose slot is [`SKIP_SLOT`] are not written. The cache is written
/// in place when uniquely owned (see the [module docs](self)).
///
/// Errors: shapes, dtypes or devices that do not match, `slots.len() != T`, a slot outside the
/// cache, or two tokens writing the same slot. On error the cache is dropped; use
/// [`reshape_and_cache_mut`] to keep it.
pub fn reshape_and_cache(cache: Tensor<4>, new: Tensor<3>, slots: &[u32]) -> Result<Tensor<4>, PagedKernelError> {
    let slots = SlotMapping::new(slots, &cache.device())?;
    slots.check(&cache, &new)?;
    Ok(slots.write(cache, new))
}

/// [`reshape_and_cache`] on a cache held by `&mut` (the form for a cache stored in a struct):
/// written in place when uniquely owned, and left untouched on an argument error.
pub fn reshape_and_cache_mut(cache: &mut Tensor<4>, new: Tensor<3>, slots: &[u32]) -> Result<(), PagedKernelError> {
    let slots = SlotMapping::new(slots, &cache.device())?;
    reshape_and_cache_with(cache, new, &slots)
}

/// [`reshape_and_cache_mut`] with slots uploaded once per step ([`SlotMapping`]) instead of on
/// every call: the form for a model writing the K and V caches of many layers.
pub fn reshape_and_cache_with(
    cache: &mut Tensor<4>,
    new: Tensor<3>,
    slots: &SlotMapping,
) -> Result<(), PagedKernelError> {
    let _span = tracing::trace_span!("kernel", op = "reshape_and_cache").entered();
    slots.check(cache, &new)?;
    in_place::update(cache, |c| slots.write(c, new));
    Ok(())
}

/// Checks a [`copy_blocks`] request.
fn check_copy_blocks(cache: &Tensor<4>, pairs: &[(u32, u32)]) -> Result<(), PagedKernelError> {
    let [num_blocks, ..] = cache_dims(cache)?;
    same_dtype(&[cache.dtype()])?;
    let mut sources = std::collections::HashSet::new();
    let mut targets = std::collections::HashSet::new();
    for &(src, dst) in pairs {
        for block in [src, dst] {
            if block as usize >= num_blocks {
                return Err(PagedKernelError::Block { what: "copy_blocks", block, num_blocks });
            }
        }
        sources.insert(src);
        if !targets.insert(dst) {
            return Err(PagedKernelError::Duplicate { what: "copy_blocks destinations", index: dst });
        }
    }
    if let Some(&block) = targets.iter().find(|b| sources.contains(b)) {
        return Err(PagedKernelError::CopyOverlap(block));
    }
    Ok(())
}

/// The unchecked launch behind [`copy_blocks`].
fn run_copy_blocks(cache: Tensor<4>, pairs: &[(u32, u32)]) -> Tensor<4> {
    if pairs.is_empty() {
        return cache;
    }
    let flat = pairs.iter().flat_map(|&(s, d)| [s, d]).collect();
    let pairs = upload2(flat, pairs.len(), 2, &cache.device());
    Tensor::from_dispatch(<Dispatch as PagedKvOps>::copy_blocks(cache.into_dispatch(), pairs.into_dispatch()))
}

/// Copies physical block `src` onto block `dst` for every `(src, dst)` pair, all heads, in one
/// launch (vLLM's fused block copy for copy-on-write), and returns the cache, written in place
/// when uniquely owned. A source may be copied to several destinations (a fork).
///
/// Errors: a block id outside the cache, a destination named twice, or a block that is both a
/// source and a destination (the result would depend on thread order). On error the cache is
/// dropped; use [`copy_blocks_mut`] to keep it.
pub fn copy_blocks(cache: Tensor<4>, pairs: &[(u32, u32)]) -> Result<Tensor<4>, PagedKernelError> {
    check_copy_blocks(&cache, pairs)?;
    Ok(run_copy_blocks(cache, pairs))
}

/// [`copy_blocks`] on a cache held by `&mut`: in place when uniquely owned, untouched on error.
pub fn copy_blocks_mut(cache: &mut Tensor<4>, pairs: &[(u32, u32)]) -> Result<(), PagedKernelError> {
    let _span = tracing::trace_span!("kernel", op = "copy_blocks", pairs = pairs.len()).entered();
    check_copy_blocks(cache, pairs)?;
    in_place::update(cache, |c| run_copy_blocks(c, pairs));
    Ok(())
}

/// Checks a [`write_blocks`] request.
fn check_write_blocks(cache: &Tensor<4>, ids: &[u32], blocks: &Tensor<4>) -> Result<(), PagedKernelError> {
    let [num_blocks, kv_heads, block_size, head_dim] = cache_dims(cache)?;
    let found = blocks.dims();
    if found[1..] != [kv_heads, block_size, head_dim] {
        return Err(PagedKernelError::Shape {
            what: "blocks",
            expected: vec![found[0], kv_heads, block_size, head_dim],
            found: found.to_vec(),
        });
    }
    if ids.len() != found[0] {
        return Err(PagedKernelError::Length { what: "write_blocks ids", expected: found[0], found: ids.len() });
    }
    same_dtype(&[cache.dtype(), blocks.dtype()])?;
    same_device(&[cache.device(), blocks.device()])?;
    check_ids("write_blocks", ids, num_blocks)?;
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    for &id in ids {
        if !seen.insert(id) {
            return Err(PagedKernelError::Duplicate { what: "write_blocks ids", index: id });
        }
    }
    Ok(())
}

/// Every id names a block of the cache.
fn check_ids(what: &'static str, ids: &[u32], num_blocks: usize) -> Result<(), PagedKernelError> {
    match ids.iter().find(|&&b| b as usize >= num_blocks) {
        Some(&block) => Err(PagedKernelError::Block { what, block, num_blocks }),
        None => Ok(()),
    }
}

/// The unchecked launch behind [`write_blocks`].
fn run_write_blocks(cache: Tensor<4>, ids: &[u32], blocks: Tensor<4>) -> Tensor<4> {
    if ids.is_empty() {
        return cache;
    }
    let ids = upload(ids.to_vec(), &cache.device());
    Tensor::from_dispatch(<Dispatch as PagedKvOps>::write_blocks(
        cache.into_dispatch(),
        ids.into_dispatch(),
        blocks.into_dispatch(),
    ))
}

/// Writes `blocks[i]` (`[n, num_kv_heads, block_size, head_dim]`) over physical block `ids[i]`
/// in one launch (swap-in: bring blocks back from host memory, uploaded with
/// `Tensor::from_data`) and returns the cache, written in place when uniquely owned.
///
/// Errors: shapes, dtypes or devices that do not match, `ids.len() != n`, an id outside the
/// cache, or an id named twice. On error the cache is dropped; use [`write_blocks_mut`] to keep
/// it.
pub fn write_blocks(cache: Tensor<4>, ids: &[u32], blocks: Tensor<4>) -> Result<Tensor<4>, PagedKernelError> {
    check_write_blocks(&cache, ids, &blocks)?;
    Ok(run_write_blocks(cache, ids, blocks))
}

/// [`write_blocks`] on a cache held by `&mut`: in place when uniquely owned, untouched on error.
pub fn write_blocks_mut(cache: &mut Tensor<4>, ids: &[u32], blocks: Tensor<4>) -> Result<(), PagedKernelError> {
    let _span = tracing::trace_span!("kernel", op = "write_blocks", blocks = ids.len()).entered();
    check_write_blocks(cache, ids, &blocks)?;
    in_place::update(cache, |c| run_write_blocks(c, ids, blocks));
    Ok(())
}

/// Blocks `ids` of the cache as a new `[ids.len(), num_kv_heads, block_size, head_dim]` tensor
/// (swap-out: read it to the host with `into_data`). The cache is not modified.
///
/// Errors: an id outside the cache.
pub fn read_blocks(cache: &Tensor<4>, ids: &[u32]) -> Result<Tensor<4>, PagedKernelError> {
    let [num_blocks, ..] = cache_dims(cache)?;
    check_ids("read_blocks", ids, num_blocks)?;
    Ok(cache.clone().select(0, upload(ids.to_vec(), &cache.device())))
}

/// The per-step inputs of [`paged_attention_with`], checked and uploaded once and then shared by
/// every layer of the step (vLLM's input metadata): block tables, which table row each query
/// reads, and each query's context length.
#[derive(Debug, Clone)]
pub struct PagedBatch {
    tables: Tensor<2, Int>,
    query_seq: Tensor<1, Int>,
    context_lens: Tensor<1, Int>,
    tokens: usize,
    block_size: usize,
    /// Largest physical block id any query reads (`None`: no query reads a block).
    max_block: Option<u32>,
}

impl PagedBatch {
    /// Checks and uploads to `device`:
    ///
    /// - `block_tables`: row-major `[S, max_blocks]`; row `s` maps sequence `s`'s logical blocks
    ///   to physical ones. Entries past a row's context are never read (any value).
    /// - `query_seq[t]`: the block-table row query `t` reads.
    /// - `context_lens[t]`: query `t` attends to key positions `0..context_lens[t]` of its
    ///   sequence.
    /// - `block_size`: tokens per block of the caches it will be used with.
    ///
    /// Errors: `query_seq` and `context_lens` of different lengths, a block table that is not
    /// whole rows (or `max_blocks = 0` with queries), a row out of range, or a context longer
    /// than `max_blocks · block_size`. Block ids are checked against the cache when used.
    pub fn new(
        block_tables: &[u32],
        max_blocks: usize,
        block_size: usize,
        query_seq: &[u32],
        context_lens: &[u32],
        device: &Device,
    ) -> Result<Self, PagedKernelError> {
        let tokens = query_seq.len();
        if context_lens.len() != tokens {
            return Err(PagedKernelError::Length { what: "context_lens", expected: tokens, found: context_lens.len() });
        }
        let whole_rows = max_blocks > 0 && block_tables.len().is_multiple_of(max_blocks);
        if !whole_rows && (tokens > 0 || !block_tables.is_empty()) {
            return Err(PagedKernelError::BlockTable { len: block_tables.len(), max_blocks });
        }
        let rows = block_tables.len().checked_div(max_blocks).unwrap_or(0);
        let max_len = max_blocks * block_size;
        let mut max_block = None;
        for (query, (&row, &len)) in query_seq.iter().zip(context_lens).enumerate() {
            if row as usize >= rows {
                return Err(PagedKernelError::Sequence { query, row, rows });
            }
            if len as usize > max_len {
                return Err(PagedKernelError::Context { query, len, max: max_len });
            }
            let start = row as usize * max_blocks;
            let used = &block_tables[start..start + (len as usize).div_ceil(block_size.max(1))];
            max_block = used.iter().copied().chain(max_block).max();
        }
        Ok(Self {
            tables: upload2(block_tables.to_vec(), rows, max_blocks, device),
            query_seq: upload(query_seq.to_vec(), device),
            context_lens: upload(context_lens.to_vec(), device),
            tokens,
            block_size,
            max_block,
        })
    }

    /// Number of queries `T`.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// Attention of `T` queries over paged keys and values, one launch for a whole batch.
///
/// - `q`: `[T, H, head_dim]`, one row per query token.
/// - `k_cache`, `v_cache`: one layer's paged storage, `[num_blocks, H_kv, block_size, head_dim]`.
/// - `block_tables`, `max_blocks`, `query_seq`, `context_lens`: as in [`PagedBatch::new`]; query
///   `t` attends to key positions `0..context_lens[t]` of block-table row `query_seq[t]`.
///
/// Returns `[T, H, head_dim]` with `out[t, h] = softmax(q[t, h] · Kᵀ · scale) · V` over those
/// positions, query head `h` reading kv head `h / (H / H_kv)` (grouped-query attention; `H_kv = H`
/// is ordinary multi-head attention). Decode (one query per sequence, each with its own context
/// length) and prefill (many queries of one sequence with increasing `context_lens`, after
/// [`reshape_and_cache`] has stored the prompt's K/V; the causal mask is then just
/// `context_lens`) go in the same launch. The softmax is computed online with max subtraction
/// (numerically stable); a query with context length 0 gets zeros.
///
/// This uploads the index arrays on every call; a model with many layers should build one
/// [`PagedBatch`] per step and call [`paged_attention_with`] per layer.
///
/// Errors: those of [`PagedBatch::new`] and [`paged_attention_with`].
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: Tensor<3>,
    k_cache: &Tensor<4>,
    v_cache: &Tensor<4>,
    block_tables: &[u32],
    max_blocks: usize,
    query_seq: &[u32],
    context_lens: &[u32],
    scale: f32,
) -> Result<Tensor<3>, PagedKernelError> {
    let [_, _, block_size, _] = cache_dims(k_cache)?;
    let tokens = q.dims()[0];
    if query_seq.len() != tokens {
        return Err(PagedKernelError::Length { what: "query_seq", expected: tokens, found: query_seq.len() });
    }
    let batch = PagedBatch::new(block_tables, max_blocks, block_size, query_seq, context_lens, &q.device())?;
    paged_attention_with(q, k_cache, v_cache, &batch, scale)
}

/// [`paged_attention`] with the block tables, query rows and context lengths of a
/// [`PagedBatch`] built once per step.
///
/// Errors: shapes, dtypes or devices that do not match (`q` must have `batch.tokens()` rows and
/// the caches `batch`'s block size), `H % H_kv != 0`, or a block id read by some query outside
/// the cache.
pub fn paged_attention_with(
    q: Tensor<3>,
    k_cache: &Tensor<4>,
    v_cache: &Tensor<4>,
    batch: &PagedBatch,
    scale: f32,
) -> Result<Tensor<3>, PagedKernelError> {
    let _span = tracing::trace_span!("kernel", op = "paged_attention", tokens = batch.tokens).entered();
    check_attention(q.dims(), q.dtype(), q.device(), k_cache, v_cache, batch)?;
    let [tokens, heads, _] = q.dims();
    if tokens == 0 || heads == 0 {
        return Ok(q);
    }
    Ok(Tensor::from_dispatch(<Dispatch as PagedKvOps>::paged_attention(
        q.into_dispatch(),
        k_cache.clone().into_dispatch(),
        v_cache.clone().into_dispatch(),
        batch.tables.clone().into_dispatch(),
        batch.query_seq.clone().into_dispatch(),
        batch.context_lens.clone().into_dispatch(),
        scale,
    )))
}

/// The argument checks of [`paged_attention_with`] for a query of `q_dims`, `q_dtype` on
/// `q_device` (shared with the quantized kernel, which checks its float parts this way).
fn check_attention(
    q_dims: [usize; 3],
    q_dtype: DType,
    q_device: Device,
    k_cache: &Tensor<4>,
    v_cache: &Tensor<4>,
    batch: &PagedBatch,
) -> Result<(), PagedKernelError> {
    let [num_blocks, kv_heads, block_size, head_dim] = cache_dims(k_cache)?;
    let cache_shape = [num_blocks, kv_heads, block_size, head_dim];
    if v_cache.dims() != cache_shape {
        return Err(PagedKernelError::Shape {
            what: "v_cache",
            expected: cache_shape.to_vec(),
            found: v_cache.dims().to_vec(),
        });
    }
    let [tokens, heads, d] = q_dims;
    if d != head_dim || tokens != batch.tokens {
        return Err(PagedKernelError::Shape {
            what: "q",
            expected: vec![batch.tokens, heads, head_dim],
            found: vec![tokens, heads, d],
        });
    }
    if block_size != batch.block_size {
        return Err(PagedKernelError::Shape {
            what: "cache block size (PagedBatch built for another)",
            expected: vec![num_blocks, kv_heads, batch.block_size, head_dim],
            found: cache_shape.to_vec(),
        });
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(PagedKernelError::Heads { heads, kv_heads });
    }
    same_dtype(&[q_dtype, k_cache.dtype(), v_cache.dtype()])?;
    same_device(&[q_device, k_cache.device(), v_cache.device(), batch.context_lens.device()])?;
    if let Some(block) = batch.max_block.filter(|&b| b as usize >= num_blocks) {
        return Err(PagedKernelError::Block { what: "block_tables", block, num_blocks });
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod quant_tests;

#[cfg(all(test, any(feature = "wgpu", feature = "vulkan")))]
mod v2_tests;

#[cfg(test)]
mod channel_tests;
