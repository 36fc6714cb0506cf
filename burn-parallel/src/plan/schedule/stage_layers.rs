//! Alpa's stage planner choosing the split of the pipeline ExeGPT's RRA runs over its devices
//! ([`balanced_stage_layers`]), which the XSimulator then prices (`ScheduleInput::stage_layers`).

use crate::plan::profile::CostModel;
use crate::plan::stages::{self, StageDevice, StageExtra, StagesError, StagesInput};

use super::xsim::decode_parts;

/// The split of the model into `stages` one-device stages whose decode step of `batch` sequences
/// at `context` has the least bottleneck (with the stages slowing each other by `kappa`, the
/// least `max + κ·(Σ − max)`), chosen by Alpa's stage planner
/// ([`crate::plan::stages::plan`] over `stages` alike devices) from the profile's layer, first-
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::profile::{DecodeTable, Extra, PrefillTable, Profile};

    /// `layers` layers of 0.5 ms a decode step each, a head of `head_ms` a sequence, nothing on
    /// the first stage.
    fn cost(layers: usize, head_ms: f64) -> CostModel {
        let profile = Profile {
            version: 1,
            model: None,
            device: None,
            layers,
            prefill: PrefillTable {
                batch: vec![1.0],
                tokens: vec![1.0, 10.0],
                base_ms: vec![vec![1.0, 1.0]],
                context_ms: [0.0; 4],
            },
            decode: DecodeTable { batch: vec![1.0], context: vec![0.0], ms: vec![vec![0.5]] },
            weight_bytes_per_layer: 1,
            kv_bytes_per_token_per_layer: 1,
            embedding: Extra { weight_bytes: 1, ms_per_token: 0.0 },
            lm_head: Extra { weight_bytes: 1, ms_per_token: head_ms },
            tensor_parallel: vec![],
            engine_step: None,
            engine_step_ms: None,
            call_ms: 0.0,
            step_variation: None,
        };
        profile.cost_model("profile").unwrap()
    }

    /// A head worth four layers moves layers forward: 7 + (3 and the head) is 3.5 ms against
    /// 3.5 ms, where the even 5 + 5 leaves the second stage at 4.5 ms.
    #[test]
    fn a_heavy_head_moves_layers_to_the_first_stage() {
        let cost = cost(10, 2.0);
        assert_eq!(balanced_stage_layers(&cost, 2, 1.0, 0.0, 0.0).unwrap(), vec![7, 3]);
        // Without a head the split is even.
        assert_eq!(balanced_stage_layers(&cost(10, 0.0), 2, 1.0, 0.0, 0.0).unwrap(), vec![5, 5]);
        // A head heavier than all the layers still leaves the last stage a layer.
        assert_eq!(balanced_stage_layers(&cost(4, 20.0), 2, 1.0, 0.0, 0.0).unwrap(), vec![3, 1]);
        // The head's cost grows with the batch: at 2 sequences it is worth 8 layers.
        assert_eq!(balanced_stage_layers(&cost, 2, 2.0, 0.0, 0.0).unwrap(), vec![9, 1]);
    }

    /// The planner prices RRA over two devices on the split it is given, says so in its output,
    /// and refuses a split that is not the model's.
    #[test]
    fn the_planner_prices_the_split_it_is_given() {
        use super::super::{LengthDistribution, ScheduleError, ScheduleInput, Strategy, plan};
        let input = |stage_layers: Option<Vec<usize>>| ScheduleInput {
            profile: cost(10, 2.0).profile().clone(),
            input_lengths: LengthDistribution::Histogram(vec![(10, 1.0)]),
            output_lengths: LengthDistribution::Histogram(vec![(5, 1.0)]),
            devices: 2,
            device_memory_bytes: 1 << 30,
            latency_bound_s: 1e3,
            strategies: Some(vec![Strategy::Rra]),
            max_encode_batch: Some(4),
            max_decode_iterations: None,
            max_decode_batch: Some(4),
            latency_percentile: None,
            step_variation: None,
            exhaustive: false,
            interference: 0.0,
            stage_layers,
        };
        let even = plan(&input(None)).unwrap();
        let balanced = plan(&input(Some(vec![7, 3]))).unwrap();
        assert_eq!(even.stage_layers, None);
        assert_eq!(balanced.stage_layers, Some(vec![7, 3]));
        assert!(balanced.throughput_qps > even.throughput_qps, "{balanced:?} against {even:?}");
        // The even split given as a list is priced as the even split.
        let listed = plan(&input(Some(vec![5, 5]))).unwrap();
        assert!((listed.throughput_qps - even.throughput_qps).abs() < 1e-9, "{listed:?} against {even:?}");
        for bad in [vec![5, 4], vec![10, 0], vec![]] {
            match plan(&input(Some(bad.clone()))) {
                Err(ScheduleError::Input(e)) => assert!(e.to_string().contains("stage_layers"), "{bad:?}: {e}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// More stages than layers cannot be split.
    #[test]
    fn more_stages_than_layers_is_an_error() {
        assert!(balanced_stage_layers(&cost(2, 1.0), 3, 1.0, 0.0, 0.0).is_err());
    }
}
