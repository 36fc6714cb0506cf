//! Each device's costs for the predictions, measured as `--stage-layers auto` measures them:
//! the per-device profiler (`burn_llm::parallel::profiler::device_profile`: the checkpoint's
//! first layers, timed back to back, embeddings and head loaded onto the device as stored,
//! cached per device, model and dtype) over a grid reaching the benchmark's prompt lengths, and
//! the measured link from each stage's device to the next (`measure_link`).

use std::path::Path;

use burn::tensor::Device;
use burn_llm::models::{DecoderSpec, PretrainedFiles};
use burn_llm::parallel::profiler::{
    LinkProfile, ProfileGrid, ProfileIdentity, ProfileWeights, device_profile, measure_link,
};
use burn_llm::plan::profile::Profile;

use super::predict::DeviceCost;

/// The profiler's grid for this benchmark: prefill slices up to `max_tokens` at batch 1 with
/// contexts below it (TeraPipe's `t_fwd(i, j)`), decode steps of one sequence.
pub fn grid(max_tokens: usize) -> ProfileGrid {
    let cap = max_tokens.max(16);
    ProfileGrid {
        prefill_batch: vec![1],
        prefill_tokens: [1, 16, 64, 256, 1024, 2048].into_iter().filter(|&t| t <= cap).collect(),
        prefill_context: [64, 256, 1024].into_iter().filter(|&c| c < cap).collect(),
        decode_batch: vec![1],
        decode_context: vec![0, 64, 256],
        warmup: 1,
        repeats: 3,
    }
}

/// The profile of `device`, named `name` (its `--devices` entry; `threads` tells devices of one
/// kind apart in the cache), cached in `cache_dir`.
pub fn profile_device(
    files: &PretrainedFiles,
    model_name: &str,
    (name, device): (&str, &Device),
    threads: usize,
    grid: &ProfileGrid,
    cache_dir: &Path,
) -> Result<Profile, Box<dyn std::error::Error>> {
    let identity = ProfileIdentity {
        device: format!("{name} ({threads} threads)"),
        model: model_name.to_string(),
        dtype: "gguf blocks, 8-bit input rows".into(),
    };
    let weights = ProfileWeights::Checkpoint { source: &files.files, quant: None };
    let mut log = Vec::new();
    let profiled = device_profile(&files.spec, weights, device, &identity, grid, Some(cache_dir), None, &mut log)
        .map_err(|e| format!("profiling {name}: {e}"))?;
    eprint!("{}", String::from_utf8_lossy(&log));
    Ok(profiled.profile)
}

/// The stages' devices in pipeline order, each with its profile (from `profiled`, by name) and
/// the measured link to the next.
pub fn pipeline(
    spec: &DecoderSpec,
    stages: &[(String, Device)],
    profiled: &[(String, Profile)],
) -> Result<Vec<DeviceCost>, Box<dyn std::error::Error>> {
    let mut out = Vec::with_capacity(stages.len());
    for (i, (name, device)) in stages.iter().enumerate() {
        let profile = profiled.iter().find(|(n, _)| n == name).map(|(_, p)| p.clone());
        let profile = profile.ok_or_else(|| format!("{name} was not profiled"))?;
        let link: Option<LinkProfile> = match stages.get(i + 1) {
            Some((next_name, next)) => Some(
                measure_link(device, next, spec.hidden_size, 256, 5)
                    .map_err(|e| format!("measuring the link {name} → {next_name}: {e}"))?,
            ),
            None => None,
        };
        out.push(DeviceCost::new(name, profile, link, spec)?);
    }
    Ok(out)
}
