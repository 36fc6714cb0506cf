//! Each model with traffic timed as the placement would run it, for the simulator's price of
//! one-device groups and of two-stage groups
//! ([`burn_parallel::plan::placement::MeasuredPipeline`]).
//!
//! AlpaServe's simulator takes a parallel configuration's latencies from profiling that
//! configuration. The per-layer profile prices a group as its layers' compute; serving adds what
//! the layers alone never see: the engine's own work each step (scheduling, sampling), on a worker
//! the operations' hand-over, and over a pipeline the hidden states handed between the devices
//! every step, the host driving both stages and the virtual engines taking turns on each device.
//! The layer profile is also cached from an earlier start, while these are timed now.
//!
//! - One device ([`measure_one_device`]): the model loaded whole on the pool's first device (a
//!   one-stage engine, as a replica runs), one request of the workload's shape timed alone.
//! - Two stages ([`measure`]): the model loaded as the placement would run it on a two-stage group
//!   (its layers split evenly, one virtual engine per stage, and two where its flags leave the
//!   count open: the faster kept), one request timed alone, then [`BURST`] started together, whose
//!   finishes come one interval apart once the pipeline is full.
//!   Where its engines step one sequence at a time (`--max-num-seqs 1`, as AlpaServe serves), the
//!   request's prefill is also timed alone, and the simulator serves the model step by step on
//!   two-stage groups ([`burn_parallel::plan::placement::measured_steps`]): each decode step is a
//!   pass of its own that queues behind other requests' prefills at every stage. With larger
//!   batches the engines batch what queues, which passes one by one do not price, and the
//!   one-pass price stays.
//!
//! Each with the model's own engine flags and prefix caching off (so that every request computes
//! its prompt); the engines are dropped before the placement loads anything.

use std::io::Write;
use std::time::Instant;

use burn_llm_models::{DecoderSpec, Prompt, SamplingParams};
use burn_parallel::plan::placement::{MeasuredPipeline, MeasuredSteps};
use burn_parallel::plan::serving::{DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, ServingWorkload};
use burn_parallel::profiler::{probe_ids, probe_prompt};

use super::super::ServerError;
use super::super::launch::ModelSpec;
use super::profiles::ModelCosts;
use super::{TwoStage, group_spec};
use crate::{Engine, Purpose};

/// Stages of the pipeline timed (groups of other sizes keep the layers' own prices).
pub(super) const STAGES: usize = 2;
/// Requests started together for the interval: `BURST − 1` intervals averaged, as one pair's
/// interval moves by half between runs on a host whose cores the stages share.
pub(super) const BURST: usize = 4;
/// Untimed runs before the timed ones.
pub(super) const WARMUP: usize = 1;
/// Timed runs of each kind: the fastest one request alone (the host's stalls only ever add to
/// it), the median burst (how the stages share the host is part of what it measures).
pub(super) const REPEATS: usize = 3;
/// How much faster than another a configuration timed here must run to be chosen over it: the
/// spread of the fastest (or median) of [`REPEATS`] runs, so that one noisy timing does not
/// decide.
pub(super) const SPREAD: f64 = 0.02;

/// The pipelines [`measure`] timed, and the virtual engines it chose.
pub(super) struct Timed {
    /// `(model, its pipeline measured)`.
    pub pipelines: Vec<(String, MeasuredPipeline)>,
    /// `(model, engines)` where two per stage served a burst faster than one.
    pub virtual_engines: Vec<(String, usize)>,
}

/// `(model, one request on one device)` for every model with traffic in `workload` that fits
/// `pool[0]`'s memory `cap` whole, timed there (the fastest of [`REPEATS`] runs); `timed`: a
/// model already timed so (by the devices' interference on replicas), `(name, ms)`.
pub(super) fn measure_one_device(
    models: &[ModelSpec],
    pool: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    cap: u64,
    timed: Option<&(String, f64)>,
    log: &mut dyn Write,
) -> Result<Vec<(String, MeasuredPipeline)>, ServerError> {
    let Some(device) = pool.first() else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for model in models.iter().filter(|m| workload.load(&m.name).is_some() && costs.model_bytes(&m.name) <= cap) {
        let (dir, arch) = costs.model(&model.name);
        let (prompt, tokens) = request_shape(workload, &model.name, arch);
        let fail = |e: &dyn std::fmt::Display| {
            ServerError::Engine(format!(
                "placement: timing `{}` on {device}: {e}; check that the device holds the model and that the worker runs",
                model.name
            ))
        };
        let alone = match timed.filter(|(name, _)| *name == model.name) {
            Some(&(_, ms)) => ms,
            None => {
                let spec = probe_spec(group_spec(
                    model,
                    vec![device.clone()],
                    &[[0, arch.num_layers]],
                    1,
                    TwoStage::default(),
                ));
                let mut engine = spec.init(dir, Purpose::Serve, &mut std::io::sink()).map_err(|e| fail(&e))?;
                let ids = [probe_ids(prompt, arch.vocab_size)];
                timed_runs_ms(engine.as_mut(), &ids, tokens).map_err(|e| fail(&e))?[0]
            }
        };
        let _ = writeln!(
            log,
            "placement: `{}` on {device} ({prompt} prompt tokens, {tokens} generated): one request {alone:.0} ms \
             (the layers' profile: {:.0} ms)",
            model.name,
            costs.request_ms(&model.name)
        );
        out.push((
            model.name.clone(),
            MeasuredPipeline { stages: 1, latency_ms: alone, interval_ms: alone, steps: None },
        ));
    }
    Ok(out)
}

/// `(model, its pipeline measured)` for every model with traffic in `workload`, timed over
/// `pool[0]` and `pool[1]`, prefilling in the chunks chosen for it (`(model, chunk tokens)`,
/// [`super::chunks`]); nothing for a pool of one device.
///
/// Where a model's flags leave its virtual engines open ([`engines_open`]), its pipeline is timed
/// with one engine per stage (vLLM's count) and with two, and two are kept where they serve the
/// burst more than [`SPREAD`] faster. With one engine per stage, a stage is idle while the engine
/// whose step it just passed on does its host work between steps (reading back, sampling,
/// scheduling, sending the next step's operations) unless another engine's step waits for it;
/// with engines that step a sequence or two at a time, as AlpaServe serves, that gap is a share
/// of every step. Each engine takes an even share of the model's KV budget, so two per stage are
/// tried only where that share builds (a byte budget must hold the full context).
pub(super) fn measure(
    models: &[ModelSpec],
    pool: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    chunk_tokens: &[(String, usize)],
    log: &mut dyn Write,
) -> Result<Timed, ServerError> {
    let mut timed = Timed { pipelines: Vec::new(), virtual_engines: Vec::new() };
    if pool.len() < STAGES {
        return Ok(timed);
    }
    let devices = pool[..STAGES].to_vec();
    for model in models.iter().filter(|m| workload.load(&m.name).is_some()) {
        let fail = |e: &dyn std::fmt::Display| {
            ServerError::Engine(format!(
                "placement: timing `{}` as a pipeline over {}: {e}; check that both devices hold half of it and that \
                 the workers run",
                model.name,
                devices.join(" → ")
            ))
        };
        let (dir, arch) = costs.model(&model.name);
        let (prompt, tokens) = request_shape(workload, &model.name, arch);
        let stages = super::even_stages(arch.num_layers, STAGES).map_err(|e| fail(&e))?;
        let chunk = super::chosen_for(chunk_tokens, &model.name);
        let spec_with =
            |engines| probe_spec(group_spec(model, devices.clone(), &stages, STAGES, TwoStage { chunk, engines }));
        let prompts: Vec<Vec<u32>> = (0..BURST).map(|r| probe_prompt(prompt, arch.vocab_size, r)).collect();
        let spec = spec_with(None);
        let one = time_pipeline(&spec, dir, &prompts, tokens).map_err(|e| fail(&e))?;
        let two = match engines_open(&model.spec) {
            true => match time_pipeline(&spec_with(Some(2 * STAGES)), dir, &prompts, tokens) {
                Ok(run) => Some(run),
                Err(e) => {
                    let _ = writeln!(log, "placement: `{}` keeps one virtual engine per stage: {e}", model.name);
                    None
                }
            },
            false => None,
        };
        let doubled = two.filter(|t| t.burst < one.burst * (1.0 - SPREAD));
        if let Some(two) = two {
            let _ = writeln!(
                log,
                "placement: `{}`'s burst of {BURST} over {}: one virtual engine per stage {:.0} ms, two {:.0} ms; it \
                 runs {} per stage on two-stage groups",
                model.name,
                devices.join(" → "),
                one.burst,
                two.burst,
                if doubled.is_some() { "two" } else { "one" }
            );
        }
        let (engines, run) = match doubled {
            Some(run) => (Some(2 * STAGES), run),
            None => (None, one),
        };
        let seats = engines.or(spec.parallel.virtual_engines).unwrap_or(1);
        let interval = ((run.burst - run.alone) / (BURST - 1) as f64).max(0.0);
        let steps = run.prefill.map(|prefill| MeasuredSteps {
            prefill_ms: prefill.min(run.alone),
            tokens,
            seats,
            burst: BURST,
            prefill_chunks: prefill_chunks(&spec, prompt),
        });
        let prefill = steps.as_ref().map(prefill_note).unwrap_or_default();
        let _ = writeln!(
            log,
            "placement: `{}` as a pipeline over {} ({prompt} prompt tokens, {tokens} generated): one request {:.0} ms\
             {prefill}, {BURST} started together {:.0} ms (each after the first adds {interval:.0} ms)",
            model.name,
            devices.join(" → "),
            run.alone,
            run.burst,
        );
        let measured = MeasuredPipeline { stages: STAGES, latency_ms: run.alone, interval_ms: interval, steps };
        timed.pipelines.push((model.name.clone(), measured));
        if let Some(n) = engines {
            timed.virtual_engines.push((model.name.clone(), n));
        }
    }
    Ok(timed)
}

/// Whether the placement chooses `spec`'s virtual engines on two-stage groups: no
/// `--virtual-engines` of its own, and a schedule without a plan (ExeGPT's sets the batches and
/// the devices' roles itself).
pub(super) fn engines_open(spec: &crate::spec::EngineSpec) -> bool {
    spec.parallel.virtual_engines.is_none() && spec.planless_policy().is_some()
}

/// One pipeline configuration timed: one request alone (the fastest run), `prompts` started
/// together (the median run) and, where its engines step one sequence at a time, the prefill
/// alone (the fastest), in ms.
#[derive(Debug, Clone, Copy)]
struct PipelineRun {
    alone: f64,
    burst: f64,
    prefill: Option<f64>,
}

/// [`PipelineRun`] of `spec`'s engine over `dir`'s model, each of `prompts` generating `tokens`.
fn time_pipeline(
    spec: &crate::spec::EngineSpec,
    dir: &std::path::Path,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Result<PipelineRun, Box<dyn std::error::Error>> {
    let one_at_a_time = spec.engine_config().max_num_seqs == 1;
    let mut engine = spec.init(dir, Purpose::Serve, &mut std::io::sink())?;
    // The three timings interleaved, round by round, so that a stretch of the host running slower
    // falls on all of them alike: the burst's interval and the prefill are read against the
    // request alone, and timed minutes apart they disagreed (a prefill alone slower than the
    // whole request).
    let (mut alone, mut burst, mut prefill) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..WARMUP + REPEATS {
        let one = requests_ms(engine.as_mut(), &prompts[..1], tokens)?;
        let all = requests_ms(engine.as_mut(), prompts, tokens)?;
        let first = one_at_a_time.then(|| requests_ms(engine.as_mut(), &prompts[..1], 1)).transpose()?;
        if round >= WARMUP {
            alone.push(one);
            burst.push(all);
            prefill.extend(first);
        }
    }
    let fastest = |runs: &[f64]| runs.iter().copied().fold(f64::INFINITY, f64::min);
    burst.sort_by(f64::total_cmp);
    Ok(PipelineRun {
        alone: fastest(&alone),
        burst: burst[burst.len() / 2],
        prefill: one_at_a_time.then(|| fastest(&prefill)),
    })
}

/// ` (its prefill N ms)` of a pipeline timed step by step, with the chunks it took if several.
pub(super) fn prefill_note(steps: &MeasuredSteps) -> String {
    let chunks = match steps.prefill_chunks {
        0 | 1 => String::new(),
        n => format!(" in {n} chunks"),
    };
    format!(" (its prefill {:.0} ms{chunks})", steps.prefill_ms)
}

/// The chunks `spec`'s engine prefills a prompt of `prompt` tokens in: one unless chunked
/// prefill is on and `--max-num-batched-tokens` is below the prompt (the engine's default budget
/// is at least the context, which every prompt fits).
fn prefill_chunks(spec: &crate::spec::EngineSpec, prompt: usize) -> usize {
    let config = spec.engine_config();
    match (config.chunked_prefill, config.max_num_batched_tokens) {
        (true, Some(budget)) if budget > 0 => prompt.div_ceil(budget).max(1),
        _ => 1,
    }
}

/// `spec` (a group's, [`super::group_spec`]) with prefix caching off, so that every timed request
/// computes its prompt.
pub(super) fn probe_spec(mut spec: crate::spec::EngineSpec) -> crate::spec::EngineSpec {
    spec.paged.no_enable_prefix_caching = true;
    spec
}

/// [`requests_ms`] of `prompts` run [`WARMUP`] times untimed, then [`REPEATS`] times timed:
/// the timed runs, fastest first.
pub(super) fn timed_runs_ms(
    engine: &mut dyn Engine,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut runs =
        (0..WARMUP + REPEATS).map(|_| requests_ms(engine, prompts, tokens)).collect::<Result<Vec<_>, _>>()?;
    let mut timed = runs.split_off(WARMUP);
    timed.sort_by(f64::total_cmp);
    Ok(timed)
}

/// The prompt tokens and generated tokens of one of `name`'s requests in `workload` (its
/// defaults where the workload gives none), fitted in the model's context.
pub(super) fn request_shape(workload: &ServingWorkload, name: &str, arch: &DecoderSpec) -> (usize, usize) {
    let shape = workload.load(name).map_or((DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS), |l| l.shape());
    let tokens = shape.1.max(1);
    (shape.0.clamp(1, arch.max_positions.saturating_sub(tokens).max(1)), tokens)
}

/// Milliseconds from adding one request per prompt (`tokens` new tokens each, EOS ignored) to the
/// last one finishing.
pub(super) fn requests_ms(
    engine: &mut dyn Engine,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(tokens) };
    let started = Instant::now();
    for (i, ids) in prompts.iter().enumerate() {
        engine.add_request(&format!("placement-probe-{i}"), Prompt::Ids(ids.clone()), params.clone())?;
    }
    while engine.has_unfinished_requests() {
        engine.step()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_timed_in_the_chunks_its_engine_prefills_it_in() {
        let mut spec = crate::spec::EngineSpec::default();
        // The default budget holds every prompt that fits the context.
        assert_eq!(prefill_chunks(&spec, 256), 1);
        spec.paged.max_num_batched_tokens = Some(64);
        assert_eq!(prefill_chunks(&spec, 256), 4);
        assert_eq!(prefill_chunks(&spec, 200), 4, "the last chunk is partial");
        assert_eq!(prefill_chunks(&spec, 64), 1);
        let steps = MeasuredSteps { prefill_ms: 400.4, tokens: 4, seats: 2, burst: 4, prefill_chunks: 4 };
        assert_eq!(prefill_note(&steps), " (its prefill 400 ms in 4 chunks)");
        assert_eq!(prefill_note(&MeasuredSteps { prefill_chunks: 1, ..steps }), " (its prefill 400 ms)");
        // Chunked prefill off: a prompt over the budget is refused, never chunked.
        spec.paged.no_chunked_prefill = true;
        assert_eq!(prefill_chunks(&spec, 256), 1);
    }
}
