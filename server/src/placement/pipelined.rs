//! Each model with traffic timed as the placement would run it, for the simulator's price of
//! one-device groups and of groups of each stage count the placement can run
//! ([`burn_plan::placement::MeasuredPipeline`]).
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
//! - `S` stages ([`measure`], over the pool's first `S` devices): the model loaded as the placement
//!   would run it on a group of `S` stages (its layers split evenly, one virtual engine per stage,
//!   prefilling in the chunks chosen for `S` stages), one request timed alone, then
//!   [`BURST`] started together, whose finishes come one interval apart once the pipeline is full.
//!   Where its engines step one sequence at a time (`--max-num-seqs 1`, as AlpaServe serves), the
//!   request's prefill is also timed alone, and the simulator serves the model step by step on
//!   groups of `S` stages ([`burn_plan::placement::measured_steps`]): each decode step
//!   is a pass of its own that queues behind other requests' prefills at every stage. With larger
//!   batches the engines batch what queues, which passes one by one do not price, and the
//!   one-pass price stays.
//!
//! Each with the model's own engine flags and prefix caching off (so that every request computes
//! its prompt); the engines are dropped before the placement loads anything.

use std::io::Write;
use std::time::Instant;

use burn_llm_models::{DecoderSpec, Prompt, SamplingParams};
use burn_parallel::profiler::{probe_ids, probe_prompt};
use burn_plan::placement::{MeasuredPipeline, MeasuredSteps};
use burn_plan::serving::{DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, ServingWorkload};

use super::super::ServerError;
use super::super::model_args::ServedModelSpec;
use super::profiles::ModelCosts;
use super::{ChunkChoice, chunk_of};
use burn_llm::{Engine, Purpose};

/// Requests started together for the interval: `BURST − 1` intervals averaged, as one pair's
/// interval moves by half between runs on a host whose cores the stages share.
pub(super) const BURST: usize = 4;
/// Untimed runs before the timed ones.
pub(super) const WARMUP: usize = 1;
/// Timed runs of each kind: the fastest one request alone (the host's stalls only ever add to
/// it), the median burst (how the stages share the host is part of what it measures).
pub(super) const REPEATS: usize = 3;

/// `(model, one request on one device)` for every model with traffic in `workload` that fits
/// `pool[0]`'s memory `cap` whole, timed there (the fastest of [`REPEATS`] runs); `timed`: a
/// model already timed so (by the devices' interference on replicas), `(name, ms)`.
pub(super) fn measure_one_device(
    models: &[ServedModelSpec],
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
                let spec = probe_spec(model, vec![device.clone()], &[[0, arch.num_layers]], None);
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

/// `(model, its pipeline measured)` for each of `models` (those [`timed_on`] that many stages),
/// timed over `devices` (one stage each, the layers split evenly), prefilling in the chunks
/// chosen for that many stages ([`super::chunks`]); nothing for fewer than two devices.
pub(super) fn measure(
    models: &[ServedModelSpec],
    devices: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    chunks: &[ChunkChoice],
    log: &mut dyn Write,
) -> Result<Vec<(String, MeasuredPipeline)>, ServerError> {
    let n = devices.len();
    if n < 2 {
        return Ok(Vec::new());
    }
    let route = devices.join(" → ");
    let mut out = Vec::new();
    for model in models {
        let fail = |e: &dyn std::fmt::Display| {
            ServerError::Engine(format!(
                "placement: timing `{}` as a pipeline over {route}: {e}; check that each device holds its share of \
                 the layers and that the workers run",
                model.name,
            ))
        };
        let (dir, arch) = costs.model(&model.name);
        let stages = super::even_stages(arch.num_layers, n).map_err(|e| fail(&e))?;
        let (prompt, tokens) = request_shape(workload, &model.name, arch);
        let spec = probe_spec(model, devices.to_vec(), &stages, chunk_of(chunks, &model.name, n));
        let one_at_a_time = spec.engine_config().max_num_seqs == 1;
        let seats = spec.parallel.virtual_engines.unwrap_or(1);
        let chunks = prefill_chunks(&spec, prompt);
        let mut engine = spec.init(dir, Purpose::Serve, &mut std::io::sink()).map_err(|e| fail(&e))?;
        let vocab = arch.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..BURST).map(|r| probe_prompt(prompt, vocab, r)).collect();
        // The three timings interleaved, round by round, so that a stretch of the host running
        // slower falls on all of them alike: the burst's interval and the prefill are read
        // against the request alone, and timed minutes apart they disagreed (a prefill alone
        // slower than the whole request).
        let (mut alone, mut burst, mut prefill) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..WARMUP + REPEATS {
            let mut time = |n: usize, tokens: usize| requests_ms(engine.as_mut(), &prompts[..n], tokens);
            let timed = (time(1, tokens), time(BURST, tokens), one_at_a_time.then(|| time(1, 1)).transpose());
            let (one, all, first) = match timed {
                (Ok(one), Ok(all), Ok(first)) => (one, all, first),
                (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => return Err(fail(&e)),
            };
            if round >= WARMUP {
                alone.push(one);
                burst.push(all);
                prefill.extend(first);
            }
        }
        let fastest = |runs: &[f64]| runs.iter().copied().fold(f64::INFINITY, f64::min);
        let alone = fastest(&alone);
        burst.sort_by(f64::total_cmp);
        let burst = burst[burst.len() / 2];
        let interval = ((burst - alone) / (BURST - 1) as f64).max(0.0);
        let steps = match one_at_a_time {
            true => Some(MeasuredSteps {
                prefill_ms: fastest(&prefill).min(alone),
                tokens,
                seats,
                burst: BURST,
                prefill_chunks: chunks,
            }),
            false => None,
        };
        let prefill = steps.as_ref().map(prefill_note).unwrap_or_default();
        let measured = MeasuredPipeline { stages: n, latency_ms: alone, interval_ms: interval, steps };
        let _ = writeln!(
            log,
            "placement: `{}` as a pipeline over {route} ({prompt} prompt tokens, {tokens} generated): one request \
             {alone:.0} ms{prefill}, {BURST} started together {burst:.0} ms (each after the first adds {interval:.0} ms)",
            model.name,
        );
        out.push((model.name.clone(), measured));
    }
    Ok(out)
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
fn prefill_chunks(spec: &burn_llm::spec::EngineSpec, prompt: usize) -> usize {
    let config = spec.engine_config();
    match (config.chunked_prefill, config.max_num_batched_tokens) {
        (true, Some(budget)) if budget > 0 => prompt.div_ceil(budget).max(1),
        _ => 1,
    }
}

/// The models timed as pipelines of `n` stages: those with traffic in `workload` and at least `n`
/// layers. One with fewer is logged and left out: no group of `n` stages can serve it, and the
/// planner splits no model so.
pub(super) fn timed_on(
    models: &[ServedModelSpec],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    n: usize,
    log: &mut dyn Write,
) -> Vec<ServedModelSpec> {
    let mut out = Vec::new();
    for model in models.iter().filter(|m| workload.load(&m.name).is_some()) {
        let layers = costs.model(&model.name).1.num_layers;
        match layers >= n {
            true => out.push(model.clone()),
            false => {
                let _ = writeln!(
                    log,
                    "placement: `{}` has {layers} layers, too few for {n}-stage groups: not timed on them",
                    model.name
                );
            }
        }
    }
    out
}

/// `model`'s engine spec on a group of `devices` running `stages` (one per device), as the
/// placement serves it (prefilling in chunks of `chunk` tokens, when chosen), with prefix caching
/// off so that every timed request computes its prompt.
pub(super) fn probe_spec(
    model: &ServedModelSpec,
    devices: Vec<String>,
    stages: &[[usize; 2]],
    chunk: Option<usize>,
) -> burn_llm::spec::EngineSpec {
    let mut spec = super::group_spec(model, devices, stages, stages.len(), chunk);
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
/// last one finishing; an error where one finished short of its tokens (an engine finishes a
/// sequence aborted once its KV pool cannot hold it), since a time of less work than the
/// workload's would price the placement on requests it never serves.
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
    let mut short = None;
    while engine.has_unfinished_requests() {
        for output in engine.step()?.into_iter().flat_map(|o| o.finished).flatten() {
            if output.generated_ids.len() < tokens {
                short.get_or_insert((output.generated_ids.len(), output.prompt_ids.len(), output.finish_reason));
            }
        }
    }
    if let Some((generated, prompt, reason)) = short {
        return Err(format!(
            "a request of {prompt} prompt tokens finished ({reason:?}) after {generated} of its {tokens} tokens: its \
             engine's KV pool (each virtual engine's share) does not hold the workload's request; raise \
             --kv-cache-memory"
        )
        .into());
    }
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_is_timed_in_the_chunks_its_engine_prefills_it_in() {
        let mut spec = burn_llm::spec::EngineSpec::default();
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
