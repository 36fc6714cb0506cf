//! `serve --placement`: the served models placed on groups of the `--devices` pool as AlpaServe
//! places them (thesis ch. 4), each group running its models as pipelines over its devices.
//!
//! - `auto`: each model profiled at start-up on the pool's first device (cached, as
//!   `--stage-layers auto` does; the planner takes the pool as identical devices), its cost of
//!   one request per layer taken from the `--workload` shape ([`burn_plan::serving`]),
//!   and [`burn_plan::placement::plan`] choosing the group partition, each group's
//!   stages and which models each group serves under the devices' memory (`--device-memory`).
//! - `replicate`: AlpaServe's replication baseline: every group is one device, and a device holds
//!   whole replicas of the models that fit, no model parallelism. With `--workload` the planner
//!   chooses the replicas on the simulator (selective replication); without, every device takes
//!   the models in order while they fit.
//! - `manual:SPEC` ([`manual`]): the groups by hand, each model's layers split evenly over its
//!   group's stages.
//!
//! A model on a group of several stages runs as one virtual engine per stage over the one loaded
//! pipeline (`--virtual-engines`), so that, as in the simulator, a stage takes the next request
//! once it has passed on the last rather than when the last has left the pipeline.
//!
//! A model on several groups is served by replicas: a request goes to the replica with the fewest
//! requests in flight, as AlpaServe's controller and the simulator do. Models on one group share
//! its devices first come, first served. Weights are what the memory check counts; each model's
//! KV budget is its `--kv-cache-memory`.
//!
//! With a workload over two or more devices, the devices' interference `κ` is measured at start-up
//! (module `interference`) and priced by the simulator, for the choice (`auto`, `replicate`) and the
//! prediction alike: stages or replicas working at once are slowed as the devices measured. For
//! each stage count `S ≥ 2` the choice can run (`auto`: every one up to the pool's size; `manual`:
//! its groups' sizes), each model with traffic and at least `S` layers is also timed running as a
//! pipeline over the pool's first `S` devices (module `pipelined`), and groups of `S` stages are
//! priced from that, as AlpaServe profiles each parallel configuration. Before that, a model whose
//! flags leave its prefill's chunks open gets the chunk size that prefills its prompt fastest over
//! those `S` devices (module `chunks`), which its engines on groups of `S` stages then run with.

mod chunks;
mod interference;
pub mod manual;
mod pipelined;
mod profiles;
mod report;

use std::collections::HashMap;
use std::io::Write;

use burn_parallel::pipeline::{PipelineError, StageLayout};
use burn_plan::placement::{self, Baseline, GroupPlan, PlacedModel, PlacementInput, PlacementOutput};
use burn_plan::serving::ServingWorkload;
use burn_plan::sim::{self, Admission};

use super::ServerError;
use super::admission::{GroupClock, SloGate};
use super::model_args::ServedModelSpec;
pub use manual::Manual;
use profiles::ModelCosts;
pub use report::{GroupModelReport, GroupReport, MeasuredReport, PlacementReport};

/// The error of `--placement auto` without a workload.
const NEEDS_WORKLOAD: &str = "--placement auto needs --workload FILE.json: each model's rate, cv and slo_s";

/// What `--placement` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementChoice {
    /// AlpaServe's placement on the simulator.
    Auto,
    /// Replication only (AlpaServe's baseline).
    Replicate,
    /// Groups given by hand.
    Manual(Manual),
}

impl std::str::FromStr for PlacementChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "auto" => Ok(Self::Auto),
            "replicate" => Ok(Self::Replicate),
            other => match other.strip_prefix("manual:") {
                Some(spec) => spec.parse().map(Self::Manual).map_err(|e| format!("--placement manual: {e}")),
                None => Err(format!("`{other}` is not a placement: give auto, replicate or manual:NAME=0,1;NAME=2")),
            },
        }
    }
}

impl PlacementChoice {
    fn name(&self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Replicate => "replicate",
            Self::Manual(_) => "manual",
        }
    }
}

/// A placement the server runs: the pool, its groups and what each serves, and the simulator's
/// prediction for the workload.
#[derive(Debug, Clone)]
pub struct ServingPlacement {
    /// `auto`, `replicate` or `manual`.
    pub mode: &'static str,
    /// The `--devices` entries.
    pub pool: Vec<String>,
    /// Groups of pool indices, each with its models' stages (`stage_latency_ms` empty when the
    /// models were not profiled).
    pub groups: Vec<GroupPlan>,
    /// The simulator on the `--workload` (none without one).
    pub prediction: Option<PlacementOutput>,
    /// What the planner was given: each model's profiled cost of one request per layer and its
    /// weight bytes, the pool and the workload (none when nothing was profiled). Predicting
    /// another trace on this placement is [`placement::evaluate`] with this input's workload
    /// replaced.
    pub input: Option<PlacementInput>,
    /// The chunks a model prefills in on groups of a stage count, where the placement chose them
    /// (`--max-num-batched-tokens`).
    pub chunk_tokens: Vec<ChunkChoice>,
}

/// The chunk size the placement chose for a model's prefill on groups of `stages` stages.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChunkChoice {
    /// The served model's name.
    pub model: String,
    /// Pipeline stages of the groups it applies to (at least 2).
    pub stages: usize,
    /// Tokens computed a step (`--max-num-batched-tokens`).
    pub tokens: usize,
}

impl ServingPlacement {
    /// Each model's engine specs, one per group serving it (its replicas), in group order: the
    /// group's devices as `--devices`, the planned stages as `--stage-layers`, over several
    /// stages one virtual engine per stage unless the model's flags say otherwise and the chunks
    /// chosen for it on that many stages (the pool's `--device-memory` and `--stage-profile-dir`
    /// served the placement and are dropped).
    pub fn replica_specs(&self, model: &ServedModelSpec) -> Vec<burn_llm::spec::EngineSpec> {
        let mut specs = Vec::new();
        for group in &self.groups {
            let Some(placed) = group.models.iter().find(|m| m.model == model.name) else { continue };
            let devices = group.devices.iter().map(|&d| self.pool[d].clone()).collect();
            let chunk = chunk_of(&self.chunk_tokens, &model.name, group.pipeline_stages);
            specs.push(group_spec(model, devices, &placed.stages, group.pipeline_stages, chunk));
        }
        specs
    }

    /// `--admission slo`: each model's gates, one per group serving it in group order (as
    /// [`ServingPlacement::replica_specs`]), the models on one group sharing its clocks, which run
    /// on each model's [`sim::admission_latencies`] at the devices' interference, or, on a group
    /// serving models step by step, on the group's own timeline ([`sim::StepClocks`]). A model
    /// without traffic in the workload has no SLO and is always taken, but its requests still
    /// take their turn on the clocks. Empty under `--admission all`.
    pub fn gates(&self) -> HashMap<String, Vec<SloGate>> {
        let mut gates: HashMap<String, Vec<SloGate>> = HashMap::new();
        let Some(input) = self.input.as_ref().filter(|i| i.admission == Admission::Slo) else {
            return gates;
        };
        let kappa = self.interference().unwrap_or(0.0);
        for (gi, group) in self.groups.iter().enumerate() {
            // As the simulator keeps a group's clocks (`plan::sim`): its own step-by-step
            // timeline where it serves a model step by step, the flow-shop rule otherwise.
            let stepped = group.models.iter().any(|m| m.steps.is_some());
            let clock = match stepped {
                true => {
                    let indices: Vec<usize> = (0..group.models.len()).collect();
                    GroupClock::stepped(gi, sim::StepClocks::new(group.sim_group(&indices), kappa))
                }
                false => GroupClock::new(gi, group.pipeline_stages),
            };
            for (i, placed) in group.models.iter().enumerate() {
                let Some(model) = input.models.iter().find(|m| m.name == placed.model) else { continue };
                let gate = match stepped {
                    true => SloGate::stepped(clock.clone(), i, model.slo_s),
                    false => {
                        let latency_ms = sim::admission_latencies(&placed.stage_latency_ms, kappa);
                        SloGate::new(clock.clone(), &latency_ms, model.slo_s)
                    }
                };
                gates.entry(placed.model.clone()).or_default().push(gate);
            }
        }
        gates
    }

    /// The placement as the start-up log prints it: one line per group, then the prediction.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "placement ({}): {} group(s) over {} device(s)",
            self.mode,
            self.groups.len(),
            self.pool.len()
        )];
        for (gi, g) in self.groups.iter().enumerate() {
            let devices: Vec<String> = g.devices.iter().map(|&d| format!("{d}:{}", self.pool[d])).collect();
            let models: Vec<String> = g
                .models
                .iter()
                .map(|m| {
                    let stages: Vec<String> =
                        m.stages.iter().map(|[a, b]| format!("{a}-{}", b.saturating_sub(1))).collect();
                    format!("`{}` layers {}", m.model, stages.join(" | "))
                })
                .collect();
            let models = if models.is_empty() { "nothing".to_string() } else { models.join(", ") };
            lines.push(format!("  group {gi} [{}] ({} stage(s)): {models}", devices.join(", "), g.pipeline_stages));
        }
        for m in self.input.iter().flat_map(|i| &i.models) {
            for p in &m.measured_pipelines {
                lines.push(match p.stages {
                    1 => format!(
                        "  `{}` timed on one device: one request {:.0} ms (one-device groups priced from this)",
                        m.name, p.latency_ms
                    ),
                    n => {
                        let stepped = self.groups.iter().flat_map(|g| &g.models).find_map(|placed| {
                            placed.steps.as_ref().filter(|s| placed.model == m.name && s.prefill_ms.len() == n)
                        });
                        let (prefill, steps) = match (&p.steps, stepped) {
                            (Some(timed), Some(costs)) => (
                                pipelined::prefill_note(timed),
                                format!(
                                    "; served step by step, its stages slowing each other by κ = {:.2} replay that",
                                    costs.kappa
                                ),
                            ),
                            _ => Default::default(),
                        };
                        format!(
                            "  `{}` timed as a {n}-stage pipeline{}: one request {:.0} ms{prefill}, each further one \
                             started with it adds {:.0} ms{steps} ({n}-stage groups priced from this)",
                            m.name,
                            chunk_of(&self.chunk_tokens, &m.name, n)
                                .map(|c| format!(", prefilling in chunks of {c} tokens"))
                                .unwrap_or_default(),
                            p.latency_ms,
                            p.interval_ms
                        )
                    }
                });
            }
        }
        if let Some(p) = &self.prediction {
            let per_model: Vec<String> =
                p.models.iter().map(|m| format!("`{}` {:.1}%", m.model, 100.0 * m.slo_attainment)).collect();
            let kappa =
                self.interference().map(|k| format!(", the devices' interference κ = {k:.2}")).unwrap_or_default();
            lines.push(format!(
                "  predicted SLO attainment on the workload: {:.1}% ({}{kappa})",
                100.0 * p.slo_attainment,
                per_model.join(", ")
            ));
        }
        if let (Some(p), Some(Admission::Slo)) = (&self.prediction, self.input.as_ref().map(|i| i.admission)) {
            let dropped = p.latencies_s.iter().filter(|l| l.is_none()).count();
            lines.push(format!(
                "  --admission slo: requests predicted to miss their SLO are rejected at arrival (503); \
                 the prediction rejects {dropped} of the workload's {}",
                p.latencies_s.len()
            ));
        }
        lines
    }

    /// The devices' measured interference the prediction priced, if any was measured.
    pub fn interference(&self) -> Option<f64> {
        self.input.as_ref().and_then(|i| i.interference)
    }
}

/// Places `models` on the `pool` (checked: the pool's size, each model keeping the shared
/// `--devices` and leaving the stages to the placement), profiling them where the choice, the
/// memory check or the prediction needs it; progress and the placement go to `log`.
pub fn place(
    choice: &PlacementChoice,
    models: &[ServedModelSpec],
    pool: &[String],
    workload: Option<&ServingWorkload>,
    admission: Admission,
    log: &mut dyn Write,
) -> Result<ServingPlacement, ServerError> {
    let config = |e: String| ServerError::Config(e);
    if models.is_empty() || pool.is_empty() {
        return Err(config("--placement needs models (--model) and devices (--devices) to place them on".into()));
    }
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    if let Some(w) = workload {
        w.check(&names).map_err(|e| config(format!("--workload: {e}")))?;
    }
    for m in models {
        check_model_flags(m, pool)?;
    }
    // Every check that needs no profile comes before the profiling.
    match (choice, workload) {
        (PlacementChoice::Manual(manual), _) => {
            manual.check(&names, pool.len()).map_err(|e| config(format!("--placement manual: {e}")))?;
        }
        (PlacementChoice::Auto, None) => return Err(config(NEEDS_WORKLOAD.into())),
        _ => {}
    }
    let caps = models[0].spec.parallel.device_memory.clone();
    if let Some(c) = caps.as_ref().filter(|c| c.len() != pool.len()) {
        return Err(config(format!(
            "--device-memory gives {} sizes for the {} --devices: give one per device, in the same order",
            c.len(),
            pool.len()
        )));
    }
    let caps: Vec<u64> = caps.unwrap_or_else(|| pool.iter().map(|d| burn_llm::spec::default_memory(d)).collect());
    let needs_costs = !matches!(choice, PlacementChoice::Manual(_)) || workload.is_some();
    let mut costs = if needs_costs || caps.iter().any(|&c| c < u64::MAX) {
        Some(ModelCosts::measure(models, pool, workload, log)?)
    } else {
        None
    };
    // What the simulator needs of the devices beside the costs: how they slow each other down.
    let devices_together = match (&costs, workload) {
        (Some(costs), Some(w)) => interference::measure(models, pool, w, costs, &caps, log)?,
        _ => None,
    };
    let interference = devices_together.as_ref().map(|m| m.kappa);
    // And what the engine adds to the layers, on one device and running as a pipeline, for the
    // group sizes the choice can run.
    let runs = |stages: usize| match choice {
        PlacementChoice::Auto => true,
        PlacementChoice::Replicate => stages == 1,
        PlacementChoice::Manual(m) => m.models.iter().any(|(_, groups)| groups.iter().any(|g| g.len() == stages)),
    };
    let mut chunk_tokens = Vec::new();
    if let (Some(costs), Some(w)) = (costs.as_mut(), workload) {
        let mut measured = Vec::new();
        if runs(1) {
            measured.extend(pipelined::measure_one_device(
                models,
                pool,
                w,
                costs,
                caps.first().copied().unwrap_or(u64::MAX),
                devices_together.as_ref().and_then(|m| m.alone_on_first.as_ref()),
                log,
            )?);
        }
        for stages in (2..=pool.len()).filter(|&s| runs(s)) {
            let devices = &pool[..stages];
            let timed = pipelined::timed_on(models, w, costs, stages, log);
            let chosen = chunks::choose(&timed, devices, w, costs, log)?;
            measured.extend(pipelined::measure(&timed, devices, w, costs, &chosen, log)?);
            chunk_tokens.extend(chosen);
        }
        costs.set_pipelines(measured);
    }
    let kappa = interference.unwrap_or(0.0);
    let memory = caps.iter().copied().min().unwrap_or(u64::MAX);
    let input =
        costs.as_ref().map(|c| PlacementInput { admission, ..c.input(pool.len(), memory, workload, interference) });
    let groups = match choice {
        PlacementChoice::Manual(manual) => manual_groups(manual, models, costs.as_ref(), kappa)?,
        PlacementChoice::Auto | PlacementChoice::Replicate => {
            let (Some(costs), Some(input)) = (&costs, &input) else {
                return Err(config("--placement auto and replicate need the models' costs".into()));
            };
            match (choice, workload) {
                (PlacementChoice::Replicate, None) => costs.packed_replicas(&caps),
                (_, Some(_)) => planned(choice, input)?,
                (_, None) => return Err(config(NEEDS_WORKLOAD.into())),
            }
        }
    };
    if let Some(costs) = &costs {
        costs.check_memory(&groups, &caps, pool)?;
    }
    let prediction = match (&input, workload) {
        (Some(input), Some(_)) => {
            Some(placement::evaluate(input, groups.clone()).map_err(|e| config(format!("--workload: {e}")))?)
        }
        _ => None,
    };
    Ok(ServingPlacement { mode: choice.name(), pool: pool.to_vec(), groups, prediction, input, chunk_tokens })
}

/// `model`'s engine spec on a group of `devices` (`--devices` entries) running its layers in
/// `stages` (half-open ranges, as `--stage-layers`) over `pipeline_stages` stages: over several,
/// one virtual engine per stage unless the model's flags say otherwise, and `chunk` (chosen by
/// [`chunks`] for that many stages) as `--max-num-batched-tokens` (the pool's `--device-memory`
/// and `--stage-profile-dir` served the placement and are dropped).
fn group_spec(
    model: &ServedModelSpec,
    devices: Vec<String>,
    stages: &[[usize; 2]],
    pipeline_stages: usize,
    chunk: Option<usize>,
) -> burn_llm::spec::EngineSpec {
    let mut spec = model.spec.clone();
    spec.device = None;
    spec.parallel.devices = Some(devices);
    // The placement has checked the memory and read the profiles these name.
    spec.parallel.device_memory = None;
    spec.parallel.stage_profile_dir = None;
    spec.parallel.pipeline_parallel_size = None;
    spec.parallel.stage_layers =
        Some(stages.iter().map(|[a, b]| format!("{a}-{}", b.saturating_sub(1))).collect::<Vec<_>>().join(","));
    // The simulator's pipeline: a stage takes the next request once it has passed on the last,
    // which takes one engine per stage (each engine's step spans every stage). Virtual engines
    // overlap steps across stages, so a model's own `--virtual-engines` is for its groups of
    // several stages: one device has nothing to overlap, and its engine would refuse the flag.
    spec.parallel.virtual_engines = match pipeline_stages {
        0 | 1 => None,
        n => Some(spec.parallel.virtual_engines.unwrap_or(n)),
    };
    // One device has nothing to overlap a prompt's chunks with: it keeps whole prompts.
    if pipeline_stages > 1 && chunk.is_some() {
        spec.paged.max_num_batched_tokens = chunk;
    }
    spec
}

/// `layers` split as evenly as possible over `stages` stages, as half-open `[start, end]` ranges.
fn even_stages(layers: usize, stages: usize) -> Result<Vec<[usize; 2]>, PipelineError> {
    Ok(StageLayout::even(layers, stages)?.stages().iter().map(|r| [r.start, r.end]).collect())
}

/// The chunk size chosen for `name` on groups of `stages` stages, if any.
fn chunk_of(chunks: &[ChunkChoice], name: &str, stages: usize) -> Option<usize> {
    chunks.iter().find(|c| c.model == name && c.stages == stages).map(|c| c.tokens)
}

/// A model's own flags may not choose what the placement chooses.
fn check_model_flags(model: &ServedModelSpec, pool: &[String]) -> Result<(), ServerError> {
    let p = &model.spec.parallel;
    let own_devices = p.devices.as_deref().is_some_and(|d| d != pool);
    let flag = if own_devices {
        Some("--devices")
    } else if p.stage_layers.is_some() {
        Some("--stage-layers")
    } else if p.pipeline_parallel_size.is_some() {
        Some("--pipeline-parallel-size")
    } else if p.tensor_parallel_size.is_some() {
        Some("--tensor-parallel-size")
    } else {
        None
    };
    match flag {
        Some(flag) => Err(ServerError::Config(format!(
            "model `{}`: {flag} conflicts with --placement, which chooses each model's devices and stages from the --devices pool: drop it",
            model.name
        ))),
        None => Ok(()),
    }
}

/// The planner's placement (`replicate`: restricted to one-device groups); every served model
/// must be on some group.
fn planned(choice: &PlacementChoice, input: &PlacementInput) -> Result<Vec<GroupPlan>, ServerError> {
    let mut input = input.clone();
    input.baseline = matches!(choice, PlacementChoice::Replicate).then_some(Baseline::Replication);
    let out =
        placement::plan(&input).map_err(|e| ServerError::Config(format!("--placement {}: {e}", choice.name())))?;
    Ok(out.groups.into_iter().filter(|g| !g.models.is_empty()).collect())
}

/// The groups of a manual placement: one per distinct device list, in first-use order, each model's
/// layers split evenly over the group's stages.
fn manual_groups(
    manual: &Manual,
    models: &[ServedModelSpec],
    costs: Option<&ModelCosts>,
    kappa: f64,
) -> Result<Vec<GroupPlan>, ServerError> {
    let mut groups: Vec<GroupPlan> = Vec::new();
    for (name, model_groups) in &manual.models {
        let Some(spec) = models.iter().find(|m| &m.name == name) else { continue };
        for devices in model_groups {
            let layers = match costs {
                Some(c) => c.layers(name),
                None => profiles::layer_count(spec)?,
            };
            let stages = even_stages(layers, devices.len())
                .map_err(|e| ServerError::Config(format!("--placement manual: model `{name}`: {e}")))?;
            let placed = match costs {
                Some(c) => c.placed(name, stages, kappa),
                None => PlacedModel { model: name.clone(), stages, stage_latency_ms: Vec::new(), steps: None },
            };
            match groups.iter_mut().find(|g| &g.devices == devices) {
                Some(g) => g.models.push(placed),
                None => groups.push(GroupPlan {
                    devices: devices.clone(),
                    pipeline_stages: devices.len(),
                    tensor_parallel: 1,
                    models: vec![placed],
                }),
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_choices_parse() {
        assert_eq!("auto".parse::<PlacementChoice>().unwrap(), PlacementChoice::Auto);
        assert_eq!("replicate".parse::<PlacementChoice>().unwrap(), PlacementChoice::Replicate);
        assert!(matches!("manual:a=0".parse::<PlacementChoice>().unwrap(), PlacementChoice::Manual(_)));
        assert!("manual:a".parse::<PlacementChoice>().unwrap_err().contains("--placement manual"));
        assert!("spread".parse::<PlacementChoice>().unwrap_err().contains("auto, replicate or manual"));
    }

    #[test]
    fn the_chosen_chunks_run_on_groups_of_the_stage_count_they_were_timed_on() {
        let model = ServedModelSpec {
            name: "a".into(),
            source: "a".into(),
            spec: Default::default(),
            chat_template: None,
            max_waiting: None,
        };
        let budget = |devices: usize, chunk: Option<usize>| {
            let stages: Vec<[usize; 2]> = (0..devices).map(|d| [d, d + 1]).collect();
            let pool = (0..devices).map(|_| "flex".to_string()).collect();
            let spec = group_spec(&model, pool, &stages, devices, chunk);
            (spec.paged.max_num_batched_tokens, spec.parallel.virtual_engines)
        };
        assert_eq!(budget(2, Some(64)), (Some(64), Some(2)));
        assert_eq!(budget(2, None), (None, Some(2)));
        assert_eq!(budget(3, Some(32)), (Some(32), Some(3)));
        // One device keeps whole prompts: nothing overlaps their chunks.
        assert_eq!(budget(1, Some(64)), (None, None));
        let choice = |stages, tokens| ChunkChoice { model: "a".into(), stages, tokens };
        let chosen = vec![choice(2, 64), choice(3, 32)];
        assert_eq!(chunk_of(&chosen, "a", 2), Some(64));
        assert_eq!(chunk_of(&chosen, "a", 3), Some(32));
        // Each stage count has its own choice: none timed on four stages, none for `b`.
        assert_eq!((chunk_of(&chosen, "a", 4), chunk_of(&chosen, "b", 2)), (None, None));
    }

    #[test]
    fn a_models_own_virtual_engines_run_on_its_groups_of_several_stages() {
        let mut spec = burn_llm::spec::EngineSpec::default();
        spec.parallel.virtual_engines = Some(4);
        let model =
            ServedModelSpec { name: "a".into(), source: "a".into(), spec, chat_template: None, max_waiting: None };
        let engines = |devices: usize| {
            let stages: Vec<[usize; 2]> = (0..devices).map(|d| [d, d + 1]).collect();
            let pool = (0..devices).map(|_| "flex".to_string()).collect();
            group_spec(&model, pool, &stages, devices, None).parallel.virtual_engines
        };
        assert_eq!((engines(2), engines(3)), (Some(4), Some(4)));
        // A replica on one device runs one engine, where the flag would be refused.
        assert_eq!(engines(1), None);
    }
}
