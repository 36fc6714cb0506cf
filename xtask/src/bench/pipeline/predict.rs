//! Predictions the measured figures are held against, from each device's profile (per-layer
//! prefill and decode times, embedding and LM head per token) and each link's measured latency
//! and rate, with the cost terms `--stage-layers auto` plans with:
//! - a stage's time for one micro-batch: its layers on its device, plus the embedding on the
//!   first stage and the final norm, LM head and the pass's fixed cost (`call_ms`) on the last,
//!   plus handing the hidden states (and rotary angles) to the next stage;
//! - a pipelined decode step of `M` micro-batches: `Σ_s t_s + (M − 1)·(max_s t_s + κ·(Σ_s t_s −
//!   max_s t_s))`, `κ` the devices' measured interference (`Interference::pipelined_ms`);
//! - a prefill cut into token slices: TeraPipe's `Σ_i t_i + (K − 1)·max_i t_i` with `t_i` slice
//!   `i`'s time on the slowest stage, plus `κ·(K − 1)·(Σ_i t_i − max_i t_i)` for the stage devices'
//!   interference on a prefill step ([`PlannedSlices::predicted_ms`]); unsliced, `K` whole-prompt
//!   passes.

use std::ops::Range;

use burn_llm::models::DecoderSpec;
use burn_llm::parallel::pipeline::Handover;
use burn_llm::parallel::plan::profile::{CostModel, Profile};
use burn_llm::parallel::profiler::LinkProfile;
use serde::Serialize;

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
        self.link.map_or(0.0, |l| {
            l.latency_ms * self.handover.tensors as f64 + l.ms_per_byte * self.handover.bytes_per_token * tokens as f64
        })
    }
}

/// What a stage computes in one pass.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// A decode step of `batch` sequences after `context` cached tokens.
    Decode { batch: usize, context: usize },
    /// One sequence's prefill of `tokens` tokens after `context` cached tokens.
    Prefill { tokens: usize, context: usize },
}

/// Predicted time of each stage of `layout` (layer ranges, stage `s` on `devices[s]`) for `work`.
pub fn stage_ms(devices: &[DeviceCost], layout: &[Range<usize>], work: Work) -> Vec<f64> {
    let last = layout.len().saturating_sub(1);
    layout
        .iter()
        .zip(devices)
        .enumerate()
        .map(|(s, (layers, d))| {
            let (per_layer, rows, logits) = match work {
                Work::Decode { batch, context } => (d.cost.decode_layer_ms(batch as f64, context as f64), batch, batch),
                Work::Prefill { tokens, context } => {
                    (d.cost.prefill_layer_ms(1.0, tokens as f64, context as f64), tokens, 1)
                }
            };
            let mut ms = per_layer * layers.len() as f64;
            if s == 0 {
                ms += d.profile.embedding.ms_per_token * rows as f64;
            }
            if s == last {
                // The hand-over ends every other stage's pass; the last one's ends reading logits.
                ms += d.profile.lm_head.ms_per_token * logits as f64 + d.profile.call_ms;
            }
            ms + d.handover_ms(rows)
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
