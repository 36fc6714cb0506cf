//! `--stage-layers auto`: each `--devices` entry profiled for this model (cached per device,
//! model and dtype), the links between consecutive devices measured, and the stages planned by
//! Alpa's inter-operator pass over those costs under each device's memory cap (`--device-memory`)
//! before any weight of the pipeline loads. With `--tensor-parallel-size auto`, every group of
//! consecutive devices is a candidate stage too (its layer timed split over its devices), and the
//! stages and each one's degree are planned together ([`AutoGroups`]).
//!
//! Stages that slow each other down when they work at once (a worker on loopback beside the host
//! CPU, two workers on one host) are measured doing so before planning ([`interference_of`]), and
//! the planner splits for a pipelined pass at that interference. How much they interfere depends
//! on what each stage does (a stage of one layer on a worker mostly waits on its round trip; one
//! of half the model computes on a core the host shares), so the interference is measured again
//! on the split it chose, each device running its stage's layers ([`split_interference`]), and
//! the split planned again at that interference until it plans the split it was measured on
//! ([`AutoStages::plan_settled`]); without tensor-parallel groups.
//!
//! Profiles live in `--stage-profile-dir` (default `~/.cache/burn-llm/profiles`), one file per
//! (device, model, dtype, grid); see [`burn_parallel::profiler::device`]. Profiling and link
//! measurements on remote workers run on a thread of their own, watched: a worker that dies or
//! stalls while being profiled is an error naming it after `--worker-timeout-s`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use burn::tensor::Device;
use burn_llm_models::PretrainedFiles;
use burn_parallel::pipeline::slicing::in_stage_pool;
use burn_parallel::pipeline::threaded::stage_pool_threads;
use burn_parallel::pipeline::{
    AutoGroup, AutoGroups, AutoStageDevice, AutoStages, Handover, LinkProfile, PipelineError, PipelinePlan,
    StageWorkload,
};
use burn_parallel::profiler::{
    self, DeviceProfile, Interference, OverlapDevice, OverlapStep, ProfileGrid, ProfileIdentity, ProfileWeights,
};

use super::EngineSpec;
use super::parallel::{DEFAULT_WORKER_TIMEOUT_S, TensorParallelSize, parse_device};
use crate::device::{WorkerAddress, WorkerError};

/// The `--stage-layers` value that asks for planned stages.
pub const AUTO: &str = "auto";

/// Tokens of the larger hand-over when a link is measured.
const LINK_TOKENS: usize = 64;
/// Timed hand-overs per size.
const LINK_REPEATS: usize = 5;

/// A progress display for [`profile_stage_device`], which may run it on another thread.
pub type SendProgress = Box<dyn FnMut(profiler::ProfileProgress<'_>) + Send>;

/// Why automatic stages could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum AutoStagesError {
    /// A flag cannot be used.
    #[error("{flag}: {problem}; {fix}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// Splitting, connecting or planning failed.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Profiling a device failed.
    #[error("profiling `{entry}` failed: {source}")]
    Profile {
        /// The `--devices` entry.
        entry: String,
        /// What failed.
        source: profiler::ProfileError,
    },
    /// A worker died or stalled while being profiled.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The model could not be opened.
    #[error(transparent)]
    Model(#[from] burn_llm_models::ModelError),
    /// Timing engines over the devices failed (`--schedule exegpt`'s interference).
    #[error(transparent)]
    Schedule(#[from] crate::schedule::PlanError),
}

/// The devices' `--devices` entries and their memory caps.
struct Entries {
    names: Vec<String>,
    caps: Vec<u64>,
}

/// Plans the stages of the model at `dir` over the spec's devices (see the module docs),
/// printing the plan to `log` before returning it.
pub(super) fn plan_auto(
    spec: &EngineSpec,
    dir: &Path,
    files: &PretrainedFiles,
    default: (&str, &Device),
    log: &mut dyn Write,
) -> Result<PipelinePlan, AutoStagesError> {
    let entries = entries(spec, default.0)?;
    let token = spec.worker_token.as_deref();
    let devices = entries.names.iter().map(|e| parse_device(e, token)).collect::<Result<Vec<_>, _>>()?;
    let timeout = worker_timeout(spec);
    let mut stage_devices = Vec::with_capacity(devices.len());
    for (i, (name, device)) in entries.names.iter().zip(&devices).enumerate() {
        let profile = profile_stage_device(spec, dir, files, name, device, &ProfileGrid::stages(), None, None, log)?;
        let link_to_next = match devices.get(i + 1) {
            Some(next) => Some(measure(&entries.names[i..=i + 1], device, next, files.spec.hidden_size, timeout)?),
            None => None,
        };
        stage_devices.push(AutoStageDevice {
            name: name.clone(),
            profile: profile.profile,
            memory_bytes: entries.caps[i],
            link_to_next,
        });
    }
    // How much the devices slow each other down working at once, each on a decode step through
    // one device's share of the layers.
    let step = OverlapStep::decode_share(files.spec.num_layers, devices.len());
    let interference = interference_of(spec, dir, &entries.names, &devices, step, log)?.kappa;
    let shares = vec![step.layers; devices.len()];
    let auto = AutoStages {
        devices: stage_devices,
        workload: StageWorkload::default(),
        kv_tokens: files.spec.max_positions,
        handover: Handover::of(&files.spec),
        interference,
    };
    let plan = if spec.parallel.tensor_parallel_size == Some(TensorParallelSize::Auto) {
        let hidden = files.spec.hidden_size;
        let groups = candidate_groups(spec, (dir, hidden), &auto, &entries, &devices, log)?;
        let AutoStages { devices: singles, workload, kv_tokens, handover, interference } = auto;
        let auto = AutoGroups { devices: singles, groups, workload, kv_tokens, handover, interference };
        PipelinePlan::auto_groups(&auto, devices, entries.names)?
    } else {
        let prediction = auto.plan_settled(|layers| match layers == shares.as_slice() {
            true => Ok(interference),
            false => split_interference(spec, dir, &entries.names, &devices, layers, log).map(|i| i.kappa),
        })?;
        PipelinePlan::from_prediction(prediction, 1, devices, entries.names)?
    };
    if let Some(prediction) = plan.prediction() {
        let _ = writeln!(log, "{}", prediction.summary());
    }
    Ok(plan)
}

/// Every group of two or more consecutive devices as a candidate stage (Alpa's submeshes along
/// the pipeline): the checkpoint's first layer split over the group's devices and timed there
/// (prefill of the workload's prompt and a decode step, every rank synchronised), the group's
/// profile its rank 0's with those times and each device's share of a layer's bytes, and the
/// link from its first device to the device after it measured. A degree the model's layers
/// cannot be split by (heads, MLP width, architecture) is logged and skipped.
fn candidate_groups(
    spec: &EngineSpec,
    (dir, hidden): (&Path, usize),
    single: &AutoStages,
    entries: &Entries,
    devices: &[Device],
    log: &mut dyn Write,
) -> Result<Vec<AutoGroup>, AutoStagesError> {
    let quant = weight_quant(spec)?;
    let prompt = single.workload.prompt_tokens;
    let timeout = worker_timeout(spec);
    let mut groups = Vec::new();
    'degrees: for degree in 2..=devices.len() {
        for first in 0..=devices.len() - degree {
            let members = first..first + degree;
            let names = entries.names[members.clone()].join("+");
            let (dir, group_devices, entry) = (dir.to_owned(), devices[members].to_vec(), names.clone());
            let times = watched(&names.replace('+', " → "), "being profiled", timeout, move |_| {
                let files = PretrainedFiles::open(&dir)?;
                let weights = ProfileWeights::Checkpoint { source: &files.files, quant };
                let model = profiler::device::one_layer_model(&files.spec, weights, &group_devices[0])
                    .map_err(|source| AutoStagesError::Profile { entry, source })?;
                Ok(profiler::tensor_parallel_times(&model, &group_devices, prompt, 3))
            })?;
            let times = match times {
                Ok(times) => times,
                Err(profiler::ProfileError::Grid(reason)) => {
                    let _ = writeln!(log, "tensor-parallel degree {degree} skipped: {reason}");
                    continue 'degrees;
                }
                Err(source) => return Err(AutoStagesError::Profile { entry: names, source }),
            };
            let _ = writeln!(
                log,
                "tensor-parallel group {names}: a layer's prefill of {prompt} tokens {:.3} ms, decode step {:.3} ms",
                times.prefill_ms, times.decode_ms
            );
            let link_to_next = match devices.get(first + degree) {
                Some(next) => {
                    let pair = [entries.names[first].clone(), entries.names[first + degree].clone()];
                    Some(measure(&pair, &devices[first], next, hidden, timeout)?)
                }
                None => None,
            };
            let rank0 = &single.devices[first].profile;
            groups.push(AutoGroup {
                first_device: first,
                degree,
                profile: profiler::group_profile(rank0, degree, prompt, times),
                link_to_next,
            });
        }
    }
    Ok(groups)
}

/// The profile of the model at `dir` (opened as `files`) on `device`, the `--devices` entry
/// `entry`, as `spec` would run it, over `grid`: read from the profile cache when it was measured
/// for this device, model, dtype and grid, else measured now and cached. `threads` measures a
/// host-CPU device in a pool of that many threads (a stage's share when stages run concurrently;
/// `None`: every core). Each point is reported to `progress` as it starts (a progress display; a
/// test kills a worker from it). On a worker it runs watched: a worker that dies or stalls while
/// being profiled is an error naming it, and nothing is cached.
#[allow(clippy::too_many_arguments)] // the device, what runs on it, and how it is measured
pub fn profile_stage_device(
    spec: &EngineSpec,
    dir: &Path,
    files: &PretrainedFiles,
    entry: &str,
    device: &Device,
    grid: &ProfileGrid,
    threads: Option<usize>,
    progress: Option<SendProgress>,
    log: &mut dyn Write,
) -> Result<DeviceProfile, AutoStagesError> {
    let quant = weight_quant(spec)?;
    let dtype = format!(
        "f32 weights {}{}, {} matmul",
        weight_format(files),
        quant.map(|q| format!(" quantized to {q:?}")).unwrap_or_default(),
        if spec.exact_matmul { "exact" } else { "8-bit-activation" }
    );
    let identity =
        ProfileIdentity { device: device_identity(entry, threads), model: model_identity(dir, &files.spec), dtype };
    let (dir, device, cache, name) = (dir.to_owned(), device.clone(), profile_dir(spec), entry.to_string());
    let grid = grid.clone();
    let (profile, lines) = watched(entry, "being profiled", worker_timeout(spec), move |heartbeat| {
        let files = PretrainedFiles::open(&dir)?;
        let mut log = Vec::new();
        let weights = ProfileWeights::Checkpoint { source: &files.files, quant };
        let mut progress = progress;
        // Each point that starts is a sign of progress: the timeout bounds one point, not the
        // whole profile.
        let mut hook = move |p: profiler::ProfileProgress<'_>| {
            heartbeat.beat();
            if let Some(progress) = progress.as_mut() {
                progress(p);
            }
        };
        let profile = in_stage_pool(threads, || {
            profiler::device_profile(
                &files.spec,
                weights,
                &device,
                &identity,
                &grid,
                Some(&cache),
                Some(&mut hook),
                &mut log,
            )
        })
        .map_err(|source| AutoStagesError::Profile { entry: name, source })?;
        Ok((profile, log))
    })?;
    let _ = log.write_all(&lines);
    Ok(profile)
}

/// The interference of `devices` (named `names`) on the split `layers` (stage `s`'s layer count
/// on `devices[s]`): [`interference_of`] on a decode step, each device running its own stage's
/// layers.
pub fn split_interference(
    spec: &EngineSpec,
    dir: &Path,
    names: &[String],
    devices: &[Device],
    layers: &[usize],
    log: &mut dyn Write,
) -> Result<Interference, AutoStagesError> {
    let step = OverlapStep::decode(layers.iter().copied().max().unwrap_or(1));
    measure_interference(spec, dir, names, devices, step, Some(layers), log)
}

/// The interference `κ` of `devices` (named `names`, in pipeline order) on `step`
/// ([`profiler::pipeline_interference`]; [`OverlapStep::decode_share`]: a decode step through a
/// stage's share of the model's layers): each runs the checkpoint's first layers, loaded as the
/// profiler loads them (the run model's layers run again as often as the step needs), the last
/// device ending its step with the final norm and LM head as the last stage does (the stage times
/// `κ` multiplies hold the head), alone and then in a pipelined pass of micro-batches, host-CPU
/// devices in the rayon pool their stage gets ([`stage_pool_threads`]). One device: `κ = 0`,
/// nothing measured.
/// Logged in one line; watched when a worker is among the devices (one that dies or stalls is
/// an error naming it).
pub fn interference_of(
    spec: &EngineSpec,
    dir: &Path,
    names: &[String],
    devices: &[Device],
    step: OverlapStep,
    log: &mut dyn Write,
) -> Result<Interference, AutoStagesError> {
    measure_interference(spec, dir, names, devices, step, None, log)
}

/// [`interference_of`], device `d` running `layers[d]` layers per step where given.
fn measure_interference(
    spec: &EngineSpec,
    dir: &Path,
    names: &[String],
    devices: &[Device],
    step: OverlapStep,
    layers: Option<&[usize]>,
    log: &mut dyn Write,
) -> Result<Interference, AutoStagesError> {
    if devices.len() < 2 {
        return Ok(Interference::none());
    }
    let quant = weight_quant(spec)?;
    let threads = stage_pool_threads(devices, None)?;
    let joined = names.join(" → ");
    let (dir, devices, entry) = (dir.to_owned(), devices.to_vec(), joined.clone());
    let own: Vec<Option<usize>> = (0..devices.len()).map(|d| layers.and_then(|l| l.get(d).copied())).collect();
    let measured = watched(&joined, "timed with the other stages", worker_timeout(spec), move |heartbeat| {
        let files = PretrainedFiles::open(&dir)?;
        let models = run_models(&files, quant, &devices, &entry, &heartbeat)?;
        let last = models.len() - 1;
        let runs: Vec<OverlapDevice<'_>> = models
            .iter()
            .zip(&threads)
            .zip(&own)
            .enumerate()
            .map(|(d, ((model, &threads), &layers))| OverlapDevice { model, threads, layers, head: d == last })
            .collect();
        profiler::pipeline_interference(&runs, step).map_err(|source| AutoStagesError::Profile { entry, source })
    })?;
    let _ = writeln!(log, "{}", measured.summary(names));
    Ok(measured)
}

/// The profiler's run model of `files` on each of `devices` (the checkpoint's first
/// [`profiler::run_layers`] layers, loaded as the profiler loads them), a beat of `heartbeat`
/// after each; a device that fails is an error naming `entry`.
pub(super) fn run_models(
    files: &PretrainedFiles,
    quant: Option<burn_llm_models::QuantSpec>,
    devices: &[Device],
    entry: &str,
    heartbeat: &Heartbeat,
) -> Result<Vec<burn_llm_models::CausalLm>, AutoStagesError> {
    let layers = profiler::run_layers(files.spec.num_layers);
    let mut models = Vec::with_capacity(devices.len());
    for device in devices {
        let weights = ProfileWeights::Checkpoint { source: &files.files, quant };
        let model = profiler::device::first_layers_model(&files.spec, weights, device, layers)
            .map_err(|source| AutoStagesError::Profile { entry: entry.to_string(), source })?;
        models.push(model);
        heartbeat.beat();
    }
    Ok(models)
}

/// The model as a profile's identity names it: its path and every shape that changes a layer's
/// cost (readable in the start-up log, unlike the whole spec).
fn model_identity(dir: &Path, spec: &burn_llm_models::DecoderSpec) -> String {
    format!(
        "{} ({:?}: {} layers, hidden {}, {} heads / {} KV heads of {}, FFN {}{}, vocab {}, context {})",
        dir.display(),
        spec.arch,
        spec.num_layers,
        spec.hidden_size,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        spec.intermediate_size,
        if spec.gated_mlp { " gated" } else { "" },
        spec.vocab_size,
        spec.max_positions,
    )
}

fn weight_quant(spec: &EngineSpec) -> Result<Option<burn_llm_models::QuantSpec>, AutoStagesError> {
    spec.weight_quant().map_err(|problem| AutoStagesError::Flag {
        flag: "--quantize",
        problem,
        fix: "give a valid --group-size".into(),
    })
}

pub(super) fn worker_timeout(spec: &EngineSpec) -> Duration {
    Duration::from_secs_f64(spec.parallel.worker_timeout_s.unwrap_or(DEFAULT_WORKER_TIMEOUT_S))
}

/// The link from `pair[0]`'s device to `pair[1]`'s, measured (watched when either is a worker).
pub(super) fn measure(
    pair: &[String],
    from: &Device,
    to: &Device,
    hidden: usize,
    timeout: Duration,
) -> Result<LinkProfile, AutoStagesError> {
    let names = pair.join(" → ");
    let (from, to, entry) = (from.clone(), to.clone(), names.clone());
    watched(&names, "its link was measured", timeout, move |_| {
        profiler::measure_link(&from, &to, hidden, LINK_TOKENS, LINK_REPEATS)
            .map_err(|source| AutoStagesError::Profile { entry, source })
    })
}

/// `--devices` (or the default device once per stage) and each one's memory cap.
fn entries(spec: &EngineSpec, default: &str) -> Result<Entries, AutoStagesError> {
    let parallel = &spec.parallel;
    if parallel
        .tensor_parallel_size
        .as_ref()
        .is_some_and(|t| *t != TensorParallelSize::Auto && *t != TensorParallelSize::Fixed(1))
    {
        return Err(AutoStagesError::Flag {
            flag: "--stage-layers auto",
            problem: "chooses the tensor-parallel degrees itself, and --tensor-parallel-size fixes them".into(),
            fix: "use --tensor-parallel-size auto or drop it, or give the stages by hand with --stage-layers".into(),
        });
    }
    let names: Vec<String> = match (&parallel.devices, parallel.pipeline_parallel_size) {
        (Some(devices), size) => {
            if let Some(size) = size.filter(|&s| s != devices.len()) {
                return Err(AutoStagesError::Flag {
                    flag: "--pipeline-parallel-size",
                    problem: format!(
                        "is {size} but --stage-layers auto runs one stage on each of the {} --devices",
                        devices.len()
                    ),
                    fix: "drop --pipeline-parallel-size, or list one device per stage".into(),
                });
            }
            devices.iter().map(|d| d.trim().to_string()).collect()
        }
        (None, size) => vec![default.to_string(); size.unwrap_or(1)],
    };
    let caps = match &parallel.device_memory {
        Some(caps) if caps.len() != names.len() => {
            return Err(AutoStagesError::Flag {
                flag: "--device-memory",
                problem: format!("gives {} sizes for {} devices", caps.len(), names.len()),
                fix: "give one size per --devices entry, in the same order (e.g. 4GiB,512MiB)".into(),
            });
        }
        Some(caps) => caps.clone(),
        None => names.iter().map(|n| default_memory(n)).collect(),
    };
    Ok(Entries { names, caps })
}

/// A device's memory when `--device-memory` does not give it: the host's available memory for
/// the CPU (`flex`), else unbounded (the device does not report its memory to Burn).
pub fn default_memory(entry: &str) -> u64 {
    if entry == "flex" { available_host_memory().unwrap_or(u64::MAX) } else { u64::MAX }
}

/// `MemAvailable` of `/proc/meminfo`, where there is one.
fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What tells two devices of one `--devices` spelling apart: a local CPU's thread count and
/// model (a cache directory may outlive the machine it was measured on; a worker's address is
/// its identity: restart a worker with other `--threads` on another port, or delete its profile).
fn device_identity(entry: &str, threads: Option<usize>) -> String {
    if WorkerAddress::is_worker(entry) {
        return entry.to_string();
    }
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    match host_cpu_model() {
        Some(cpu) => format!("{entry} ({threads} threads, {cpu})"),
        None => format!("{entry} ({threads} threads)"),
    }
}

/// The first `model name` of `/proc/cpuinfo`, where there is one.
fn host_cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// How the checkpoint stores its weights.
fn weight_format(files: &PretrainedFiles) -> &'static str {
    match files.files {
        burn_llm_models::ModelFiles::Gguf(_) => "as GGUF blocks",
        burn_llm_models::ModelFiles::Safetensors(_) => "as safetensors",
    }
}

/// `--stage-profile-dir`, else `~/.cache/burn-llm/profiles`.
fn profile_dir(spec: &EngineSpec) -> PathBuf {
    spec.parallel.stage_profile_dir.clone().unwrap_or_else(|| super::build::dirs_cache().join("profiles"))
}

/// Runs `work` on a thread of its own when `name` involves a worker, waiting at most `timeout`
/// for each sign of progress: the result, or a beat of the [`Heartbeat`] `work` is given (a
/// profile beats as each point starts, so a long profile of a slow worker is not taken for a
/// stall). A worker that dies or stalls is an error naming it, never a panic or a hang.
pub(super) fn watched<R: Send + 'static>(
    name: &str,
    what: &'static str,
    timeout: Duration,
    work: impl FnOnce(Heartbeat) -> Result<R, AutoStagesError> + Send + 'static,
) -> Result<R, AutoStagesError> {
    let workers: Vec<&str> = name.split(" → ").filter(|e| WorkerAddress::is_worker(e)).collect();
    if workers.is_empty() {
        return work(Heartbeat(None));
    }
    let workers = workers.join(", ");
    let (tx, rx) = mpsc::channel();
    let beats = tx.clone();
    let heartbeat = Heartbeat(Some(Box::new(move || {
        let _ = beats.send(Watch::Alive);
    })));
    std::thread::Builder::new()
        .name("burn-llm-profile".into())
        .spawn(move || {
            let _ = tx.send(Watch::Done(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(heartbeat)))));
        })
        .map_err(|e| WorkerError::Failed { workers: workers.clone(), what, reason: e.to_string() })?;
    loop {
        match rx.recv_timeout(timeout) {
            Ok(Watch::Alive) => continue,
            Ok(Watch::Done(Ok(Ok(r)))) => return Ok(r),
            Ok(Watch::Done(Ok(Err(e)))) => {
                return Err(WorkerError::Failed { workers, what, reason: e.to_string() }.into());
            }
            Ok(Watch::Done(Err(panic))) => {
                let reason = crate::device::panic_message(panic);
                return Err(WorkerError::Failed { workers, what, reason }.into());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(WorkerError::Stalled { workers, what, timeout_s: timeout.as_secs_f64() }.into());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let reason = "the profiling thread ended".into();
                return Err(WorkerError::Failed { workers, what, reason }.into());
            }
        }
    }
}

/// What the thread of [`watched`] sends: a sign of progress, or the result.
enum Watch<R> {
    Alive,
    Done(std::thread::Result<Result<R, AutoStagesError>>),
}

/// A sign of progress for [`watched`]'s wait (a no-op when nothing watches).
pub(super) struct Heartbeat(Option<Box<dyn Fn() + Send>>);

impl Heartbeat {
    fn beat(&self) {
        if let Some(beat) = &self.0 {
            beat();
        }
    }
}
