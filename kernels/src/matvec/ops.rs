//! The dense matrix-vector product as a Burn backend extension: a CubeCL kernel for every GPU
//! runtime (`cube.rs`), Flex's CPU product, and remote devices (the server runs the op on
//! its own backend). The quantized products keep their ops ([`crate::ops::GroupQuantOps`]),
//! whose CubeCL implementation calls the quantized matrix-vector kernels (`cube_quant.rs`).

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};

/// The decode matrix-vector product.
#[backend_extension(
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Fusion: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Flex: cfg(feature = "flex"),
    Remote: cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))
)]
pub trait MatvecOps: Backend {
    /// `x · w` for `x` `[m, k]` and `w` `[k, n]` of one floating dtype, `w` contiguous or the
    /// transposed view of a contiguous `[n, k]` tensor (any other view is made contiguous first).
    #[fusion(dtype = x, shape = {
        let mut s = x.clone();
        s[1] = w[1];
        s
    })]
    fn matvec(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self>;
}

#[cfg(feature = "flex")]
impl MatvecOps for burn::backend::Flex {
    fn matvec(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::backend::Flex;
        use burn::tensor::Tensor;
        let (x, w) = (Tensor::<2>::from_primitive::<Flex>(x), Tensor::<2>::from_primitive::<Flex>(w));
        crate::matmul(x, w).try_into_primitive::<Flex>().expect("a product of Flex tensors stays on Flex")
    }
}
