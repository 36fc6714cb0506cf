//! How much the pool's devices slow each other down when they work at once, for the placement's
//! simulator ([`burn_plan::sim`]): while `n` devices hold a request, each advances at
//! `1 / (1 + κ·(n − 1))` of its speed alone. Replicas on two devices serving at once, or a
//! pipeline's stages overlapping, share whatever the devices share (a host's cores, the host
//! threads that drive a worker).
//!
//! Measured on the requests of the first model with traffic, as the server runs them: a replica
//! of the model on each device (a one-stage engine, as `--placement replicate` loads it), one
//! request of the workload's shape timed on each alone, then on every device at once, each from
//! its own thread as the server's engines run. `κ` is the mean slowdown over the devices,
//! `(together ÷ alone − 1) ÷ (n − 1)`. Only a whole request sees what serving shares: the
//! engines' host work, the hand-overs to a worker and the gaps between steps, which a pass
//! through a few layers does not: there the host's fixed costs per step weigh far more than in a
//! request.
//!
//! A model too large for a device whole falls back to that pass ([`interference_of`], as
//! `--stage-layers auto` measures it): a prefill step and a decode step through a few layers on
//! every device, alone and pipelined, weighed by each phase's share of one request's time (from
//! the model's profile). A phase under [`MIN_SHARE`] of a request is not measured.

use std::io::Write;
use std::sync::mpsc;

use burn::tensor::Device;
use burn_parallel::profiler::{OverlapStep, probe_ids};
use burn_plan::serving::{DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, ServingWorkload};

use super::super::ServerError;
use super::super::model_args::ServedModelSpec;
use super::pipelined::{REPEATS, WARMUP, probe_spec, request_shape, requests_ms};
use super::profiles::ModelCosts;
use burn_llm::Purpose;
use burn_llm::spec::{interference_of, parse_device};

/// A phase below this share of a request's time is left unmeasured (its `κ` weighs too little).
const MIN_SHARE: f64 = 0.05;

/// What [`measure`] found.
pub(super) struct Measured {
    /// The devices' interference `κ`.
    pub(super) kappa: f64,
    /// `(model, ms)`: one request of the model alone on the pool's first device, where the
    /// replicas were timed (the one-device timing of that model, which need not run again).
    pub(super) alone_on_first: Option<(String, f64)>,
}

/// The pool's interference `κ` for `workload`'s requests; `None` for a pool of one device or a
/// workload without traffic. `caps`: each device's memory, which decides whether a replica of the
/// model fits on every device.
pub(super) fn measure(
    models: &[ServedModelSpec],
    pool: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    caps: &[u64],
    log: &mut dyn Write,
) -> Result<Option<Measured>, ServerError> {
    let Some(model) = models.iter().find(|m| workload.load(&m.name).is_some()) else { return Ok(None) };
    if pool.len() < 2 {
        return Ok(None);
    }
    let fail = |e: &dyn std::fmt::Display| {
        ServerError::Engine(format!(
            "placement: timing the devices working together on `{}`: {e}; check that the workers run",
            model.name
        ))
    };
    let whole = costs.model_bytes(&model.name);
    let target = Target { model, pool, workload, costs };
    let measured = match caps.iter().all(|&cap| whole <= cap) {
        true => replicas(target, log)
            .map(|(kappa, alone)| Measured { kappa, alone_on_first: Some((model.name.clone(), alone)) }),
        false => layer_passes(target, log).map(|kappa| Measured { kappa, alone_on_first: None }),
    };
    measured.map(Some).map_err(|e| fail(&e))
}

/// The model whose requests are timed, on which devices, and its costs.
#[derive(Clone, Copy)]
struct Target<'a> {
    model: &'a ServedModelSpec,
    pool: &'a [String],
    workload: &'a ServingWorkload,
    costs: &'a ModelCosts,
}

/// `κ` from one request on a replica of `model` on every device of `pool`, alone and at once, and
/// the request's time alone on the first device (ms).
fn replicas(target: Target<'_>, log: &mut dyn Write) -> Result<(f64, f64), String> {
    let Target { model, pool, workload, costs } = target;
    let (dir, arch) = costs.model(&model.name);
    let (prompt, tokens) = request_shape(workload, &model.name, arch);
    let ids = probe_ids(prompt, arch.vocab_size);
    let runs = WARMUP + REPEATS;
    let (alone, together) = std::thread::scope(|scope| -> Result<(Vec<f64>, Vec<Vec<f64>>), String> {
        // One thread per device, as the server runs an engine per replica: it builds its engine,
        // says it is ready, then times one request whenever it is told to.
        let mut links = Vec::with_capacity(pool.len());
        for device in pool {
            let (go, told) = mpsc::channel::<()>();
            let (report, reports) = mpsc::channel::<Result<f64, String>>();
            let spec = probe_spec(model, vec![device.clone()], &[[0, arch.num_layers]], None);
            let ids = ids.clone();
            scope.spawn(move || {
                let mut engine = match spec.init(dir, Purpose::Serve, &mut std::io::sink()) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = report.send(Err(format!("a replica on {device}: {e}")));
                        return;
                    }
                };
                let _ = report.send(Ok(0.0));
                while told.recv().is_ok() {
                    let timed = requests_ms(engine.as_mut(), std::slice::from_ref(&ids), tokens)
                        .map_err(|e| format!("a request on {device}: {e}"));
                    if report.send(timed).is_err() {
                        return;
                    }
                }
            });
            links.push((go, reports));
        }
        let gone = || "a replica's thread ended".to_string();
        for (_, reports) in &links {
            reports.recv().map_err(|_| gone())??;
        }
        // Starts a request on each of `devices` at once and waits for all of them.
        let run = |devices: &[usize]| -> Result<Vec<f64>, String> {
            for &d in devices {
                links[d].0.send(()).map_err(|_| gone())?;
            }
            devices.iter().map(|&d| links[d].1.recv().map_err(|_| gone())?).collect()
        };
        let mut alone = Vec::with_capacity(pool.len());
        for d in 0..pool.len() {
            let mut timed =
                (0..runs).map(|_| Ok(run(&[d])?[0])).collect::<Result<Vec<f64>, String>>()?.split_off(WARMUP);
            timed.sort_by(f64::total_cmp);
            alone.push(timed[0]);
        }
        let all: Vec<usize> = (0..pool.len()).collect();
        let together = (0..runs).map(|_| run(&all)).collect::<Result<Vec<_>, String>>()?.split_off(WARMUP);
        Ok((alone, together))
    })?;
    let kappa = replica_kappa(&alone, &together);
    let median: Vec<f64> = (0..pool.len())
        .map(|d| {
            let mut t: Vec<f64> = together.iter().map(|run| run[d]).collect();
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect();
    let _ = writeln!(
        log,
        "placement: the devices' interference on `{}`'s requests ({prompt} prompt tokens, {tokens} generated), a \
         replica on each of {}: one request alone {} ms, on every device at once {} ms (median): κ = {kappa:.2} \
         (while n devices work, each runs at 1/(1 + κ·(n − 1)) of its speed alone)",
        model.name,
        pool.join(", "),
        join_ms(&alone),
        join_ms(&median)
    );
    Ok((kappa, alone[0]))
}

/// `κ` of `n` devices from each one's time alone and each run's times with all at once: a run's
/// mean slowdown `together ÷ alone` is `1 + κ·(n − 1)`; the median run's, never below 1.
fn replica_kappa(alone: &[f64], together: &[Vec<f64>]) -> f64 {
    let n = alone.len();
    if n < 2 || together.is_empty() {
        return 0.0;
    }
    let mut slowdowns: Vec<f64> = together
        .iter()
        .map(|run| run.iter().zip(alone).map(|(t, a)| t / a.max(f64::EPSILON)).sum::<f64>() / n as f64)
        .collect();
    slowdowns.sort_by(f64::total_cmp);
    ((slowdowns[slowdowns.len() / 2] - 1.0) / (n - 1) as f64).max(0.0)
}

fn join_ms(ms: &[f64]) -> String {
    ms.iter().map(|t| format!("{t:.0}")).collect::<Vec<_>>().join(" / ")
}

/// `κ` from a prefill and a decode step through a few layers on every device, alone and
/// pipelined, for a model too large for a device whole.
fn layer_passes(target: Target<'_>, log: &mut dyn Write) -> Result<f64, String> {
    let Target { model, pool, workload, costs } = target;
    let token = model.spec.worker_token.as_deref();
    let devices = pool
        .iter()
        .map(|entry| parse_device(entry, token))
        .collect::<Result<Vec<Device>, _>>()
        .map_err(|e| e.to_string())?;
    let (dir, spec) = costs.model(&model.name);
    let (prompt, max_tokens) =
        workload.load(&model.name).map_or((DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS), |l| l.shape());
    let share = costs.prefill_share(&model.name);
    let weight = prefill_weight(share);
    let mut kappa = |step: OverlapStep| -> Result<f64, String> {
        Ok(interference_of(&model.spec, dir, pool, &devices, step, log).map_err(|e| e.to_string())?.kappa)
    };
    // A phase that weighs nothing is not measured.
    let prefill = if weight > 0.0 { kappa(OverlapStep::prefill(prompt.min(spec.max_positions)))? } else { 0.0 };
    let decode = if weight < 1.0 { kappa(OverlapStep::decode_share(spec.num_layers, pool.len()))? } else { 0.0 };
    let mixed = weighted(share, prefill, decode);
    let _ = writeln!(
        log,
        "placement: the devices' interference on `{}`'s requests ({prompt} prompt tokens, {max_tokens} generated), \
         over a few layers (the model fits no device whole): κ = {mixed:.2} (prefill {prefill:.2}, decode \
         {decode:.2}, the prefill {:.0}% of a request's time)",
        model.name,
        100.0 * share
    );
    Ok(mixed)
}

/// The weight of the prefill's `κ` for a request spending `share` of its time in the prefill:
/// `share`, with a phase under [`MIN_SHARE`] of the time weighing nothing.
fn prefill_weight(share: f64) -> f64 {
    if share < MIN_SHARE {
        0.0
    } else if share > 1.0 - MIN_SHARE {
        1.0
    } else {
        share
    }
}

/// `κ` of a request spending `share` of its time in the prefill.
fn weighted(share: f64, prefill: f64, decode: f64) -> f64 {
    let weight = prefill_weight(share);
    weight * prefill + (1.0 - weight) * decode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_interference_weighs_each_phase_by_its_time() {
        assert!((weighted(0.75, 1.0, 0.2) - 0.8).abs() < 1e-12);
        // A phase too short to be measured does not weigh at all.
        assert_eq!(weighted(0.01, 9.0, 0.4), 0.4);
        assert_eq!(weighted(0.99, 0.6, 9.0), 0.6);
    }

    #[test]
    fn replicas_slowing_each_other_give_the_median_runs_kappa() {
        // Two devices of 1.0 s and 2.0 s alone; runs at once 1.2× (the median), 1.1× and 1.5× slower.
        let together = vec![vec![1.2, 2.4], vec![1.1, 2.2], vec![1.5, 3.0]];
        assert!((replica_kappa(&[1.0, 2.0], &together) - 0.2).abs() < 1e-12);
        // Over three devices the slowdown is shared by the two others: 1 + 2κ.
        assert!((replica_kappa(&[1.0, 1.0, 1.0], &[vec![1.4, 1.4, 1.4]]) - 0.2).abs() < 1e-12);
        // Faster at once than alone (noise) is no interference, not a negative one.
        assert_eq!(replica_kappa(&[1.0, 1.0], &[vec![0.9, 0.95]]), 0.0);
        assert_eq!(replica_kappa(&[1.0], &[vec![2.0]]), 0.0);
    }
}
