//! ExeGPT plans in the paged engine: turns the planner's output ([`ScheduleOutput`], from
//! `cargo run --example plan -- schedule` or planned here at start-up) into the paged engine's
//! [`SchedulingPolicy::Phased`]. The paged engine knows only the schedule's shape; this facade
//! knows the planner.
//!
//! On one device only ExeGPT's RRA strategy maps onto the engine: prefill `B_E` requests, decode
//! `N_D` iterations over at most `B_D` sequences, repeat (ExeGPT §4.1), prefilling sooner when `B_E`
//! seats have freed (§5.2), as the planner's one-device simulation assumes. Over two devices
//! ([`plan_for`] with `devices: 2`) the planner's choice runs: WAA as [`burn_paged::DisaggEngine`]
//! (prefill on one device, decode on the other, [`waa_config`]), RRA as the same phased schedule
//! on virtual engines over a two-stage pipeline, one per decoder micro-batch ([`pipelined_engines`]).
//!
//! Planning at start-up needs the model's cost profile on this device: a saved one, or one
//! measured now ([`profiling`]: the layers, then the paged engine's per-step overhead).

mod cycle;
mod profiling;
mod waa_pair;

pub use cycle::{EngineInterference, engine_interference};
pub use profiling::{check_layers, engine_steps, load_or_profile, measure_profile, time_engine_steps};
pub use waa_pair::waa_interference;

use std::path::{Path, PathBuf};

use burn_llm_models::generation::prepare_prompt;
use burn_llm_models::{ModelError, Pretrained, Prompt};
use burn_paged::{DisaggConfig, EngineConfig, PagedError, SchedulingPolicy};
use burn_parallel::profiler::ProfileError;
use burn_plan::profile::Profile;
use burn_plan::schedule::{
    self, BatchInterference, LengthDistribution, ScheduleError, ScheduleInput, ScheduleOutput, Strategy,
};

/// Why an ExeGPT plan cannot run in the paged engine.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A file cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file cannot be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not the JSON expected.
    #[error("{path} is not {what}: {source}")]
    Parse {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The plan is a WAA plan.
    #[error(
        "the plan uses ExeGPT's {strategy:?} strategy; the paged engine runs only RRA on one device: plan with `\"strategies\": [\"rra\"]` and `\"devices\": 1`"
    )]
    NotRra {
        /// The plan's strategy.
        strategy: Strategy,
    },
    /// The plan needs more than one device.
    #[error(
        "the plan runs on {devices} devices ({stages} pipeline stages, tensor-parallel degree {degree}); the paged engine runs on one device: plan with `\"devices\": 1`"
    )]
    NotOneDevice {
        /// Devices it uses.
        devices: usize,
        /// Its pipeline stages.
        stages: usize,
        /// Its tensor-parallel degree.
        degree: usize,
    },
    /// The plan's batch sizes or `N_D` cannot run.
    #[error("the plan cannot run: {0}")]
    Invalid(String),
    /// The model could not be profiled on its device.
    #[error("cannot profile the model for the ExeGPT planner: {0}")]
    Profiler(#[from] ProfileError),
    /// A profile does not fit the model, or cannot be measured on it.
    #[error("{0}")]
    Profile(String),
    /// The planner found no schedule (bad profile, infeasible bound, ...).
    #[error("ExeGPT planner: {0}")]
    Planner(#[from] ScheduleError),
    /// A prompt cannot be tokenized for the workload.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The KV-cache budget cannot be sized for the planner's memory.
    #[error(transparent)]
    Paged(#[from] PagedError),
}

/// The phased schedule an RRA plan on one device describes. The engine runs at most the plan's
/// `B_D` sequences at once: `B_D` is the decode batch's steady-state mean, and a cap there keeps
/// the batch's swings from slowing the long queries the latency bound is for (a cap at
/// `max_num_seqs` was measured and not kept; README, "Output lengths from the workload").
pub fn phased_policy(plan: &ScheduleOutput) -> Result<SchedulingPolicy, PlanError> {
    if plan.strategy != Strategy::Rra {
        return Err(PlanError::NotRra { strategy: plan.strategy });
    }
    let devices = plan.encode_devices.max(plan.decode_devices);
    if devices != 1 || plan.pipeline_stages != 1 || plan.tensor_parallel_degree != 1 {
        return Err(PlanError::NotOneDevice {
            devices,
            stages: plan.pipeline_stages,
            degree: plan.tensor_parallel_degree,
        });
    }
    let decode_iterations = plan
        .decode_iterations
        .ok_or_else(|| PlanError::Invalid("an RRA plan needs `decode_iterations` (N_D); re-run the planner".into()))?;
    let policy = SchedulingPolicy::Phased {
        encode_batch: plan.encode_batch,
        decode_batch: plan.decode_batch,
        decode_iterations,
    };
    policy.validate().map_err(PlanError::Invalid)?;
    Ok(policy)
}

/// How an RRA plan over a pipeline of `devices` stages (one stage per device, no tensor
/// parallelism) runs: as one virtual engine per decoder micro-batch over the one pipeline
/// ([`crate::engine::paged_engines`]), so that the micro-batches cycle through the stages from one
/// decode iteration to the next (ExeGPT Figure 4(c): a stage starts micro-batch 1's next
/// iteration while a later stage works on micro-batch 2), as the planner prices RRA's decode
/// iterations. One engine would not: it samples a step's logits before it schedules the next, so
/// every step waits for its last micro-batch to leave the last stage. Each engine runs the plan's
/// phases ([`phased_policy`]) on its share of the batches, `⌈B_E ÷ M⌉` and `⌈B_D ÷ M⌉`, one
/// micro-batch per step, with its share of `base`'s KV pool. Returns each engine's configuration
/// and how many.
pub fn pipelined_engines(
    plan: &ScheduleOutput,
    devices: usize,
    base: EngineConfig,
) -> Result<(EngineConfig, usize), PlanError> {
    if plan.strategy != Strategy::Rra {
        return Err(PlanError::NotRra { strategy: plan.strategy });
    }
    if plan.pipeline_stages != devices || plan.tensor_parallel_degree != 1 {
        return Err(PlanError::Invalid(format!(
            "the RRA plan runs {} pipeline stages at tensor-parallel degree {}, and {devices} devices are given: plan with `\"devices\": {devices}`",
            plan.pipeline_stages, plan.tensor_parallel_degree
        )));
    }
    let engines = plan.decoder_micro_batches.max(1);
    let share = ScheduleOutput {
        pipeline_stages: 1,
        encode_devices: 1,
        decode_devices: 1,
        encode_batch: plan.encode_batch.div_ceil(engines),
        decode_batch: plan.decode_batch.div_ceil(engines),
        ..plan.clone()
    };
    let scheduling = phased_policy(&share)?;
    let config = EngineConfig {
        max_num_seqs: share.encode_batch.max(share.decode_batch),
        scheduling,
        micro_batches: Some(1),
        ..base
    };
    Ok((config, engines))
}

/// The two engines' settings of a WAA plan over two devices (one prefilling, one decoding):
/// `base` with the plan's `B_E` and `B_D`.
pub fn waa_config(plan: &ScheduleOutput, base: EngineConfig) -> Result<DisaggConfig, PlanError> {
    if plan.strategy == Strategy::Rra {
        return Err(PlanError::Invalid("an RRA plan has no separate prefill and decode devices".into()));
    }
    if plan.encode_devices != 1 || plan.decode_devices != 1 || plan.tensor_parallel_degree != 1 {
        return Err(PlanError::Invalid(format!(
            "the WAA plan prefills on {} and decodes on {} devices (tensor-parallel degree {}); two devices run one of each: plan with `\"devices\": 2`",
            plan.encode_devices, plan.decode_devices, plan.tensor_parallel_degree
        )));
    }
    if plan.encode_batch == 0 || plan.decode_batch == 0 {
        return Err(PlanError::Invalid("the plan's encode and decode batches must be at least 1".into()));
    }
    Ok(DisaggConfig::waa(base, plan.encode_batch, plan.decode_batch))
}

/// Reads a saved planner output (`cargo run --example plan -- schedule --input … > FILE.json`).
pub fn read_plan(path: &Path) -> Result<ScheduleOutput, PlanError> {
    read_json(path, "an ExeGPT plan (the JSON output of `cargo run --example plan -- schedule`)")
}

/// Reads a planner cost profile (format: [`burn_plan::profile`]).
pub fn read_profile(path: &Path) -> Result<Profile, PlanError> {
    read_json(path, "a planner cost profile (see burn-plan/src/profile.rs)")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &'static str) -> Result<T, PlanError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| PlanError::Read { what, path: path.to_owned(), source })?;
    serde_json::from_str(&text).map_err(|source| PlanError::Parse { what, path: path.to_owned(), source })
}

/// The workload and the device an RRA plan is made for at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleWorkload {
    /// Token length of every prompt: the planner's input-length distribution `P_E(S)`.
    pub prompt_lens: Vec<usize>,
    /// Tokens every request generates, one entry per request or one for all: the planner's
    /// output-length distribution `P_D(S)`, whose 99th percentile the latency bound applies to
    /// (ExeGPT §7.1). Requests that may stop early at EOS are planned at their `max_new_tokens`.
    pub output_lens: Vec<usize>,
    /// Tokens the engine's KV-cache pool holds.
    pub kv_tokens: usize,
    /// The engine's `max_num_seqs`: the largest encode batch searched and the largest decode
    /// batch the engine runs.
    pub max_num_seqs: usize,
}

impl ScheduleWorkload {
    /// The mean prompt length.
    pub fn mean_prompt(&self) -> f64 {
        mean(&self.prompt_lens)
    }

    /// The mean context of a decode step: the mean prompt plus half the mean output.
    pub fn mean_context(&self) -> f64 {
        self.mean_prompt() + mean(&self.output_lens) / 2.0
    }

    /// The workload of generating up to `max_new_tokens` tokens for each of `prompts` with
    /// `model` on a paged engine configured by `config` (every output planned at
    /// `max_new_tokens`).
    pub fn new(
        model: &Pretrained,
        config: &EngineConfig,
        prompts: &[Prompt],
        max_new_tokens: usize,
    ) -> Result<Self, PlanError> {
        let spec = model.model.spec();
        let prompt_lens = prompts
            .iter()
            .map(|p| {
                prepare_prompt(0, p, Some(&model.tokenizer), spec.vocab_size, spec.max_positions)
                    .map(|(_, ids)| ids.len())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (blocks, _) = config.device_blocks_for(&model.model)?;
        Ok(Self {
            prompt_lens,
            output_lens: vec![max_new_tokens],
            kv_tokens: blocks * config.block_size,
            max_num_seqs: config.max_num_seqs,
        })
    }
}

/// Plans ExeGPT's RRA schedule on one device for `workload` under `latency_bound_s`, with the
/// costs of `profile`. The device's memory is the profile's weights plus `kv_tokens` tokens of KV
/// cache (the engine's pool, in the profile's bytes per token), so the planner's memory check is
/// the pool's; the decode batch is capped at the engine's `max_num_seqs`.
pub fn plan_rra(
    profile: Profile,
    workload: &ScheduleWorkload,
    latency_bound_s: f64,
) -> Result<ScheduleOutput, PlanError> {
    plan_for(profile, workload, latency_bound_s, 1, 0.0, None, None)
}

/// The mean of `v` (0 for none).
fn mean(v: &[usize]) -> f64 {
    v.iter().sum::<usize>() as f64 / v.len().max(1) as f64
}

/// How much devices that work at once slow each other down, as the planner prices it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceInterference {
    /// Pipeline stages on different micro-batches (RRA over the devices): the `κ` of
    /// [`burn_parallel::profiler::pipeline_interference`] or of [`engine_interference`].
    pub stages: f64,
    /// The same with each engine decoding a batch, where measured
    /// ([`EngineInterference::at_batch`]; `None`: `stages` at every batch).
    pub stages_at_batch: Option<BatchInterference>,
    /// WAA's prefill device beside its decode device, each repeating its own kind of step: the `κ`
    /// of [`burn_parallel::profiler::side_by_side`] (`None`: `stages`).
    pub waa: Option<f64>,
}

impl From<f64> for DeviceInterference {
    /// One `κ` for every way the devices work at once.
    fn from(stages: f64) -> Self {
        Self { stages, stages_at_batch: None, waa: None }
    }
}

/// Like [`plan_rra`] over `devices` devices of the same memory (each a full model replica and
/// the pool), every strategy considered: RRA (pipeline stages) or WAA (separate prefill and
/// decode devices), whichever the planner finds best under the bound; devices that work at once
/// slow each other down by `interference` (0 on one device). `stage_layers`: the
/// layers of each stage of the pipeline RRA runs over the devices, where it is not an even split.
/// `strategies`: the strategies the planner may choose from (default: all three over several
/// devices, RRA on one; WAA alone on one device is the planner's error).
pub fn plan_for(
    profile: Profile,
    workload: &ScheduleWorkload,
    latency_bound_s: f64,
    devices: usize,
    interference: impl Into<DeviceInterference>,
    stage_layers: Option<&[usize]>,
    strategies: Option<&[Strategy]>,
) -> Result<ScheduleOutput, PlanError> {
    if workload.prompt_lens.is_empty() || workload.output_lens.is_empty() || workload.output_lens.contains(&0) {
        return Err(PlanError::Invalid(
            "planning needs at least one prompt and an output of at least one token (--max-new-tokens ≥ 1)".into(),
        ));
    }
    let interference = interference.into();
    let weights = (profile.layers as u64)
        .saturating_mul(profile.weight_bytes_per_layer)
        .saturating_add(profile.embedding.weight_bytes)
        .saturating_add(profile.lm_head.weight_bytes);
    let kv = (workload.kv_tokens as u64)
        .saturating_mul(profile.kv_bytes_per_token_per_layer)
        .saturating_mul(profile.layers as u64);
    // Over several devices the engines run a pipeline's stages or WAA's prefill and decode
    // devices, never tensor parallelism: the planner is not offered what cannot run.
    let profile = Profile { tensor_parallel: Vec::new(), ..profile };
    let input = ScheduleInput {
        profile,
        input_lengths: LengthDistribution::Trace(workload.prompt_lens.clone()),
        output_lengths: LengthDistribution::Trace(workload.output_lens.clone()),
        devices,
        device_memory_bytes: weights.saturating_add(kv),
        latency_bound_s,
        strategies: match (devices, strategies) {
            (_, Some(strategies)) => Some(strategies.to_vec()),
            (1, None) => Some(vec![Strategy::Rra]),
            _ => None,
        },
        max_encode_batch: Some(workload.max_num_seqs),
        max_decode_iterations: None,
        max_decode_batch: Some(workload.max_num_seqs),
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: interference.stages,
        interference_at_batch: interference.stages_at_batch,
        waa_interference: interference.waa,
        stage_layers: stage_layers.map(<[usize]>::to_vec),
    };
    Ok(schedule::plan(&input)?)
}

/// The layers of each of the `stages` stages RRA runs over as many devices, as `text` gives them
/// (`--stage-layers`): `auto` has Alpa's stage planner balance `profile`'s decode step of
/// `batch` sequences at `context` ([`schedule::balanced_stage_layers`]: the embedding and the
/// engine's step on the first stage, the LM head on the last), a list (`0-2,3-3`) is taken as it
/// is, and none is an even split.
pub fn rra_stage_layers(
    profile: &Profile,
    stages: usize,
    text: Option<&str>,
    batch: usize,
    context: f64,
) -> Result<Vec<usize>, PlanError> {
    use burn_parallel::pipeline::StageLayout;
    let invalid = |e: &dyn std::fmt::Display| PlanError::Invalid(format!("--stage-layers: {e}"));
    let layout = match text.map(str::trim) {
        Some("auto") => {
            let cost = profile.cost_model("profile").map_err(|e| PlanError::Profile(e.to_string()))?;
            let batch = batch.max(1) as f64;
            return schedule::balanced_stage_layers(&cost, stages, batch, context, 0.0).map_err(|e| invalid(&e));
        }
        Some(list) => StageLayout::parse(list, profile.layers).map_err(|e| invalid(&e))?,
        None => StageLayout::even(profile.layers, stages).map_err(|e| invalid(&e))?,
    };
    if layout.len() != stages {
        return Err(invalid(&format_args!(
            "gives {} stages, and RRA runs {stages} here: give {stages} ranges",
            layout.len()
        )));
    }
    Ok(layout.counts())
}

/// One line describing a plan: the schedule and what the planner predicts.
pub fn describe(plan: &ScheduleOutput) -> String {
    if plan.strategy != Strategy::Rra {
        return format!(
            "ExeGPT {:?} schedule: prefill on {} device(s) at B_E = {}, decode on {} at B_D ≤ {}, KV moved after each prefill · predicted {:.2} queries/s, p{} latency {:.3} s (bound {} s)",
            plan.strategy,
            plan.encode_devices,
            plan.encode_batch,
            plan.decode_devices,
            plan.decode_batch,
            plan.throughput_qps,
            plan.latency_percentile,
            plan.latency_s,
            plan.latency_bound_s
        );
    }
    let layers = match &plan.stage_layers {
        Some(layers) => format!(" of {} layers", layers.iter().map(usize::to_string).collect::<Vec<_>>().join(" | ")),
        None => String::new(),
    };
    format!(
        "ExeGPT RRA schedule over {} stage(s){layers}: prefill B_E = {}, then N_D = {} decode iterations at B_D ≤ {} · predicted {:.2} queries/s, p{} latency {:.3} s (bound {} s)",
        plan.pipeline_stages,
        plan.encode_batch,
        plan.decode_iterations.unwrap_or(0),
        plan.decode_batch,
        plan.throughput_qps,
        plan.latency_percentile,
        plan.latency_s,
        plan.latency_bound_s
    )
}
