//! The custom ops behind group quantization, as a Burn backend extension: a CubeCL kernel for
//! every GPU runtime ([`super::cube`]) and a pure-Rust twin for Flex ([`super::flex`]).
//!
//! Layout shared by both: a row-major `[rows, cols]` matrix quantized in groups of `group`
//! consecutive columns; `scale` and `min` are `[rows, cols / group]`; codes are packed
//! little-end-first into `u32` words, `32 / bits` codes a word, so `codes` is
//! `[rows, cols · bits / 32]` of dtype `U32`.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, backend_extension};

/// Group-wise asymmetric quantization ops.
#[backend_extension(
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Fusion: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Flex: cfg(feature = "flex"),
    Remote: cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))
)]
pub trait GroupQuantOps: Backend {
    /// Codes `q = clamp(round((x − min) / scale), 0, 2^bits − 1)` packed into `u32` words
    /// (`q = 0` where `scale = 0`, i.e. constant groups).
    #[fusion(dtype = burn::tensor::DType::U32, shape = {
        let mut s = x.clone();
        let last = s.num_dims() - 1;
        s[last] = s[last] * *bits as usize / 32;
        s
    })]
    fn pack_groups(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> IntTensor<Self>;

    /// `x = q · scale + min` for every packed code.
    #[fusion(dtype = scale, shape = {
        let mut s = codes.clone();
        let last = s.num_dims() - 1;
        s[last] = s[last] * 32 / *bits as usize;
        s
    })]
    fn unpack_groups(
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self>;

    /// `x · W` for `x` `[m, k]` and a weight `W` `[k, n]` quantized in groups along `n`, without
    /// materializing `W`: `out[i, j] = Σ_k x[i, k] · (q[k, j] · scale[k, j / group] + min[k, j / group])`.
    #[fusion(dtype = x, shape = {
        let mut s = x.clone();
        s[1] = codes[1] * 32 / *bits as usize;
        s
    })]
    fn fused_qmatmul(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self>;

    /// `x · Wᵀ` for `x` `[m, k]` and a weight `W` `[n, k]` quantized in groups along `k` (the
    /// llama.cpp/GGUF layout), without materializing `W`:
    /// `out[i, j] = Σ_g scale[j, g] · Σ_{k∈g} x[i, k] · q[j, k] + min[j, g] · Σ_{k∈g} x[i, k]`.
    #[fusion(dtype = x, shape = {
        let mut s = x.clone();
        s[1] = codes[0];
        s
    })]
    ///
    /// `int8_rows` is the caller's [`MatmulPrecision`](super::MatmulPrecision) as an argument (1:
    /// [`Int8Activations`](super::MatmulPrecision::Int8Activations), 0: exact), so that it travels
    /// with the op to a remote worker instead of being read from the worker's own thread; only a
    /// backend with an 8-bit-row kernel (Flex) reads it.
    ///
    /// `symmetric_offset` is the weight's [`QuantSpec::symmetric_offset`](super::QuantSpec): when
    /// it is not 0, every `min[j, g]` is exactly `−symmetric_offset · scale[j, g]`, and a kernel may
    /// derive it rather than read it (Flex's integer kernels do; the others read `min`).
    #[allow(clippy::too_many_arguments)]
    fn fused_qmatmul_nt(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
        int8_rows: u32,
        symmetric_offset: u32,
    ) -> FloatTensor<Self>;
}
