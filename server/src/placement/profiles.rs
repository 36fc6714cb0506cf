//! Each served model's costs for the placement: profiled at start-up on the pool's first device
//! (through the `--stage-layers auto` profiler and its cache, over the grid around the model's
//! request shape, [`ProfileGrid::request`]), turned into one request's latency per layer and each
//! layer's weight bytes.

use std::io::Write;

use burn_llm_models::PretrainedFiles;
use std::path::{Path, PathBuf};

use burn_llm_models::DecoderSpec;
use burn_parallel::profiler::ProfileGrid;
use burn_plan::placement::{
    GroupPlan, MeasuredPipeline, ModelSpec as PlannedModel, PlacedModel, PlacementInput, priced_stage_latency_ms,
    priced_steps,
};
use burn_plan::serving::{
    DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, ServingWorkload, layer_memory_bytes, request_layer_ms,
};

use super::super::ServerError;
use super::super::model_args::ServedModelSpec;
use burn_llm::spec::{parse_device, profile_stage_device};

/// The SLO of a model without traffic (it has no request to meet it).
const NO_TRAFFIC_SLO_S: f64 = 1e9;

/// One model's costs.
#[derive(Debug, Clone)]
struct Cost {
    name: String,
    /// Its model directory and architecture, as opened for the profile (the interference and
    /// pipeline timings read them too).
    dir: PathBuf,
    spec: DecoderSpec,
    layer_ms: Vec<f64>,
    layer_bytes: Vec<u64>,
    slo_s: f64,
    /// The prefill's share of one request's time.
    prefill_share: f64,
    /// Pipelines of it timed running ([`super::pipelined`]).
    pipelines: Vec<MeasuredPipeline>,
}

/// Every served model's costs, in `--model` order.
#[derive(Debug, Clone)]
pub(super) struct ModelCosts(Vec<Cost>);

/// The model files `model` names, opened.
pub(super) fn open(model: &ServedModelSpec) -> Result<(PathBuf, PretrainedFiles), ServerError> {
    let fail =
        |e: &dyn std::fmt::Display| ServerError::Engine(format!("model `{}` ({}): {e}", model.name, model.source));
    let dir = burn_llm_models::hub::resolve_model(&model.source).map_err(|e| fail(&e))?;
    let files = PretrainedFiles::open(&dir).map_err(|e| fail(&e))?;
    Ok((dir, files))
}

/// The model's layer count, from its files.
pub(super) fn layer_count(model: &ServedModelSpec) -> Result<usize, ServerError> {
    Ok(open(model)?.1.spec.num_layers)
}

impl ModelCosts {
    /// Profiles every model on `pool[0]` (cached) and prices one request of its `workload` shape.
    pub(super) fn measure(
        models: &[ServedModelSpec],
        pool: &[String],
        workload: Option<&ServingWorkload>,
        log: &mut dyn Write,
    ) -> Result<Self, ServerError> {
        let entry = &pool[0];
        let mut costs = Vec::with_capacity(models.len());
        for model in models {
            let fail = |e: &dyn std::fmt::Display| {
                ServerError::Engine(format!("placement: profiling model `{}` on {entry}: {e}", model.name))
            };
            let (dir, files) = open(model)?;
            let device = parse_device(entry, model.spec.worker_token.as_deref()).map_err(|e| fail(&e))?;
            let _ = writeln!(log, "placement: costs of `{}` on {entry}", model.name);
            let load = workload.and_then(|w| w.load(&model.name));
            let shape = load.map_or((DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS), |l| l.shape());
            let profile = profile_stage_device(
                &model.spec,
                &dir,
                &files,
                entry,
                &device,
                &ProfileGrid::request(shape.0, shape.1),
                None,
                None,
                log,
            )
            .map_err(|e| fail(&e))?;
            let cost = profile.profile.cost_model("profile").map_err(|e| fail(&e))?;
            let layer_ms = request_layer_ms(&cost, shape);
            let prefill_ms: f64 = request_layer_ms(&cost, (shape.0, 1)).iter().sum();
            let total: f64 = layer_ms.iter().sum();
            costs.push(Cost {
                name: model.name.clone(),
                spec: files.spec.clone(),
                dir,
                prefill_share: if total > 0.0 { (prefill_ms / total).clamp(0.0, 1.0) } else { 1.0 },
                layer_ms,
                layer_bytes: layer_memory_bytes(&profile.profile),
                slo_s: load.map_or(NO_TRAFFIC_SLO_S, |l| l.slo_s),
                pipelines: Vec::new(),
            });
        }
        Ok(Self(costs))
    }

    /// Records each `(model, pipeline measured)`.
    pub(super) fn set_pipelines(&mut self, measured: Vec<(String, MeasuredPipeline)>) {
        for (name, pipeline) in measured {
            if let Some(c) = self.0.iter_mut().find(|c| c.name == name) {
                c.pipelines.retain(|p| p.stages != pipeline.stages);
                c.pipelines.push(pipeline);
            }
        }
    }

    /// `name`'s model directory and architecture.
    pub(super) fn model(&self, name: &str) -> (&Path, &DecoderSpec) {
        let c = self.cost(name);
        (&c.dir, &c.spec)
    }

    fn cost(&self, name: &str) -> &Cost {
        self.0.iter().find(|c| c.name == name).unwrap_or(&self.0[0])
    }

    /// The planner's input: `devices` identical devices of `memory` bytes that slow each other
    /// down by `interference` when they work at once.
    pub(super) fn input(
        &self,
        devices: usize,
        memory: u64,
        workload: Option<&ServingWorkload>,
        interference: Option<f64>,
    ) -> PlacementInput {
        let models = self
            .0
            .iter()
            .map(|c| PlannedModel {
                name: c.name.clone(),
                layer_latency_ms: c.layer_ms.clone(),
                layer_memory_bytes: c.layer_bytes.clone(),
                slo_s: c.slo_s,
                tensor_parallel: Vec::new(),
                measured_pipelines: c.pipelines.clone(),
            })
            .collect();
        let workload =
            workload.map(ServingWorkload::placement_workload).unwrap_or(burn_plan::placement::PlacementWorkload {
                trace: Some(Vec::new()),
                arrivals: None,
                duration_s: None,
                seed: None,
            });
        PlacementInput {
            models,
            devices,
            device_memory_bytes: memory,
            workload,
            baseline: None,
            beam: None,
            interference,
            // A server serves every model it was given.
            serve_every_model: true,
            admission: Default::default(),
        }
    }

    /// The share of one request's time that `name` spends in its prefill.
    pub(super) fn prefill_share(&self, name: &str) -> f64 {
        self.cost(name).prefill_share
    }

    /// The model's layers.
    pub(super) fn layers(&self, name: &str) -> usize {
        self.cost(name).layer_ms.len()
    }

    /// `name` placed on `stages` (half-open layer ranges), priced as the planner prices it: each
    /// stage's latency of one request from its layers' one-device latencies, or, for a pipeline of
    /// a stage count measured running, the measurement's price at the devices' interference
    /// `kappa`; and its steps where that pipeline was timed serving step by step.
    pub(super) fn placed(&self, name: &str, stages: Vec<[usize; 2]>, kappa: f64) -> PlacedModel {
        let c = self.cost(name);
        let split: Vec<f64> = stages.iter().map(|[a, b]| c.layer_ms[*a..*b].iter().sum()).collect();
        let steps = priced_steps(&c.pipelines, &split);
        let stage_latency_ms = priced_stage_latency_ms(&c.pipelines, split, kappa);
        PlacedModel { model: name.to_string(), stages, stage_latency_ms, steps }
    }

    fn bytes(&self, name: &str, [a, b]: [usize; 2]) -> u64 {
        self.cost(name).layer_bytes[a..b].iter().sum()
    }

    /// One request of `name` on one device as its layers' profile prices it, ms.
    pub(super) fn request_ms(&self, name: &str) -> f64 {
        self.cost(name).layer_ms.iter().sum()
    }

    /// The bytes of all of `name`'s layers.
    pub(super) fn model_bytes(&self, name: &str) -> u64 {
        self.cost(name).layer_bytes.iter().sum()
    }

    /// Replication without a workload: every device takes whole models in `--model` order while
    /// they fit in its memory (`caps`).
    pub(super) fn packed_replicas(&self, caps: &[u64]) -> Vec<GroupPlan> {
        let mut groups = Vec::new();
        for (d, &cap) in caps.iter().enumerate() {
            let mut used = 0u64;
            let mut models = Vec::new();
            for c in &self.0 {
                let whole = [0, c.layer_ms.len()];
                let need = self.bytes(&c.name, whole);
                if used.checked_add(need).is_some_and(|t| t <= cap) {
                    used += need;
                    models.push(self.placed(&c.name, vec![whole], 0.0));
                }
            }
            if !models.is_empty() {
                groups.push(GroupPlan { devices: vec![d], pipeline_stages: 1, tensor_parallel: 1, models });
            }
        }
        groups
    }

    /// Fails when a model is on no group, or a device holds more weights than its memory.
    pub(super) fn check_memory(&self, groups: &[GroupPlan], caps: &[u64], pool: &[String]) -> Result<(), ServerError> {
        for c in &self.0 {
            if !groups.iter().any(|g| g.models.iter().any(|m| m.model == c.name)) {
                let need: u64 = c.layer_bytes.iter().sum();
                return Err(ServerError::Config(format!(
                    "placement: model `{}` ({need} bytes of weights) fits on no device group beside the others \
                     (the smallest device memory is {} bytes): give more --devices, more --device-memory, or serve fewer models",
                    c.name,
                    caps.iter().min().copied().unwrap_or(0)
                )));
            }
        }
        for (d, &cap) in caps.iter().enumerate() {
            let mut need = 0u64;
            let mut holds = Vec::new();
            for g in groups {
                let Some(stage) = g.devices.iter().position(|&x| x == d) else { continue };
                for m in &g.models {
                    let Some(&range) = m.stages.get(stage) else { continue };
                    let bytes = self.bytes(&m.model, range);
                    need = need.saturating_add(bytes);
                    holds.push(format!(
                        "`{}` layers {}-{} ({bytes} bytes)",
                        m.model,
                        range[0],
                        range[1].saturating_sub(1)
                    ));
                }
            }
            if need > cap {
                return Err(ServerError::Config(format!(
                    "placement: device {d} ({}) would hold {need} bytes of weights, {} — more than its {cap} bytes of memory: \
                     spread the models over more devices, give more --device-memory, or serve fewer models",
                    pool[d],
                    holds.join(", ")
                )));
            }
        }
        Ok(())
    }
}
