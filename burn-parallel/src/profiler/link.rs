//! The link between two consecutive stages' devices, measured: the time `Tensor::to_device` takes
//! to hand a hidden-state tensor over, at two sizes, fitted as `latency + bytes / rate`.

use std::time::Instant;

use super::ProfileError;
pub use crate::pipeline::auto::LinkProfile;
use burn::tensor::{Device, Distribution, Tensor};

/// Measures the link from `from` to `to` with hidden states of `hidden` values per token: the
/// median of `repeats` hand-overs (after one untimed) of 1 token and of `tokens` tokens, each
/// timed until `to` has synchronised. Fails with the device's error (a worker that died).
pub fn measure_link(
    from: &Device,
    to: &Device,
    hidden: usize,
    tokens: usize,
    repeats: usize,
) -> Result<LinkProfile, ProfileError> {
    let sync = |d: &Device| d.sync().map_err(|e| ProfileError::Device(e.to_string()));
    let time = |rows: usize| -> Result<(f64, f64), ProfileError> {
        let tensor = Tensor::<3>::random([1, rows, hidden], Distribution::Uniform(-1.0, 1.0), from);
        let bytes = (rows * hidden * tensor.dtype().size()) as f64;
        sync(from)?;
        let mut samples = Vec::with_capacity(repeats);
        for run in 0..=repeats.max(1) {
            let started = Instant::now();
            let moved = tensor.clone().to_device(to);
            sync(to)?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            drop(moved);
            if run > 0 {
                samples.push(ms);
            }
        }
        Ok((bytes, super::fit::median(samples)))
    };
    let (small_bytes, small_ms) = time(1)?;
    let (large_bytes, large_ms) = time(tokens.max(2))?;
    let slope = ((large_ms - small_ms) / (large_bytes - small_bytes)).max(0.0);
    let latency_ms = (small_ms - slope * small_bytes).max(0.0);
    Ok(LinkProfile { latency_ms, ms_per_byte: slope })
}
