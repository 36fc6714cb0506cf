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

use serde::{Deserialize, Serialize};

use super::super::check::{self, InputError};

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
        Ok(())
    }
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
/// simulator gives a second request started with the first, [`crate::plan::sim`]), kept between
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
    use crate::plan::sim::{self, Group, Request};

    #[test]
    fn measured_stages_make_the_simulator_replay_the_measured_pair() {
        let measured = MeasuredPipeline { stages: 2, latency_ms: 1000.0, interval_ms: 800.0 };
        for kappa in [0.0, 0.2, 0.5] {
            let stages = measured_stage_latency_ms(&[400.0, 500.0], &measured, kappa);
            assert!((stages.iter().sum::<f64>() - 1000.0).abs() < 1e-9, "{stages:?}");
            assert!(stages[1] > stages[0], "the split's slowest stage stays the slowest: {stages:?}");
            // One request alone takes the measured latency; two started together, latency plus
            // interval, in the simulator at the same κ.
            let group = Group { stages: 2, models: vec![(0, stages.iter().map(|ms| ms / 1e3).collect())] };
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

    #[test]
    fn bad_measurements_are_refused_naming_the_field() {
        let ok = MeasuredPipeline { stages: 2, latency_ms: 10.0, interval_ms: 6.0 };
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
    }
}
