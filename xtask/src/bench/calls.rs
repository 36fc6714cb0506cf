//! Timing GPU calls for the kernel benches: seconds per call over samples of several calls.

use burn::tensor::{Device, Tensor};
use burn_llm::offload::profiler::time;

/// Seconds per call of `f` and its last result: the median of 5 samples of `iters` calls after a
/// warm-up sample (which also compiles the kernels), each sample ending when its last result is
/// read back, so every call before it has run (one stream, in order).
pub(crate) fn per_call<const D: usize>(device: &Device, iters: usize, f: &dyn Fn() -> Tensor<D>) -> (f64, Tensor<D>) {
    let iters = iters.max(1);
    let mut last = None;
    let seconds = time(5, || {
        let results: Vec<Tensor<D>> = (0..iters).map(|_| f()).collect();
        let out = results.last().cloned().expect("at least one call");
        let _ = out.clone().into_data();
        let _ = device.sync();
        drop(results);
        last = Some(out);
    });
    (seconds / iters as f64, last.expect("timed at least once"))
}
