//! # burn-llm-kernels
//!
//! Numerics for burn-llm, each op a CubeCL kernel for every GPU runtime plus a pure-Rust twin for
//! Burn's Flex CPU backend, with a test that they agree. Kernels know nothing about models or
//! policies.
//!
//! Today: FlexGen's fine-grained group-wise asymmetric quantization (§4.1 of the FlexGen paper):
//! values are split into groups of `group_size` consecutive elements along one axis, and each group
//! stores `x_q = round((x − min) / (max − min) · (2^b − 1))` with its own `min` and
//! `scale = (max − min) / (2^b − 1)`; dequantization is `x = x_q · scale + min`. Burn's built-in
//! quantization is symmetric only (no zero point), hence this crate.
//!
//! And vLLM's PagedAttention kernels ([`paged`]): a KV cache stored in fixed-size blocks,
//! written token by token ([`reshape_and_cache`]), copied block-wise for copy-on-write
//! ([`copy_blocks`]), swapped ([`write_blocks`], [`read_blocks`]) and attended to through
//! per-sequence block tables ([`paged_attention`]).

#![warn(missing_docs)]

/// Defines `fn $name(args) -> ret` that calls `$portable(args)` compiled for AVX2/FMA when the CPU
/// has them (detected at run time) and as built otherwise: the Flex twins' inner loops are
/// written portably and vectorize much wider under AVX2.
macro_rules! avx2_dispatch {
    ($(#[$doc:meta])* fn $name:ident $(<$g:ident: $bound:path>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $portable:ident) => {
        $(#[$doc])*
        fn $name $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2 $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
                    $portable($($arg),*)
                }
                // SAFETY: the features `avx2` is compiled for were just detected.
                return unsafe { avx2($($arg),*) };
            }
            $portable($($arg),*)
        }
    };
}

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube;
#[cfg(feature = "flex")]
mod flex;
pub mod ops;
pub mod paged;

pub use paged::{
    copy_blocks, copy_blocks_mut, paged_attention, paged_attention_with, read_blocks, reshape_and_cache, reshape_and_cache_mut,
    reshape_and_cache_with, slot, write_blocks, write_blocks_mut, PagedBatch, PagedKernelError, SlotMapping, SKIP_SLOT,
};

use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use crate::ops::GroupQuantOps;

/// What is wrong with a quantization request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Only 4- and 8-bit codes are implemented.
    #[error("{0}-bit quantization is not supported (use 4 or 8)")]
    Bits(u32),
    /// The group size does not tile the quantized axis into whole words.
    #[error("group size {group} must be a positive multiple of {per_word} that divides the axis length {len}")]
    GroupSize {
        /// Requested group size.
        group: usize,
        /// Codes per `u32` word at this bit width.
        per_word: usize,
        /// Length of the quantized axis.
        len: usize,
    },
    /// Host buffers handed to [`GroupQuantized::from_host`] do not fit the shape.
    #[error("quantized buffers hold {found:?} codes/scales/minimums, the shape needs {expected:?}")]
    HostBuffers {
        /// Lengths the shape and spec need (codes, scales, minimums).
        expected: [usize; 3],
        /// Lengths received.
        found: [usize; 3],
    },
    /// The axis does not exist.
    #[error("axis {axis} out of range for a rank-{rank} tensor")]
    Axis {
        /// Requested axis.
        axis: usize,
        /// Tensor rank.
        rank: usize,
    },
}

/// How to quantize: bits per value, values per group, and the axis groups run along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Consecutive values sharing one `scale` and `min` (FlexGen uses 64).
    pub group_size: usize,
    /// Axis along which groups are formed (weights: the output channel; KV cache: the hidden
    /// dimension).
    pub axis: usize,
}

impl QuantSpec {
    /// `bits`-bit groups of `group_size` along `axis`.
    pub fn new(bits: u32, group_size: usize, axis: usize) -> Self {
        Self { bits, group_size, axis }
    }

    /// Codes per `u32` word.
    pub fn per_word(&self) -> usize {
        32 / self.bits as usize
    }

    /// Largest code, `2^bits − 1`.
    pub fn max_code(&self) -> u32 {
        (1 << self.bits) - 1
    }

    /// Bytes that `values` values take when quantized this way: the codes plus an `f32` scale
    /// and minimum per group.
    pub fn storage_bytes(&self, values: usize) -> usize {
        values * self.bits as usize / 8 + values / self.group_size.max(1) * 2 * std::mem::size_of::<f32>()
    }

    /// Checks that a tensor of `shape` can be quantized this way (bit width, axis, group size).
    pub fn validate(&self, shape: &[usize]) -> Result<(), KernelError> {
        if self.bits != 4 && self.bits != 8 {
            return Err(KernelError::Bits(self.bits));
        }
        let len = *shape.get(self.axis).ok_or(KernelError::Axis { axis: self.axis, rank: shape.len() })?;
        let per_word = self.per_word();
        if self.group_size == 0 || !self.group_size.is_multiple_of(per_word) || !len.is_multiple_of(self.group_size) {
            return Err(KernelError::GroupSize { group: self.group_size, per_word, len });
        }
        Ok(())
    }
}

/// A tensor stored as packed group-quantized codes with per-group scale and minimum.
///
/// Internally the quantized axis is moved last and the tensor flattened to `[rows, cols]`:
/// `codes` is `[rows, cols · bits / 32]` (`u32`), `scale` and `min` are `[rows, cols / group]`.
#[derive(Debug, Clone)]
pub struct GroupQuantized<const D: usize> {
    /// Packed codes, `U32`.
    pub codes: Tensor<2, Int>,
    /// Per-group scale.
    pub scale: Tensor<2>,
    /// Per-group minimum.
    pub min: Tensor<2>,
    /// Shape of the original tensor.
    pub shape: [usize; D],
    /// How it was quantized.
    pub spec: QuantSpec,
}

impl<const D: usize> GroupQuantized<D> {
    /// Bytes held by codes, scales and minimums (`f32` scales).
    pub fn size_bytes(&self) -> usize {
        self.spec.storage_bytes(self.shape.iter().product())
    }

    /// Wraps codes, scales and minimums that were quantized elsewhere (a GGUF file's blocks,
    /// repacked) into a tensor on `device`, checking that their lengths fit `shape` and `spec`.
    /// The layout is the one documented on the type, with the quantized axis already last in the
    /// host buffers.
    pub fn from_host(
        codes: Vec<u32>,
        scale: Vec<f32>,
        min: Vec<f32>,
        shape: [usize; D],
        spec: QuantSpec,
        device: &Device,
    ) -> Result<Self, KernelError> {
        spec.validate(&shape)?;
        let last = moved_last(shape, spec.axis);
        let cols = last[D - 1];
        let rows = last.iter().product::<usize>() / cols.max(1);
        let (words, groups) = (cols / spec.per_word(), cols / spec.group_size);
        let expected = [rows * words, rows * groups, rows * groups];
        let found = [codes.len(), scale.len(), min.len()];
        if expected != found {
            return Err(KernelError::HostBuffers { expected, found });
        }
        Ok(Self {
            codes: Tensor::from_data(TensorData::new(codes, [rows, words]), (device, DType::U32)),
            scale: Tensor::from_data(TensorData::new(scale, [rows, groups]), device),
            min: Tensor::from_data(TensorData::new(min, [rows, groups]), device),
            shape,
            spec,
        })
    }

    /// Rows `index` of a `[rows, cols]` tensor quantized along its columns, still quantized (an
    /// embedding lookup that never expands the table).
    pub fn select_rows(&self, index: Tensor<1, Int>) -> GroupQuantized<D> {
        let n = index.dims()[0];
        let mut shape = self.shape;
        shape[0] = n;
        GroupQuantized {
            codes: self.codes.clone().select(0, index.clone()),
            scale: self.scale.clone().select(0, index.clone()),
            min: self.min.clone().select(0, index),
            shape,
            spec: self.spec,
        }
    }
}

/// The shape with `axis` swapped to the end.
fn moved_last<const D: usize>(mut shape: [usize; D], axis: usize) -> [usize; D] {
    shape.swap(axis, D - 1);
    shape
}

/// Quantizes `x` group-wise on its own device.
pub fn quantize<const D: usize>(x: Tensor<D>, spec: QuantSpec) -> Result<GroupQuantized<D>, KernelError> {
    let shape: [usize; D] = x.dims();
    spec.validate(&shape)?;
    let last = moved_last(shape, spec.axis);
    let cols = last[D - 1];
    let rows = last.iter().product::<usize>() / cols.max(1);
    let groups = cols / spec.group_size;
    let flat: Tensor<2> = x.swap_dims(spec.axis, D - 1).reshape([rows, cols]);
    let grouped = flat.clone().reshape([rows, groups, spec.group_size]);
    let min = grouped.clone().min_dim(2).reshape([rows, groups]);
    let max = grouped.max_dim(2).reshape([rows, groups]);
    let scale = (max - min.clone()) / spec.max_code() as f32;
    let codes = Tensor::from_dispatch(<Dispatch as GroupQuantOps>::pack_groups(
        flat.into_dispatch(),
        scale.clone().into_dispatch(),
        min.clone().into_dispatch(),
        spec.bits,
        spec.group_size,
    ));
    Ok(GroupQuantized { codes, scale, min, shape, spec })
}

/// Restores a tensor of the original shape, on the device the codes live on.
pub fn dequantize<const D: usize>(q: &GroupQuantized<D>) -> Tensor<D> {
    let flat: Tensor<2> = Tensor::from_dispatch(<Dispatch as GroupQuantOps>::unpack_groups(
        q.codes.clone().into_dispatch(),
        q.scale.clone().into_dispatch(),
        q.min.clone().into_dispatch(),
        q.spec.bits,
        q.spec.group_size,
    ));
    flat.reshape(moved_last(q.shape, q.spec.axis)).swap_dims(q.spec.axis, D - 1)
}

/// The weight layout [`qmatmul`] or [`qmatmul_transposed`] needs is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the fused matmul needs a weight quantized along axis 1 whose shared dimension is k = {k}; got shape {shape:?} along axis {axis}")]
pub struct QMatmulLayout {
    /// Columns of `x`.
    pub k: usize,
    /// Shape of the quantized weight.
    pub shape: [usize; 2],
    /// Its quantization axis.
    pub axis: usize,
}

/// `x · W` (`x` `[m, k]`, `W` `[k, n]` quantized along `n`) by the fused dequantize-matmul kernel,
/// which never materializes `W` in full precision. Best for decode-sized `m`; for large `m`,
/// [`dequantize`] then an ordinary matmul is faster.
pub fn qmatmul(x: Tensor<2>, w: &GroupQuantized<2>) -> Result<Tensor<2>, QMatmulLayout> {
    fused(x, w, false)
}

/// `x · Wᵀ` (`x` `[m, k]`, `W` `[n, k]` quantized along `k`: llama.cpp's layout, in which GGUF
/// files ship their weights) by the fused dequantize-matmul kernel, which never materializes `W`.
/// Best for decode-sized `m`; for large `m`, [`dequantize`] then an ordinary matmul is faster.
pub fn qmatmul_transposed(x: Tensor<2>, w: &GroupQuantized<2>) -> Result<Tensor<2>, QMatmulLayout> {
    fused(x, w, true)
}

/// The fused product with `W` `[k, n]` (FlexGen) or, `transposed`, `[n, k]` (GGUF), both
/// quantized along axis 1.
fn fused(x: Tensor<2>, w: &GroupQuantized<2>, transposed: bool) -> Result<Tensor<2>, QMatmulLayout> {
    let k = x.dims()[1];
    let shared = if transposed { w.shape[1] } else { w.shape[0] };
    if w.spec.axis != 1 || shared != k {
        return Err(QMatmulLayout { k, shape: w.shape, axis: w.spec.axis });
    }
    let op = if transposed {
        <Dispatch as GroupQuantOps>::fused_qmatmul_nt
    } else {
        <Dispatch as GroupQuantOps>::fused_qmatmul
    };
    Ok(Tensor::from_dispatch(op(
        x.into_dispatch(),
        w.codes.clone().into_dispatch(),
        w.scale.clone().into_dispatch(),
        w.min.clone().into_dispatch(),
        w.spec.bits,
        w.spec.group_size,
    )))
}

#[cfg(test)]
mod tests;
