//! Model placement for serving (AlpaServe, thesis ch. 4 §4.4.2): partition the devices into
//! groups, give each group a pipeline/tensor-parallel configuration, and choose which models each
//! group serves so that the most requests meet their SLO in the [simulator](super::sim).
//!
//! Algorithm 4 enumerates group partitions — groups of equal size `g`, plus one group of the
//! remaining devices (as AlpaServe assumes) — and a configuration `(stages p, degree t)` with
//! `p·t = g` shared by the equal groups (the remainder group runs a `rem`-stage pipeline). For
//! each, Algorithm 3 (simulator-guided greedy with beam `k`) adds (model, group) replicas one at a
//! time, each time keeping the `k` selections of highest SLO attainment, until no replica fits;
//! a model is split over a group's stages by the [`stages`](super::stages) DP (§4.4.1). All
//! models form one bucket (AlpaServe's size buckets are left out). `baseline: "replication"`
//! restricts the search to one-device groups: replication only, on the same simulator.
//! `interference` (the devices' measured `κ`) makes the simulator slow down stages that work at
//! once, so that a pipeline's overlap and replicas beside each other are priced as the devices
//! measured them, not as free. A model's `measured_pipelines` (a pipeline of it timed running)
//! price a group of that many stages from the measurement ([`measured`]), as AlpaServe profiles
//! each parallel configuration, instead of from its layers' one-device latencies alone.

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
use super::sim::{self, Admission, Dropping, Group, Request};
use super::stages::{Problem, StageOption, StagesError, TpDegree};

mod measured;
mod selection;
mod workload;
pub use measured::{
    MeasuredPipeline, MeasuredSteps, StepCosts, measured_stage_latency_ms, measured_steps, priced_stage_latency_ms,
    priced_steps,
};
use selection::{Selection, same_replicas};
use workload::workload;

/// Largest device count, model count and request count accepted.
const MAX_DEVICES: usize = 4096;
const MAX_MODELS: usize = 4096;
const MAX_REQUESTS: usize = 10_000_000;
use sim::SLO_SLACK_S;

/// Input of [`plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementInput {
    /// The models to serve.
    pub models: Vec<ModelSpec>,
    /// Devices in the cluster.
    pub devices: usize,
    /// Memory of each device in bytes.
    pub device_memory_bytes: u64,
    /// Requests to serve.
    pub workload: PlacementWorkload,
    /// `"replication"`: only one-device groups (the baseline).
    #[serde(default)]
    pub baseline: Option<Baseline>,
    /// Beam size `k` of Algorithm 3 (default 1).
    #[serde(default)]
    pub beam: Option<usize>,
    /// The devices' measured interference `κ` ([`Interference`](crate::interference::Interference)): stages of any
    /// groups working at once slow each other down ([`sim`]'s module docs). Absent or 0: they
    /// share nothing, as in AlpaServe's simulator.
    #[serde(default)]
    pub interference: Option<f64>,
    /// Keep only placements that serve every model, as a server must (default `false`, AlpaServe's
    /// Algorithm 3, which keeps the highest attainment even when it leaves a model out: under
    /// overload, leaving one model's traffic unserved can let more of the others' meet their SLO).
    #[serde(default)]
    pub serve_every_model: bool,
    /// `"slo"`: each group drops at arrival a request its stage clocks say would miss its SLO, as
    /// AlpaServe's controller does ([`sim`]'s module docs); a dropped request misses. Default
    /// `"all"`: every request is served, however late.
    #[serde(default, skip_serializing_if = "Admission::is_all")]
    pub admission: Admission,
}

/// One model: per-layer costs (from a profile) and its SLO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Name used in traces and the output.
    pub name: String,
    /// Latency of each layer on one device, in milliseconds.
    pub layer_latency_ms: Vec<f64>,
    /// Bytes of each layer.
    pub layer_memory_bytes: Vec<u64>,
    /// Latency objective of one request, in seconds.
    pub slo_s: f64,
    /// Per-layer latencies at tensor-parallel degrees ≥ 2 (optional).
    #[serde(default)]
    pub tensor_parallel: Vec<TpDegree>,
    /// Pipelines of the model timed running, at most one per stage count (optional): a group of
    /// that many stages is priced from the measurement ([`measured_stage_latency_ms`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured_pipelines: Vec<MeasuredPipeline>,
}

/// The placement baselines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Baseline {
    /// Every group is one device: models are only replicated.
    Replication,
}

/// Requests: an explicit `trace`, or gamma-process `arrivals` over `duration_s` from `seed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementWorkload {
    /// `[[time_s, model], …]`, model by name or index.
    #[serde(default)]
    pub trace: Option<Vec<(f64, ModelRef)>>,
    /// One arrival process per model with traffic.
    #[serde(default)]
    pub arrivals: Option<Vec<Arrivals>>,
    /// Length of the generated workload in seconds.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Seed of the generated workload (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
}

/// A gamma arrival process for one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arrivals {
    /// The model, by name or index.
    pub model: ModelRef,
    /// Mean requests per second.
    pub rate: f64,
    /// Coefficient of variation of the inter-arrival gaps (1: Poisson; larger: burstier).
    pub cv: f64,
}

/// A model named by its name or its index in `models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ModelRef {
    /// Index into `models`.
    Index(usize),
    /// A model's `name`.
    Name(String),
}

/// Output of [`plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementOutput {
    /// The device groups and what they serve.
    pub groups: Vec<GroupPlan>,
    /// Fraction of all requests that met their SLO.
    pub slo_attainment: f64,
    /// Attainment per model.
    pub models: Vec<ModelAttainment>,
    /// Latency of every request in seconds, in trace order (generated workloads: arrival order);
    /// `null` for a request whose model no group serves, or that was dropped at arrival
    /// (`admission: "slo"`).
    pub latencies_s: Vec<Option<f64>>,
    /// The baseline this placement was restricted to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
}

/// One device group of a placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupPlan {
    /// Device indices.
    pub devices: Vec<usize>,
    /// Pipeline stages.
    pub pipeline_stages: usize,
    /// Tensor-parallel degree of every stage.
    pub tensor_parallel: usize,
    /// Models the group serves.
    pub models: Vec<PlacedModel>,
}

impl GroupPlan {
    /// The group as the simulator runs it, its `models[i]` as model `indices[i]`: each model's
    /// stage latencies in seconds, and its steps where it is served step by step.
    pub fn sim_group(&self, indices: &[usize]) -> Group {
        let placed = || indices.iter().copied().zip(&self.models);
        Group {
            stages: self.pipeline_stages,
            models: placed().map(|(i, m)| (i, m.stage_latency_ms.iter().map(|ms| ms / 1000.0).collect())).collect(),
            steps: placed().filter_map(|(i, m)| Some((i, m.steps.as_ref()?.sim()))).collect(),
        }
    }
}

/// A model replica on a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacedModel {
    /// Model name.
    pub model: String,
    /// Its layers on each stage (half-open ranges).
    pub stages: Vec<[usize; 2]>,
    /// Its latency on each stage in milliseconds.
    pub stage_latency_ms: Vec<f64>,
    /// How it serves step by step, when its pipeline was timed so ([`measured_steps`]): the
    /// simulator runs its requests pass by pass on these; `stage_latency_ms` stays what
    /// admission runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<StepCosts>,
}

/// SLO attainment of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelAttainment {
    /// Model name.
    pub model: String,
    /// Requests for it.
    pub requests: usize,
    /// Fraction of them that met the SLO (1 when it had none).
    pub slo_attainment: f64,
}

/// Why no placement could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlacementError {
    /// A field cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The model cannot be split.
    #[error("model `{model}`: {source}")]
    Stages {
        /// Model name.
        model: String,
        /// Why.
        source: StagesError,
    },
    /// Nothing fits anywhere.
    #[error("no model fits on any group of the {devices} devices with {memory} bytes each; add devices or memory")]
    NothingFits {
        /// Devices.
        devices: usize,
        /// Memory per device.
        memory: u64,
    },
}

/// Plans the placement for `input` (see the module docs).
pub fn plan(input: &PlacementInput) -> Result<PlacementOutput, PlacementError> {
    let problem = Checked::new(input)?;
    let group_sizes: Vec<usize> = match input.baseline {
        Some(Baseline::Replication) => vec![1],
        None => (1..=input.devices).collect(),
    };
    let mut degrees: Vec<usize> = vec![1];
    for m in &input.models {
        degrees.extend(m.tensor_parallel.iter().map(|d| d.degree));
    }
    degrees.sort_unstable();
    degrees.dedup();
    let mut best: Option<Selection> = None;
    for g in group_sizes {
        for &t in degrees.iter().filter(|&&t| g % t == 0) {
            let mut shapes = vec![(g / t, t); input.devices / g];
            if !input.devices.is_multiple_of(g) {
                shapes.push((input.devices % g, 1));
            }
            let selection = problem.greedy(&shapes)?;
            if best.as_ref().is_none_or(|b| selection.better_than(b, problem.every())) {
                best = Some(selection);
            }
        }
    }
    let best = best
        .filter(|b| !b.is_empty())
        .ok_or(PlacementError::NothingFits { devices: input.devices, memory: input.device_memory_bytes })?;
    Ok(problem.output(&best, input.baseline))
}

/// Simulates `input`'s workload on a placement made elsewhere (`groups`: a hand-made one, or one
/// to check), each placed model's `stage_latency_ms` as given; groups keep their order.
pub fn evaluate(input: &PlacementInput, groups: Vec<GroupPlan>) -> Result<PlacementOutput, PlacementError> {
    let problem = Checked::new(input)?;
    let mut sim_groups = Vec::with_capacity(groups.len());
    for (gi, g) in groups.iter().enumerate() {
        let mut indices = Vec::with_capacity(g.models.len());
        for (mi, placed) in g.models.iter().enumerate() {
            let field = format!("groups[{gi}].models[{mi}]");
            let Some(index) = input.models.iter().position(|m| m.name == placed.model) else {
                return Err(InputError::new(field, format!("no model is named `{}`", placed.model)).into());
            };
            check::same_len(
                &format!("{field}.stage_latency_ms"),
                &placed.stage_latency_ms,
                g.pipeline_stages,
                "stages",
            )?;
            check::latencies(&format!("{field}.stage_latency_ms"), &placed.stage_latency_ms)?;
            if let Some(costs) = &placed.steps {
                costs.check(&format!("{field}.steps"), g.pipeline_stages)?;
            }
            indices.push(index);
        }
        sim_groups.push(g.sim_group(&indices));
    }
    Ok(problem.outcome(groups, &sim_groups, input.baseline))
}

/// A model split for one group shape.
#[derive(Debug, Clone)]
struct Split {
    ranges: Vec<[usize; 2]>,
    stage_latency_ms: Vec<f64>,
    steps: Option<StepCosts>,
    device_memory_bytes: Vec<u64>,
}

/// Checked input and the derived workload.
struct Checked<'a> {
    input: &'a PlacementInput,
    /// Requests sorted by arrival, and their index in trace order.
    requests: Vec<Request>,
    order: Vec<usize>,
    beam: usize,
    kappa: f64,
    /// Each model's SLO in seconds, in model order.
    slo_s: Vec<f64>,
}

impl<'a> Checked<'a> {
    /// The number of models when every one must be served.
    fn every(&self) -> Option<usize> {
        self.input.serve_every_model.then_some(self.input.models.len())
    }

    fn new(input: &'a PlacementInput) -> Result<Self, PlacementError> {
        check::count("models", input.models.len(), MAX_MODELS)?;
        check::count("devices", input.devices, MAX_DEVICES)?;
        let beam = check::count("beam", input.beam.unwrap_or(1), 1024)?;
        let kappa = check::non_negative("interference", input.interference.unwrap_or(0.0))?;
        for (i, m) in input.models.iter().enumerate() {
            let f = |name: &str| format!("models[{i}].{name}");
            if input.models[..i].iter().any(|o| o.name == m.name) {
                return Err(InputError::new(f("name"), format!("`{}` is used twice", m.name)).into());
            }
            check::latencies(&f("layer_latency_ms"), &m.layer_latency_ms)?;
            let layers = check::count(&f("layer_latency_ms"), m.layer_latency_ms.len(), MAX_DEVICES)?;
            check::same_len(&f("layer_memory_bytes"), &m.layer_memory_bytes, layers, "layers")?;
            check::positive(&f("slo_s"), m.slo_s)?;
            for (j, d) in m.tensor_parallel.iter().enumerate() {
                let tf = f(&format!("tensor_parallel[{j}]"));
                if d.degree < 2 || d.degree > MAX_DEVICES {
                    return Err(InputError::new(format!("{tf}.degree"), "must be between 2 and 4096").into());
                }
                if m.tensor_parallel[..j].iter().any(|o| o.degree == d.degree) {
                    return Err(InputError::new(format!("{tf}.degree"), "is listed twice").into());
                }
                check::same_len(&format!("{tf}.layer_latency_ms"), &d.layer_latency_ms, layers, "layers")?;
                check::latencies(&format!("{tf}.layer_latency_ms"), &d.layer_latency_ms)?;
            }
            for (j, p) in m.measured_pipelines.iter().enumerate() {
                let pf = f(&format!("measured_pipelines[{j}]"));
                p.check(&pf, layers)?;
                if m.measured_pipelines[..j].iter().any(|o| o.stages == p.stages) {
                    return Err(InputError::new(format!("{pf}.stages"), "is measured twice").into());
                }
            }
        }
        let requests = workload(input)?;
        if requests.is_empty() {
            return Err(
                InputError::new("workload", "has no requests; give a trace or positive rates and duration").into()
            );
        }
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by(|&a, &b| requests[a].arrival_s.total_cmp(&requests[b].arrival_s));
        let sorted = order.iter().map(|&i| requests[i]).collect();
        let slo_s = input.models.iter().map(|m| m.slo_s).collect();
        Ok(Self { input, requests: sorted, order, beam, kappa, slo_s })
    }

    /// The split of `model` over a group of shape `(stages, degree)`, if it fits alone.
    fn split(&self, model: usize, (stages, degree): (usize, usize)) -> Result<Option<Split>, PlacementError> {
        let m = &self.input.models[model];
        let latency = if degree == 1 {
            &m.layer_latency_ms
        } else {
            match m.tensor_parallel.iter().find(|d| d.degree == degree) {
                Some(d) => &d.layer_latency_ms,
                None => return Ok(None),
            }
        };
        if stages > latency.len() {
            return Ok(None);
        }
        let problem = Problem::new(
            vec![StageOption::new(degree, latency)],
            Some((&m.layer_memory_bytes, self.input.device_memory_bytes)),
            stages,
            None,
        )
        .map_err(|source| PlacementError::Stages { model: m.name.clone(), source })?;
        match problem.solve() {
            Ok(p) => Ok(Some(Split {
                ranges: p.ranges,
                // Measured pipelines run at degree 1.
                steps: if degree == 1 { priced_steps(&m.measured_pipelines, &p.stage_latency_ms) } else { None },
                stage_latency_ms: match degree {
                    1 => priced_stage_latency_ms(&m.measured_pipelines, p.stage_latency_ms, self.kappa),
                    _ => p.stage_latency_ms,
                },
                device_memory_bytes: p.device_memory_bytes,
            })),
            Err(StagesError::DoesNotFit { .. }) => Ok(None),
            Err(source) => Err(PlacementError::Stages { model: m.name.clone(), source }),
        }
    }

    /// Algorithm 3: simulator-guided greedy model selection with beam `k` on groups of `shapes`.
    fn greedy(&self, shapes: &[(usize, usize)]) -> Result<Selection, PlacementError> {
        let models = self.input.models.len();
        // splits[group][model], solved once per distinct shape.
        let mut splits: Vec<Vec<Option<Split>>> = Vec::with_capacity(shapes.len());
        for (gi, &shape) in shapes.iter().enumerate() {
            let row = match shapes[..gi].iter().position(|&s| s == shape) {
                Some(same) => splits[same].clone(),
                None => (0..models).map(|m| self.split(m, shape)).collect::<Result<_, _>>()?,
            };
            splits.push(row);
        }
        let empty = self.evaluate(
            Selection {
                shapes: shapes.to_vec(),
                replicas: vec![Vec::new(); shapes.len()],
                used: shapes.iter().map(|&(p, _)| vec![0; p]).collect(),
                attainment: 0.0,
                groups: Vec::new(),
            },
            &splits,
        );
        let mut best = empty.clone();
        let mut beam = vec![empty];
        loop {
            let mut next: Vec<Selection> = Vec::new();
            for sel in &beam {
                for m in 0..models {
                    for (gi, row) in splits.iter().enumerate() {
                        let Some(split) = &row[m] else { continue };
                        if sel.replicas[gi].contains(&m) {
                            continue;
                        }
                        let fits = sel.used[gi].iter().zip(&split.device_memory_bytes).all(|(&u, &need)| {
                            u.checked_add(need).is_some_and(|t| t <= self.input.device_memory_bytes)
                        });
                        if !fits {
                            continue;
                        }
                        let mut new = sel.clone();
                        new.replicas[gi].push(m);
                        for (u, &need) in new.used[gi].iter_mut().zip(&split.device_memory_bytes) {
                            *u += need;
                        }
                        if next.iter().any(|o| same_replicas(o, &new)) {
                            continue;
                        }
                        next.push(self.evaluate(new, &splits));
                    }
                }
            }
            if next.is_empty() {
                return Ok(best);
            }
            next.sort_by(|a, b| b.attainment.total_cmp(&a.attainment));
            // The best of all candidates, not only of the beam: with `serve_every_model`, the
            // highest attainment may be one that leaves a model out.
            for candidate in &next {
                if candidate.better_than(&best, self.every()) {
                    best = candidate.clone();
                }
            }
            next.truncate(self.beam);
            beam = next;
        }
    }

    /// Simulates `sel` and records its attainment.
    fn evaluate(&self, mut sel: Selection, splits: &[Vec<Option<Split>>]) -> Selection {
        sel.groups = sel
            .replicas
            .iter()
            .enumerate()
            .map(|(gi, models)| {
                let placed = || models.iter().filter_map(|&m| Some((m, splits[gi][m].as_ref()?)));
                Group {
                    stages: sel.shapes[gi].0,
                    models: placed()
                        .map(|(m, split)| (m, split.stage_latency_ms.iter().map(|ms| ms / 1000.0).collect()))
                        .collect(),
                    steps: placed().filter_map(|(m, split)| Some((m, split.steps.as_ref()?.sim()))).collect(),
                }
            })
            .collect();
        let attained =
            self.simulate(&sel.groups).iter().zip(&self.requests).filter(|(l, r)| self.attained(**l, r)).count();
        sel.attainment = attained as f64 / self.requests.len() as f64;
        sel
    }

    /// The latency of every request on `groups` (sorted order), dropped as `admission` says.
    fn simulate(&self, groups: &[Group]) -> Vec<Option<f64>> {
        let drop = match self.input.admission {
            Admission::All => Dropping::Never,
            Admission::Slo => Dropping::Late(&self.slo_s),
        };
        sim::simulate_admitting(groups, &self.requests, self.kappa, drop)
    }

    /// Whether a request with latency `latency` met its model's SLO.
    fn attained(&self, latency: Option<f64>, request: &Request) -> bool {
        latency.is_some_and(|l| l <= self.input.models[request.model].slo_s + SLO_SLACK_S)
    }

    fn output(&self, sel: &Selection, baseline: Option<Baseline>) -> PlacementOutput {
        let mut groups = Vec::new();
        let mut first_device = 0;
        for (gi, &(p, t)) in sel.shapes.iter().enumerate() {
            let devices: Vec<usize> = (first_device..first_device + p * t).collect();
            first_device += p * t;
            let models = sel.replicas[gi]
                .iter()
                .filter_map(|&m| {
                    let split = self.split(m, (p, t)).ok().flatten()?;
                    Some(PlacedModel {
                        model: self.input.models[m].name.clone(),
                        stages: split.ranges,
                        stage_latency_ms: split.stage_latency_ms,
                        steps: split.steps,
                    })
                })
                .collect();
            groups.push(GroupPlan { devices, pipeline_stages: p, tensor_parallel: t, models });
        }
        self.outcome(groups, &sel.groups, baseline)
    }

    /// The output for `groups` as the simulator runs them (`sim_groups`): latencies back in trace
    /// order and the attainment overall and per model.
    fn outcome(&self, groups: Vec<GroupPlan>, sim_groups: &[Group], baseline: Option<Baseline>) -> PlacementOutput {
        let latencies = self.simulate(sim_groups);
        let mut latencies_s = vec![None; self.requests.len()];
        for (sorted, &original) in self.order.iter().enumerate() {
            latencies_s[original] = latencies[sorted];
        }
        let attained = self.requests.iter().zip(&latencies).filter(|(r, l)| self.attained(**l, r)).count();
        let slo_attainment = attained as f64 / self.requests.len() as f64;
        let models = self
            .input
            .models
            .iter()
            .enumerate()
            .map(|(mi, m)| {
                let (mut requests, mut ok) = (0usize, 0usize);
                for (r, &l) in self.requests.iter().zip(&latencies) {
                    if r.model == mi {
                        requests += 1;
                        ok += usize::from(self.attained(l, r));
                    }
                }
                ModelAttainment {
                    model: m.name.clone(),
                    requests,
                    slo_attainment: if requests == 0 { 1.0 } else { ok as f64 / requests as f64 },
                }
            })
            .collect();
        PlacementOutput { groups, slo_attainment, models, latencies_s, baseline }
    }
}
