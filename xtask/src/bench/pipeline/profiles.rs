//! Each device's costs for the predictions: the Burn profiler's per-layer tables on that device
//! (`burn_llm::parallel::profiler::profile`, one layer of the model's shape), and the measured
//! rate of the link to the next stage's device (a residual-stream-sized tensor moved with
//! `to_device` and read back).

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm::models::DecoderSpec;
use burn_llm::parallel::plan::profile::CostModel;
use burn_llm::parallel::profiler::{ProfileGrid, profile};

use super::predict::DeviceCost;
use crate::report::percentile;

/// The profiler's grid for this benchmark: prefill slices up to `max_tokens` at batch 1, contexts
/// up to the longest prompt, decode batches up to `max_batch`.
pub fn grid(max_tokens: usize, max_batch: usize) -> ProfileGrid {
    let tokens: Vec<usize> = [16, 64, 256, 1024, 2048].into_iter().filter(|&t| t <= max_tokens.max(16)).collect();
    let context: Vec<usize> = [256, 1024].into_iter().filter(|&c| c < max_tokens.max(257)).collect();
    let decode_batch: Vec<usize> = [1, 2, 4, 8, 16].into_iter().filter(|&b| b <= max_batch.max(1)).collect();
    ProfileGrid {
        prefill_batch: vec![1],
        prefill_tokens: tokens,
        prefill_context: context,
        decode_batch,
        decode_context: vec![0, 64, 256],
        warmup: 1,
        repeats: 3,
    }
}

/// The profile of `device` (named `name` in reports and errors).
pub fn profile_device(
    spec: &DecoderSpec,
    name: &str,
    device: &Device,
    grid: &ProfileGrid,
) -> Result<CostModel, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let mut measured = profile(spec, device, grid, None).map_err(|e| format!("profiling {name}: {e}"))?;
    measured.device = Some(name.to_string());
    let cost = measured.cost_model("profile")?;
    eprintln!(
        "profiled {name} in {:.1} s: decode layer {:.2} ms (batch 1), prefill layer {:.1} ms (256 tokens)",
        started.elapsed().as_secs_f64(),
        cost.decode_layer_ms(1.0, 0.0),
        cost.prefill_layer_ms(1.0, 256.0, 0.0)
    );
    Ok(cost)
}

/// The stages' devices in pipeline order, each with its profile (from `profiled`, by name) and the
/// measured link to the next.
pub fn pipeline(
    stages: &[(String, Device)],
    profiled: &[(String, CostModel)],
    hidden: usize,
) -> Result<Vec<DeviceCost>, Box<dyn std::error::Error>> {
    let mut out = Vec::with_capacity(stages.len());
    for (i, (name, device)) in stages.iter().enumerate() {
        let cost = profiled.iter().find(|(n, _)| n == name).map(|(_, c)| c.clone());
        let cost = cost.ok_or_else(|| format!("{name} was not profiled"))?;
        let link_ms_per_byte = match stages.get(i + 1) {
            Some((_, next)) => link_ms_per_byte(device, next, hidden)?,
            None => 0.0,
        };
        out.push(DeviceCost { name: name.clone(), cost, link_ms_per_byte });
    }
    Ok(out)
}

/// Milliseconds per byte of moving a 256-row residual stream from `from` to `to` (median of 5,
/// after one untimed move; each move read back on `to`, so it is complete when the clock stops).
fn link_ms_per_byte(from: &Device, to: &Device, hidden: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let rows = 256;
    let bytes = (rows * hidden * 4) as f64;
    let mut times = Vec::new();
    for run in 0..6 {
        let x = Tensor::<2>::random([rows, hidden], Distribution::Uniform(-1.0, 1.0), from);
        x.clone().into_data();
        let started = Instant::now();
        let moved = x.to_device(to);
        moved.into_data();
        if run > 0 {
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(percentile(&times, 50.0) / bytes)
}
