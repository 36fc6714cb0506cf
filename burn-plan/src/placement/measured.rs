//! Pipelines measured running, for the placement's simulator.
//!
//! AlpaServe's simulator takes each parallel configuration's stage latencies from profiling that
//! configuration (thesis §4.5). The planner's stage latencies are its layers' one-device costs
//! split by the stages DP, which leave out what running as a pipeline adds: hidden states handed
//! between devices every step, the host driving every stage, the engines taking turns on each
//! device. Where a model was timed running as a pipeline of `stages` stages (one request alone,
//! then several started together), a group of that many stages is priced from the measurement
//! instead ([`measured_stage_latency_ms`]): the stages' latencies add up to the measured latency,
//! and their slowest stage is set so that the simulator, at the devices' interference `κ`, makes
//! a second request add the measured interval. A "pipeline" of one stage is one request on one
//! device, measured: a one-device group of the model is priced at its latency, which the layers'
//! profile leaves the engine's own work out of (scheduling, sampling, the hand-over to a worker).
//!
//! A pipeline timed as it serves step by step ([`MeasuredSteps`]: each engine one sequence a
//! step) is also priced as the simulator's [`Steps`](crate::sim::Steps)
//! ([`measured_steps`]): its prefill and decode passes from the request's prefill timed alone and
//! the rest of the request, split over the stages in the DP split's proportions, and the `κ` its
//! stages slow each other by set so that the simulator, running the timed burst step by step,
//! takes as long as the burst took.

use serde::{Deserialize, Serialize};

use super::super::check::{self, InputError};
use crate::sim::{self, Group, Request, Steps};

/// The largest `κ` [`measured_steps`] fits: a burst slower than that prices stages that take
/// turns many times over.
const MAX_STEPS_KAPPA: f64 = 16.0;

/// One request through a model's pipeline, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredPipeline {
    /// Pipeline stages (1: the model on one device), tensor-parallel degree 1.
    pub stages: usize,
    /// One request alone through the pipeline, milliseconds.
    pub latency_ms: f64,
    /// What each request started with it after the first added to the batch's time,
    /// milliseconds: the pipeline's interval between requests, its slowest stage slowed by the
    /// others.
    pub interval_ms: f64,
    /// How the pipeline was timed serving step by step, when it was (optional): a group of
    /// `stages` stages then serves the model step by step in the simulator ([`measured_steps`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<MeasuredSteps>,
}

/// What a pipeline timed serving step by step adds to [`MeasuredPipeline`]: its engines ran one
/// sequence a step, and the burst of `burst` requests started together took `latency_ms +
/// (burst − 1)·interval_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredSteps {
    /// One request's prefill alone (one token generated), milliseconds.
    pub prefill_ms: f64,
    /// Tokens each timed request generated (its decode steps are one fewer).
    pub tokens: usize,
    /// Requests the pipeline ran at once (its engines, one sequence each).
    pub seats: usize,
    /// Requests started together for `interval_ms`.
    pub burst: usize,
    /// Chunks each timed prompt was prefilled in (`--max-num-batched-tokens` below the prompt;
    /// 1 when whole).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub prefill_chunks: usize,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// A model's steps on a group, priced: [`Steps`] in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCosts {
    /// Each stage's time of the whole prefill (all its chunks).
    pub prefill_ms: Vec<f64>,
    /// Passes the prefill is computed in, following each other through the stages.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub prefill_chunks: usize,
    /// Each stage's time of one decode pass.
    pub decode_ms: Vec<f64>,
    /// Decode passes after the prefill.
    pub decodes: usize,
    /// Requests in the stages at once.
    pub seats: usize,
    /// How much each other busy stage of the group slows a pass.
    pub kappa: f64,
}

impl StepCosts {
    /// The simulator's steps (seconds).
    pub fn sim(&self) -> Steps {
        let s = |ms: &[f64]| ms.iter().map(|t| t / 1000.0).collect();
        Steps {
            prefill: s(&self.prefill_ms),
            prefill_chunks: self.prefill_chunks,
            decode: s(&self.decode_ms),
            decodes: self.decodes,
            seats: self.seats,
            kappa: self.kappa,
        }
    }

    /// Checks the fields for a group of `stages` stages, naming `field` in errors.
    pub(super) fn check(&self, field: &str, stages: usize) -> Result<(), InputError> {
        check::same_len(&format!("{field}.prefill_ms"), &self.prefill_ms, stages, "stages")?;
        check::latencies(&format!("{field}.prefill_ms"), &self.prefill_ms)?;
        check::same_len(&format!("{field}.decode_ms"), &self.decode_ms, stages, "stages")?;
        check::latencies(&format!("{field}.decode_ms"), &self.decode_ms)?;
        for (name, value) in [("seats", self.seats), ("prefill_chunks", self.prefill_chunks)] {
            if value == 0 {
                return Err(InputError::new(format!("{field}.{name}"), "must be at least 1"));
            }
        }
        check::non_negative(&format!("{field}.kappa"), self.kappa)?;
        Ok(())
    }
}

impl MeasuredPipeline {
    /// Checks the fields, naming `field` in errors.
    pub(super) fn check(&self, field: &str, layers: usize) -> Result<(), InputError> {
        if self.stages < 1 || self.stages > layers {
            return Err(InputError::new(
                format!("{field}.stages"),
                format!("{} is not between 1 and the model's {layers} layers", self.stages),
            ));
        }
        check::positive(&format!("{field}.latency_ms"), self.latency_ms)?;
        check::non_negative(&format!("{field}.interval_ms"), self.interval_ms)?;
        if let Some(steps) = &self.steps {
            check::positive(&format!("{field}.steps.prefill_ms"), steps.prefill_ms)?;
            for (name, value, least) in [
                ("tokens", steps.tokens, 1),
                ("seats", steps.seats, 1),
                ("burst", steps.burst, 2),
                ("prefill_chunks", steps.prefill_chunks, 1),
            ] {
                if value < least {
                    return Err(InputError::new(format!("{field}.steps.{name}"), format!("must be at least {least}")));
                }
            }
        }
        Ok(())
    }
}

/// `split` (a model's stage latencies, ms, as the DP split them) priced step by step from
/// whichever of its `measured` pipelines has that many stages and was timed so
/// ([`measured_steps`]); `None` when none was.
pub fn priced_steps(measured: &[MeasuredPipeline], split: &[f64]) -> Option<StepCosts> {
    measured.iter().find(|p| p.stages == split.len() && split.len() > 1).and_then(|p| measured_steps(split, p))
}

/// The steps of a pipeline whose stages the DP split as `split`, priced from `measured` (`None`
/// when it was not timed step by step): the prefill takes the measured prefill `P`, each decode
/// pass `(L − P) ÷ (tokens − 1)` of the measured request `L`, both shared over the stages as
/// `split` shares the request (for a prefill in several chunks, which overlap through the stages,
/// scaled so that the simulator prefills one prompt alone in `P`); the seats are the engines it
/// ran; and `κ` is the one at which the simulator, running `burst` requests started together
/// step by step on the group alone, takes the burst's measured time `L + (burst − 1)·interval`
/// ([`burst_kappa`]).
pub fn measured_steps(split: &[f64], measured: &MeasuredPipeline) -> Option<StepCosts> {
    let steps = measured.steps.as_ref()?;
    let n = split.len().max(1);
    let total: f64 = split.iter().sum();
    let share = |t: f64| if total > 0.0 { t / total } else { 1.0 / n as f64 };
    let prefill = steps.prefill_ms.min(measured.latency_ms);
    let decodes = steps.tokens.saturating_sub(1);
    let decode = if decodes > 0 { (measured.latency_ms - prefill) / decodes as f64 } else { 0.0 };
    let chunks = steps.prefill_chunks.max(1);
    let mut costs = StepCosts {
        prefill_ms: split.iter().map(|&t| prefill * share(t)).collect(),
        prefill_chunks: chunks,
        decode_ms: split.iter().map(|&t| decode * share(t)).collect(),
        decodes,
        seats: steps.seats.max(1),
        kappa: 0.0,
    };
    let target_ms = measured.latency_ms + (steps.burst.max(1) - 1) as f64 * measured.interval_ms;
    // A request's chunks keep its stages busy at once, so its prefill alone depends on `κ`, and
    // the burst's `κ` on the prefill: fitted in turn, the prefill scaled to `P` at the last `κ`.
    // A whole prefill is on one stage at a time, at `P` whatever `κ` is: one round.
    let rounds = if chunks == 1 { 1 } else { CHUNKED_FIT_ROUNDS };
    for _ in 0..rounds {
        let alone = together_ms(&StepCosts { decodes: 0, ..costs.clone() }, 1);
        if alone > 0.0 {
            costs.prefill_ms.iter_mut().for_each(|t| *t *= prefill / alone);
        }
        costs.kappa = burst_kappa(&costs, steps.burst, target_ms);
    }
    Some(costs)
}

/// Rounds of [`measured_steps`]'s fit of a chunked prefill's stage times and `κ`.
const CHUNKED_FIT_ROUNDS: usize = 8;

/// The `κ` at which [`together_ms`] runs `burst` requests of `costs` in `target_ms` (0 when it is
/// that slow already, at most [`MAX_STEPS_KAPPA`]).
fn burst_kappa(costs: &StepCosts, burst: usize, target_ms: f64) -> f64 {
    let burst_ms = |kappa: f64| together_ms(&StepCosts { kappa, ..costs.clone() }, burst);
    if burst_ms(0.0) >= target_ms {
        return 0.0;
    }
    if burst_ms(MAX_STEPS_KAPPA) <= target_ms {
        return MAX_STEPS_KAPPA;
    }
    let (mut low, mut high) = (0.0, MAX_STEPS_KAPPA);
    for _ in 0..60 {
        let mid = 0.5 * (low + high);
        if burst_ms(mid) < target_ms { low = mid } else { high = mid }
    }
    0.5 * (low + high)
}

/// Milliseconds the simulator takes to run `requests` of `costs`' model, started together, step
/// by step on a group of its stages alone.
fn together_ms(costs: &StepCosts, requests: usize) -> f64 {
    let per_request = costs.prefill_ms.iter().zip(&costs.decode_ms).map(|(p, d)| (p + d * costs.decodes as f64) / 1e3);
    let group =
        Group { steps: vec![(0, costs.sim())], ..Group::new(costs.prefill_ms.len(), vec![(0, per_request.collect())]) };
    let burst = vec![Request { arrival_s: 0.0, model: 0 }; requests.max(1)];
    1e3 * sim::simulate(&[group], &burst, 0.0).into_iter().flatten().fold(0.0, f64::max)
}

/// `split` (a model's stage latencies, ms, as the DP split them) priced from whichever of its
/// `measured` pipelines has that many stages ([`measured_stage_latency_ms`]); as it is when none
/// has.
pub fn priced_stage_latency_ms(measured: &[MeasuredPipeline], split: Vec<f64>, kappa: f64) -> Vec<f64> {
    match measured.iter().find(|p| p.stages == split.len()) {
        Some(pipeline) => measured_stage_latency_ms(&split, pipeline, kappa),
        None => split,
    }
}

/// The stage latencies (ms) of a pipeline whose stages the DP split as `split`, priced from
/// `measured` at interference `kappa`: they add up to `measured.latency_ms = L`, the split's
/// slowest stage takes `m` with `m + κ·(L − m) = measured.interval_ms` (the interval the
/// simulator gives a second request started with the first, [`crate::sim`]), kept between
/// `L ÷ stages` and `L`, and the other stages share `L − m` in the split's proportions.
pub fn measured_stage_latency_ms(split: &[f64], measured: &MeasuredPipeline, kappa: f64) -> Vec<f64> {
    let n = split.len();
    let total = measured.latency_ms;
    if n < 2 {
        return vec![total; n];
    }
    let kappa = kappa.max(0.0);
    // m·(1 − κ) = I − κ·L; at κ ≥ 1 no split makes the interval shorter than L, the nearest is m = L.
    let bottleneck = if kappa < 1.0 { (measured.interval_ms - kappa * total) / (1.0 - kappa) } else { total };
    let bottleneck = bottleneck.clamp(total / n as f64, total);
    let slowest = split.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i);
    let rest: f64 = split.iter().enumerate().filter(|&(i, _)| i != slowest).map(|(_, t)| t).sum();
    split
        .iter()
        .enumerate()
        .map(|(i, &t)| match i == slowest {
            true => bottleneck,
            false if rest > 0.0 => (total - bottleneck) * t / rest,
            false => (total - bottleneck) / (n - 1) as f64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{self, Group, Request};

    #[test]
    fn measured_stages_make_the_simulator_replay_the_measured_pair() {
        let measured = MeasuredPipeline { stages: 2, latency_ms: 1000.0, interval_ms: 800.0, steps: None };
        for kappa in [0.0, 0.2, 0.5] {
            let stages = measured_stage_latency_ms(&[400.0, 500.0], &measured, kappa);
            assert!((stages.iter().sum::<f64>() - 1000.0).abs() < 1e-9, "{stages:?}");
            assert!(stages[1] > stages[0], "the split's slowest stage stays the slowest: {stages:?}");
            // One request alone takes the measured latency; two started together, latency plus
            // interval, in the simulator at the same κ.
            let group = Group::new(2, vec![(0, stages.iter().map(|ms| ms / 1e3).collect())]);
            let at = |t| Request { arrival_s: t, model: 0 };
            let alone = sim::simulate(std::slice::from_ref(&group), &[at(0.0)], kappa);
            let pair = sim::simulate(std::slice::from_ref(&group), &[at(0.0), at(0.0)], kappa);
            assert!((alone[0].unwrap() - 1.0).abs() < 1e-9, "{alone:?}");
            assert!((pair[1].unwrap() - 1.8).abs() < 1e-9, "κ {kappa}: {pair:?}");
        }
        // An interval the split cannot reach is clamped: no faster than equal stages, no slower
        // than one stage doing everything.
        let fast = MeasuredPipeline { interval_ms: 100.0, ..measured.clone() };
        assert_eq!(measured_stage_latency_ms(&[400.0, 500.0], &fast, 0.0), vec![500.0, 500.0]);
        let slow = MeasuredPipeline { interval_ms: 5000.0, ..measured.clone() };
        assert_eq!(measured_stage_latency_ms(&[400.0, 500.0], &slow, 0.0), vec![0.0, 1000.0]);
        assert_eq!(measured_stage_latency_ms(&[400.0, 500.0], &measured, 1.5), vec![0.0, 1000.0]);
    }

    fn timed_serving(interval_ms: f64) -> MeasuredPipeline {
        let steps = MeasuredSteps { prefill_ms: 580.0, tokens: 4, seats: 2, burst: 4, prefill_chunks: 1 };
        MeasuredPipeline { stages: 2, latency_ms: 720.0, interval_ms, steps: Some(steps) }
    }

    /// Seconds the simulator takes, with `costs` on a two-stage group, for one request alone and
    /// for 4 started together.
    fn replayed(costs: &StepCosts) -> (f64, f64) {
        (together_ms(costs, 1) / 1e3, together_ms(costs, 4) / 1e3)
    }

    #[test]
    fn measured_steps_make_the_simulator_replay_the_measured_burst_step_by_step() {
        let measured = timed_serving(486.0);
        let costs = measured_steps(&[300.0, 330.0], &measured).unwrap();
        assert!((costs.prefill_ms.iter().sum::<f64>() - 580.0).abs() < 1e-9, "{costs:?}");
        assert!((costs.decode_ms.iter().sum::<f64>() * 3.0 - 140.0).abs() < 1e-9, "{costs:?}");
        assert!(costs.prefill_ms[1] > costs.prefill_ms[0], "shared as the split shares a request: {costs:?}");
        assert_eq!((costs.decodes, costs.seats), (3, 2));
        assert!(costs.kappa > 0.0, "{costs:?}");
        let (alone, burst) = replayed(&costs);
        assert!((alone - 0.72).abs() < 1e-9, "{alone}");
        assert!((burst - (0.72 + 3.0 * 0.486)).abs() < 1e-6, "{burst}");
        // A burst the stages serve that fast without slowing each other: κ 0, not below.
        assert_eq!(measured_steps(&[300.0, 330.0], &timed_serving(100.0)).unwrap().kappa, 0.0);
        // Untimed step by step, or one stage: no steps.
        assert_eq!(measured_steps(&[1.0, 1.0], &MeasuredPipeline { steps: None, ..measured.clone() }), None);
        assert!(priced_steps(std::slice::from_ref(&measured), &[1.0, 1.0]).is_some());
        assert!(priced_steps(std::slice::from_ref(&measured), &[1.0, 1.0, 1.0]).is_none());
        let one = MeasuredPipeline { stages: 1, ..measured };
        assert!(priced_steps(&[one], &[1.0]).is_none());
    }

    #[test]
    fn a_chunked_prefill_is_priced_so_that_the_simulator_replays_it_alone_and_in_a_burst() {
        // Prompts timed in 4 chunks overlapping through the two stages: a request alone in
        // 546 ms, its prefill in 400, each further one of a burst of 4 adding 460.
        let chunked = MeasuredSteps { prefill_ms: 400.0, tokens: 4, seats: 2, burst: 4, prefill_chunks: 4 };
        let measured = MeasuredPipeline { stages: 2, latency_ms: 546.0, interval_ms: 460.0, steps: Some(chunked) };
        let costs = measured_steps(&[300.0, 330.0], &measured).unwrap();
        assert_eq!(costs.prefill_chunks, 4);
        assert!((costs.prefill_ms[1] / costs.prefill_ms[0] - 1.1).abs() < 1e-9, "the split's shares: {costs:?}");
        assert!(costs.prefill_ms.iter().sum::<f64>() > 400.0, "the chunks overlap: more work than P: {costs:?}");
        assert!(costs.kappa > 0.0, "{costs:?}");
        let (alone, burst) = replayed(&costs);
        assert!((alone - 0.546).abs() < 1e-3, "{alone}");
        assert!((burst - (0.546 + 3.0 * 0.460)).abs() < 1e-3, "{burst}");
        // Its chunks are part of what is checked.
        let zero = MeasuredSteps { prefill_chunks: 0, ..measured.steps.clone().unwrap() };
        let bad = MeasuredPipeline { steps: Some(zero), ..measured };
        assert!(bad.check("m", 30).unwrap_err().to_string().contains("m.steps.prefill_chunks"));
    }

    #[test]
    fn bad_measurements_are_refused_naming_the_field() {
        let ok = MeasuredPipeline { stages: 2, latency_ms: 10.0, interval_ms: 6.0, steps: None };
        assert!(ok.check("m", 4).is_ok());
        let none = MeasuredPipeline { stages: 0, ..ok.clone() };
        assert!(none.check("m", 4).unwrap_err().to_string().contains("m.stages"));
        // One stage: the model on one device, priced at its measured latency whatever the split.
        let one = MeasuredPipeline { stages: 1, ..ok.clone() };
        assert!(one.check("m", 4).is_ok());
        assert_eq!(priced_stage_latency_ms(std::slice::from_ref(&one), vec![7.0], 0.3), vec![10.0]);
        assert_eq!(priced_stage_latency_ms(std::slice::from_ref(&one), vec![3.0, 4.0], 0.3), vec![3.0, 4.0]);
        let deep = MeasuredPipeline { stages: 5, ..ok.clone() };
        assert!(deep.check("m", 4).is_err());
        let zero = MeasuredPipeline { latency_ms: 0.0, ..ok.clone() };
        assert!(zero.check("m", 4).unwrap_err().to_string().contains("m.latency_ms"));
        let nan = MeasuredPipeline { interval_ms: f64::NAN, ..ok };
        assert!(nan.check("m", 4).unwrap_err().to_string().contains("m.interval_ms"));
        let steps = timed_serving(400.0);
        assert!(steps.check("m", 4).is_ok());
        for (bad, field) in [
            (MeasuredSteps { burst: 1, ..steps.steps.clone().unwrap() }, "m.steps.burst"),
            (MeasuredSteps { seats: 0, ..steps.steps.clone().unwrap() }, "m.steps.seats"),
            (MeasuredSteps { tokens: 0, ..steps.steps.clone().unwrap() }, "m.steps.tokens"),
            (MeasuredSteps { prefill_ms: 0.0, ..steps.steps.clone().unwrap() }, "m.steps.prefill_ms"),
        ] {
            let err = MeasuredPipeline { steps: Some(bad), ..steps.clone() }.check("m", 4).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        let costs = measured_steps(&[1.0, 1.0], &steps).unwrap();
        assert!(costs.check("s", 2).is_ok());
        assert!(costs.check("s", 3).unwrap_err().to_string().contains("s.prefill_ms"));
        assert!(StepCosts { seats: 0, ..costs.clone() }.check("s", 2).unwrap_err().to_string().contains("s.seats"));
        assert!(StepCosts { kappa: -1.0, ..costs }.check("s", 2).unwrap_err().to_string().contains("s.kappa"));
    }
}
