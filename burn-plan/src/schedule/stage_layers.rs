//! Alpa's stage planner choosing the split of the pipeline ExeGPT's RRA runs over its devices
//! ([`balanced_stage_layers`]), which the XSimulator then prices (`ScheduleInput::stage_layers`).

use crate::profile::CostModel;
use crate::stages::{self, StageDevice, StageExtra, StagesError, StagesInput};

use super::xsim::decode_parts;

/// The split of the model into `stages` one-device stages whose decode step of `batch` sequences
/// at `context` has the least bottleneck (with the stages slowing each other by `kappa`, the
/// least `max + κ·(Σ − max)`), chosen by Alpa's stage planner
/// ([`crate::stages::plan`] over `stages` alike devices) from the profile's layer, first-
/// and last-stage costs ([`super::decode_stage_ms`]'s parts): the layers of each stage. Where the
/// LM head outweighs several layers (a small model with a large vocabulary) an even split leaves
/// the last stage the bottleneck, and this moves layers forward.
pub fn balanced_stage_layers(
    cost: &CostModel,
    stages: usize,
    batch: f64,
    context: f64,
    kappa: f64,
) -> Result<Vec<usize>, StagesError> {
    let (layer_ms, first, last) = decode_parts(cost, batch, context);
    let layers = cost.profile().layers;
    let device = StageDevice {
        name: None,
        layer_latency_ms: vec![layer_ms; layers],
        memory_bytes: u64::MAX,
        link_ms: 0.0,
        fixed_ms: 0.0,
    };
    let input = StagesInput {
        layer_latency_ms: vec![layer_ms; layers],
        layer_memory_bytes: Some(vec![cost.profile().weight_bytes_per_layer; layers]),
        stages,
        devices: Some(vec![device; stages]),
        first_stage: Some(StageExtra { latency_ms: first, memory_bytes: 0 }),
        last_stage: Some(StageExtra { latency_ms: last, memory_bytes: 0 }),
        interference: kappa,
        ..Default::default()
    };
    let out = stages::plan(&input)?;
    Ok(out.stages.iter().map(|[a, b]| b - a).collect())
}
