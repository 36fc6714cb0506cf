//! Fused ops of a decoder step on the CPU: RMSNorm, rotate-half RoPE, `silu(gate) · up` (and GELU's) and
//! masked attention over a prefix of preallocated key/value slots.
//!
//! Burn's Flex backend runs each tensor op eagerly into a new buffer: RMSNorm is six ops (and six
//! allocations), RoPE is two slices, six products and a concatenation, and attention over a cache
//! view copies the visible keys and values before each product. On Flex these functions run the
//! whole computation in one pass of plain Rust over the inputs (in place where the input buffer is
//! not shared), vectorized for the CPU at hand. On every other device (wgpu and the GPU runtimes)
//! they run the same math as ordinary Burn ops, so callers need no device check of their own.

mod activation;
mod argmax;
mod attention;
#[cfg(feature = "flex")]
mod exp;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod gemm;
mod matmul;
mod norm;
#[cfg(feature = "flex")]
mod prefill;
mod rope;
#[cfg(all(test, feature = "flex"))]
mod tests;

pub use activation::{Gate, gated_mul};
pub use argmax::argmax_rows;
pub use attention::{attention_with, prefix_attention};
pub use matmul::matmul;
pub use norm::rms_norm;
pub use rope::rotate_half;
