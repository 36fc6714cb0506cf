//! How much pipeline stages slow each other down when they work at once: the interference `κ`
//! that micro-batched steps are priced with.
//!
//! A device profile ([`super::device_profile`]) times each device alone. Stages that overlap (stage
//! `s + 1` on micro-batch `m` while stage `s` works on `m + 1`) may share what the profile never
//! saw shared: a machine's cores when the host CPU computes beside a worker on loopback, or two
//! workers on one host, and the host threads that drive a worker (they issue every operation and
//! wait on its replies). So it is measured in the pipeline's own rhythm: a pass of
//! [`OverlapStep::micro_batches`] micro-batches through the devices as stages, each device on a
//! thread of its own (host-CPU devices in the rayon pool their stage would get) running the same
//! step (the checkpoint's first layers, as the profiler runs them, and on the last stage's device
//! the final norm and LM head over the step's last position: [`OverlapDevice::head`]), every
//! micro-batch handed on to the next device when done, as `PipelineLm`'s threaded stages hand on
//! hidden states.
//!
//! Each device is timed alone before and after the passes, the devices taking turns run by run,
//! and keeps the faster median. With `a_d` each device's step alone, `M` micro-batches and `P` a
//! pass, the interval a later micro-batch adds is `(P − Σ a) ÷ (M − 1)`, and
//! `κ = (interval − max a) ÷ (Σ a − max a)`: 0 when the stages overlap perfectly (each later
//! micro-batch adds only the slowest stage), 1 when they might as well take turns, above 1 when
//! overlapping costs more than taking turns. A pipelined pass of stages taking `t_s` alone is then
//! priced at `Σ t + (M − 1)·(max t + κ·(Σ t − max t))` ([`Interference::pipelined_ms`]), the
//! formula the measurement solves for `κ`: each stage is slowed only while the others work, and by
//! as much as their work.
//!
//! A pass rather than lock-step ticks (every device's step started together, the next waiting for
//! the slowest): a pipeline's stages wait only on their inputs, so a fast stage runs ahead of a
//! slow one, which ticks never let it do; the pass times the rhythm the price is used for.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use burn_llm_models::CausalLm;
use serde::{Deserialize, Serialize};

use super::ProfileError;
use super::fit::median;
use super::measure::{StepShape, alone_in_turns_ms, guarded_step_ms};
use crate::pipeline::slicing::in_stage_pool;

/// One stage's device for [`pipeline_interference`].
pub struct OverlapDevice<'a> {
    /// The model's first few layers on the device (the profiler's run model).
    pub model: &'a CausalLm,
    /// Rayon threads a stage on the host CPU computes with (`None`: the caller's pool; other
    /// devices ignore it).
    pub threads: Option<usize>,
    /// Layers this device's step runs (`None`: the step's [`OverlapStep::layers`]): a stage's
    /// own share, when the split being priced gives the devices unequal shares.
    pub layers: Option<usize>,
    /// Whether each step ends with the final norm and the LM head over the step's last position,
    /// as the pipeline's last stage ends its step: the stage times a measured `κ` multiplies
    /// include the head, so the step it is measured on must too.
    pub head: bool,
}

impl OverlapDevice<'_> {
    fn layers(&self, step: OverlapStep) -> usize {
        self.layers.unwrap_or(step.layers).max(1)
    }

    /// What the device's step of `step` runs: one sequence, its own layers, and the head where it
    /// runs one.
    fn shape(&self, step: OverlapStep) -> StepShape {
        StepShape { batch: 1, tokens: step.tokens, context: step.context, layers: self.layers(step), head: self.head }
    }
}

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

/// Measures the interference of `devices` on `step` (see the module docs). One device has nothing
/// to overlap with: `κ = 0`. A device that fails is an error naming its index.
pub fn pipeline_interference(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<Interference, ProfileError> {
    if step.tokens == 0 || step.repeats == 0 || step.micro_batches < 2 {
        return Err(ProfileError::Grid(
            "an overlap step needs at least one token, one timed run and two micro-batches a pass".into(),
        ));
    }
    let own: Vec<usize> = devices.iter().map(|d| d.layers(step)).collect();
    let layers = if own.iter().all(|&l| l == step.layers) { Vec::new() } else { own };
    let head: Vec<usize> = devices.iter().enumerate().filter(|(_, d)| d.head).map(|(i, _)| i).collect();
    let before = alone_ms(devices, step)?;
    if devices.len() < 2 {
        return Ok(Interference {
            step,
            pass_ms: step.micro_batches as f64 * before.first().copied().unwrap_or(0.0),
            alone_ms: before,
            kappa: 0.0,
            layers,
            head,
        });
    }
    let pass = passes_ms(devices, step)?;
    // Timed again after the passes, each device's alone step is the faster of the two medians: a
    // device still warming up (a worker's first steps after its weights arrived) or disturbed
    // once must not pass for a slow one, which would hide the interference.
    let after = alone_ms(devices, step)?;
    let alone: Vec<f64> = before.iter().zip(&after).map(|(b, a)| b.min(*a)).collect();
    let kappa = Interference::kappa_of(&alone, pass, step.micro_batches);
    Ok(Interference { step, kappa, alone_ms: alone, pass_ms: pass, layers, head })
}

/// Each device's median step alone, the devices taking turns run by run
/// ([`alone_in_turns_ms`]).
fn alone_ms(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<Vec<f64>, ProfileError> {
    alone_in_turns_ms(devices.len(), step.warmup, step.repeats, |i| {
        let d = &devices[i];
        in_stage_pool(d.threads, || guarded_step_ms(d.model, d.shape(step))).map_err(|e| at_device(i, e))
    })
}

/// The median pass of `step.micro_batches` micro-batches through `devices` in order, each on a
/// thread of its own: device `d` runs micro-batch `m` once it has run `m − 1` and device `d − 1`
/// has run `m`. A pass runs from the first device's start to the last device's end; all start
/// together. Every thread hands on every micro-batch and passes every barrier, failed or not (a
/// step that panics counts as failed), so that none waits forever; the first failure is returned.
fn passes_ms(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<f64, ProfileError> {
    let n = devices.len();
    let start = Barrier::new(n);
    let failure: Mutex<Option<(usize, ProfileError)>> = Mutex::new(None);
    let failed = || failure.lock().map(|f| f.is_some()).unwrap_or(true);
    // Device `d` hands each micro-batch on to `d + 1`: the first has nothing to wait for, the last
    // no one to hand on to.
    let mut senders: Vec<Option<Sender<()>>> = Vec::with_capacity(n);
    let mut receivers: Vec<Option<Receiver<()>>> = vec![None];
    for _ in 1..n {
        let (tx, rx) = channel();
        senders.push(Some(tx));
        receivers.push(Some(rx));
    }
    senders.push(None);
    let spans = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .zip(senders.into_iter().zip(receivers))
            .enumerate()
            .map(|(i, (d, (to, from)))| {
                let (start, failure, failed) = (&start, &failure, &failed);
                scope.spawn(move || {
                    in_stage_pool(d.threads, move || {
                        let mut spans = Vec::with_capacity(step.repeats);
                        for run in 0..step.warmup + step.repeats {
                            start.wait();
                            let began = Instant::now();
                            for _ in 0..step.micro_batches {
                                // A closed channel means a neighbour panicked: its panic is resumed below.
                                if let Some(from) = &from {
                                    let _ = from.recv();
                                }
                                if !failed()
                                    && let Err(e) = guarded_step_ms(d.model, d.shape(step))
                                    && let Ok(mut slot) = failure.lock()
                                {
                                    slot.get_or_insert((i, e));
                                }
                                if let Some(to) = &to {
                                    let _ = to.send(());
                                }
                            }
                            if run >= step.warmup {
                                spans.push((began, Instant::now()));
                            }
                        }
                        spans
                    })
                })
            })
            .collect();
        let mut per_thread: Vec<Vec<(Instant, Instant)>> = Vec::with_capacity(n);
        for handle in handles {
            match handle.join() {
                Ok(spans) => per_thread.push(spans),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        per_thread
    });
    if let Some((i, e)) = failure.into_inner().ok().flatten() {
        return Err(at_device(i, e));
    }
    let per_pass: Vec<f64> = (0..step.repeats)
        .filter_map(|r| {
            let began = spans.iter().filter_map(|s| s.get(r)).map(|s| s.0).min()?;
            let ended = spans.iter().filter_map(|s| s.get(r)).map(|s| s.1).max()?;
            Some(ended.duration_since(began).as_secs_f64() * 1e3)
        })
        .collect();
    Ok(median(per_pass))
}

fn at_device(index: usize, e: ProfileError) -> ProfileError {
    match e {
        ProfileError::Device(reason) => {
            ProfileError::Device(format!("stage device {index}, timed with the other stages: {reason}"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiler::tiny_llama;

    fn tiny() -> CausalLm {
        tiny_llama(64, 2)
    }

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

    #[test]
    fn one_device_has_nothing_to_overlap_with() {
        let model = tiny();
        let one = [OverlapDevice { model: &model, threads: None, layers: None, head: false }];
        let step = OverlapStep { tokens: 1, context: 8, layers: 3, micro_batches: 4, warmup: 1, repeats: 3 };
        let measured = pipeline_interference(&one, step).expect("measures");
        assert_eq!(measured.kappa, 0.0);
        assert_eq!(measured.alone_ms.len(), 1);
    }

    #[test]
    fn devices_in_a_pass_report_their_steps_and_a_finite_interference() {
        let (a, b) = (tiny(), tiny());
        let devices = [
            OverlapDevice { model: &a, threads: Some(1), layers: None, head: false },
            OverlapDevice { model: &b, threads: Some(1), layers: None, head: false },
        ];
        let step = OverlapStep { tokens: 4, context: 8, layers: 2, micro_batches: 4, warmup: 1, repeats: 5 };
        let measured = pipeline_interference(&devices, step).expect("measures");
        assert_eq!(measured.alone_ms.len(), 2);
        assert!(measured.alone_ms.iter().all(|a| a.is_finite() && *a > 0.0), "{measured:?}");
        assert!(measured.pass_ms > 0.0 && measured.kappa.is_finite() && measured.kappa >= 0.0, "{measured:?}");
        // The last device runs every micro-batch after the first device's first: a pass is never
        // shorter than the slower device's 4 steps, up to timing noise.
        let slowest = measured.alone_ms.iter().copied().fold(0.0, f64::max);
        assert!(measured.pass_ms > 0.5 * 4.0 * slowest, "{measured:?}");
        assert!(measured.measured_interval_ms() >= 0.0 && measured.measured_interval_ms() < measured.pass_ms);
    }

    #[test]
    fn each_device_can_run_its_own_share_of_layers() {
        let (a, b) = (tiny(), tiny());
        let devices = [
            OverlapDevice { model: &a, threads: Some(1), layers: Some(24), head: false },
            OverlapDevice { model: &b, threads: Some(1), layers: Some(1), head: false },
        ];
        let step = OverlapStep { tokens: 4, context: 8, layers: 2, micro_batches: 2, warmup: 1, repeats: 5 };
        let measured = pipeline_interference(&devices, step).expect("measures");
        assert_eq!(measured.layers, vec![24, 1]);
        assert!(measured.alone_ms[0] > measured.alone_ms[1], "24 layers against 1: {measured:?}");
        assert!(measured.summary(&["a".into(), "b".into()]).contains("layers 24 / 1"));
        // Devices that all run the step's layers record none of their own.
        let same = [
            OverlapDevice { model: &a, threads: Some(1), layers: Some(2), head: false },
            OverlapDevice { model: &b, threads: Some(1), layers: None, head: false },
        ];
        assert!(pipeline_interference(&same, step).expect("measures").layers.is_empty());
    }

    #[test]
    fn the_last_stage_can_end_its_step_with_the_lm_head() {
        // A vocabulary of 32768 over a hidden size of 32: the head's 1M multiply-adds outweigh a
        // layer's ~20k fifty-fold, so the device that runs it is the slower one alone.
        let model = tiny_llama(32768, 1);
        let devices = [
            OverlapDevice { model: &model, threads: Some(1), layers: Some(1), head: false },
            OverlapDevice { model: &model, threads: Some(1), layers: Some(1), head: true },
        ];
        let step = OverlapStep { tokens: 4, context: 8, layers: 1, micro_batches: 2, warmup: 1, repeats: 5 };
        let measured = pipeline_interference(&devices, step).expect("measures");
        assert_eq!(measured.head, vec![1]);
        assert!(measured.alone_ms[1] > measured.alone_ms[0], "the head's device is slower alone: {measured:?}");
        let summary = measured.summary(&["a".into(), "b".into()]);
        assert!(summary.contains("1 layers each, the LM head on b"), "{summary}");
    }

    #[test]
    fn an_empty_step_is_refused() {
        let model = tiny();
        let devices = [
            OverlapDevice { model: &model, threads: None, layers: None, head: false },
            OverlapDevice { model: &model, threads: None, layers: None, head: false },
        ];
        let step = OverlapStep { tokens: 0, ..OverlapStep::decode(4) };
        assert!(matches!(pipeline_interference(&devices, step), Err(ProfileError::Grid(_))));
        let step = OverlapStep { micro_batches: 1, ..OverlapStep::decode(4) };
        assert!(matches!(pipeline_interference(&devices, step), Err(ProfileError::Grid(_))));
    }
}
