//! How much pipeline stages slow each other down when they work at once: the interference `κ`
//! that micro-batched steps are priced with, and the price itself.
//!
//! Stages that overlap (stage `s + 1` on micro-batch `m` while stage `s` works on `m + 1`) may
//! share what a device timed alone never saw shared: a machine's cores, or the host threads that
//! drive a worker. With `a_d` each device's step alone, `M` micro-batches and `P` a pass, the
//! interval a later micro-batch adds is `(P − Σ a) ÷ (M − 1)`, and
//! `κ = (interval − max a) ÷ (Σ a − max a)`: 0 when the stages overlap perfectly (each later
//! micro-batch adds only the slowest stage), 1 when they might as well take turns, above 1 when
//! overlapping costs more than taking turns. A pipelined pass of stages taking `t_s` alone is then
//! priced at `Σ t + (M − 1)·(max t + κ·(Σ t − max t))` ([`Interference::pipelined_ms`]), the
//! formula the measurement solves for `κ`: each stage is slowed only while the others work, and by
//! as much as their work.
//!
//! What is measured and how (a pass of micro-batches through the devices as stages, each on a
//! thread of its own) is Burn's business: `burn_parallel::profiler::pipeline_interference` fills
//! an [`Interference`]; this module holds the record and the arithmetic every planner prices with.

use serde::{Deserialize, Serialize};

/// The step every device times: `tokens` new tokens of one sequence after `context` cached ones,
/// through `layers` layers between two synchronisations: the model's layers in order, from the
/// first again when it has fewer (so that a step lasts about as long as a stage's share of a deep
/// model, and per-step costs, a thread woken, a worker's round trip, weigh in it as they weigh in
/// a stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapStep {
    /// New tokens (1: a decode step).
    pub tokens: usize,
    /// Cached tokens before them.
    pub context: usize,
    /// Layers run per step (at least 1).
    pub layers: usize,
    /// Micro-batches in a pass through the devices (at least 2 to see them overlap).
    pub micro_batches: usize,
    /// Untimed runs before the timed ones (steps alone, and passes).
    pub warmup: usize,
    /// Timed runs, steps alone and passes (the median is kept).
    pub repeats: usize,
}

impl OverlapStep {
    /// A decode step after 64 tokens through `stage_layers` layers, 8 micro-batches a pass: what a
    /// micro-batched decode step overlaps.
    pub fn decode(stage_layers: usize) -> Self {
        Self { tokens: 1, context: 64, layers: stage_layers.max(1), micro_batches: 8, warmup: 3, repeats: 15 }
    }

    /// A decode step through one stage's share of `layers` layers split over `stages` stages.
    pub fn decode_share(layers: usize, stages: usize) -> Self {
        Self::decode(layers.div_ceil(stages.max(1)))
    }

    /// A prefill of `tokens` tokens (at least 1) through 2 layers, 4 a pass: compute-bound steps,
    /// where a step's fixed costs weigh little, so two layers show what a stage's share would.
    pub fn prefill(tokens: usize) -> Self {
        Self { tokens: tokens.max(1), context: 0, layers: 2, micro_batches: 4, warmup: 2, repeats: 5 }
    }
}

/// What [`pipeline_interference`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    /// The step it was measured on.
    pub step: OverlapStep,
    /// Each device's step alone (median), ms.
    pub alone_ms: Vec<f64>,
    /// A pass of the step's micro-batches through every device in turn, overlapping (median), ms.
    pub pass_ms: f64,
    /// `(interval − max alone) ÷ (Σ alone − max alone)` with `interval = (pass − Σ alone) ÷ (M − 1)`,
    /// at least 0 (see the module docs).
    pub kappa: f64,
    /// Each device's layers per step where they differ from the step's (empty: every device ran
    /// [`OverlapStep::layers`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<usize>,
    /// The devices whose steps ended with the LM head ([`OverlapDevice::head`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub head: Vec<usize>,
}

impl Interference {
    /// No interference (one device, or devices that share nothing): `κ = 0`.
    pub fn none() -> Self {
        Self {
            step: OverlapStep::decode(1),
            alone_ms: Vec::new(),
            pass_ms: 0.0,
            kappa: 0.0,
            layers: Vec::new(),
            head: Vec::new(),
        }
    }

    /// `κ` from a pass `pass` of `micro_batches` micro-batches through devices whose steps take
    /// `alone`: the `κ` for which [`pipelined_ms`](Self::pipelined_ms) gives `pass`. 0 when only
    /// one device works or one micro-batch shows no overlap.
    pub fn kappa_of(alone: &[f64], pass: f64, micro_batches: usize) -> f64 {
        let (sum, max) = sum_and_max(alone);
        let rest = sum - max;
        match later_interval_ms(alone, pass, micro_batches) {
            Some(interval) if rest > 0.0 => ((interval - max) / rest).max(0.0),
            _ => 0.0,
        }
    }

    /// `κ` from a cycle: `engines` steps (virtual engines', or micro-batches') cycling through
    /// stages taking `stage_ms` alone, each coming round every `period` ms. The `κ` for which
    /// `engines·(max t + κ·(Σ t − max t)) = period`, the planner's price of decode iterations
    /// cycling through a pipeline, at least 0; 0 with one stage or one engine.
    pub fn kappa_of_cycle(stage_ms: &[f64], period: f64, engines: usize) -> f64 {
        let (sum, max) = sum_and_max(stage_ms);
        let rest = sum - max;
        if engines < 2 || rest <= 0.0 || !period.is_finite() {
            return 0.0;
        }
        ((period / engines as f64 - max) / rest).max(0.0)
    }

    /// The time a pass's later micro-batch added, ms: `(pass − Σ alone) ÷ (M − 1)` (0 without
    /// a pass of several micro-batches through several devices).
    pub fn measured_interval_ms(&self) -> f64 {
        later_interval_ms(&self.alone_ms, self.pass_ms, self.step.micro_batches).map_or(0.0, |i| i.max(0.0))
    }

    /// One micro-batch's share of a pipelined pass over stages taking `stage_ms` alone:
    /// `max t + κ·(Σ t − max t)` for interference `kappa`.
    pub fn interval_ms(stage_ms: &[f64], kappa: f64) -> f64 {
        let (sum, max) = sum_and_max(stage_ms);
        max + kappa.max(0.0) * (sum - max)
    }

    /// A pass of `micro_batches` equal micro-batches over stages taking `stage_ms` alone: the
    /// first goes through every stage in turn (`Σ t`), each later one adds an
    /// [`interval_ms`](Self::interval_ms).
    pub fn pipelined_ms(stage_ms: &[f64], micro_batches: usize, kappa: f64) -> f64 {
        stage_ms.iter().sum::<f64>() + micro_batches.saturating_sub(1) as f64 * Self::interval_ms(stage_ms, kappa)
    }

    /// One line for start-up logs.
    pub fn summary(&self, names: &[String]) -> String {
        let alone: Vec<String> = names.iter().zip(&self.alone_ms).map(|(n, a)| format!("{n} {a:.2} ms")).collect();
        let layers = match self.layers.as_slice() {
            [] => format!("{} layers each", self.step.layers),
            own => format!("layers {}", own.iter().map(usize::to_string).collect::<Vec<_>>().join(" / ")),
        };
        let head: Vec<&str> = self.head.iter().filter_map(|&d| names.get(d).map(String::as_str)).collect();
        let layers = match head.as_slice() {
            [] => layers,
            on => format!("{layers}, the LM head on {}", on.join(", ")),
        };
        format!(
            "stages overlapping ({} new token(s) after {}, {layers}): alone {}; a pass of {} micro-batches \
             {:.2} ms, {:.2} ms each after the first: interference κ = {:.2} (a later micro-batch costs \
             max + κ·(Σ − max) of its stages' times; 0 overlaps perfectly, 1 takes turns)",
            self.step.tokens,
            self.step.context,
            alone.join(", "),
            self.step.micro_batches,
            self.pass_ms,
            self.measured_interval_ms(),
            self.kappa
        )
    }
}

/// `(Σ t, max t)` of stage times (`max` 0 without stages).
fn sum_and_max(t: &[f64]) -> (f64, f64) {
    (t.iter().sum(), t.iter().copied().fold(0.0, f64::max))
}

/// What each micro-batch after the first added to a pass `pass` of `micro_batches` through
/// devices whose steps take `alone`: `(pass − Σ alone) ÷ (M − 1)`; `None` without several of both.
fn later_interval_ms(alone: &[f64], pass: f64, micro_batches: usize) -> Option<f64> {
    (micro_batches >= 2 && alone.len() >= 2 && pass.is_finite())
        .then(|| (pass - alone.iter().sum::<f64>()) / (micro_batches - 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kappa_is_zero_for_perfect_overlap_one_for_turns_and_more_when_overlap_costs() {
        // Stages of 2 and 6 ms, 3 micro-batches: 8 + 2·6 ms when every later one adds only the
        // slowest stage, 3·8 ms when they take turns.
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 20.0, 3), 0.0);
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 24.0, 3), 1.0);
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 32.0, 3), 3.0);
        // Faster than the slowest stage allows is noise, not negative interference.
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 18.0, 3), 0.0);
        // One device, or one micro-batch, shows nothing of an overlap.
        assert_eq!(Interference::kappa_of(&[6.0], 30.0, 3), 0.0);
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 12.0, 1), 0.0);
        // The measurement solves the price: the pass it prices is the pass measured.
        for kappa in [0.0, 0.4, 1.0, 2.5] {
            let pass = Interference::pipelined_ms(&[3.0, 7.0, 5.0], 8, kappa);
            assert!((Interference::kappa_of(&[3.0, 7.0, 5.0], pass, 8) - kappa).abs() < 1e-12);
        }
    }

    #[test]
    fn kappa_of_a_cycle_solves_the_cyclic_price_of_its_engines() {
        // Two engines over stages of 4 and 6 ms: each comes round every 2·6 ms when the stages
        // overlap perfectly, every 2·10 ms when the engines might as well take turns.
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], 12.0, 2), 0.0);
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], 20.0, 2), 1.0);
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], 16.0, 2), 0.5);
        // Faster than the slowest stage allows is noise; one engine or one stage shows nothing.
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], 10.0, 2), 0.0);
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], 20.0, 1), 0.0);
        assert_eq!(Interference::kappa_of_cycle(&[10.0], 30.0, 2), 0.0);
        assert_eq!(Interference::kappa_of_cycle(&[4.0, 6.0], f64::NAN, 2), 0.0);
        // Solved against the price it feeds: three engines over three stages.
        for kappa in [0.0, 0.3, 1.0, 2.0] {
            let period = 3.0 * Interference::interval_ms(&[3.0, 7.0, 5.0], kappa);
            assert!((Interference::kappa_of_cycle(&[3.0, 7.0, 5.0], period, 3) - kappa).abs() < 1e-12);
        }
    }

    #[test]
    fn a_pipelined_pass_pays_the_interference_per_later_micro_batch() {
        // κ = 0: TeraPipe's and GPipe's Σ t + (M − 1)·max t.
        assert_eq!(Interference::pipelined_ms(&[2.0, 5.0], 3, 0.0), 17.0);
        // κ = 1: the stages take turns, M·Σ t.
        assert_eq!(Interference::pipelined_ms(&[2.0, 5.0], 3, 1.0), 21.0);
        assert_eq!(Interference::pipelined_ms(&[2.0, 5.0], 1, 2.5), 7.0);
        assert_eq!(Interference::interval_ms(&[2.0, 5.0], 0.5), 6.0);
        assert_eq!(Interference::pipelined_ms(&[], 2, 1.0), 0.0);
    }
}
