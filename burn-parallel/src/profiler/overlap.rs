//! How much pipeline stages slow each other down when they work at once: the interference `κ`
//! that micro-batched steps are priced with.
//!
//! A device profile ([`super::device_profile`]) times each device alone. Stages that overlap (stage
//! `s + 1` on micro-batch `m` while stage `s` works on `m + 1`) may share what the profile never
//! saw shared: a machine's cores when the host CPU computes beside a worker on loopback, or two
//! workers on one host, and the host threads that drive a worker (they issue every operation and
//! wait on its replies). So it is measured, in the pipeline's own rhythm: every device runs the
//! same step (the checkpoint's first layers, as the profiler runs them) on a thread of its own,
//! host-CPU devices in the rayon pool their stage would get, all starting together at each tick
//! and the next tick waiting for the slowest, as a pipeline's stages wait for each other.
//!
//! Each device is timed alone before and after the ticks, the devices taking turns run by run,
//! and keeps the faster median. With `a_d` each device's step alone and `T` a tick,
//! `κ = (T − max a) ÷ (Σ a − max a)`: 0 when the stages overlap perfectly (a tick is the slowest
//! stage), 1 when they might as well take turns (a tick is the sum), above 1 when overlapping
//! costs more than taking turns. A pipelined pass of
//! stages taking `t_s` alone is then priced at `max t + κ·(Σ t − max t)` per micro-batch
//! ([`Interference::interval_ms`]): each stage is slowed only while the others work, and by as
//! much as their work.

use std::sync::Barrier;
use std::sync::Mutex;
use std::time::Instant;

use burn_llm_models::CausalLm;
use serde::{Deserialize, Serialize};

use super::ProfileError;
use super::fit::median;
use super::measure::{Bench, Progress};
use crate::pipeline::slicing::in_stage_pool;

/// One stage's device for [`pipeline_interference`].
pub struct OverlapDevice<'a> {
    /// The model's first few layers on the device (the profiler's run model).
    pub model: &'a CausalLm,
    /// Rayon threads a stage on the host CPU computes with (`None`: the caller's pool; other
    /// devices ignore it).
    pub threads: Option<usize>,
}

/// The step every device times: `tokens` new tokens of one sequence after `context` cached ones,
/// through `layers` layers between two synchronisations: the model's layers in order, from the
/// first again when it has fewer (so that a step lasts about as long as a stage's share of a deep
/// model, and per-tick costs, a thread woken, a worker's round trip, weigh in it as they weigh in
/// a stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapStep {
    /// New tokens (1: a decode step).
    pub tokens: usize,
    /// Cached tokens before them.
    pub context: usize,
    /// Layers run per step (at least 1).
    pub layers: usize,
    /// Untimed runs before the timed ones (alone, and again together).
    pub warmup: usize,
    /// Timed runs, alone and together (the median is kept).
    pub repeats: usize,
}

impl OverlapStep {
    /// A decode step after 64 tokens through `stage_layers` layers: what a micro-batched decode
    /// step overlaps.
    pub fn decode(stage_layers: usize) -> Self {
        Self { tokens: 1, context: 64, layers: stage_layers.max(1), warmup: 3, repeats: 15 }
    }

    /// A decode step through one stage's share of `layers` layers split over `stages` stages.
    pub fn decode_share(layers: usize, stages: usize) -> Self {
        Self::decode(layers.div_ceil(stages.max(1)))
    }

    /// A prefill of `tokens` tokens (at least 1) through 2 layers: compute-bound steps, where a
    /// tick's fixed costs weigh little, so two layers show what a stage's share would.
    pub fn prefill(tokens: usize) -> Self {
        Self { tokens: tokens.max(1), context: 0, layers: 2, warmup: 2, repeats: 5 }
    }
}

/// What [`pipeline_interference`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    /// The step it was measured on.
    pub step: OverlapStep,
    /// Each device's step alone (median), ms.
    pub alone_ms: Vec<f64>,
    /// A tick, every device's step started together (median), ms.
    pub together_ms: f64,
    /// `(together − max alone) ÷ (Σ alone − max alone)`, at least 0 (see the module docs).
    pub kappa: f64,
}

impl Interference {
    /// No interference (one device, or devices that share nothing): `κ = 0`.
    pub fn none() -> Self {
        Self { step: OverlapStep::decode(1), alone_ms: Vec::new(), together_ms: 0.0, kappa: 0.0 }
    }

    /// `κ` from a tick `together` and the steps `alone`: 0 when only one device works.
    pub fn kappa_of(alone: &[f64], together: f64) -> f64 {
        let (sum, max) = (alone.iter().sum::<f64>(), alone.iter().copied().fold(0.0, f64::max));
        let rest = sum - max;
        if rest > 0.0 && together.is_finite() { ((together - max) / rest).max(0.0) } else { 0.0 }
    }

    /// One micro-batch's share of a pipelined pass over stages taking `stage_ms` alone:
    /// `max t + κ·(Σ t − max t)` for interference `kappa`.
    pub fn interval_ms(stage_ms: &[f64], kappa: f64) -> f64 {
        let (sum, max) = (stage_ms.iter().sum::<f64>(), stage_ms.iter().copied().fold(0.0, f64::max));
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
        format!(
            "stages overlapping ({} new token(s) after {}, {} layers each): alone {}, together {:.2} ms a tick: \
             interference κ = {:.2} (a micro-batch costs max + κ·(Σ − max) of its stages' times; \
             0 overlaps perfectly, 1 takes turns)",
            self.step.tokens,
            self.step.context,
            self.step.layers,
            alone.join(", "),
            self.together_ms,
            self.kappa
        )
    }
}

/// Measures the interference of `devices` on `step` (see the module docs). One device has nothing
/// to overlap with: `κ = 0`. A device that fails is an error naming its index.
pub fn pipeline_interference(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<Interference, ProfileError> {
    if step.tokens == 0 || step.repeats == 0 {
        return Err(ProfileError::Grid("an overlap step needs at least one token and one timed run".into()));
    }
    let before = alone_ms(devices, step)?;
    if devices.len() < 2 {
        return Ok(Interference {
            step,
            together_ms: before.first().copied().unwrap_or(0.0),
            alone_ms: before,
            kappa: 0.0,
        });
    }
    let together = ticks_ms(devices, step)?;
    // Timed again after the ticks, each device's alone step is the faster of the two medians: a
    // device still warming up (a worker's first steps after its weights arrived) or disturbed
    // once must not pass for a slow one, which would hide the interference.
    let after = alone_ms(devices, step)?;
    let alone: Vec<f64> = before.iter().zip(&after).map(|(b, a)| b.min(*a)).collect();
    Ok(Interference { step, kappa: Interference::kappa_of(&alone, together), alone_ms: alone, together_ms: together })
}

/// Each device's median step alone, the devices taking turns run by run (so that whatever drifts
/// while they are timed, the host's load or a device warming up, reaches all of them alike).
fn alone_ms(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<Vec<f64>, ProfileError> {
    let mut runs = vec![Vec::with_capacity(step.repeats); devices.len()];
    for run in 0..step.warmup + step.repeats {
        for (i, d) in devices.iter().enumerate() {
            let ms = in_stage_pool(d.threads, || step_ms(d.model, step)).map_err(|e| at_device(i, e))?;
            if run >= step.warmup {
                runs[i].push(ms);
            }
        }
    }
    Ok(runs.into_iter().map(median).collect())
}

/// The median tick of `devices` all running `step`, started together and waited for together.
/// Every thread passes every barrier, failed or not, so that none waits forever; the first
/// failure is returned.
fn ticks_ms(devices: &[OverlapDevice<'_>], step: OverlapStep) -> Result<f64, ProfileError> {
    let n = devices.len();
    let (start, end) = (Barrier::new(n), Barrier::new(n));
    let failure: Mutex<Option<(usize, ProfileError)>> = Mutex::new(None);
    let failed = || failure.lock().map(|f| f.is_some()).unwrap_or(true);
    let ticks = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (start, end, failure, failed) = (&start, &end, &failure, &failed);
                scope.spawn(move || {
                    in_stage_pool(d.threads, || {
                        let mut ticks = Vec::with_capacity(step.repeats);
                        for run in 0..step.warmup + step.repeats {
                            start.wait();
                            let began = Instant::now();
                            if !failed()
                                && let Err(e) = step_ms(d.model, step)
                                && let Ok(mut slot) = failure.lock()
                            {
                                slot.get_or_insert((i, e));
                            }
                            end.wait();
                            if run >= step.warmup {
                                ticks.push(began.elapsed().as_secs_f64() * 1e3);
                            }
                        }
                        ticks
                    })
                })
            })
            .collect();
        let mut per_thread: Vec<Vec<f64>> = Vec::with_capacity(n);
        for handle in handles {
            match handle.join() {
                Ok(ticks) => per_thread.push(ticks),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        per_thread
    });
    if let Some((i, e)) = failure.into_inner().ok().flatten() {
        return Err(at_device(i, e));
    }
    // A tick ends at the second barrier for every thread: each one's reading of it differs by
    // when it passed the first; the latest starter's reading is the shortest, so take the largest.
    let per_tick: Vec<f64> =
        (0..step.repeats).map(|r| ticks.iter().filter_map(|t| t.get(r)).copied().fold(0.0, f64::max)).collect();
    Ok(median(per_tick))
}

/// One timed step of `model`'s layers (see [`OverlapStep`]), the device drained before and after:
/// the profiler's prefill run ([`Bench::prefill_once_ms`]) through `step.layers` layers.
fn step_ms(model: &CausalLm, step: OverlapStep) -> Result<f64, ProfileError> {
    let device = model.device();
    let progress = Progress::new(0, None);
    let bench = Bench::new(model, &device, 0, 1, &progress).cycling_layers(step.layers);
    bench.prefill_once_ms(1, step.tokens, step.context)
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
    use std::path::Path;

    use burn::tensor::Device;
    use burn_llm_models::DecoderSpec;

    use super::*;

    fn tiny() -> CausalLm {
        let config = serde_json::json!({
            "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        });
        let spec = DecoderSpec::from_json(&config.to_string(), Path::new("tiny")).expect("a tiny spec parses");
        CausalLm::random(spec, &Device::flex()).expect("a tiny model builds")
    }

    #[test]
    fn kappa_is_zero_for_perfect_overlap_one_for_turns_and_more_when_overlap_costs() {
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 6.0), 0.0);
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 8.0), 1.0);
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 12.0), 3.0);
        // Faster than the slowest alone is noise, not negative interference.
        assert_eq!(Interference::kappa_of(&[2.0, 6.0], 5.0), 0.0);
        assert_eq!(Interference::kappa_of(&[6.0], 9.0), 0.0);
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
        let one = [OverlapDevice { model: &model, threads: None }];
        let step = OverlapStep { tokens: 1, context: 8, layers: 3, warmup: 1, repeats: 3 };
        let measured = pipeline_interference(&one, step).expect("measures");
        assert_eq!(measured.kappa, 0.0);
        assert_eq!(measured.alone_ms.len(), 1);
    }

    #[test]
    fn devices_ticking_together_report_their_steps_and_a_finite_interference() {
        let (a, b) = (tiny(), tiny());
        let devices = [OverlapDevice { model: &a, threads: Some(1) }, OverlapDevice { model: &b, threads: Some(1) }];
        let step = OverlapStep { tokens: 4, context: 8, layers: 2, warmup: 1, repeats: 5 };
        let measured = pipeline_interference(&devices, step).expect("measures");
        assert_eq!(measured.alone_ms.len(), 2);
        assert!(measured.alone_ms.iter().all(|a| a.is_finite() && *a > 0.0), "{measured:?}");
        assert!(measured.together_ms > 0.0 && measured.kappa.is_finite() && measured.kappa >= 0.0, "{measured:?}");
        // A tick waits for the slower device: never shorter than it alone, up to timing noise.
        let slowest = measured.alone_ms.iter().copied().fold(0.0, f64::max);
        assert!(measured.together_ms > 0.5 * slowest, "{measured:?}");
    }

    #[test]
    fn an_empty_step_is_refused() {
        let model = tiny();
        let devices = [OverlapDevice { model: &model, threads: None }, OverlapDevice { model: &model, threads: None }];
        let step = OverlapStep { tokens: 0, ..OverlapStep::decode(4) };
        assert!(matches!(pipeline_interference(&devices, step), Err(ProfileError::Grid(_))));
    }
}
