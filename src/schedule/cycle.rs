//! The interference of engines over a pipeline, measured in the rhythm the planner prices RRA's
//! decode iterations in: steps cycling through the stages.
//!
//! [`burn_parallel::profiler::pipeline_interference`] times a pipelined pass of the layers alone.
//! The engines add what it never sees: each step's work on the host (scheduling, sampling,
//! streaming every operation to a worker), and two engines' threads sharing the process that
//! drives the devices. So [`engine_interference`] times two virtual engines decoding one sequence
//! each, and solves the planner's price of their cycle, `2·(max t + κ·(Σ t − max t))` over the
//! stage times it prices ([`decode_stage_ms`] of the profile), for the period measured
//! ([`Interference::kappa_of_cycle`]), so that the planner prices that cycle as it ran (unless it
//! ran faster than the stages allow, which `κ` = 0 prices). Then again with each engine decoding
//! as many sequences as the plan's engines may hold: on a host whose cores the workers and the
//! driving process share, how much a larger batch's stages slow each other need not be what one
//! sequence's do, and a `κ` of one sequence would misprice large-batch plans. The planner
//! interpolates between the two (`ScheduleInput::interference_at_batch`). One engine's step alone
//! is timed too, for the log.

use std::sync::Arc;
use std::time::Instant;

use burn_llm_models::{LanguageModel, Prompt, SamplingParams};
use burn_paged::{EngineConfig, KvCacheMemory};
use burn_parallel::profiler::fit::median;
use burn_parallel::profiler::{Interference, probe_prompt};
use burn_plan::profile::Profile;
use burn_plan::schedule::decode_stage_ms;
use serde::{Deserialize, Serialize};

use super::{BatchInterference, DeviceInterference, PlanError};
use crate::engine::paged_engines;

/// Prompt tokens of each sequence of the runs (fewer on a model of fewer positions).
const PROMPT: usize = 64;
/// New tokens of each sequence of the runs (fewer on a model of fewer positions).
const TOKENS: usize = 64;
/// Steps of each sequence left out before its periods are timed: the prefill, and the engines
/// falling into their cycle (both start together, so their first steps share the first stage).
const SETTLE: usize = 8;
/// Tokens per KV block of the runs' engines.
const BLOCK: usize = 16;

/// Each sequence's prompt and new tokens, within the model's positions.
#[derive(Debug, Clone, Copy)]
struct Run {
    prompt: usize,
    tokens: usize,
}

impl Run {
    /// [`PROMPT`] and [`TOKENS`], halved together until they fit `positions`; an error when too
    /// few steps would be left to time.
    fn within(positions: usize) -> Result<Self, PlanError> {
        let (mut prompt, mut tokens) = (PROMPT, TOKENS);
        while prompt + tokens > positions && tokens > SETTLE + 2 {
            (prompt, tokens) = ((prompt / 2).max(1), (tokens / 2).max(SETTLE + 2));
        }
        if prompt + tokens > positions {
            return Err(PlanError::Profile(format!(
                "the model's {positions} positions leave too few decode steps to time engines over the pipeline \
                 (at least {}): give the plan with --plan FILE.json instead",
                SETTLE + 3
            )));
        }
        Ok(Self { prompt, tokens })
    }
}

/// Two virtual engines timed over the pipeline, each decoding `seqs` sequences.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineCycle {
    /// Sequences each engine decoded.
    pub seqs: usize,
    /// One engine's decode step of `seqs` sequences over the pipeline alone (median), ms.
    pub alone_ms: f64,
    /// That step's stages as the planner prices them (the profile's [`decode_stage_ms`]), ms.
    pub stage_ms: Vec<f64>,
    /// How often each of two virtual engines' decode steps came round (median), ms.
    pub period_ms: f64,
    /// `κ` of the cycle over `stage_ms` ([`Interference::kappa_of_cycle`]).
    pub kappa: f64,
}

/// What [`engine_interference`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineInterference {
    /// Each engine decoding one sequence.
    pub one: EngineCycle,
    /// Each engine decoding the most sequences the plan's engines may hold, where that is more
    /// than one.
    pub at_batch: Option<EngineCycle>,
}

impl EngineInterference {
    /// How the planner prices the engines working at once, with WAA's `κ` `waa`.
    pub fn priced(&self, waa: Option<f64>) -> DeviceInterference {
        let at_batch = self.at_batch.as_ref().map(|c| BatchInterference { batch: c.seqs as f64, kappa: c.kappa });
        DeviceInterference { stages: self.one.kappa, stages_at_batch: at_batch, waa }
    }

    /// One line for start-up logs.
    pub fn summary(&self) -> String {
        let cycle = |c: &EngineCycle| {
            format!(
                "{} sequence(s) each: one engine's decode step {:.2} ms alone (stages {:.2?} ms as the planner \
                 prices them), two virtual engines' steps came round every {:.2} ms, κ = {:.2}",
                c.seqs, c.alone_ms, c.stage_ms, c.period_ms, c.kappa
            )
        };
        let at_batch = self.at_batch.as_ref().map(|c| format!("; {}", cycle(c))).unwrap_or_default();
        format!(
            "engines overlapping (interference κ: a step costs max + κ·(Σ − max) of its stages' times while \
             the other engine's is on the pipeline): {}{at_batch}",
            cycle(&self.one)
        )
    }
}

/// Measures the interference of paged engines over `pipeline`, a model in pipeline stages of
/// `stage_layers` layers each, whose cost `profile` holds (see the module docs): with each engine
/// decoding one sequence, and `seats` sequences where that is more.
pub fn engine_interference<M: LanguageModel + Send + Sync + 'static>(
    pipeline: &Arc<M>,
    stage_layers: &[usize],
    profile: &Profile,
    seats: usize,
) -> Result<EngineInterference, PlanError> {
    let run = Run::within(pipeline.spec().max_positions)?;
    let cost = profile.cost_model("profile").map_err(|e| PlanError::Profile(e.to_string()))?;
    let context = (run.prompt + run.tokens / 2) as f64;
    let cycle = |seqs: usize| -> Result<EngineCycle, PlanError> {
        let alone_ms = decode_period_ms(pipeline, run, 1, seqs)?;
        let period_ms = decode_period_ms(pipeline, run, 2, seqs)?;
        let stage_ms = decode_stage_ms(&cost, stage_layers, seqs as f64, context);
        let kappa = Interference::kappa_of_cycle(&stage_ms, period_ms, 2);
        Ok(EngineCycle { seqs, alone_ms, stage_ms, period_ms, kappa })
    };
    let one = cycle(1)?;
    let at_batch = if seats > 1 { Some(cycle(seats)?) } else { None };
    Ok(EngineInterference { one, at_batch })
}

/// The median time (ms) between one engine's decode steps while `engines` paged engines (virtual
/// engines when several) over `pipeline` decode `seqs` sequences each, from the steps' own starts.
fn decode_period_ms<M: LanguageModel + Send + Sync + 'static>(
    pipeline: &Arc<M>,
    run: Run,
    engines: usize,
    seqs: usize,
) -> Result<f64, PlanError> {
    let sequences = engines * seqs;
    let config = EngineConfig {
        block_size: BLOCK,
        kv_cache_memory: KvCacheMemory::Blocks(sequences * ((run.prompt + run.tokens).div_ceil(BLOCK) + 1)),
        max_num_seqs: seqs,
        micro_batches: Some(1),
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let failed =
        |e: &dyn std::fmt::Display| PlanError::Profile(format!("timing {engines} engine(s) over the pipeline: {e}"));
    let mut engine = paged_engines(Arc::clone(pipeline), None, vec![], config, engines).map_err(|e| failed(&e))?;
    let vocab = pipeline.spec().vocab_size;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(run.tokens) };
    // Each request goes to the engine with the fewest unfinished: `seqs` each.
    for i in 0..sequences {
        let prompt = Prompt::Ids(probe_prompt(run.prompt, vocab, i));
        engine.add_request(&i.to_string(), prompt, params.clone()).map_err(|e| failed(&e))?;
    }
    let mut starts: Vec<Vec<Instant>> = vec![Vec::new(); sequences];
    while engine.has_unfinished_requests() {
        for out in engine.step().map_err(|e| failed(&e))? {
            if let Some(at) = out.request_id.parse::<usize>().ok().and_then(|i| starts.get_mut(i)) {
                at.extend(out.step_started);
            }
        }
    }
    let periods: Vec<f64> =
        starts.iter().flat_map(|s| s.windows(2).skip(SETTLE).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)).collect();
    if periods.is_empty() {
        return Err(failed(&"no decode steps to time"));
    }
    Ok(median(periods))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_fit_the_models_positions_or_say_what_to_do() {
        let roomy = Run::within(2048).unwrap();
        assert_eq!((roomy.prompt, roomy.tokens), (PROMPT, TOKENS));
        let small = Run::within(40).unwrap();
        assert!(small.prompt + small.tokens <= 40 && small.tokens > SETTLE + 1, "{small:?}");
        let err = Run::within(8).unwrap_err().to_string();
        assert!(err.contains("8 positions") && err.contains("--plan"), "{err}");
    }
}
