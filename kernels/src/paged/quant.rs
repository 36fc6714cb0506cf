//! Group-quantized paged KV storage: one layer's keys (or values) as packed codes with a scale and
//! minimum per group along the head dimension, in exactly the format [`quantize`] writes (the
//! contiguous KV cache's format, so both caches hold the same codes for the same keys).
//!
//! [`QuantizedBlocks`] keeps three tensors with the block layout of a float cache: codes
//! `[num_blocks, kv_heads, block_size, head_dim · bits / 32]` (`U32`) and scale and minimum
//! `[num_blocks, kv_heads, block_size, head_dim / group]` (the model's float dtype). A slot's
//! codes and its groups' parameters therefore live in the same block of each tensor, and every
//! block operation (copy-on-write, swap, hand-off) applies to the three alike: the float parts go
//! through the fused block kernels of [`crate::paged`], the codes through Burn's indexed copies.
//! [`KvPool`] is a layer's storage either way, so a cache handles dense and quantized pools
//! through one set of calls.
//!
//! Writes quantize the step's new keys ([`quantize`], one group row per token and head) and
//! scatter codes, scales and minimums to the tokens' slots; [`paged_attention_pool`] dequantizes
//! inside the attention kernel (`code · scale + min`), never materializing a float cache.
//!
//! Keys may instead be quantized per channel (KIVI, Liu et al. 2024): one group is one channel of
//! one head over a block's `block_size` tokens ([`QuantizedBlocks::zeros_per_channel`]). Such
//! blocks are stored as [`quantize`] lays out groups along the token axis: codes `[num_blocks,
//! kv_heads, head_dim, block_size · bits / 32]` and scale and minimum `[num_blocks, kv_heads,
//! head_dim, 1]`. A block's channel groups need all its tokens, so they are written a whole block
//! at a time from floats ([`QuantizedBlocks::write_channels`]); the cache keeps the floats of
//! unfinished blocks itself.

use burn::backend::Dispatch;
use burn::tensor::{DType, Device, IndexingUpdateOp, Int, Tensor, TensorData};

use super::ops::PagedKvOps;
use super::{
    PagedBatch, PagedKernelError, SKIP_SLOT, SlotMapping, copy_blocks_mut, paged_attention_with, read_blocks,
    reshape_and_cache_with, upload, write_blocks_mut,
};
use crate::quant::{GroupQuantized, QuantSpec, dequantize, quantize};

/// Axis of a `[.., .., .., head_dim]` block tensor that per-token groups run along.
const HEAD_AXIS: usize = 3;
/// Axis of a `[.., .., block_size, ..]` block tensor that per-channel key groups run along.
const TOKEN_AXIS: usize = 2;

/// One layer's paged keys (or values), group-quantized along the head dimension, or (keys) per
/// channel over each block's tokens.
#[derive(Debug, Clone)]
pub struct QuantizedBlocks {
    /// `[num_blocks, kv_heads, block_size, head_dim · bits / 32]`, `U32` (per channel:
    /// `[num_blocks, kv_heads, head_dim, block_size · bits / 32]`).
    codes: Tensor<4, Int>,
    /// `[num_blocks, kv_heads, block_size, head_dim / group]` (per channel: `[num_blocks,
    /// kv_heads, head_dim, 1]`).
    scale: Tensor<4>,
    /// Per-group minimum, like `scale`.
    min: Tensor<4>,
    spec: QuantSpec,
}

impl QuantizedBlocks {
    /// Zeroed storage for a float cache of `shape` (`[num_blocks, kv_heads, block_size,
    /// head_dim]`), scales and minimums in `dtype`. Errors when `spec`'s groups do not tile a
    /// head.
    pub fn zeros(shape: [usize; 4], spec: QuantSpec, dtype: DType, device: &Device) -> Result<Self, PagedKernelError> {
        Self::zeros_along(shape, spec.along(HEAD_AXIS), dtype, device)
    }

    /// Zeroed per-channel (KIVI) key storage for a float cache of `shape`: `bits`-bit codes, one
    /// scale and minimum per channel of each head over each block's tokens. Errors when the
    /// block size is not a whole number of `u32` words of codes (a multiple of `32 / bits`).
    pub fn zeros_per_channel(
        shape: [usize; 4],
        bits: u32,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, PagedKernelError> {
        let spec = QuantSpec::new(bits, shape[TOKEN_AXIS], TOKEN_AXIS).map_err(PagedKernelError::Quant)?;
        Self::zeros_along(shape, spec, dtype, device)
    }

    fn zeros_along(
        shape: [usize; 4],
        spec: QuantSpec,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, PagedKernelError> {
        spec.validate(&shape).map_err(PagedKernelError::Quant)?;
        let [blocks, heads, rows, len] = stored(shape, spec);
        let groups = [blocks, heads, rows, len / spec.group_size()];
        Ok(Self {
            codes: Tensor::zeros([blocks, heads, rows, len / spec.per_word()], (device, DType::U32)),
            scale: Tensor::zeros(groups, (device, dtype)),
            min: Tensor::zeros(groups, (device, dtype)),
            spec,
        })
    }

    /// The quantization: groups along axis 3 of the block tensors (the head dimension), or along
    /// axis 2 (the tokens of a block, per-channel keys).
    pub fn spec(&self) -> QuantSpec {
        self.spec
    }

    /// Keys quantized per channel over each block's tokens (KIVI).
    pub fn per_channel(&self) -> bool {
        self.spec.axis() == TOKEN_AXIS
    }

    /// The shape of the float cache this stores: `[num_blocks, kv_heads, block_size, head_dim]`.
    pub fn dims(&self) -> [usize; 4] {
        let [blocks, heads, rows, words] = self.codes.dims();
        let len = words * self.spec.per_word();
        if self.per_channel() { [blocks, heads, len, rows] } else { [blocks, heads, rows, len] }
    }

    /// The codes, scales and minimums as host data (`[codes, scale, min]`), e.g. to swap out.
    pub fn into_data(self) -> [TensorData; 3] {
        [self.codes.into_data(), self.scale.into_data(), self.min.into_data()]
    }

    /// Blocks from host data of the three parts ([`QuantizedBlocks::into_data`]) on `device`.
    /// Errors when the parts do not describe the same blocks of `spec`.
    pub fn from_data(parts: [TensorData; 3], spec: QuantSpec, device: &Device) -> Result<Self, PagedKernelError> {
        let [codes, scale, min] = parts;
        let dtype = scale.dtype();
        let blocks = Self {
            codes: Tensor::from_data(codes, (device, DType::U32)),
            scale: Tensor::from_data(scale, (device, dtype)),
            min: Tensor::from_data(min, (device, dtype)),
            spec,
        };
        blocks.check_parts()?;
        Ok(blocks)
    }

    /// Codes, scales and minimums describe the same blocks.
    fn check_parts(&self) -> Result<(), PagedKernelError> {
        let [blocks, heads, rows, len] = stored(self.dims(), self.spec);
        let groups = vec![blocks, heads, rows, len / self.spec.group_size()];
        for (what, part) in [("scale", &self.scale), ("min", &self.min)] {
            if part.dims().to_vec() != groups {
                return Err(PagedKernelError::Shape { what, expected: groups, found: part.dims().to_vec() });
            }
        }
        Ok(())
    }

    /// The blocks dequantized to floats (`[num_blocks, kv_heads, block_size, head_dim]`).
    pub fn dequantize(&self) -> Tensor<4> {
        let [blocks, heads, rows, words] = self.codes.dims();
        let rows = blocks * heads * rows;
        let groups = self.scale.dims()[3];
        dequantize(&GroupQuantized {
            codes: self.codes.clone().reshape([rows, words]),
            scale: self.scale.clone().reshape([rows, groups]),
            min: self.min.clone().reshape([rows, groups]),
            shape: self.dims(),
            spec: self.spec,
        })
    }

    /// Per-channel keys: quantizes whole blocks `floats` (`[n, kv_heads, block_size, head_dim]`)
    /// per channel over their first `counts[i]` tokens (the tokens after those hold nothing yet
    /// and do not widen a channel's range) and writes them over blocks `ids`. Arguments are
    /// checked before anything is written.
    pub fn write_channels(&mut self, ids: &[u32], floats: Tensor<4>, counts: &[usize]) -> Result<(), PagedKernelError> {
        let [_, heads, block_size, head_dim] = self.dims();
        let [n, h, b, d] = floats.dims();
        if !self.per_channel() {
            return Err(PagedKernelError::Layout("blocks grouped along the head are written a token at a time"));
        }
        if [h, b, d] != [heads, block_size, head_dim] || counts.len() != n {
            return Err(PagedKernelError::Shape {
                what: "per-channel key blocks",
                expected: vec![counts.len(), heads, block_size, head_dim],
                found: vec![n, h, b, d],
            });
        }
        if ids.len() != n {
            return Err(PagedKernelError::Length { what: "per-channel key block ids", expected: n, found: ids.len() });
        }
        if let Some(&count) = counts.iter().find(|&&c| c == 0 || c > block_size) {
            return Err(PagedKernelError::Length {
                what: "tokens of a per-channel key block",
                expected: block_size,
                found: count,
            });
        }
        if n == 0 {
            return Ok(());
        }
        // Unwritten tokens take the value of token 0, so each channel's range is its written
        // tokens' range.
        let keep: Vec<f32> =
            counts.iter().flat_map(|&c| (0..block_size).map(move |t| f32::from(u8::from(t < c)))).collect();
        let device = floats.device();
        let keep = Tensor::<4>::from_data(TensorData::new(keep, [n, 1, block_size, 1]), &device).cast(floats.dtype());
        let first = floats.clone().slice([0..n, 0..heads, 0..1, 0..head_dim]);
        let floats = floats * keep.clone() + first * (keep.neg() + 1.0);
        let q = quantize(floats, self.spec).map_err(PagedKernelError::Quant)?;
        let words = block_size / self.spec.per_word();
        let blocks = Self {
            codes: q.codes.reshape([n, heads, head_dim, words]),
            scale: q.scale.reshape([n, heads, head_dim, 1]),
            min: q.min.reshape([n, heads, head_dim, 1]),
            spec: self.spec,
        };
        self.write_blocks(ids, blocks)
    }

    /// The same blocks on `device`.
    pub fn to_device(self, device: &Device) -> Self {
        Self {
            codes: self.codes.to_device(device),
            scale: self.scale.to_device(device),
            min: self.min.to_device(device),
            spec: self.spec,
        }
    }

    /// Quantizes `new` (`[T, kv_heads, head_dim]`) and writes token `t`'s codes and group
    /// parameters to slot `slots[t]` (skipping [`SKIP_SLOT`]s), in place when uniquely owned.
    /// Arguments are checked before anything is written.
    pub fn write(&mut self, new: Tensor<3>, slots: &SlotMapping) -> Result<(), PagedKernelError> {
        if self.per_channel() {
            return Err(PagedKernelError::Layout("per-channel key blocks are written a whole block at a time"));
        }
        let [_, heads, block_size, head_dim] = self.dims();
        let [tokens, h, d] = new.dims();
        if [h, d] != [heads, head_dim] {
            return Err(PagedKernelError::Shape {
                what: "new",
                expected: vec![tokens, heads, head_dim],
                found: vec![tokens, h, d],
            });
        }
        if tokens == 0 {
            return slots.check_tokens(0);
        }
        let q = quantize(new, self.spec.along(2)).map_err(PagedKernelError::Quant)?;
        let groups = self.scale.dims()[3];
        // The scale write checks the slots, dtypes and devices; after it nothing can fail.
        reshape_and_cache_with(&mut self.scale, q.scale.reshape([tokens, heads, groups]), slots)?;
        reshape_and_cache_with(&mut self.min, q.min.reshape([tokens, heads, groups]), slots)?;
        let Some((dst, src)) = slots.code_rows(heads, block_size) else { return Ok(()) };
        let codes = match src {
            Some(src) => q.codes.select(0, src),
            None => q.codes,
        };
        super::in_place::update(&mut self.codes, |c| {
            let [blocks, heads, block_size, words] = c.dims();
            c.reshape([blocks * heads * block_size, words])
                .select_assign(0, dst, codes, IndexingUpdateOp::Assign)
                .reshape([blocks, heads, block_size, words])
        });
        Ok(())
    }

    /// Copies block `src` onto block `dst` for every pair (see [`copy_blocks`](super::copy_blocks)).
    pub fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), PagedKernelError> {
        // The scale copy checks the pairs; after it nothing can fail.
        copy_blocks_mut(&mut self.scale, pairs)?;
        copy_blocks_mut(&mut self.min, pairs)?;
        if pairs.is_empty() {
            return Ok(());
        }
        let device = self.codes.device();
        let src = upload(pairs.iter().map(|p| p.0).collect(), &device);
        let dst = upload(pairs.iter().map(|p| p.1).collect(), &device);
        super::in_place::update(&mut self.codes, |c| {
            let blocks = c.clone().select(0, src);
            c.select_assign(0, dst, blocks, IndexingUpdateOp::Assign)
        });
        Ok(())
    }

    /// Blocks `ids` as their own [`QuantizedBlocks`] (swap-out, hand-off).
    pub fn read_blocks(&self, ids: &[u32]) -> Result<Self, PagedKernelError> {
        let scale = read_blocks(&self.scale, ids)?;
        let min = read_blocks(&self.min, ids)?;
        let codes = self.codes.clone().select(0, upload(ids.to_vec(), &self.codes.device()));
        Ok(Self { codes, scale, min, spec: self.spec })
    }

    /// Writes `blocks` over blocks `ids` (swap-in, hand-off); checked before anything is written.
    pub fn write_blocks(&mut self, ids: &[u32], blocks: Self) -> Result<(), PagedKernelError> {
        let ([_, heads, block_size, head_dim], found) = (self.dims(), blocks.dims());
        if found[1..] != [heads, block_size, head_dim] || blocks.spec != self.spec {
            return Err(PagedKernelError::Shape {
                what: "quantized blocks",
                expected: vec![found[0], heads, block_size, head_dim],
                found: found.to_vec(),
            });
        }
        blocks.check_parts()?;
        same_codes_device(&self.codes, &blocks.codes)?;
        // The scale write checks the ids, dtypes and devices; after it nothing can fail.
        write_blocks_mut(&mut self.scale, ids, blocks.scale)?;
        write_blocks_mut(&mut self.min, ids, blocks.min)?;
        if ids.is_empty() {
            return Ok(());
        }
        let ids = upload(ids.to_vec(), &self.codes.device());
        super::in_place::update(&mut self.codes, |c| c.select_assign(0, ids, blocks.codes, IndexingUpdateOp::Assign));
        Ok(())
    }
}

/// The shape a block tensor of `dims` (`[num_blocks, kv_heads, block_size, head_dim]`) is stored
/// in: with the axis `spec`'s groups run along last.
fn stored(dims: [usize; 4], spec: QuantSpec) -> [usize; 4] {
    let [blocks, heads, block_size, head_dim] = dims;
    if spec.axis() == TOKEN_AXIS { [blocks, heads, head_dim, block_size] } else { dims }
}

/// Codes of two block sets live on one device.
fn same_codes_device(a: &Tensor<4, Int>, b: &Tensor<4, Int>) -> Result<(), PagedKernelError> {
    if a.device() == b.device() { Ok(()) } else { Err(PagedKernelError::Device) }
}

/// The rows of a step's new codes (`[T · kv_heads, words]`) and of a cache's codes seen as
/// `[num_blocks · kv_heads · block_size, words]` that a quantized write copies: cache row
/// `(block · kv_heads + head) · block_size + offset` of slot `block · block_size + offset` for
/// every token and head whose slot is not skipped, and the new rows they take (`None`: all, in
/// order). `None` when every token is skipped.
pub(super) fn code_rows(
    slots: &[u32],
    kv_heads: usize,
    block_size: usize,
    device: &Device,
) -> Option<(Tensor<1, Int>, Option<Tensor<1, Int>>)> {
    let mut dst = Vec::with_capacity(slots.len() * kv_heads);
    let mut src = Vec::with_capacity(slots.len() * kv_heads);
    for (token, &slot) in slots.iter().enumerate() {
        if slot == SKIP_SLOT {
            continue;
        }
        let (block, offset) = (slot as usize / block_size, slot as usize % block_size);
        for head in 0..kv_heads {
            dst.push(((block * kv_heads + head) * block_size + offset) as u32);
            src.push((token * kv_heads + head) as u32);
        }
    }
    if dst.is_empty() {
        return None;
    }
    let all = src.len() == slots.len() * kv_heads;
    Some((upload(dst, device), (!all).then(|| upload(src, device))))
}

/// One layer's paged keys (or values): floats, or group-quantized codes.
#[allow(clippy::large_enum_variant)] // one per layer and K/V, never moved in hot loops
#[derive(Debug, Clone)]
pub enum KvPool {
    /// `[num_blocks, kv_heads, block_size, head_dim]` floats.
    Dense(Tensor<4>),
    /// Group-quantized along the head dimension.
    Quantized(QuantizedBlocks),
}

impl KvPool {
    /// Zeroed storage of `shape` (`[num_blocks, kv_heads, block_size, head_dim]`): `dtype` floats,
    /// or `quant` codes with `dtype` scales and minimums.
    pub fn zeros(
        shape: [usize; 4],
        quant: Option<QuantSpec>,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, PagedKernelError> {
        Ok(match quant {
            None => Self::Dense(Tensor::zeros(shape, (device, dtype))),
            Some(spec) => Self::Quantized(QuantizedBlocks::zeros(shape, spec, dtype, device)?),
        })
    }

    /// `[num_blocks, kv_heads, block_size, head_dim]`.
    pub fn dims(&self) -> [usize; 4] {
        match self {
            Self::Dense(t) => t.dims(),
            Self::Quantized(q) => q.dims(),
        }
    }

    /// The quantization, if the pool stores codes.
    pub fn quantization(&self) -> Option<QuantSpec> {
        match self {
            Self::Dense(_) => None,
            Self::Quantized(q) => Some(q.spec),
        }
    }

    /// The shape of one block (the last three dimensions) and the dtype of each part of the
    /// pool, in the order of [`KvPool::into_data`]: the floats, or the codes, scales and minimums.
    pub fn parts(&self) -> Vec<([usize; 3], DType)> {
        let block = |t: [usize; 4]| [t[1], t[2], t[3]];
        match self {
            Self::Dense(t) => vec![(block(t.dims()), t.dtype())],
            Self::Quantized(q) => vec![
                (block(q.codes.dims()), DType::U32),
                (block(q.scale.dims()), q.scale.dtype()),
                (block(q.min.dims()), q.min.dtype()),
            ],
        }
    }

    /// The pool as floats (dense storage as is, codes dequantized).
    pub fn dense(&self) -> Tensor<4> {
        match self {
            Self::Dense(t) => t.clone(),
            Self::Quantized(q) => q.dequantize(),
        }
    }

    /// Writes the step's new keys (or values) to their slots (see [`reshape_and_cache_with`] and
    /// [`QuantizedBlocks::write`]).
    pub fn write(&mut self, new: Tensor<3>, slots: &SlotMapping) -> Result<(), PagedKernelError> {
        match self {
            Self::Dense(t) => reshape_and_cache_with(t, new, slots),
            Self::Quantized(q) => q.write(new, slots),
        }
    }

    /// Copy-on-write of every `(src, dst)` pair (see [`copy_blocks_mut`]).
    pub fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), PagedKernelError> {
        match self {
            Self::Dense(t) => copy_blocks_mut(t, pairs),
            Self::Quantized(q) => q.copy_blocks(pairs),
        }
    }

    /// Blocks `ids` as a pool of their own (see [`read_blocks`]).
    pub fn read_blocks(&self, ids: &[u32]) -> Result<Self, PagedKernelError> {
        Ok(match self {
            Self::Dense(t) => Self::Dense(read_blocks(t, ids)?),
            Self::Quantized(q) => Self::Quantized(q.read_blocks(ids)?),
        })
    }

    /// Writes `blocks` (read from a pool of the same kind) over blocks `ids` (see
    /// [`write_blocks_mut`]).
    pub fn write_blocks(&mut self, ids: &[u32], blocks: Self) -> Result<(), PagedKernelError> {
        match (self, blocks) {
            (Self::Dense(t), Self::Dense(b)) => write_blocks_mut(t, ids, b),
            (Self::Quantized(q), Self::Quantized(b)) => q.write_blocks(ids, b),
            (pool, blocks) => {
                Err(PagedKernelError::Storage { pool: pool.quantization(), blocks: blocks.quantization() })
            }
        }
    }

    /// The same blocks on `device`.
    pub fn to_device(self, device: &Device) -> Self {
        match self {
            Self::Dense(t) => Self::Dense(t.to_device(device)),
            Self::Quantized(q) => Self::Quantized(q.to_device(device)),
        }
    }

    /// Host data of the pool's parts: `[floats]`, or `[codes, scale, min]`.
    pub fn into_data(self) -> Vec<TensorData> {
        match self {
            Self::Dense(t) => vec![t.into_data()],
            Self::Quantized(q) => q.into_data().into(),
        }
    }

    /// A pool of the kind `quant` says from host data of its parts ([`KvPool::into_data`]).
    pub fn from_data(
        parts: Vec<TensorData>,
        quant: Option<QuantSpec>,
        device: &Device,
    ) -> Result<Self, PagedKernelError> {
        let found = parts.len();
        match (quant, <[TensorData; 3]>::try_from(parts)) {
            (Some(spec), Ok(parts)) => Ok(Self::Quantized(QuantizedBlocks::from_data(parts, spec, device)?)),
            (None, Err(mut parts)) if found == 1 => {
                let data = parts.remove(0);
                let dtype = data.dtype();
                Ok(Self::Dense(Tensor::from_data(data, (device, dtype))))
            }
            _ => Err(PagedKernelError::Length {
                what: "pool parts",
                expected: if quant.is_some() { 3 } else { 1 },
                found,
            }),
        }
    }
}

/// [`paged_attention_with`] over pools of either kind: float caches as they are, quantized ones
/// dequantized inside the kernel. Both pools must be stored alike, except that quantized keys may
/// be per channel ([`QuantizedBlocks::zeros_per_channel`]) beside values of the same bits grouped
/// along the head.
///
/// Errors: those of [`paged_attention_with`] (checked on the value scales), or pools stored
/// differently.
pub fn paged_attention_pool(
    q: Tensor<3>,
    keys: &KvPool,
    values: &KvPool,
    batch: &PagedBatch,
    scale: f32,
) -> Result<Tensor<3>, PagedKernelError> {
    let (k, v) = match (keys, values) {
        (KvPool::Dense(k), KvPool::Dense(v)) => return paged_attention_with(q, k, v, batch, scale),
        (KvPool::Quantized(k), KvPool::Quantized(v))
            if !v.per_channel() && (k.spec == v.spec || (k.per_channel() && k.spec.bits() == v.spec.bits())) =>
        {
            (k, v)
        }
        _ => return Err(PagedKernelError::Storage { pool: keys.quantization(), blocks: values.quantization() }),
    };
    let _span = tracing::trace_span!("kernel", op = "paged_attention_quantized", tokens = batch.tokens).entered();
    // The checks of the float kernel, on the value scales: block size and ids, heads, dtypes,
    // devices (a scale tensor is a float cache `groups` wide: the query is checked against that
    // width); the keys must store the same blocks on the same device in the same dtype.
    let dims = v.dims();
    if k.dims() != dims {
        return Err(PagedKernelError::Shape { what: "key blocks", expected: dims.to_vec(), found: k.dims().to_vec() });
    }
    let [tokens, heads, d] = q.dims();
    if d != dims[3] {
        return Err(PagedKernelError::Shape {
            what: "q",
            expected: vec![tokens, heads, dims[3]],
            found: vec![tokens, heads, d],
        });
    }
    let groups = v.scale.dims()[3];
    super::check_attention([tokens, heads, groups], q.dtype(), q.device(), &v.scale, &v.scale, batch)?;
    super::same_dtype(&[k.scale.dtype(), v.scale.dtype()])?;
    super::same_device(&[k.codes.device(), v.codes.device()])?;
    if tokens == 0 || heads == 0 {
        return Ok(q);
    }
    Ok(Tensor::from_dispatch(<Dispatch as PagedKvOps>::paged_attention_quantized(
        q.into_dispatch(),
        k.codes.clone().into_dispatch(),
        k.scale.clone().into_dispatch(),
        k.min.clone().into_dispatch(),
        v.codes.clone().into_dispatch(),
        v.scale.clone().into_dispatch(),
        v.min.clone().into_dispatch(),
        batch.tables.clone().into_dispatch(),
        batch.query_seq.clone().into_dispatch(),
        batch.context_lens.clone().into_dispatch(),
        scale,
        v.spec.bits(),
        v.spec.group_size(),
        u32::from(k.per_channel()),
    )))
}
