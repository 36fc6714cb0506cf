//! The planner's cost profile of a model on its device, measured here because only the facade
//! sees both the profiler (`burn_parallel::profiler`, the model's layers) and the paged engine
//! (whose measured steps the profile's `engine_step_ms` and `engine_step` hold).
//!
//! [`time_engine_steps`] times real paged-engine steps: for each point of an [`EngineStepGrid`],
//! an engine over the model runs one prefill step of `batch` prompts, then `decode_steps` decode
//! steps of the same sequences (ExeGPT's phased schedule keeps the two apart). Every timed step
//! goes to [`fit::engine_steps`] (the decode steps at their middle context): the profile's
//! `engine_step_ms` tables of each point's median (what the XSimulator reads on one device), its
//! linear `engine_step` overhead, and its `step_variation`, the 99th-percentile spread of each
//! run's steps (its prefill; its decode steps together) about those medians, which the planner
//! adds to its latency (ExeGPT §7.9).
//! [`load_or_profile`] reads a cached profile or measures one (layers, then engine steps) and
//! writes it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use burn_llm_models::{CausalLm, Prompt, SamplingParams};
use burn_paged::{EngineConfig, EngineStats, KvCacheMemory, LlmEngine, SchedulingPolicy};
use burn_parallel::profiler::fit::{self, StepKind, StepSample};
use burn_parallel::profiler::{self, EngineStepGrid, ProfileGrid};
use burn_plan::profile::Profile;

use super::{PlanError, read_profile};

/// Largest batch the start-up profile measures; larger batches are extrapolated.
const MAX_PROFILED_BATCH: usize = 32;
/// Tokens per KV block of the timing engines.
const BLOCK_SIZE: usize = 16;

/// Times the paged engine's steps of `model` over `grid` (see the module docs). Points whose
/// prompt and decode steps exceed the model's positions, or whose prefill exceeds the engine's
/// token budget, are skipped. The timed runs go round the points (every point's first run, then
/// every point's second, …) after each point's warm-up: a slow stretch of the machine then
/// lands on one run of many points, where the medians discard it and the runs' spread counts
/// it, instead of on every run of one point, whose median it would become.
pub fn time_engine_steps(model: &CausalLm, grid: &EngineStepGrid) -> Result<Vec<StepSample>, PlanError> {
    let spec = model.spec();
    let token_budget = spec.max_positions.max(2048);
    let points: Vec<(usize, usize)> = grid
        .batch
        .iter()
        .flat_map(|&batch| grid.prompt_tokens.iter().map(move |&tokens| (batch, tokens)))
        .filter(|&(batch, tokens)| {
            batch > 0
                && tokens > 0
                && tokens + grid.decode_steps <= spec.max_positions
                && batch * tokens <= token_budget
        })
        .collect();
    if points.is_empty() {
        return Err(PlanError::Profile(format!(
            "no engine step of the grid fits the model's {} positions: give shorter prompts",
            spec.max_positions
        )));
    }
    for &(batch, tokens) in &points {
        for _ in 0..grid.warmup {
            run_once(model, batch, tokens, grid.decode_steps)?;
        }
    }
    let mut samples = Vec::new();
    for run in 0..grid.repeats.max(1) {
        for &(batch, tokens) in &points {
            let (times, _) = run_once(model, batch, tokens, grid.decode_steps)?;
            // The decode steps run at contexts `tokens ..= tokens + decode_steps − 1`.
            let context = tokens + grid.decode_steps.saturating_sub(1) / 2;
            samples.push(StepSample { kind: StepKind::Prefill, batch, tokens, context: 0, ms: times[0], run });
            samples.extend(times[1..].iter().map(|&ms| StepSample {
                kind: StepKind::Decode,
                batch,
                tokens: 1,
                context,
                ms,
                run,
            }));
        }
    }
    Ok(samples)
}

/// One prefill of `batch` distinct prompts of `tokens` tokens, then `decode_steps` decode steps:
/// each step's milliseconds (`engine.step()` returns once the sampled tokens are on the host) and
/// the engine's counters.
/// The prompts differ from their first token and the prefix cache is off, so the prefill
/// computes every prompt, as a batch of users' prompts needs.
fn run_once(
    model: &CausalLm,
    batch: usize,
    tokens: usize,
    decode_steps: usize,
) -> Result<(Vec<f64>, EngineStats), PlanError> {
    let blocks = 2 * batch * (tokens + decode_steps + 1).div_ceil(BLOCK_SIZE) + 8;
    let config = EngineConfig {
        block_size: BLOCK_SIZE,
        kv_cache_memory: KvCacheMemory::Blocks(blocks),
        max_num_seqs: batch,
        scheduling: SchedulingPolicy::Phased {
            encode_batch: batch,
            decode_batch: batch,
            decode_iterations: decode_steps + 1,
        },
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut engine = LlmEngine::from_parts(model.clone(), None, vec![], config)?;
    let vocab = model.spec().vocab_size;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(decode_steps + 1) };
    for i in 0..batch {
        engine.add_request(i.to_string(), Prompt::Ids(profiler::probe_prompt(tokens, vocab, i)), params.clone())?;
    }
    let mut times = Vec::with_capacity(decode_steps + 1);
    for _ in 0..=decode_steps {
        let started = Instant::now();
        engine.step()?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok((times, engine.stats()))
}

/// Times `model`'s paged-engine steps over `grid` and sets `profile`'s `engine_step_ms` and
/// `engine_step` from them.
pub fn engine_steps(model: &CausalLm, profile: &mut Profile, grid: &EngineStepGrid) -> Result<(), PlanError> {
    let samples = time_engine_steps(model, grid)?;
    fit::engine_steps(profile, &samples).map_err(burn_plan::schedule::ScheduleError::from)?;
    Ok(())
}

/// Measures `model`'s profile on its device for an engine of at most `max_num_seqs` sequences:
/// its layers over [`ProfileGrid::serving`], then its engine steps over
/// [`EngineStepGrid::serving`] (batches beyond 32 are extrapolated). Progress and the time it
/// took go to `log`.
pub fn measure_profile(model: &CausalLm, max_num_seqs: usize, log: &mut dyn Write) -> Result<Profile, PlanError> {
    let max_batch = max_num_seqs.clamp(1, MAX_PROFILED_BATCH);
    let spec = model.spec();
    let device = model.device();
    let started = Instant::now();
    let _ = writeln!(log, "profiling the model's layers for the ExeGPT planner (batches up to {max_batch}) ...");
    let mut profile = profiler::profile(spec, &device, &ProfileGrid::serving(max_batch), None)?;
    let _ = writeln!(log, "  layers in {:.1} s; timing paged-engine steps ...", started.elapsed().as_secs_f64());
    engine_steps(model, &mut profile, &EngineStepGrid::serving(max_batch))?;
    profile.model = Some(format!("{} layers, hidden {}", spec.num_layers, spec.hidden_size));
    let _ = writeln!(log, "  profiled in {:.1} s", started.elapsed().as_secs_f64());
    Ok(profile)
}

/// `path`'s profile when it exists (checked against `model`), else a profile measured now
/// ([`measure_profile`]) and written to `path` when one is given, for the next run.
pub fn load_or_profile(
    path: Option<&Path>,
    model: &CausalLm,
    max_num_seqs: usize,
    log: &mut dyn Write,
) -> Result<Profile, PlanError> {
    if let Some(path) = path.filter(|p| p.exists()) {
        let profile = read_profile(path)?;
        check_layers(&profile, model.spec().num_layers, path)?;
        return Ok(profile);
    }
    let profile = measure_profile(model, max_num_seqs, log)?;
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(&profile).map_err(|e| PlanError::Profile(e.to_string()))?;
        // Written whole through a temporary file, so a cut-off run leaves no half profile.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text + "\n")
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| PlanError::Write { path: path.to_owned(), source })?;
        let _ = writeln!(log, "  wrote the profile to {}", path.display());
    }
    Ok(profile)
}

/// An error unless `profile` was measured for a model of `layers` layers.
pub fn check_layers(profile: &Profile, layers: usize, path: &Path) -> Result<(), PlanError> {
    if profile.layers == layers {
        return Ok(());
    }
    Err(PlanError::Profile(format!(
        "{} profiles a model of {} layers but this one has {layers}: delete it to measure this model, or give another",
        path.display(),
        profile.layers
    )))
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;
    use burn_llm_models::DecoderSpec;

    use super::*;

    /// A timed prefill of a batch computes every prompt of it: none is read from the prefix
    /// cache, as none of a batch of users' prompts would be.
    #[test]
    fn a_timed_prefill_computes_every_prompt_of_its_batch() {
        let config = r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}"#;
        let spec = DecoderSpec::from_json(config, Path::new("tiny")).unwrap();
        let model = CausalLm::random(spec, &Device::flex()).unwrap();
        let (batch, tokens, decode_steps) = (3, 2 * BLOCK_SIZE, 2);
        let (times, stats) = run_once(&model, batch, tokens, decode_steps).unwrap();
        assert_eq!(times.len(), decode_steps + 1);
        assert_eq!(stats.cached_tokens, 0, "{stats:?}");
        assert_eq!(stats.computed_tokens, batch * (tokens + decode_steps), "{stats:?}");
    }
}
