//! # Group-wise quantization (FlexGen, Sheng et al. ICML '23, §4.1)
//!
//! Values are split into groups of `group_size` consecutive elements along one axis, and each
//! group stores `x_q = round((x − min) / (max − min) · (2^b − 1))` with its own `min` and
//! `scale = (max − min) / (2^b − 1)`; dequantization is `x = x_q · scale + min`. Burn's built-in
//! quantization is symmetric only (no zero point), hence this module.
//!
//! - [`QuantSpec`]: bits, group size and axis, checked when built; the type every crate uses to
//!   describe a group quantization.
//! - [`quantize`] / [`dequantize`]: a tensor to [`GroupQuantized`] codes and back.
//! - [`qmatmul`] / [`qmatmul_transposed`]: fused dequantize-matmul that never materializes the
//!   full-precision weight. On the CPU the GGUF-layout product runs in integer arithmetic on
//!   8-bit-quantized input rows (llama.cpp's way) unless [`MatmulPrecision::Exact`] is set.
//!
//! Each op is a CubeCL kernel for every GPU runtime with a pure-Rust twin for Flex ([`ops`]).

mod choice;
#[cfg(feature = "flex")]
pub(crate) mod kq;
mod matmul;
pub mod ops;
mod precision;
#[cfg(feature = "flex")]
pub(crate) mod q8;
mod spec;
#[cfg(feature = "flex")]
pub(crate) mod split;
#[cfg(feature = "flex")]
mod strip_bench;
#[cfg(feature = "flex")]
pub use strip_bench::StripProduct;

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
pub(crate) mod remote;

pub use choice::{FUSED_MAX_ROWS, ProductSite, fused_product_wins, product_site};
pub use matmul::{QMatmulLayout, qmatmul, qmatmul_transposed};
pub use precision::{MatmulPrecision, matmul_precision, set_matmul_precision, with_matmul_precision};
pub use spec::{KernelError, QuantSpec};

/// The instruction set the Flex integer kernels run with on this CPU, chosen at run time:
/// `"AVX-512 VNNI"`, `"AVX2"` or `"scalar"` (benchmarks name it beside their figures).
#[cfg(feature = "flex")]
pub fn integer_isa() -> &'static str {
    q8::Isa::best().name()
}

use burn::backend::Dispatch;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use self::ops::GroupQuantOps;

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

    /// Bytes a product on Flex's integer kernels reads: [`GroupQuantized::size_bytes`] less the
    /// minimums of a [symmetric](QuantSpec::with_symmetric_offset) weight, which they derive.
    pub fn cpu_read_bytes(&self) -> usize {
        let derived = match self.spec.symmetric_offset() {
            0 => 0,
            _ => self.shape.iter().product::<usize>() / self.spec.group_size() * std::mem::size_of::<f32>(),
        };
        self.size_bytes() - derived
    }

    /// Wraps codes, scales and minimums that were quantized elsewhere (a GGUF file's blocks,
    /// repacked) into a tensor on `device`, checking that their lengths fit `shape` and `spec`
    /// (and, for a [symmetric](QuantSpec::with_symmetric_offset) spec, that every minimum is
    /// `−offset · scale`). The layout is the one documented on the type, with the quantized axis
    /// already last in the host buffers.
    pub fn from_host(
        codes: Vec<u32>,
        scale: Vec<f32>,
        min: Vec<f32>,
        shape: [usize; D],
        spec: QuantSpec,
        device: &Device,
    ) -> Result<Self, KernelError> {
        spec.validate(&shape)?;
        let last = moved_last(shape, spec.axis());
        let cols = last[D - 1];
        let rows = last.iter().product::<usize>() / cols.max(1);
        let (words, groups) = (cols / spec.per_word(), cols / spec.group_size());
        let expected = [rows * words, rows * groups, rows * groups];
        let found = [codes.len(), scale.len(), min.len()];
        if expected != found {
            return Err(KernelError::HostBuffers { expected, found });
        }
        let offset = spec.symmetric_offset();
        if offset > 0 {
            let derived = |s: f32| s * -(offset as f32);
            if let Some(group) = min.iter().zip(&scale).position(|(m, &s)| m.to_bits() != derived(s).to_bits()) {
                return Err(KernelError::SymmetricMinimum { group, offset });
            }
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
    let _span = tracing::trace_span!("kernel", op = "quantize").entered();
    let shape: [usize; D] = x.dims();
    spec.validate(&shape)?;
    let last = moved_last(shape, spec.axis());
    let cols = last[D - 1];
    let rows = last.iter().product::<usize>() / cols.max(1);
    let groups = cols / spec.group_size();
    let flat: Tensor<2> = x.swap_dims(spec.axis(), D - 1).reshape([rows, cols]);
    let grouped = flat.clone().reshape([rows, groups, spec.group_size()]);
    let min = grouped.clone().min_dim(2).reshape([rows, groups]);
    let max = grouped.max_dim(2).reshape([rows, groups]);
    let scale = (max - min.clone()) / spec.max_code() as f32;
    let codes = Tensor::from_dispatch(<Dispatch as GroupQuantOps>::pack_groups(
        flat.into_dispatch(),
        scale.clone().into_dispatch(),
        min.clone().into_dispatch(),
        spec.bits(),
        spec.group_size(),
    ));
    // The minimums are each group's own, whatever offset `spec` names.
    Ok(GroupQuantized { codes, scale, min, shape, spec: spec.with_symmetric_offset(0) })
}

/// Restores a tensor of the original shape, on the device the codes live on.
pub fn dequantize<const D: usize>(q: &GroupQuantized<D>) -> Tensor<D> {
    let _span = tracing::trace_span!("kernel", op = "dequantize").entered();
    let flat: Tensor<2> = Tensor::from_dispatch(<Dispatch as GroupQuantOps>::unpack_groups(
        q.codes.clone().into_dispatch(),
        q.scale.clone().into_dispatch(),
        q.min.clone().into_dispatch(),
        q.spec.bits(),
        q.spec.group_size(),
    ));
    flat.reshape(moved_last(q.shape, q.spec.axis())).swap_dims(q.spec.axis(), D - 1)
}

#[cfg(test)]
mod tests;

#[cfg(all(test, feature = "flex"))]
mod batch_tests;
