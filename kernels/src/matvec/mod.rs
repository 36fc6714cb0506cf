//! # Decode matrix-vector products (skinny GEMM)
//!
//! `x · W` for `x` `[m, k]` with few rows (`m ≤` [`MATVEC_MAX_ROWS`], a decode step's batch) on
//! the GPU runtimes. Burn's tensor-core matmul tiles such a product 64×64 and launches one
//! workgroup per tile of outputs (64 of them for `n = 4096`), far too few to keep a GPU's memory
//! busy; a decode step is bound by reading the weights, so these kernels are built around that:
//!
//! - the weight is read exactly once per call whatever `m` is: every input row is applied to
//!   each weight value loaded (the rows' accumulators live in registers);
//! - loads are 4-wide vectors along the weight's contiguous axis, neighbouring threads on
//!   neighbouring addresses;
//! - enough workgroups to fill a large GPU: the shared dimension `k` is split across the threads
//!   of a workgroup and, for the `[k, n]` layout, across workgroups, then summed in a fixed order
//!   (deterministic results);
//! - accumulation in `f32` whatever the storage dtype (`f32`, `f16`, `bf16`).
//!
//! Two weight layouts, each dense or group-quantized (4/8-bit codes dequantized in registers):
//!
//! - `[k, n]` (Burn's `Linear`, `[in, out]`; FlexGen's quantized weights, grouped along `n`):
//!   threads own 4 output columns and walk a slice of `k`; partial sums over the workgroup's
//!   slices meet in shared memory; when `k` is also split across workgroups, a second small pass
//!   sums the per-split partials (`cube.rs`, `cube_quant.rs`).
//! - `[n, k]` (HF's and GGUF's `[out, in]`; a tied embedding table used as the LM head): a
//!   group of lanes (a plane, i.e. a warp or subgroup, where the device has plane operations)
//!   owns 1–4 output rows and walks `k` in vectors; the lanes' partial sums are reduced with
//!   `plane_sum`, or through shared memory on devices without plane operations (chosen when the
//!   kernel is launched).
//!
//! [`crate::matmul`] routes a dense product here on a CubeCL device (and on a remote one) when
//! `m ≤ MATVEC_MAX_ROWS`, detecting a weight given as the transposed view of an `[n, k]` tensor
//! (no copy); the fused quantized products ([`crate::qmatmul`], [`crate::qmatmul_transposed`])
//! use these kernels for the same `m` on the GPU runtimes. Larger `m` keeps Burn's matmul and the
//! per-output quantized kernel. Flex keeps its own CPU products.

mod ops;
pub use ops::MatvecOps;

#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
pub(crate) mod cube;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
pub(crate) mod cube_quant;
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
pub(crate) mod remote;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::Dispatch;
use burn::tensor::{DType, Tensor};

/// Most input rows the matrix-vector kernels take; above, a product is a GEMM and goes to Burn's
/// matmul (dense) or the per-output kernel (quantized).
pub const MATVEC_MAX_ROWS: usize = 32;

/// Whether the GPU products may use the matrix-vector kernels (on unless a benchmark turned them
/// off to time the older paths).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the matrix-vector kernels on or off for the whole process, so that a benchmark can time
/// the paths they replace (Burn's matmul, the per-output quantized kernel) on the same shapes.
/// Results are equal either way within rounding; nothing but benchmarks needs to call this.
pub fn set_matvec_kernels(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether the matrix-vector kernels are on (see [`set_matvec_kernels`]).
pub fn matvec_kernels() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether a quantized product with `m` input rows runs on the matrix-vector kernels.
#[cfg_attr(not(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")), allow(dead_code))]
pub(crate) fn quantized_applies(m: usize) -> bool {
    (1..=MATVEC_MAX_ROWS).contains(&m) && matvec_kernels()
}

/// Whether [`crate::matmul`] sends `x · w` to [`matvec`]: a device that runs CubeCL kernels (or a
/// remote one), `1 ≤ m ≤ MATVEC_MAX_ROWS`, shapes that agree, and one floating dtype the
/// kernels read.
pub(crate) fn applies(x: &Tensor<2>, w: &Tensor<2>) -> bool {
    let ([m, k], [k2, n]) = (x.dims(), w.dims());
    let dtype_ok = x.dtype() == w.dtype() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16);
    (1..=MATVEC_MAX_ROWS).contains(&m)
        && k == k2
        && k > 0
        && n > 0
        && dtype_ok
        && matvec_kernels()
        && runs_kernels(&x.device())
}

/// Devices whose backend implements [`MatvecOps`] with a kernel: the CubeCL runtimes, and remote
/// devices (whose server runs the op on its own backend).
fn runs_kernels(device: &burn::tensor::Device) -> bool {
    #[allow(unreachable_patterns)]
    match device.as_dispatch() {
        #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
        burn::backend::DispatchDevice::Cube(_) => true,
        #[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
        burn::backend::DispatchDevice::Remote(_) => true,
        _ => false,
    }
}

/// `x · w` for `x` `[m, k]` and `w` `[k, n]` (contiguous, or the transposed view of a contiguous
/// `[n, k]` tensor) by the matrix-vector kernels, for shapes [`applies`] accepted. The result has
/// the inputs' dtype. On Flex this is the CPU product of [`crate::matmul`].
pub(crate) fn matvec(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let m = x.dims()[0];
    debug_assert_eq!(x.dims()[1], w.dims()[0], "checked by `applies`");
    let _span = tracing::trace_span!("kernel", op = "matvec", rows = m).entered();
    Tensor::from_dispatch(<Dispatch as MatvecOps>::matvec(x.into_dispatch(), w.into_dispatch()))
}

#[cfg(all(test, any(feature = "wgpu", feature = "vulkan")))]
mod tests;
