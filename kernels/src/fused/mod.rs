//! Fused ops of a decoder step on the CPU: RMSNorm, rotate-half RoPE, `silu(gate) · up` (and GELU's) and
//! masked attention over a prefix of preallocated key/value slots.
//!
//! Burn's Flex backend runs each tensor op eagerly into a new buffer: RMSNorm is six ops (and six
//! allocations), RoPE is two slices, six products and a concatenation, and attention over a cache
//! view copies the visible keys and values before each product. On Flex these functions run the
//! whole computation in one pass of plain Rust over the inputs (in place where the input buffer is
//! not shared), vectorized for the CPU at hand. On the GPU runtimes RMSNorm (with or without the
//! residual add before it), RoPE of the queries and keys together and the gated product of a fused
//! gate|up projection are one CubeCL kernel launch each ([`ops::FusedOps`], `cube.rs`, with a Flex
//! twin in `flex_ops.rs`); so is attention (`cube_attention.rs` for decode steps, the
//! flash-attention kernel of `cube_flash.rs` for prefill). Callers need no device check.

mod activation;
mod argmax;
mod attention;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube_attention;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube_flash;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube_norms;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
mod cube_row_norm;
#[cfg(feature = "flex")]
mod exp;
#[cfg(all(test, feature = "flex", feature = "wgpu"))]
mod flash_tests;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(feature = "flex")]
mod flex_ops;
#[cfg(feature = "flex")]
mod gemm;
mod matmul;
mod norm;
pub mod ops;
#[cfg(feature = "flex")]
mod prefill;
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
pub(crate) mod remote;
mod rope;
#[cfg(all(test, feature = "flex"))]
mod tests;
#[cfg(all(test, feature = "flex", feature = "wgpu"))]
mod twin_tests;

pub use activation::{Gate, gated_mul, gated_mul_fused};
pub use argmax::argmax_rows;
pub use attention::{GpuPrefill, attention_with, gpu_prefill, prefix_attention, set_gpu_prefill};
pub use matmul::matmul;
pub use norm::{add_rms_norm, norm_add_norm, rms_norm, rms_norm_add};
pub use rope::{norm_rotate_half_qk, rotate_half, rotate_half_qk};
