//! [`PipelinePlan`]: how a model is split over devices (stages, tensor-parallel ranks, devices),
//! checked before anything loads, with the prediction of `--stage-layers auto` when the planner
//! made it.

use burn::tensor::Device;
use burn_llm_models::DecoderSpec;

use super::auto::{AutoStages, StagePrediction};
use super::layout::{PipelineError, Result, StageLayout, check_device_count};

/// How a model is split: the stages' layers, the tensor-parallel degree inside each stage, and
/// the devices, `devices[s * tensor_parallel + r]` for stage `s`, rank `r`.
#[derive(Debug, Clone)]
pub struct PipelinePlan {
    pub(super) layout: StageLayout,
    pub(super) tensor_parallel: usize,
    devices: Vec<Device>,
    names: Vec<String>,
    prediction: Option<StagePrediction>,
}

impl PipelinePlan {
    /// Checks that `devices` has one entry per (stage, rank) and that `tensor_parallel` ≥ 1.
    pub fn new(layout: StageLayout, tensor_parallel: usize, devices: Vec<Device>) -> Result<Self> {
        check_device_count(devices.len(), layout.len(), tensor_parallel)?;
        let names = devices.iter().map(|d| format!("{d:?}")).collect();
        Ok(Self { layout, tensor_parallel, devices, names, prediction: None })
    }

    /// Stages planned from measured costs (`--stage-layers auto`, Alpa's inter-operator pass):
    /// one stage per entry of `auto` (a device, or a group of `tensor_parallel` devices whose
    /// profile is the group's), on `devices` (`devices[s · tensor_parallel + r]`, as in
    /// [`PipelinePlan::new`]), named `names`. Errors before anything loads when a device cannot
    /// hold one layer or the caps cannot hold the model.
    pub fn auto(auto: &AutoStages, tensor_parallel: usize, devices: Vec<Device>, names: Vec<String>) -> Result<Self> {
        let prediction = auto.plan()?;
        let plan = Self::new(prediction.layout()?, tensor_parallel, devices)?.with_names(names);
        Ok(plan.with_prediction(prediction))
    }

    /// Names the devices in outputs (`flex`, `wgpu`, …) instead of their debug form.
    pub fn with_names(mut self, names: Vec<String>) -> Self {
        if names.len() == self.devices.len() {
            self.names = names;
        }
        self
    }

    /// Attaches what the planner predicted for this split.
    pub fn with_prediction(mut self, prediction: StagePrediction) -> Self {
        self.prediction = Some(prediction);
        self
    }

    /// What the planner predicted, when the stages were planned (`--stage-layers auto`).
    pub fn prediction(&self) -> Option<&StagePrediction> {
        self.prediction.as_ref()
    }

    /// The stages' layers.
    pub fn layout(&self) -> &StageLayout {
        &self.layout
    }

    /// Tensor-parallel ranks per stage.
    pub fn tensor_parallel(&self) -> usize {
        self.tensor_parallel
    }

    /// The devices of stage `stage`, one per rank.
    pub fn stage_devices(&self, stage: usize) -> &[Device] {
        let tp = self.tensor_parallel;
        &self.devices[stage * tp..(stage + 1) * tp]
    }

    /// The devices' names, in `--devices` order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The plan for `--json`: `{"stages": [{"first_layer", "last_layer", "devices": [names]}],
    /// "tensor_parallel", "predicted"}`, where `predicted` (present when the planner made the
    /// stages) is the [`StagePrediction`]: each stage's predicted prefill, decode step and
    /// per-request time, its bytes and link, and the bottleneck stage.
    pub fn to_json(&self) -> serde_json::Value {
        let tp = self.tensor_parallel;
        let stages: Vec<serde_json::Value> = self
            .layout
            .stages()
            .iter()
            .enumerate()
            .map(|(s, range)| {
                serde_json::json!({
                    "first_layer": range.start,
                    "last_layer": range.end - 1,
                    "devices": &self.names[s * tp..(s + 1) * tp],
                })
            })
            .collect();
        let mut plan = serde_json::json!({ "stages": stages, "tensor_parallel": tp });
        if let Some(prediction) = &self.prediction {
            plan["predicted"] = serde_json::to_value(prediction).unwrap_or(serde_json::Value::Null);
        }
        plan
    }

    pub(super) fn stage_names(&self, stage: usize) -> String {
        let tp = self.tensor_parallel;
        self.names[stage * tp..(stage + 1) * tp].join("+")
    }

    /// Checks the plan against a model of `spec`'s depth.
    pub(super) fn check(&self, spec: &DecoderSpec) -> Result<()> {
        if self.layout.num_layers() != spec.num_layers {
            return Err(PipelineError::BadStageLayers {
                text: self.layout.to_string(),
                reason: format!("the model has {} layers", spec.num_layers),
            });
        }
        Ok(())
    }

    /// The devices of the embeddings (first stage, rank 0) and of the head (last stage, rank 0).
    pub(super) fn end_devices(&self) -> (&Device, &Device) {
        (&self.stage_devices(0)[0], &self.stage_devices(self.layout.len() - 1)[0])
    }
}
