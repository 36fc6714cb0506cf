//! Predictions the measured figures are held against, from each device's profile (per-layer
//! prefill and decode times, embedding and LM head per token) and each link's measured latency
//! and rate, with the cost terms `--stage-layers auto` plans with:
//! - a stage's time for one micro-batch: the planner's own [`stage_pass_ms`] (its layers on its
//!   device, the embedding on the first stage, the final norm, LM head and the pass's fixed cost
//!   on the last), with handing the hidden states (and rotary angles) to the next stage priced by
//!   the pipeline's [`Handover`];
//! - a pipelined decode step of `M` micro-batches: `Σ_s t_s + (M − 1)·(max_s t_s + κ·(Σ_s t_s −
//!   max_s t_s))`, `κ` the devices' measured interference (`Interference::pipelined_ms`);
//! - a prefill cut into token slices: TeraPipe's `Σ_i t_i + (K − 1)·max_i t_i` with `t_i` slice
//!   `i`'s time on the slowest stage, plus `κ·(K − 1)·(Σ_i t_i − max_i t_i)` for the stage devices'
//!   interference on a prefill step ([`PlannedSlices::predicted_ms`]); unsliced, `K` whole-prompt
//!   passes.

use std::ops::Range;

use burn_llm::models::DecoderSpec;
use burn_llm::parallel::pipeline::Handover;
use burn_llm::parallel::profiler::LinkProfile;
use burn_llm::plan::profile::{CostModel, Profile};
use burn_llm::plan::stage_pass::{StagePlace, stage_pass_ms};
use serde::Serialize;

pub use burn_llm::plan::stage_pass::Work;

/// One stage's device: its profile and its link to the next stage.
#[derive(Debug, Clone)]
pub struct DeviceCost {
    /// The `--devices` entry.
    pub name: String,
    pub profile: Profile,
    cost: CostModel,
    /// The measured link to the next stage's device (`None` on the last).
    pub link: Option<LinkProfile>,
    handover: Handover,
}

impl DeviceCost {
    /// Checks `profile`.
    pub fn new(
        name: &str,
        profile: Profile,
        link: Option<LinkProfile>,
        spec: &DecoderSpec,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let cost = profile.cost_model(name)?;
        Ok(Self { name: name.to_string(), profile, cost, link, handover: Handover::of(spec) })
    }

    /// Milliseconds to hand `tokens` tokens' hidden states to the next stage (0 on the last).
    fn handover_ms(&self, tokens: usize) -> f64 {
        self.link.map_or(0.0, |l| self.handover.ms(&l, tokens))
    }
}

/// Predicted time of each stage of `layout` (layer ranges, stage `s` on `devices[s]`) for `work`.
pub fn stage_ms(devices: &[DeviceCost], layout: &[Range<usize>], work: Work) -> Vec<f64> {
    let last = layout.len().saturating_sub(1);
    layout
        .iter()
        .zip(devices)
        .enumerate()
        .map(|(s, (layers, d))| {
            let place = StagePlace { layers: layers.len(), first: s == 0, last: s == last };
            stage_pass_ms(&d.cost, place, work, d.handover_ms(work.tokens()))
        })
        .collect()
}

/// The largest of `values` (0 for none).
pub fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(0.0, f64::max)
}

/// Predicted and measured figures of one run, side by side.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Versus {
    pub predicted_ms: f64,
    pub measured_ms: f64,
    /// `measured ÷ predicted − 1`.
    pub error: f64,
}

impl Versus {
    pub fn new(predicted_ms: f64, measured_ms: f64) -> Self {
        Self { predicted_ms, measured_ms, error: measured_ms / predicted_ms - 1.0 }
    }
}

/// The stage layer ranges of an engine's placement line (`stage 0: layers 0-14 on flex, …`).
pub fn layout_of(placement: &str) -> Option<Vec<Range<usize>>> {
    let mut ranges = Vec::new();
    for part in placement.split("layers ").skip(1) {
        let span = part.split_whitespace().next()?;
        let (a, b) = span.split_once('-')?;
        let (a, b): (usize, usize) = (a.parse().ok()?, b.trim_end_matches(',').parse().ok()?);
        ranges.push(a..b + 1);
    }
    (!ranges.is_empty()).then_some(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_read_from_the_placement_line() {
        let line = "2 pipeline stages (stage 0: layers 0-11 on flex, stage 1: layers 12-29 on ws://127.0.0.1:4000), 3 MiB handed between stages";
        assert_eq!(layout_of(line), Some(vec![0..12, 12..30]));
        assert_eq!(layout_of("whole model on flex"), None);
    }
}
