//! The parallelism settings of every engine spec (flags of every example CLI and the server): `--devices flex,wgpu,…`,
//! `--pipeline-parallel-size N`, `--tensor-parallel-size N`, `--stage-layers 0-11,12-23`
//! (inclusive ranges), `--micro-batches N` and `--prefill-slices auto|uniform:N|off` (TeraPipe
//! token slices of a prefill through the stages), turned into a checked
//! [`PipelinePlan`] before any weight is loaded, and the pipeline-parallel engines built from it.
//! Entries `ws://HOST:PORT[#INDEX]` are devices of remote workers (the `worker` example,
//! `--worker-token`); an engine using any runs behind [`WatchedEngine`], so that a worker that
//! dies or stalls fails its requests with an error naming it after `--worker-timeout-s`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::Device;
use burn_llm_models::{Generator, LanguageModel, PrefillSlicing, PretrainedFiles};
use burn_paged::EngineConfig;
use burn_parallel::pipeline::{PipelineError, PipelineLm, PipelinePlan, StageLayout};
use clap::ValueEnum;

use super::{EngineKind, EngineSpec};
use crate::device::{DeviceChoice, WatchedEngine, WorkerAddress, remote_device};
use crate::engine::Engine;

/// Flags that split a model over several devices.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ParallelSpec {
    /// Devices of the stages and ranks, comma-separated (`flex,wgpu`): stage s, tensor-parallel
    /// rank r runs on entry s·TP + r. Default: `--device` for every stage.
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<String>>,
    /// Pipeline stages (contiguous groups of layers, each on its own device). Default: the
    /// number of `--stage-layers` ranges, else `--devices` entries ÷ the tensor-parallel size,
    /// else 1.
    #[arg(long)]
    pub pipeline_parallel_size: Option<usize>,
    /// Tensor-parallel ranks per stage: each layer of a stage split Megatron-style over this
    /// many devices (default 1); a list (`2,1`) gives each stage its own degree, stage s on the
    /// next `degree` entries of `--devices`; `auto` with `--stage-layers auto`: a degree per
    /// stage chosen with the split (Alpa), each candidate group's layer timed on its devices.
    #[arg(long, value_parser = parse_tensor_parallel_size)]
    pub tensor_parallel_size: Option<TensorParallelSize>,
    /// Layers of each stage as inclusive ranges in layer order, e.g. `0-11,12-23` for 24
    /// layers, or `auto`: one stage per `--devices` entry, each device profiled for this model
    /// (cached) and the links between them measured, the split chosen by Alpa's inter-operator
    /// pass under `--device-memory`. Default: an even split.
    #[arg(long)]
    pub stage_layers: Option<String>,
    /// `--stage-layers auto`: each device's memory for its stage, comma-separated in `--devices`
    /// order (`4GiB,512MiB`). Default: the host's available memory for `flex`, unbounded for
    /// other devices (they do not report theirs).
    #[arg(long, value_delimiter = ',', value_parser = super::parse_bytes)]
    pub device_memory: Option<Vec<u64>>,
    /// `--stage-layers auto`: directory of cached device profiles (default
    /// `~/.cache/burn-llm/profiles`); a profile is reused only for the same device, model and
    /// dtype.
    #[arg(long)]
    pub stage_profile_dir: Option<std::path::PathBuf>,
    /// Paged engine over stages: micro-batches each step's sequences are split into (default:
    /// one per stage).
    #[arg(long)]
    pub micro_batches: Option<usize>,
    /// Remote workers in `--devices`: the longest the engine may go without a sign of progress
    /// (the model's upload, a token, a step) before its requests fail with an error naming the
    /// workers (default 120).
    #[arg(long)]
    pub worker_timeout_s: Option<f64>,
    /// Paged engine over stages: cut each prompt's prefill into token slices that follow each
    /// other through the stages (TeraPipe), `auto` (the slicing planner, from each stage's
    /// device profiled at start-up), `uniform:N` (N near-equal slices) or `off` (default: one
    /// pass).
    #[arg(long)]
    pub prefill_slices: Option<PrefillSlices>,
    /// Paged engine over stages: engines over the one pipeline, each with its own scheduler and
    /// an even share of the KV pool, stepping at once so that one's step runs on the later stages
    /// while another's runs on the earlier ones (vLLM's virtual engines; give the number of
    /// stages). A request goes to the one with the fewest unfinished requests. Default 1.
    #[arg(long)]
    pub virtual_engines: Option<usize>,
}

/// The paged engine's prefill slicing (`None`: one pass).
pub type PrefillSlicingChoice = Option<Arc<dyn PrefillSlicing>>;

/// `--prefill-slices`: how a pipelined prefill is cut into token slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillSlices {
    /// TeraPipe's planner over the stages' measured costs ([`PlannedSlices`]).
    Auto,
    /// `N` near-equal slices ([`UniformSlices`]).
    Uniform(usize),
    /// One pass (the default).
    Off,
}

impl std::str::FromStr for PrefillSlices {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t = text.trim();
        match t {
            "auto" => return Ok(Self::Auto),
            "off" => return Ok(Self::Off),
            _ => {}
        }
        match t.strip_prefix("uniform:").map(|n| n.trim().parse::<usize>()) {
            Some(Ok(n)) if n >= 1 => Ok(Self::Uniform(n)),
            _ => Err(format!("unparsable --prefill-slices '{text}': expected auto, uniform:N (N ≥ 1) or off")),
        }
    }
}

/// `--tensor-parallel-size`: a degree, one degree per stage, or `auto` (planned with
/// `--stage-layers auto`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorParallelSize {
    /// This many ranks per stage.
    Fixed(usize),
    /// Stage `s` has `degrees[s]` ranks (`2,1`).
    PerStage(Vec<usize>),
    /// A degree per stage chosen by the planner.
    Auto,
}

fn parse_tensor_parallel_size(text: &str) -> Result<TensorParallelSize, String> {
    let bad = || {
        format!(
            "`{text}`: give a number of ranks per stage, one number per stage (`2,1`), or `auto` with --stage-layers auto"
        )
    };
    match text.trim() {
        "auto" => Ok(TensorParallelSize::Auto),
        n if n.contains(',') => {
            let degrees = n.split(',').map(|d| d.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>();
            degrees.map(TensorParallelSize::PerStage).map_err(|_| bad())
        }
        n => n.parse().map(TensorParallelSize::Fixed).map_err(|_| bad()),
    }
}

/// `--worker-timeout-s`'s default.
pub const DEFAULT_WORKER_TIMEOUT_S: f64 = 120.0;

impl ParallelSpec {
    /// Whether any parallelism flag was given.
    pub fn is_set(&self) -> bool {
        self.devices.is_some()
            || self.pipeline_parallel_size.is_some()
            || self.tensor_parallel_size.as_ref().is_some_and(|t| *t != TensorParallelSize::Fixed(1))
            || self.stage_layers.is_some()
            || self.micro_batches.is_some()
            || self.prefill_slices.is_some_and(|s| s != PrefillSlices::Off)
            || self.virtual_engines.is_some_and(|n| n != 1)
    }

    /// The pipeline stages the flags ask for, as far as they tell without the model: the
    /// `--pipeline-parallel-size`, else the `--stage-layers` ranges, else the `--devices`
    /// entries ÷ the tensor-parallel size, else 1.
    pub fn stages_hint(&self) -> usize {
        let ranges = self.stage_layers.as_deref().filter(|t| t.trim() != "auto").map(|t| t.split(',').count());
        let per_stage = self.per_stage_degrees().map(<[usize]>::len);
        let listed = self.devices.as_ref().map(|d| d.len() / self.tensor_parallel().max(1));
        self.pipeline_parallel_size.or(ranges).or(per_stage).or(listed).unwrap_or(1)
    }

    /// Whether the stages are planned from measured costs (`--stage-layers auto`).
    pub fn is_auto(&self) -> bool {
        self.stage_layers.as_deref().is_some_and(|s| s.trim() == super::auto_stages::AUTO)
    }

    /// The checked split of a model of `num_layers` layers: stage layout, degrees and devices
    /// (`default` on every stage and rank when `--devices` is absent). Errors before any work:
    /// more stages than layers, a bad `--stage-layers`, a device list that does not match
    /// the stages' ranks, a list of degrees of another length than the stages, a device that
    /// cannot be used.
    /// Remote entries connect now, with `token` (default: `$BURN_LLM_WORKER_TOKEN`).
    pub fn plan(
        &self,
        num_layers: usize,
        default: (&str, &Device),
        token: Option<&str>,
    ) -> Result<PipelinePlan, PipelineError> {
        let layout = match (&self.stage_layers, self.pipeline_parallel_size) {
            _ if self.is_auto() || self.tensor_parallel_size == Some(TensorParallelSize::Auto) => {
                return Err(PipelineError::BadStageLayers {
                    text: self.stage_layers.clone().unwrap_or_default(),
                    reason: "planned stages (and --tensor-parallel-size auto, which needs --stage-layers auto) \
                             need the model's files and profiles: build the engine with EngineSpec::init, or \
                             plan with PipelinePlan::auto"
                        .into(),
                });
            }
            (Some(text), size) => {
                let layout = StageLayout::parse(text, num_layers)?;
                if let Some(size) = size.filter(|&s| s != layout.len()) {
                    return Err(PipelineError::StageCountMismatch { ranges: layout.len(), size });
                }
                layout
            }
            (None, size) => {
                let per_stage = self.per_stage_degrees().map(<[usize]>::len);
                let listed = self.devices.as_ref().map(|d| d.len() / self.tensor_parallel().max(1));
                StageLayout::even(num_layers, size.or(per_stage).or(listed.filter(|&n| n > 0)).unwrap_or(1))?
            }
        };
        let degrees = match self.per_stage_degrees() {
            Some(degrees) => degrees.to_vec(),
            None => vec![self.tensor_parallel(); layout.len()],
        };
        if degrees.len() != layout.len() {
            return Err(PipelineError::DegreeCount { degrees: degrees.len(), stages: layout.len() });
        }
        let (names, devices): (Vec<String>, Vec<Device>) = match &self.devices {
            Some(entries) => entries
                .iter()
                .map(|e| parse_device(e, token).map(|d| (e.trim().to_string(), d)))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .unzip(),
            None => {
                let ranks: usize = degrees.iter().sum();
                (0..ranks).map(|_| (default.0.to_string(), default.1.clone())).unzip()
            }
        };
        let plan = match self.per_stage_degrees() {
            Some(_) => PipelinePlan::with_degrees(layout, degrees, devices)?,
            None => PipelinePlan::new(layout, self.tensor_parallel(), devices)?,
        };
        Ok(plan.with_names(names))
    }

    /// Tensor-parallel ranks per stage (1 when not given, per stage, or `auto`: see
    /// [`ParallelSpec::per_stage_degrees`] and the planner).
    pub fn tensor_parallel(&self) -> usize {
        match self.tensor_parallel_size {
            Some(TensorParallelSize::Fixed(n)) => n,
            _ => 1,
        }
    }

    /// Each stage's degree when `--tensor-parallel-size` lists one per stage.
    pub fn per_stage_degrees(&self) -> Option<&[usize]> {
        match &self.tensor_parallel_size {
            Some(TensorParallelSize::PerStage(degrees)) => Some(degrees),
            _ => None,
        }
    }

    /// The remote entries of `--devices`, comma-separated (empty when all are local).
    pub fn workers(&self) -> String {
        let entries = self.devices.iter().flatten().map(|e| e.trim());
        entries.filter(|e| WorkerAddress::is_worker(e)).collect::<Vec<_>>().join(", ")
    }
}

/// One `--devices` entry: a local backend by its `--device` name (`flex`, `wgpu`, `vulkan`,
/// `cuda`, `metal`), or a remote worker's device `ws://HOST:PORT[#INDEX]`, connected now with
/// `token` (see [`remote_device`]).
pub fn parse_device(entry: &str, token: Option<&str>) -> Result<Device, PipelineError> {
    let entry = entry.trim();
    let error = |reason: String| PipelineError::Device { entry: entry.to_string(), reason };
    if WorkerAddress::is_worker(entry) {
        return remote_device(entry, token).map_err(|e| error(e.to_string()));
    }
    if entry.starts_with("wss://") {
        return Err(error(
            "Burn's WebSocket transport has no TLS: use ws://HOST:PORT on a private network (see README, Remote workers)"
                .into(),
        ));
    }
    let choice = DeviceChoice::from_str(entry, true).map_err(|_| {
        let names: Vec<&str> = DeviceChoice::value_variants().iter().map(|d| d.name()).collect();
        error(format!("not a device: use one of {}", names.join(", ")))
    })?;
    choice.device().map_err(|e| error(e.to_string()))
}

/// The plain or paged engine over pipeline stages, as `spec` describes them (validated by the
/// caller): the plan is checked against the model's depth before any weight loads, then each
/// stage's weights load onto its device. With remote workers the engine runs behind a
/// [`WatchedEngine`].
pub(super) fn build_parallel_engine(
    spec: &EngineSpec,
    kind: EngineKind,
    dir: &std::path::Path,
    default: (&str, &Device),
    log: &mut dyn Write,
) -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
    let parallel = &spec.parallel;
    let files = PretrainedFiles::open(dir)?;
    let plan = if parallel.is_auto() {
        super::auto_stages::plan_auto(spec, dir, &files, default, log)?
    } else {
        parallel.plan(files.spec.num_layers, default, spec.worker_token.as_deref())?
    };
    // Every stage's degree must split the model's heads and MLP before anything is profiled or loaded.
    plan.check(&files.spec)?;
    let slicing = match kind {
        EngineKind::Paged => {
            let (slicing, line) = super::slicing::prefill_slicing(spec, dir, &files, &plan, log)?;
            if let Some(line) = line {
                writeln!(log, "{line}")?;
            }
            slicing
        }
        _ => None,
    };
    let workers = parallel.workers();
    if workers.is_empty() {
        let (engine, summary) = build_on_plan(spec, kind, files, &plan, slicing)?;
        writeln!(log, "{summary}")?;
        return Ok(engine);
    }
    let timeout = parallel.worker_timeout_s.unwrap_or(DEFAULT_WORKER_TIMEOUT_S);
    let spec = spec.clone();
    let engine = WatchedEngine::spawn(workers, Duration::from_secs_f64(timeout), move || {
        build_on_plan(&spec, kind, files, &plan, slicing).map(|(engine, _)| engine).map_err(|e| e.to_string())
    })?;
    writeln!(log, "{}", engine.placement().unwrap_or_default())?;
    Ok(Box::new(engine))
}

/// The plain or paged engine over `plan`'s stages, each stage's weights loaded onto its devices,
/// in the spec's precision, and the placement summary.
fn build_on_plan(
    spec: &EngineSpec,
    kind: EngineKind,
    files: PretrainedFiles,
    plan: &PipelinePlan,
    prefill_slicing: PrefillSlicingChoice,
) -> Result<(Box<dyn Engine>, String), Box<dyn std::error::Error>> {
    let model = PipelineLm::from_checkpoint(files.spec.clone(), &files.files, plan, spec.weight_quant()?)?;
    let (tokenizer, eos) = (Some(files.tokenizer), files.eos_token_ids);
    let summary = model.placement_summary().unwrap_or_default();
    let engine: Box<dyn Engine> = match kind {
        EngineKind::Paged => {
            let config = EngineConfig { prefill_slicing, ..spec.engine_config() };
            crate::engine::paged_engines(model, tokenizer, eos, config, spec.parallel.virtual_engines.unwrap_or(1))?
        }
        _ => Box::new(spec.plain_generator(Generator::new(model, tokenizer, eos))?),
    };
    Ok((spec.with_precision(engine), summary))
}
