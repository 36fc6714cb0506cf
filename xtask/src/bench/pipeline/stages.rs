//! Part (a): Alpa's automatic stages (`--stage-layers auto`) against an even split on an unequal
//! pair of devices. Each split runs the paged engine over the pair and is measured three ways,
//! each against its prediction from the devices' profiles ([`predict`](super::predict)):
//! - a decode step of one sequence: every stage in turn, `Σ_s t_s`;
//! - a decode step of `batch` sequences in `batch` micro-batches of one, the stages working on
//!   different micro-batches at once: `Σ_s t_s + (batch − 1)·(max_s t_s + κ·(Σ_s t_s − max_s t_s))`
//!   with the devices' interference `κ` measured on that split, each device running its stage's
//!   layers (`burn_llm::spec::split_interference`, what `--stage-layers auto` prices its chosen
//!   split with), so that the measured bottleneck stage is `(step(batch) − step(1)) ÷ (batch − 1)`;
//! - one prompt's prefill, unsliced: `Σ_s t_s` of the prompt.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use burn_llm::models::{Prompt, SamplingParams};
use burn_llm::paged::KvCacheMemory;
use burn_llm::parallel::pipeline::StagePrediction;
use burn_llm::parallel::profiler::{Interference, OverlapStep};
use burn_llm::spec::{PagedSpec, ParallelSpec, PrefillSlices};
use burn_llm::{Engine, EngineKind, EngineSpec, Purpose};
use rand::SeedableRng;
use serde::Serialize;

use super::drive::{self, Request};
use super::predict::{self, DeviceCost, Versus, Work};

/// Measures the devices' interference on a split (each device's layer count, in order).
pub type SplitInterference<'a> = dyn FnMut(&[usize]) -> Result<Interference, Box<dyn std::error::Error>> + 'a;

/// Part (a)'s settings.
#[derive(Debug, Clone, Serialize)]
pub struct StagesWorkload {
    /// Sequences of the micro-batched decode step (one micro-batch each).
    pub batch: usize,
    /// The decoding sequences' prompt length.
    pub prompt: usize,
    /// Decode steps timed per run (the median is kept).
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
    /// Predicted time of each stage for one sequence's decode step, and for the prompt.
    pub decode_stage_ms: Vec<f64>,
    pub prompt_stage_ms: Vec<f64>,
    /// The slowest stage of a decode step: predicted, and measured from the micro-batched step.
    pub decode_bottleneck: Versus,
    /// Predicted slowest stage of the prompt's prefill.
    pub prompt_bottleneck_ms: f64,
    /// The devices' interference measured on this split (each running its stage's layers).
    pub interference: Interference,
    /// Where the decode predictions come from: the planner's own (`--stage-layers auto`: the
    /// stage times and `κ` it split with, measured at the engine's start-up, right before the
    /// split runs), or the bench's device profiles and `interference`.
    pub decode_predicted_by: String,
    /// The `κ` the decode predictions use.
    pub decode_kappa: f64,
    /// One sequence's decode step, `batch` sequences' micro-batched step, the prompt's prefill.
    pub decode_step: Versus,
    pub batch_step: Versus,
    pub prompt: Versus,
}

/// Part (a)'s result.
#[derive(Debug, Clone, Serialize)]
pub struct StagesResult {
    pub devices: Vec<String>,
    /// What makes the devices unequal.
    pub unequal: String,
    pub workload: StagesWorkload,
    /// The devices' interference on equal shares, what `--stage-layers auto` plans with first.
    pub interference: Interference,
    /// Even split first, then auto.
    pub rows: Vec<SplitRow>,
}

/// What one split measured, in milliseconds: medians of a one-sequence decode step, a
/// micro-batched decode step and the prompt's prefill.
struct Measured {
    step: f64,
    batch_step: f64,
    prompt: f64,
}

/// Runs the even split and `--stage-layers auto` over `costs`' devices (their `--devices`
/// entries, in order).
pub fn run(
    model: &Path,
    vocab: usize,
    costs: &[DeviceCost],
    token: &str,
    workload: &StagesWorkload,
    unequal: &str,
    split_interference: &mut SplitInterference<'_>,
) -> Result<StagesResult, Box<dyn std::error::Error>> {
    let names: Vec<String> = costs.iter().map(|c| c.name.clone()).collect();
    let layers = costs.first().map_or(0, |c| c.profile.layers);
    let shares = vec![OverlapStep::decode_share(layers, costs.len()).layers; costs.len()];
    let interference = split_interference(&shares)?;
    let profile_dir = std::env::temp_dir().join(format!("burn-llm-bench-stage-profiles-{}", std::process::id()));
    let w = workload;
    let mut rows = Vec::new();
    for (label, stage_layers) in [("even split", None), ("auto (Alpa)", Some("auto".to_string()))] {
        let kv_tokens = w.batch * (w.prompt + w.steps + 8) + w.long_prompt + 64;
        let spec = EngineSpec {
            engine: Some(EngineKind::Paged),
            worker_token: Some(token.to_string()),
            paged: PagedSpec {
                block_size: Some(16),
                kv_cache_memory: Some(KvCacheMemory::Blocks(kv_tokens.div_ceil(16) + 16)),
                max_num_batched_tokens: Some(w.long_prompt.max(w.batch * w.prompt) + 16),
                no_enable_prefix_caching: true,
                no_chunked_prefill: true,
                ..PagedSpec::default()
            },
            parallel: ParallelSpec {
                devices: Some(names.clone()),
                // Profiled afresh, as the predictions' profiles are: a profile cached by an earlier
                // run (another load, another CPU) would plan from other costs.
                stage_profile_dir: stage_layers.is_some().then(|| profile_dir.clone()),
                stage_layers,
                micro_batches: Some(w.batch),
                prefill_slices: Some(PrefillSlices::Off),
                ..ParallelSpec::default()
            },
            ..EngineSpec::default()
        };
        let mut log = Vec::new();
        let mut engine = spec.init(model, Purpose::Serve, &mut log)?;
        let plan_log = crate::report::home_relative(String::from_utf8_lossy(&log).trim());
        let placement = engine.placement().unwrap_or_default();
        let layout = predict::layout_of(&placement)
            .ok_or_else(|| format!("{label}: the engine reports no stages (placement: `{placement}`)"))?;
        let m = measure(engine.as_mut(), vocab, w)?;
        let counts: Vec<usize> = layout.iter().map(|r| r.len()).collect();
        let own = if counts == shares { interference.clone() } else { split_interference(&counts)? };
        let context = (w.prompt + w.steps / 2) as f64;
        // Auto stages are judged against what the planner predicted for the split it chose; the
        // even split, which no planner chose, against the bench's profiles.
        let (decode_stage_ms, kappa, decode_predicted_by) = match planned(engine.as_ref()) {
            Some(p) => (
                p.stages.iter().map(|s| s.decode_step_ms).collect(),
                p.interference,
                "the planner's own prediction (its stage times and κ, measured at start-up)".to_string(),
            ),
            None => (
                predict::stage_ms(costs, &layout, Work::Decode { batch: 1, context }),
                own.kappa,
                "the bench's device profiles, κ on the split".to_string(),
            ),
        };
        let prompt_stage_ms = predict::stage_ms(costs, &layout, Work::Prefill { tokens: w.long_prompt, context: 0.0 });
        let measured_bottleneck = (m.batch_step - m.step) / (w.batch.max(2) - 1) as f64;
        let row = SplitRow {
            split: label.to_string(),
            stage_layers: ranges(&layout),
            plan_log,
            decode_bottleneck: Versus::new(Interference::interval_ms(&decode_stage_ms, kappa), measured_bottleneck),
            prompt_bottleneck_ms: predict::max(&prompt_stage_ms),
            decode_step: Versus::new(Interference::pipelined_ms(&decode_stage_ms, 1, kappa), m.step),
            batch_step: Versus::new(Interference::pipelined_ms(&decode_stage_ms, w.batch, kappa), m.batch_step),
            prompt: Versus::new(Interference::pipelined_ms(&prompt_stage_ms, 1, kappa), m.prompt),
            interference: own,
            decode_predicted_by,
            decode_kappa: kappa,
            decode_stage_ms,
            prompt_stage_ms,
        };
        eprintln!(
            "stages: {label:11} layers {:?}: step {:.1} ms (predicted {:.1}), {} micro-batches {:.1} ms (predicted {:.1}), prompt {:.0} ms (predicted {:.0})",
            row.stage_layers,
            row.decode_step.measured_ms,
            row.decode_step.predicted_ms,
            w.batch,
            row.batch_step.measured_ms,
            row.batch_step.predicted_ms,
            row.prompt.measured_ms,
            row.prompt.predicted_ms
        );
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&profile_dir);
    Ok(StagesResult { devices: names, unequal: unequal.to_string(), workload: workload.clone(), interference, rows })
}

/// The planner's prediction of the engine's stages (`--stage-layers auto`), from its plan.
fn planned(engine: &dyn Engine) -> Option<StagePrediction> {
    serde_json::from_value(engine.placement_plan()?.get("predicted")?.clone()).ok()
}

/// Measures one split (see [`Measured`]); a first run warms the devices up.
fn measure(engine: &mut dyn Engine, vocab: usize, w: &StagesWorkload) -> Result<Measured, Box<dyn std::error::Error>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let decoders: Vec<Request> = (0..w.batch)
        .map(|_| Request { prompt: drive::random_prompt(w.prompt, vocab, &mut rng), output: w.steps + 1, at_step: 0 })
        .collect();
    let decode_steps = |engine: &mut dyn Engine, requests: &[Request]| -> Result<f64, Box<dyn std::error::Error>> {
        // Step 0 prefills every prompt; the rest are decode steps.
        let trace = drive::run(engine, requests)?;
        let steps: Vec<f64> = trace.steps_s.iter().skip(1).map(|s| s * 1e3).collect();
        Ok(drive::median(&steps))
    };
    decode_steps(engine, &decoders[..1])?;
    let step = decode_steps(engine, &decoders[..1])?;
    let batch_step = decode_steps(engine, &decoders)?;
    let mut prompts = Vec::new();
    for _ in 0..w.repeats {
        prompts.push(first_token_ms(engine, drive::random_prompt(w.long_prompt, vocab, &mut rng))?);
    }
    Ok(Measured { step, batch_step, prompt: drive::median(&prompts) })
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

/// Layer ranges as `--stage-layers` writes them (inclusive).
pub fn ranges(layout: &[Range<usize>]) -> Vec<String> {
    layout.iter().map(|r| format!("{}-{}", r.start, r.end - 1)).collect()
}
