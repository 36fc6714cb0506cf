//! Part (a): Alpa's automatic stages (`--stage-layers auto`) against an even split on an unequal
//! pair of devices. Each split runs the paged engine over the pair: a decode step of `batch`
//! sequences in one micro-batch per stage, and one prompt's prefill (unsliced), each measured and
//! predicted from the devices' profiles ([`predict`](super::predict)).

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use burn_llm::models::{Prompt, SamplingParams};
use burn_llm::paged::KvCacheMemory;
use burn_llm::spec::{PagedSpec, ParallelSpec};
use burn_llm::{Engine, EngineKind, EngineSpec, Purpose};
use rand::SeedableRng;
use serde::Serialize;

use super::drive::{self, Request};
use super::predict::{self, DeviceCost, Versus, Work};

/// Part (a)'s settings.
#[derive(Debug, Clone, Serialize)]
pub struct StagesWorkload {
    /// Sequences decoding together.
    pub batch: usize,
    /// Their prompt length.
    pub prompt: usize,
    /// Decode steps timed (the median is kept).
    pub steps: usize,
    /// The prompt whose prefill is timed.
    pub long_prompt: usize,
    /// Times that prompt is prefilled (the median is kept).
    pub repeats: usize,
}

/// One split's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SplitRow {
    pub split: String,
    /// Layers of each stage (`0-11`, …).
    pub stage_layers: Vec<String>,
    /// The plan as the engine printed it at build.
    pub plan_log: String,
    /// Predicted time of each stage for one decode micro-batch, and for the prompt.
    pub decode_stage_ms: Vec<f64>,
    pub prompt_stage_ms: Vec<f64>,
    /// Predicted slowest stage of a decode micro-batch and of the prompt.
    pub decode_bottleneck_ms: f64,
    pub prompt_bottleneck_ms: f64,
    /// The whole decode step (micro-batches = stages) and the whole prompt's prefill.
    pub decode_step: Versus,
    pub prompt: Versus,
}

/// Part (a)'s result.
#[derive(Debug, Clone, Serialize)]
pub struct StagesResult {
    pub devices: Vec<String>,
    /// What makes the devices unequal.
    pub unequal: String,
    pub workload: StagesWorkload,
    /// Even split first, then auto.
    pub rows: Vec<SplitRow>,
}

/// Runs the even split and `--stage-layers auto` over `devices` (names as `--devices` entries,
/// with their profiles in `costs`).
pub fn run(
    model: &Path,
    hidden: usize,
    vocab: usize,
    costs: &[DeviceCost],
    token: &str,
    workload: &StagesWorkload,
    unequal: &str,
) -> Result<StagesResult, Box<dyn std::error::Error>> {
    let names: Vec<String> = costs.iter().map(|c| c.name.clone()).collect();
    let mut rows = Vec::new();
    for (label, stage_layers) in [("even split", None), ("auto (Alpa)", Some("auto".to_string()))] {
        let spec = EngineSpec {
            engine: Some(EngineKind::Paged),
            worker_token: Some(token.to_string()),
            paged: PagedSpec {
                block_size: Some(16),
                kv_cache_memory: Some(KvCacheMemory::Blocks(
                    (workload.batch * (workload.prompt + workload.steps + 8) + workload.long_prompt * 2).div_ceil(16)
                        + 16,
                )),
                max_num_batched_tokens: Some(workload.long_prompt.max(workload.batch * workload.prompt) + 16),
                no_enable_prefix_caching: true,
                no_chunked_prefill: true,
                ..PagedSpec::default()
            },
            parallel: ParallelSpec {
                devices: Some(names.clone()),
                stage_layers,
                prefill_slices: Some("off".into()),
                ..ParallelSpec::default()
            },
            ..EngineSpec::default()
        };
        let mut log = Vec::new();
        let mut engine = spec.init(model, Purpose::Serve, &mut log)?;
        let plan_log = String::from_utf8_lossy(&log).trim().to_string();
        let placement = engine.placement().unwrap_or_default();
        let layout = predict::layout_of(&placement)
            .ok_or_else(|| format!("{label}: the engine reports no stages (placement: `{placement}`)"))?;
        let (step_ms, prompt_ms) = measure(engine.as_mut(), vocab, workload)?;
        let micro = layout.len();
        let per_micro = workload.batch.div_ceil(micro);
        let context = workload.prompt + workload.steps / 2;
        let decode_stage_ms = predict::stage_ms(costs, &layout, hidden, Work::Decode { batch: per_micro, context });
        let prompt_stage_ms =
            predict::stage_ms(costs, &layout, hidden, Work::Prefill { tokens: workload.long_prompt, context: 0 });
        let row = SplitRow {
            split: label.to_string(),
            stage_layers: ranges(&layout),
            plan_log,
            decode_bottleneck_ms: max(&decode_stage_ms),
            prompt_bottleneck_ms: max(&prompt_stage_ms),
            decode_step: Versus::new(predict::pipelined_ms(&decode_stage_ms, micro), step_ms),
            prompt: Versus::new(predict::pipelined_ms(&prompt_stage_ms, 1), prompt_ms),
            decode_stage_ms,
            prompt_stage_ms,
        };
        eprintln!(
            "stages: {label:11} layers {:?}: decode step {:.1} ms (predicted {:.1}), prompt {:.0} ms (predicted {:.0})",
            row.stage_layers,
            row.decode_step.measured_ms,
            row.decode_step.predicted_ms,
            row.prompt.measured_ms,
            row.prompt.predicted_ms
        );
        rows.push(row);
    }
    Ok(StagesResult { devices: names, unequal: unequal.to_string(), workload: workload.clone(), rows })
}

/// The median decode step of `batch` sequences (every sequence running), and the median time of
/// the prompt's prefill to its first token, in milliseconds.
fn measure(
    engine: &mut dyn Engine,
    vocab: usize,
    w: &StagesWorkload,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let decoders: Vec<Request> = (0..w.batch)
        .map(|_| Request { prompt: drive::random_prompt(w.prompt, vocab, &mut rng), output: w.steps + 2, at_step: 0 })
        .collect();
    // A first run warms the devices up; the second's steps after the prefill are decode steps.
    drive::run(engine, &decoders[..1])?;
    let trace = drive::run(engine, &decoders)?;
    let decode_steps: Vec<f64> = trace.steps_s.iter().skip(1).map(|s| s * 1e3).collect();
    let mut prompts = Vec::new();
    for _ in 0..w.repeats {
        let prompt = drive::random_prompt(w.long_prompt, vocab, &mut rng);
        prompts.push(first_token_ms(engine, prompt)?);
    }
    Ok((drive::median(&decode_steps), drive::median(&prompts)))
}

/// Milliseconds from adding one request of `prompt` on an idle engine to its first token.
pub fn first_token_ms(engine: &mut dyn Engine, prompt: Vec<u32>) -> Result<f64, Box<dyn std::error::Error>> {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(1) };
    let started = Instant::now();
    engine.add_request("first-token", Prompt::Ids(prompt), params)?;
    let mut first = None;
    while engine.has_unfinished_requests() {
        let outputs = engine.step()?;
        if first.is_none() && outputs.iter().any(|o| o.sequences.iter().any(|d| !d.token_ids.is_empty())) {
            first = Some(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    first.ok_or_else(|| "the request finished without a token".into())
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

/// Layer ranges as `--stage-layers` writes them (inclusive).
pub fn ranges(layout: &[Range<usize>]) -> Vec<String> {
    layout.iter().map(|r| format!("{}-{}", r.start, r.end - 1)).collect()
}
