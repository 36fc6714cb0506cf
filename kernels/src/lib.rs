//! # burn-llm-kernels
//!
//! Numerics for burn-llm, each op a CubeCL kernel for every GPU runtime plus a pure-Rust twin for
//! Burn's Flex CPU backend, with a test that they agree. Kernels know nothing about models or
//! policies.
//!
//! Four modules:
//!
//! - [`quant`]: FlexGen's fine-grained group-wise asymmetric quantization ([`QuantSpec`],
//!   [`quantize`], [`dequantize`]) and the fused dequantize-matmul ([`qmatmul`],
//!   [`qmatmul_transposed`]).
//! - [`paged`]: vLLM's PagedAttention kernels: a KV cache stored in fixed-size blocks, written
//!   token by token ([`reshape_and_cache`]), copied block-wise for copy-on-write
//!   ([`copy_blocks`]), swapped ([`write_blocks`], [`read_blocks`]) and attended to through
//!   per-sequence block tables ([`paged_attention`]).
//! - [`matvec`]: decode-sized products (`m ≤ 32` rows) on the GPU runtimes, dense and
//!   group-quantized, reading each weight once ([`matmul`] and the fused quantized products use
//!   them).
//! - [`fused`]: the rest of a decoder step fused into single passes on Flex (RMSNorm, RoPE,
//!   `silu(gate) · up`, attention over a prefix of preallocated K/V slots), ordinary Burn ops
//!   elsewhere.
//!
//! [`cpu`] detects the host's vector extensions once, for every run-time dispatch of the Flex
//! twins; [`limits`] reads the largest tensor a GPU device holds ([`GpuTensorLimit`]).
//!
//! With the `remote` feature (and a GPU feature, which brings Burn's IR types), [`remote`] makes
//! both modules' ops run on devices of other processes and machines (Burn's remote backend):
//! client-side glue, and `remote::register_ops` for the server.
//!
//! The modules' public items are re-exported here, so `burn_llm_kernels::QuantSpec` and
//! `burn_llm_kernels::quant::QuantSpec` name the same type.

#![warn(missing_docs)]

/// Defined before the modules so that both [`quant`] and [`paged`] can use it.
///
/// Defines `fn $name(args) -> ret` that calls `$portable(args)` compiled for AVX2/FMA when the CPU
/// has them (detected at run time) and as built otherwise: the Flex twins' inner loops are
/// written portably and vectorize much wider under AVX2.
macro_rules! avx2_dispatch {
    ($(#[$doc:meta])* $vis:vis fn $name:ident $(<$g:ident: $bound:path>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $portable:ident) => {
        $(#[$doc])*
        $vis fn $name $(<$g: $bound>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if $crate::cpu::features().avx2_fma() {
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

pub mod cpu;
pub mod fused;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
pub mod launches;
pub mod limits;
pub mod matvec;
pub mod paged;
pub mod quant;
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
pub mod remote;
pub mod test_devices;

pub use cpu::CpuFeatures;
pub use fused::{
    Gate, GpuPrefill, add_rms_norm, argmax_rows, attention_with, gated_mul, gated_mul_fused, gpu_prefill, matmul,
    norm_add_norm, norm_rotate_half_qk, prefix_attention, rms_norm, rms_norm_add, rotate_half, rotate_half_qk,
    set_gpu_prefill,
};
pub use limits::{GpuTensorLimit, KERNEL_INDEX_ELEMENTS};
pub use matvec::{MATVEC_MAX_ROWS, matvec_kernels, set_matvec_kernels};
pub use paged::{
    KvPool, PagedBatch, PagedKernelError, QuantizedBlocks, SKIP_SLOT, SlotMapping, copy_blocks, copy_blocks_mut,
    paged_attention, paged_attention_pool, paged_attention_with, read_blocks, reshape_and_cache, reshape_and_cache_mut,
    reshape_and_cache_with, slot, write_blocks, write_blocks_mut,
};
#[cfg(feature = "flex")]
pub use quant::integer_isa;
pub use quant::{
    FUSED_MAX_ROWS, GroupQuantized, KernelError, MatmulPrecision, ProductSite, QMatmulLayout, QuantSpec, dequantize,
    fused_product_wins, matmul_precision, ops, product_site, qmatmul, qmatmul_transposed, quantize,
    set_matmul_precision, with_matmul_precision,
};
