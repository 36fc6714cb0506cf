//! [`MatmulPrecision`]: whether the CPU's fused matmul on GGUF-layout weights quantizes its input
//! rows to 8 bits (llama.cpp's way, the fast default) or keeps them `f32` (exact, for parity
//! tests against HF transformers). A process-wide setting (the CLI's `--exact-matmul`) with a
//! per-thread override ([`with_matmul_precision`], for tests that run side by side).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// How the Flex twin of the fused GGUF-layout matmul treats its input rows. GPU kernels always
/// compute in `f32` and ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulPrecision {
    /// Input rows quantized to signed 8-bit codes per block of 32 (one `f32` scale each) and
    /// multiplied with the weight codes in integer arithmetic, as llama.cpp does (`Q8_1`
    /// activations). Changes logits by about 1e-3 relative; the default.
    #[default]
    Int8Activations,
    /// `f32` input rows times the dequantized codes: equal to dequantize-then-matmul within
    /// float rounding.
    Exact,
}

static EXACT: AtomicBool = AtomicBool::new(false);

thread_local! {
    static OVERRIDE: Cell<Option<MatmulPrecision>> = const { Cell::new(None) };
}

/// Sets the precision for every thread without an override of its own.
pub fn set_matmul_precision(precision: MatmulPrecision) {
    EXACT.store(precision == MatmulPrecision::Exact, Ordering::Relaxed);
}

/// The precision in force on this thread.
pub fn matmul_precision() -> MatmulPrecision {
    OVERRIDE.with(Cell::get).unwrap_or(if EXACT.load(Ordering::Relaxed) {
        MatmulPrecision::Exact
    } else {
        MatmulPrecision::Int8Activations
    })
}

/// Runs `f` with `precision` on this thread only (restored afterwards, also when `f` panics).
pub fn with_matmul_precision<R>(precision: MatmulPrecision, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<MatmulPrecision>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDE.with(|o| o.replace(Some(precision))));
    f()
}
