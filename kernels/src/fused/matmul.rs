//! `x · w` of 2-D tensors.

use burn::tensor::Tensor;

/// `x · w` for `x` `[m, k]` and `w` `[k, n]` (either may be a view, e.g. a transposed embedding
/// table): on Flex in `f32`, register-tiled loops (`gemm.rs`); on a GPU runtime (or a remote
/// device) with `m ≤` [`MATVEC_MAX_ROWS`](crate::MATVEC_MAX_ROWS), the matrix-vector kernels
/// ([`crate::matvec`]), which read a transposed contiguous `w` in place; elsewhere, and for shapes
/// that do not agree (Burn reports those), Burn's matmul.
pub fn matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&x) && super::flex::on_flex(&w) && x.dims()[1] == w.dims()[0] {
        return super::gemm::flex_matmul(x, w);
    }
    if crate::matvec::applies(&x, &w) {
        return crate::matvec::matvec(x, w);
    }
    x.matmul(w)
}
