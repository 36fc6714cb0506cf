//! How much the pool's devices slow each other down when they work at once, for the placement's
//! simulator ([`burn_parallel::plan::sim`]): a pipeline's stages overlapping, or replicas on two
//! devices serving at once, share whatever the devices share (a host's cores, the host threads
//! that drive a worker).
//!
//! Measured as `--stage-layers auto` measures it ([`crate::spec::interference_of`]), on the
//! requests of the first model with traffic: every device runs the same step alone and then all
//! together. A request is a prefill and decode steps, which do not share a host alike (a prefill
//! is compute-bound, a decode step mostly fixed costs), so both are measured and `κ` is their
//! mean weighted by each phase's share of one request's time (from the model's profile). A phase
//! under [`MIN_SHARE`] of a request is not measured.

use std::io::Write;

use burn::tensor::Device;
use burn_parallel::plan::serving::{DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, ServingWorkload};
use burn_parallel::profiler::OverlapStep;

use super::super::ServerError;
use super::super::launch::ModelSpec;
use super::profiles::ModelCosts;
use crate::spec::{interference_of, parse_device};

/// A phase below this share of a request's time is left unmeasured (its `κ` weighs too little).
const MIN_SHARE: f64 = 0.05;

/// The pool's interference `κ` for `workload`'s requests; `None` for a pool of one device or a
/// workload without traffic.
pub(super) fn measure(
    models: &[ModelSpec],
    pool: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    log: &mut dyn Write,
) -> Result<Option<f64>, ServerError> {
    let Some(model) = models.iter().find(|m| workload.load(&m.name).is_some()) else { return Ok(None) };
    if pool.len() < 2 {
        return Ok(None);
    }
    let fail = |e: &dyn std::fmt::Display| {
        ServerError::Engine(format!("placement: timing the devices working together on `{}`: {e}", model.name))
    };
    let token = model.spec.worker_token.as_deref();
    let devices = pool
        .iter()
        .map(|entry| parse_device(entry, token))
        .collect::<Result<Vec<Device>, _>>()
        .map_err(|e| fail(&e))?;
    let (dir, spec) = costs.model(&model.name);
    let (prompt, max_tokens) =
        workload.load(&model.name).map_or((DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS), |l| l.shape());
    let share = costs.prefill_share(&model.name);
    let weight = prefill_weight(share);
    let mut kappa = |step: OverlapStep| -> Result<f64, ServerError> {
        Ok(interference_of(&model.spec, dir, pool, &devices, step, log).map_err(|e| fail(&e))?.kappa)
    };
    // A phase that weighs nothing is not measured.
    let prefill = if weight > 0.0 { kappa(OverlapStep::prefill(prompt.min(spec.max_positions)))? } else { 0.0 };
    let decode = if weight < 1.0 { kappa(OverlapStep::decode_share(spec.num_layers, pool.len()))? } else { 0.0 };
    let mixed = weighted(share, prefill, decode);
    let _ = writeln!(
        log,
        "placement: the devices' interference on `{}`'s requests ({prompt} prompt tokens, {max_tokens} generated): \
         κ = {mixed:.2} (prefill {prefill:.2}, decode {decode:.2}, the prefill {:.0}% of a request's time)",
        model.name,
        100.0 * share
    );
    Ok(Some(mixed))
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
}
