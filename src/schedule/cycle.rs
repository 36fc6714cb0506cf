//! The interference of engines over a pipeline, measured in the rhythm the planner prices RRA's
//! decode iterations in: steps cycling through the stages.
//!
//! [`burn_parallel::profiler::pipeline_interference`] times a pipelined pass of the layers alone.
//! The engines add what it never sees: each step's work on the host (scheduling, sampling,
//! streaming every operation to a worker), and two engines' threads sharing the process that
//! drives the devices. So [`engine_interference`] times one engine's decode step of one sequence
//! over the pipeline alone, then two virtual engines decoding one sequence each, and solves the
//! planner's price of their cycle, `2·(max t + κ·(Σ t − max t))` over its own stage times
//! ([`decode_stage_ms`], scaled to the measured step), for the period measured
//! ([`Interference::kappa_of_cycle`]).

use std::sync::Arc;
use std::time::Instant;

use burn_llm_models::{LanguageModel, Prompt, SamplingParams};
use burn_paged::{EngineConfig, KvCacheMemory};
use burn_parallel::plan::profile::Profile;
use burn_parallel::plan::schedule::decode_stage_ms;
use burn_parallel::profiler::fit::median;
use burn_parallel::profiler::{Interference, probe_prompt};
use serde::{Deserialize, Serialize};

use super::PlanError;
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

/// What [`engine_interference`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineInterference {
    /// One engine's decode step of one sequence over the pipeline alone (median), ms.
    pub alone_ms: f64,
    /// That step as the planner splits it into stages, scaled to `alone_ms`.
    pub stage_ms: Vec<f64>,
    /// How often each of two virtual engines' decode steps came round (median), ms.
    pub period_ms: f64,
    /// `κ` of the cycle ([`Interference::kappa_of_cycle`]).
    pub kappa: f64,
}

impl EngineInterference {
    /// One line for start-up logs.
    pub fn summary(&self) -> String {
        format!(
            "engines overlapping: one engine's decode step of one sequence {:.2} ms alone (stages {:.2?} ms as \
             the planner splits it); two virtual engines' steps came round every {:.2} ms: interference κ = {:.2}",
            self.alone_ms, self.stage_ms, self.period_ms, self.kappa
        )
    }
}

/// Measures the interference of paged engines over `pipeline`, a model in pipeline stages of
/// `stage_layers` layers each, whose cost `profile` holds (see the module docs).
pub fn engine_interference<M: LanguageModel + Send + Sync + 'static>(
    pipeline: &Arc<M>,
    stage_layers: &[usize],
    profile: &Profile,
) -> Result<EngineInterference, PlanError> {
    let run = Run::within(pipeline.spec().max_positions)?;
    let alone_ms = decode_period_ms(pipeline, run, 1)?;
    let period_ms = decode_period_ms(pipeline, run, 2)?;
    let context = (run.prompt + run.tokens / 2) as f64;
    let cost = profile.cost_model("profile").map_err(|e| PlanError::Profile(e.to_string()))?;
    let planned = decode_stage_ms(&cost, stage_layers, 1.0, context);
    let scale = alone_ms / planned.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let stage_ms: Vec<f64> = planned.iter().map(|t| t * scale).collect();
    let kappa = Interference::kappa_of_cycle(&stage_ms, period_ms, 2);
    Ok(EngineInterference { alone_ms, stage_ms, period_ms, kappa })
}

/// The median time (ms) between one engine's decode steps while `engines` paged engines (virtual
/// engines when several) over `pipeline` decode one sequence each, from the steps' own starts.
fn decode_period_ms<M: LanguageModel + Send + Sync + 'static>(
    pipeline: &Arc<M>,
    run: Run,
    engines: usize,
) -> Result<f64, PlanError> {
    let config = EngineConfig {
        block_size: BLOCK,
        kv_cache_memory: KvCacheMemory::Blocks(engines * ((run.prompt + run.tokens).div_ceil(BLOCK) + 1)),
        max_num_seqs: 1,
        micro_batches: Some(1),
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let failed =
        |e: &dyn std::fmt::Display| PlanError::Profile(format!("timing {engines} engine(s) over the pipeline: {e}"));
    let mut engine = paged_engines(Arc::clone(pipeline), None, vec![], config, engines).map_err(|e| failed(&e))?;
    let vocab = pipeline.spec().vocab_size;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(run.tokens) };
    for i in 0..engines {
        let prompt = Prompt::Ids(probe_prompt(run.prompt, vocab, i));
        engine.add_request(&i.to_string(), prompt, params.clone()).map_err(|e| failed(&e))?;
    }
    let mut starts: Vec<Vec<Instant>> = vec![Vec::new(); engines];
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
