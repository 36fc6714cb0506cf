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
use burn_plan::interference::{Interference, OverlapStep};

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
