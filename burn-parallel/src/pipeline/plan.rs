//! [`PipelinePlan`]: how a model is split over devices (stages, each stage's tensor-parallel
//! degree, devices), checked before anything loads, with the prediction of `--stage-layers auto`
//! when the planner made it.

use burn::tensor::Device;
use burn_llm_models::DecoderSpec;

use super::auto::{AutoStages, StagePrediction};
use super::auto_groups::AutoGroups;
use super::kv_map::KvMap;
use super::layout::{PipelineError, Result, StageLayout, check_device_count, check_group_devices};
use crate::tensor::ShardPlan;

/// How a model is split: the stages' layers, each stage's tensor-parallel degree, and the
/// devices in stage order, stage `s` rank `r` on `devices[offset(s) + r]` where `offset(s)` is the
/// sum of the degrees before `s` (`s · tp + r` when every stage has degree `tp`).
#[derive(Debug, Clone)]
pub struct PipelinePlan {
    pub(super) layout: StageLayout,
    degrees: Vec<usize>,
    devices: Vec<Device>,
    names: Vec<String>,
    prediction: Option<StagePrediction>,
}

impl PipelinePlan {
    /// Every stage at degree `tensor_parallel`: checks that `devices` has one entry per (stage,
    /// rank) and that `tensor_parallel` ≥ 1.
    pub fn new(layout: StageLayout, tensor_parallel: usize, devices: Vec<Device>) -> Result<Self> {
        check_device_count(devices.len(), layout.len(), tensor_parallel)?;
        let degrees = vec![tensor_parallel; layout.len()];
        Self::with_degrees(layout, degrees, devices)
    }

    /// Stage `s` at degree `degrees[s]` (Alpa's per-stage intra-operator choice), on the next
    /// `degrees[s]` entries of `devices`: checks one degree ≥ 1 per stage and one device per
    /// (stage, rank).
    pub fn with_degrees(layout: StageLayout, degrees: Vec<usize>, devices: Vec<Device>) -> Result<Self> {
        check_group_devices(devices.len(), layout.len(), &degrees)?;
        let names = devices.iter().map(|d| format!("{d:?}")).collect();
        Ok(Self { layout, degrees, devices, names, prediction: None })
    }

    /// Stages planned from measured costs (`--stage-layers auto`, Alpa's inter-operator pass):
    /// one stage per entry of `auto` (a device, or a group of `tensor_parallel` devices whose
    /// profile is the group's), on `devices` (`devices[s · tensor_parallel + r]`, as in
    /// [`PipelinePlan::new`]), named `names`. Errors before anything loads when a device cannot
    /// hold one layer or the caps cannot hold the model.
    pub fn auto(auto: &AutoStages, tensor_parallel: usize, devices: Vec<Device>, names: Vec<String>) -> Result<Self> {
        Self::from_prediction(auto.plan()?, tensor_parallel, devices, names)
    }

    /// The split a [`StagePrediction`] describes (from [`AutoStages::plan`] or
    /// [`AutoStages::plan_settled`]), every stage at degree `tensor_parallel`, on `devices` named
    /// `names`, carrying the prediction.
    pub fn from_prediction(
        prediction: StagePrediction,
        tensor_parallel: usize,
        devices: Vec<Device>,
        names: Vec<String>,
    ) -> Result<Self> {
        let plan = Self::new(prediction.layout()?, tensor_parallel, devices)?.with_names(names);
        Ok(plan.with_prediction(prediction))
    }

    /// Stages and each stage's tensor-parallel degree planned together from measured costs
    /// (`--stage-layers auto --tensor-parallel-size auto`: Alpa's inter-operator DP over layer
    /// ranges and groups of consecutive devices, [`burn_plan::stage_groups`]), on `devices`
    /// (one per entry of `auto.devices`), named `names`. Errors before anything loads when no
    /// choice of groups fits the devices' caps.
    pub fn auto_groups(auto: &AutoGroups, devices: Vec<Device>, names: Vec<String>) -> Result<Self> {
        let prediction = auto.plan()?;
        let degrees = prediction.stages.iter().map(|s| s.degree).collect();
        let plan = Self::with_degrees(prediction.layout()?, degrees, devices)?.with_names(names);
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

    /// Each stage's tensor-parallel degree.
    pub fn degrees(&self) -> &[usize] {
        &self.degrees
    }

    /// The degree of every stage when they all have the same one (`None` when they differ).
    pub fn tensor_parallel(&self) -> Option<usize> {
        let first = *self.degrees.first()?;
        self.degrees.iter().all(|&d| d == first).then_some(first)
    }

    /// The entries of `devices` stage `stage` runs on.
    fn stage_range(&self, stage: usize) -> std::ops::Range<usize> {
        let start: usize = self.degrees[..stage].iter().sum();
        start..start + self.degrees[stage]
    }

    /// The devices of stage `stage`, one per rank.
    pub fn stage_devices(&self, stage: usize) -> &[Device] {
        &self.devices[self.stage_range(stage)]
    }

    /// The names of stage `stage`'s devices, one per rank.
    pub fn stage_device_names(&self, stage: usize) -> &[String] {
        &self.names[self.stage_range(stage)]
    }

    /// Where the cache keeps each rank's keys and values ([`KvMap`]) for a model of `kv_heads`
    /// key/value heads.
    pub fn kv_map(&self, kv_heads: usize) -> KvMap {
        let per_layer: Vec<usize> = self
            .layout
            .stages()
            .iter()
            .zip(&self.degrees)
            .flat_map(|(r, &d)| std::iter::repeat_n(d, r.len()))
            .collect();
        KvMap::new(kv_heads, &per_layer)
    }

    /// The devices' names, in `--devices` order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The plan for `--json`: `{"stages": [{"first_layer", "last_layer", "devices": [names],
    /// "degree"}], "tensor_parallel", "predicted"}`, where `tensor_parallel` is every stage's
    /// degree when they agree (`null` when they differ), and `predicted` (present when the
    /// planner made the stages) is the [`StagePrediction`]: each stage's predicted prefill,
    /// decode step and per-request time, its bytes and link, and the bottleneck stage.
    pub fn to_json(&self) -> serde_json::Value {
        let stages: Vec<serde_json::Value> = self
            .layout
            .stages()
            .iter()
            .enumerate()
            .map(|(s, range)| {
                serde_json::json!({
                    "first_layer": range.start,
                    "last_layer": range.end - 1,
                    "devices": self.stage_device_names(s),
                    "degree": self.degrees[s],
                })
            })
            .collect();
        let mut plan = serde_json::json!({ "stages": stages, "tensor_parallel": self.tensor_parallel() });
        if let Some(prediction) = &self.prediction {
            plan["predicted"] = serde_json::to_value(prediction).unwrap_or(serde_json::Value::Null);
        }
        plan
    }

    pub(super) fn stage_names(&self, stage: usize) -> String {
        self.stage_device_names(stage).join("+")
    }

    /// Checks the plan against a model of `spec`'s depth and heads: every stage's degree must
    /// split its layers (before any weight loads).
    pub fn check(&self, spec: &DecoderSpec) -> Result<()> {
        if self.layout.num_layers() != spec.num_layers {
            return Err(PipelineError::BadStageLayers {
                text: self.layout.to_string(),
                reason: format!("the model has {} layers", spec.num_layers),
            });
        }
        for &degree in self.degrees.iter().filter(|&&d| d > 1) {
            ShardPlan::for_spec(spec, degree)?;
        }
        Ok(())
    }

    /// The devices of the embeddings (first stage, rank 0) and of the head (last stage, rank 0).
    pub(super) fn end_devices(&self) -> (&Device, &Device) {
        (&self.stage_devices(0)[0], &self.stage_devices(self.layout.len() - 1)[0])
    }
}
