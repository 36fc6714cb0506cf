//! How much two devices slow each other down when each repeats a step of its own at once: the
//! interference ExeGPT's WAA pays, its encoding device prefilling while its decoding device
//! decodes.
//!
//! [`super::pipeline_interference`] times pipeline stages: the same step handed from device to
//! device. WAA's two devices hand nothing on within a period; each runs its own kind of step
//! (a prefill of whole prompts; a decode step of a large batch) without waiting for the other,
//! and on a shared host they share its cores. So each [`Side`] is timed alone (the two taking
//! turns run by run, the faster of the medians before and after kept, as the pipeline pass does),
//! then both at once, each on a thread of its own repeating its step until both have run their
//! timed steps (so that every timed step of either ran while the other was working). The period
//! of the two at once is set by the slower, `max(e', d')`; the planner prices it
//! `max(a) + κ·min(a)` from the steps alone ([`super::Interference::interval_ms`] over the two),
//! so `κ = (max(e', d') − max(a)) ÷ min(a)`, at least 0.

use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use burn_llm_models::CausalLm;
use serde::{Deserialize, Serialize};

use super::ProfileError;
use super::fit::median;
use super::measure::{StepShape, alone_in_turns_ms, guarded_step_ms};
use crate::pipeline::slicing::in_stage_pool;

/// One device of [`side_by_side`] and the step it repeats: `batch` sequences of `tokens` new
/// tokens after `context` cached ones, through `layers` layers (the model's layers in order, from
/// the first again when it has fewer), ending with the LM head over each sequence's last position
/// (both WAA engines sample every step).
#[derive(Clone, Copy)]
pub struct Side<'a> {
    /// The model on the device.
    pub model: &'a CausalLm,
    /// Rayon threads a host-CPU device computes with (`None`: the caller's pool).
    pub threads: Option<usize>,
    /// Sequences per step (at least 1).
    pub batch: usize,
    /// New tokens of each (1: a decode step; a prompt's length: a prefill).
    pub tokens: usize,
    /// Cached tokens before them.
    pub context: usize,
    /// Layers a step runs (at least 1).
    pub layers: usize,
}

impl Side<'_> {
    /// One timed step ([`guarded_step_ms`]: a panic is an error, so that the other thread is not
    /// left waiting for steps that never come).
    fn step_ms(&self) -> Result<f64, ProfileError> {
        let shape = StepShape {
            batch: self.batch.max(1),
            tokens: self.tokens.max(1),
            context: self.context,
            layers: self.layers.max(1),
            head: true,
        };
        guarded_step_ms(self.model, shape)
    }
}

/// What [`side_by_side`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SideBySide {
    /// Each side's step alone (median), ms.
    pub alone_ms: [f64; 2],
    /// Each side's step while the other repeats its own (median), ms.
    pub together_ms: [f64; 2],
    /// `(max together − max alone) ÷ min alone`, at least 0 (see the module docs).
    pub kappa: f64,
}

impl SideBySide {
    /// `κ` of two steps taking `alone` ms alone and `together` ms at once: the `κ` for which
    /// `max a + κ·min a` is the slower of the two at once; 0 when either step takes no time.
    pub fn kappa_of(alone: [f64; 2], together: [f64; 2]) -> f64 {
        let (hi, lo) = (alone[0].max(alone[1]), alone[0].min(alone[1]));
        let period = together[0].max(together[1]);
        if lo <= 0.0 || !period.is_finite() { 0.0 } else { ((period - hi) / lo).max(0.0) }
    }

    /// One line for start-up logs, the two sides named `names`.
    pub fn summary(&self, names: [&str; 2]) -> String {
        format!(
            "prefill beside decode: {} {:.2} ms alone, {:.2} ms at once; {} {:.2} ms alone, {:.2} ms at once: \
             interference κ = {:.2} (the slower at once is max + κ·min of the two alone)",
            names[0],
            self.alone_ms[0],
            self.together_ms[0],
            names[1],
            self.alone_ms[1],
            self.together_ms[1],
            self.kappa
        )
    }
}

/// Measures `sides` alone and at once (see the module docs): `warmup` untimed and `repeats` timed
/// steps each. A side that fails is an error naming it.
pub fn side_by_side(sides: [Side<'_>; 2], warmup: usize, repeats: usize) -> Result<SideBySide, ProfileError> {
    if repeats == 0 {
        return Err(ProfileError::Grid("timing two devices side by side needs at least one timed step".into()));
    }
    let before = alone_ms(&sides, warmup, repeats)?;
    let together = together_ms(&sides, warmup, repeats)?;
    let after = alone_ms(&sides, warmup, repeats)?;
    let alone = [before[0].min(after[0]), before[1].min(after[1])];
    Ok(SideBySide { alone_ms: alone, together_ms: together, kappa: SideBySide::kappa_of(alone, together) })
}

/// Each side's median step alone, the two taking turns run by run ([`alone_in_turns_ms`]).
fn alone_ms(sides: &[Side<'_>; 2], warmup: usize, repeats: usize) -> Result<[f64; 2], ProfileError> {
    let alone = alone_in_turns_ms(2, warmup, repeats, |i| {
        in_stage_pool(sides[i].threads, || sides[i].step_ms()).map_err(|e| at_side(i, e))
    })?;
    Ok([alone[0], alone[1]])
}

/// Each side's median step while the other repeats its own: both start together, and each keeps
/// stepping until both have run `warmup + repeats` steps, so every step either times ran beside
/// the other's work. A failed step stops both (the first failure is returned).
fn together_ms(sides: &[Side<'_>; 2], warmup: usize, repeats: usize) -> Result<[f64; 2], ProfileError> {
    let quota = warmup + repeats;
    let start = Barrier::new(2);
    // Each side's steps done; `usize::MAX` once a side failed, which stops the other.
    let done = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = sides
            .iter()
            .enumerate()
            .map(|(i, side)| {
                let (start, done) = (&start, &done);
                scope.spawn(move || {
                    in_stage_pool(side.threads, move || {
                        let mut times = Vec::new();
                        start.wait();
                        loop {
                            let other = done[1 - i].load(Ordering::Acquire);
                            if other == usize::MAX || (times.len() >= quota && other >= quota) {
                                return Ok(times);
                            }
                            let began = Instant::now();
                            if let Err(e) = side.step_ms() {
                                done[i].store(usize::MAX, Ordering::Release);
                                return Err(at_side(i, e));
                            }
                            times.push(began.elapsed().as_secs_f64() * 1e3);
                            done[i].store(times.len(), Ordering::Release);
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(ProfileError::Device("a timing thread panicked".into()))))
            .collect::<Vec<_>>()
    });
    let mut medians = [0.0; 2];
    for (i, result) in results.into_iter().enumerate() {
        let times = result?;
        medians[i] = median(times.into_iter().skip(warmup).collect());
    }
    Ok(medians)
}

fn at_side(index: usize, e: ProfileError) -> ProfileError {
    match e {
        ProfileError::Device(reason) => {
            ProfileError::Device(format!("{} device, timed beside the other: {reason}", ["prefill", "decode"][index]))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiler::tiny_llama;

    #[test]
    fn kappa_prices_the_slower_side_at_once_from_the_two_alone() {
        // 10 and 4 ms alone: 10 at once overlaps perfectly, 14 takes turns.
        assert_eq!(SideBySide::kappa_of([10.0, 4.0], [10.0, 4.0]), 0.0);
        assert_eq!(SideBySide::kappa_of([10.0, 4.0], [14.0, 6.0]), 1.0);
        assert_eq!(SideBySide::kappa_of([4.0, 10.0], [5.0, 12.0]), 0.5);
        // The faster side slowed past the slower one sets the period.
        assert_eq!(SideBySide::kappa_of([10.0, 4.0], [9.0, 12.0]), 0.5);
        // Faster at once than alone is noise; a step of no time has nothing to overlap.
        assert_eq!(SideBySide::kappa_of([10.0, 4.0], [9.0, 3.0]), 0.0);
        assert_eq!(SideBySide::kappa_of([10.0, 0.0], [12.0, 0.0]), 0.0);
        assert_eq!(SideBySide::kappa_of([10.0, 4.0], [f64::NAN, 3.0]), 0.0);
    }

    #[test]
    fn a_prefill_beside_a_decode_batch_is_timed_alone_and_at_once() {
        let (a, b) = (tiny_llama(64, 2), tiny_llama(64, 2));
        let prefill = Side { model: &a, threads: Some(1), batch: 1, tokens: 24, context: 0, layers: 4 };
        let decode = Side { model: &b, threads: Some(1), batch: 4, tokens: 1, context: 16, layers: 4 };
        let measured = side_by_side([prefill, decode], 1, 5).expect("measures");
        for ms in measured.alone_ms.iter().chain(&measured.together_ms) {
            assert!(ms.is_finite() && *ms > 0.0, "{measured:?}");
        }
        assert!(measured.kappa.is_finite() && measured.kappa >= 0.0, "{measured:?}");
        assert_eq!(measured.kappa, SideBySide::kappa_of(measured.alone_ms, measured.together_ms));
        let line = measured.summary(["flex", "ws://w"]);
        assert!(line.contains("flex") && line.contains("ws://w") && line.contains("κ ="), "{line}");
        assert!(matches!(side_by_side([prefill, decode], 1, 0), Err(ProfileError::Grid(_))));
    }
}
