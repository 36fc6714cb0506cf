//! The fused dequantize-matmul: `x · W` and `x · Wᵀ` with `W` group-quantized.

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use super::GroupQuantized;
use super::ops::GroupQuantOps;

/// The weight layout [`qmatmul`] or [`qmatmul_transposed`] needs is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the fused matmul needs a weight quantized along axis 1 whose shared dimension is k = {k}; got shape {shape:?} along axis {axis}"
)]
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
/// [`dequantize`](super::dequantize) then an ordinary matmul is faster.
pub fn qmatmul(x: Tensor<2>, w: &GroupQuantized<2>) -> Result<Tensor<2>, QMatmulLayout> {
    fused(x, w, false)
}

/// `x · Wᵀ` (`x` `[m, k]`, `W` `[n, k]` quantized along `k`: llama.cpp's layout, in which GGUF
/// files ship their weights) by the fused dequantize-matmul kernel, which never materializes `W`.
/// Best for decode-sized `m`; for large `m`, [`dequantize`](super::dequantize) then an ordinary matmul is faster.
pub fn qmatmul_transposed(x: Tensor<2>, w: &GroupQuantized<2>) -> Result<Tensor<2>, QMatmulLayout> {
    fused(x, w, true)
}

/// The fused product with `W` `[k, n]` (FlexGen) or, `transposed`, `[n, k]` (GGUF), both
/// quantized along axis 1.
fn fused(x: Tensor<2>, w: &GroupQuantized<2>, transposed: bool) -> Result<Tensor<2>, QMatmulLayout> {
    let _span = tracing::trace_span!("kernel", op = "qmatmul", rows = x.dims()[0], transposed).entered();
    let k = x.dims()[1];
    let shared = if transposed { w.shape[1] } else { w.shape[0] };
    if w.spec.axis() != 1 || shared != k {
        return Err(QMatmulLayout { k, shape: w.shape, axis: w.spec.axis() });
    }
    let (x, codes, scale, min) = (
        x.into_dispatch(),
        w.codes.clone().into_dispatch(),
        w.scale.clone().into_dispatch(),
        w.min.clone().into_dispatch(),
    );
    let (bits, group) = (w.spec.bits(), w.spec.group_size());
    Ok(Tensor::from_dispatch(if transposed {
        // The precision is read here, on the caller's thread, and shipped with the op.
        let int8_rows = u32::from(super::matmul_precision() == super::MatmulPrecision::Int8Activations);
        let offset = w.spec.symmetric_offset();
        <Dispatch as GroupQuantOps>::fused_qmatmul_nt(x, codes, scale, min, bits, group, int8_rows, offset)
    } else {
        <Dispatch as GroupQuantOps>::fused_qmatmul(x, codes, scale, min, bits, group)
    }))
}
