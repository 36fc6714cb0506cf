//! `--stage-layers auto --tensor-parallel-size auto`: stages and each stage's tensor-parallel
//! degree planned together from measured costs (Alpa's inter-operator DP over (layer range,
//! submesh) choices with each submesh's intra-operator degree, thesis §3.5.2).
//!
//! Every device of `--devices`, in pipeline order, brings its own [`Profile`], cap and measured
//! link to the next device (the degree-1 candidates, as for [`AutoStages`](super::AutoStages));
//! every candidate group of `degree ≥ 2` consecutive devices brings the profile of a layer split
//! over it (timed on the group, communication included) and the measured link from its first
//! device to the device after it. The pure planner [`burn_plan::stage_groups`] chooses which
//! groups become stages and their layers, every device used once; [`AutoGroups::plan`] returns
//! the [`StagePrediction`] with each stage's devices and degree. Stages that slow each other down
//! (`interference`) are split for the least `max + κ·(Σ − max)` of their costs.

use super::auto::{
    AutoStageDevice, DeviceCosts, Handover, LinkProfile, PlannedStage, StagePrediction, StageWorkload, predict_stage,
};
use super::layout::{PipelineError, Result};
use burn_plan::profile::Profile;
use burn_plan::stage_groups::{self, DeviceGroup, GroupDevice, GroupStagesInput};
use burn_plan::stages::StageExtra;

/// A candidate tensor-parallel group: devices `first_device .. first_device + degree` of
/// [`AutoGroups::devices`].
#[derive(Debug, Clone)]
pub struct AutoGroup {
    /// Its first device (rank 0: the stage's input, output and, on the last stage, the head).
    pub first_device: usize,
    /// Its devices (≥ 2; single devices are the degree-1 candidates of [`AutoGroups::devices`]).
    pub degree: usize,
    /// The model's profile on the group: its layer split over the group's devices, and rank 0's
    /// embeddings and head ([`crate::profiler::group_profile`]).
    pub profile: Profile,
    /// The measured link from its first device to the device after the group (`None` when the
    /// group ends the list).
    pub link_to_next: Option<LinkProfile>,
}

/// Everything the per-stage-degree plan is made from.
#[derive(Debug, Clone)]
pub struct AutoGroups {
    /// The devices in pipeline order, each with its own profile, cap and link to the next.
    pub devices: Vec<AutoStageDevice>,
    /// The candidate groups of two devices or more.
    pub groups: Vec<AutoGroup>,
    /// The request the stages are balanced for.
    pub workload: StageWorkload,
    /// Tokens of KV cache each stage's layers must hold (counted in each layer's bytes).
    pub kv_tokens: usize,
    /// What a stage hands the next.
    pub handover: Handover,
    /// How much stages slow each other down when they work at once, as
    /// [`AutoStages::interference`](super::AutoStages::interference) (0: not at all).
    pub interference: f64,
}

impl AutoGroups {
    /// Every candidate as a stage device: the single devices, then the groups (named by their
    /// devices joined with `+`, capped by their smallest device's cap).
    fn candidates(&self) -> Result<Vec<(usize, usize, AutoStageDevice)>> {
        let n = self.devices.len();
        let mut out: Vec<(usize, usize, AutoStageDevice)> =
            self.devices.iter().enumerate().map(|(i, d)| (i, 1, d.clone())).collect();
        for group in &self.groups {
            let end = group.first_device.saturating_add(group.degree);
            if group.degree < 2 || end > n {
                return Err(PipelineError::Device {
                    entry: format!("group of {} devices from device {}", group.degree, group.first_device),
                    reason: format!("a group needs 2 or more of the {n} devices, in the list"),
                });
            }
            let members = &self.devices[group.first_device..end];
            out.push((
                group.first_device,
                group.degree,
                AutoStageDevice {
                    name: members.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join("+"),
                    profile: group.profile.clone(),
                    memory_bytes: members.iter().map(|d| d.memory_bytes).min().unwrap_or(u64::MAX),
                    link_to_next: group.link_to_next,
                },
            ));
        }
        let Some(first) = self.devices.first() else {
            return Err(PipelineError::Zero("the number of --devices entries"));
        };
        for (_, _, c) in &out {
            if c.profile.layers != first.profile.layers {
                return Err(PipelineError::Device {
                    entry: c.name.clone(),
                    reason: format!(
                        "its profile is of a model of {} layers, `{}`'s of {}: profile one model on every device",
                        c.profile.layers, first.name, first.profile.layers
                    ),
                });
            }
        }
        Ok(out)
    }

    /// The `stage_groups` planner's input: each candidate's per-layer cost of one request at its
    /// degree, its fixed cost (on a group that ends the pipeline: the LM head and the pass's
    /// synchronisation per step) and its link; each device's cap; a layer's bytes at degree 1.
    pub fn groups_input(&self) -> Result<GroupStagesInput> {
        self.input_of(&self.candidates()?)
    }

    /// [`AutoGroups::groups_input`] over `candidates` ([`AutoGroups::candidates`]).
    fn input_of(&self, candidates: &[(usize, usize, AutoStageDevice)]) -> Result<GroupStagesInput> {
        let n = self.devices.len();
        let first = &self.devices[0].profile;
        let layers = first.layers;
        let w = self.workload;
        let steps = w.output_tokens as f64;
        let mut groups = Vec::with_capacity(candidates.len());
        for (i, (first_device, degree, device)) in candidates.iter().enumerate() {
            let cost = DeviceCosts::new(device, i)?;
            let ends = first_device + degree == n;
            let head = device.profile.lm_head.ms_per_token + device.profile.call_ms;
            groups.push(DeviceGroup {
                first_device: *first_device,
                degree: *degree,
                layer_latency_ms: vec![cost.prefill_layer(w) + steps * cost.decode_layer(w); layers],
                fixed_ms: if ends { (1.0 + steps) * head } else { 0.0 },
                link_ms: device.link_to_next.map_or(0.0, |l| self.handover.request_ms(&l, w)),
            });
        }
        let last = &self.devices[n - 1].profile;
        let layer_bytes = first.weight_bytes_per_layer + first.kv_bytes_per_token_per_layer * self.kv_tokens as u64;
        Ok(GroupStagesInput {
            layer_memory_bytes: vec![layer_bytes; layers],
            devices: self
                .devices
                .iter()
                .map(|d| GroupDevice { name: Some(d.name.clone()), memory_bytes: d.memory_bytes })
                .collect(),
            groups,
            first_stage: Some(StageExtra {
                latency_ms: first.embedding.ms_per_token * (w.prompt_tokens + w.output_tokens) as f64,
                memory_bytes: first.embedding.weight_bytes,
            }),
            // The head's time is in the fixed cost of the groups that end the pipeline (its rank
            // 0 holds it); its bytes count on that rank.
            last_stage: Some(StageExtra { latency_ms: 0.0, memory_bytes: last.lm_head.weight_bytes }),
            interference: self.interference,
        })
    }

    /// Plans the stages and their degrees; an error names the caps when no choice of groups
    /// holds the model, before anything loads.
    pub fn plan(&self) -> Result<StagePrediction> {
        let candidates = self.candidates()?;
        let out = stage_groups::plan(&self.input_of(&candidates)?)?;
        let last = out.stages.len().saturating_sub(1);
        let mut predicted = Vec::with_capacity(out.stages.len());
        for (s, stage) in out.stages.iter().enumerate() {
            let index = candidates
                .iter()
                .position(|(f, d, _)| *f == stage.first_device && *d == stage.degree)
                .ok_or_else(|| PipelineError::Device {
                    entry: format!("group of {} devices from device {}", stage.degree, stage.first_device),
                    reason: "the planner chose a group that is not among the candidates (a bug: please report it)"
                        .into(),
                })?;
            let device = &candidates[index].2;
            let planned = PlannedStage {
                device,
                layers: stage.layers,
                first: s == 0,
                last: s == last,
                degree: stage.degree,
                request_ms: stage.latency_ms,
                memory_bytes: stage.memory_bytes,
            };
            predicted.push(predict_stage(self.workload, &self.handover, &DeviceCosts::new(device, index)?, planned));
        }
        let mut prediction = StagePrediction::new(predicted, self.workload);
        prediction.interference = self.interference;
        Ok(prediction)
    }
}
