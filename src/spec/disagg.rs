//! `--schedule exegpt` over two `--devices` (local devices or `ws://` workers): the ExeGPT
//! planner chooses between its strategies for two devices and that choice runs. WAA prefills on
//! the first device and decodes on the second ([`DisaggEngine`], each device a full model replica
//! with its own KV pool, a request's blocks moved after its prefill); RRA runs the phased schedule
//! over a two-stage pipeline (an even layer split, or `--stage-layers`: a list, or `auto` for Alpa's
//! stage planner over the ExeGPT profile, [`schedule::rra_stage_layers`], whose split the planner
//! then prices), on one virtual engine per decoder micro-batch
//! ([`schedule::pipelined_engines`]). The plan prices the two devices working at once with their
//! measured interference: RRA's at two virtual engines decoding over the two-stage pipeline against
//! one ([`schedule::engine_interference`]; the pipeline is then kept for an RRA plan), WAA's at the
//! first device prefilling a mean prompt beside the second decoding a batch
//! ([`schedule::waa_interference`]).

use std::error::Error;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use burn::tensor::Device;
use burn_llm_models::PretrainedFiles;
use burn_paged::DisaggEngine;
use burn_parallel::pipeline::threaded::stage_pool_threads;
use burn_parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use burn_parallel::profiler::SideBySide;
use burn_plan::profile::Profile;
use burn_plan::schedule::{ScheduleOutput, Strategy};

use super::auto_stages::{AutoStagesError, run_models, watched, worker_timeout};
use super::build::refused;
use super::parallel::{DEFAULT_WORKER_TIMEOUT_S, PrefillSlices, TensorParallelSize, parse_device};
use super::{EngineSpec, Purpose, ScheduleKind};
use crate::device::WatchedEngine;
use crate::engine::{Engine, paged_engines};
use crate::schedule::{self, EngineInterference};

/// Devices an ExeGPT plan over several devices runs on.
const DEVICES: usize = 2;

impl EngineSpec {
    /// Whether the spec asks for ExeGPT's schedule over two devices: `--schedule exegpt` with two
    /// `--devices` entries and no other parallelism flag (`--pipeline-parallel-size 2` and
    /// `--stage-layers`, the split RRA's pipeline runs, allowed).
    pub fn exegpt_over_two_devices(&self) -> bool {
        let p = &self.parallel;
        self.paged.schedule == Some(ScheduleKind::Exegpt)
            && p.devices.as_ref().is_some_and(|d| d.len() == DEVICES)
            && p.pipeline_parallel_size.is_none_or(|n| n == DEVICES)
            && p.tensor_parallel_size.as_ref().is_none_or(|t| *t == TensorParallelSize::Fixed(1))
            && p.micro_batches.is_none()
            && p.prefill_slices.is_none_or(|s| s == PrefillSlices::Off)
    }
}

/// Plans (or reads) the ExeGPT schedule for two devices and builds the engine that runs it; with
/// remote workers, behind a [`WatchedEngine`].
pub(super) fn build(
    spec: &EngineSpec,
    model: &Path,
    purpose: Purpose<'_>,
    log: &mut dyn Write,
) -> Result<Box<dyn Engine>, Box<dyn Error>> {
    let entries = spec.parallel.devices.clone().unwrap_or_default();
    let token = spec.worker_token.as_deref();
    let devices = entries.iter().map(|e| parse_device(e, token)).collect::<Result<Vec<Device>, _>>()?;
    let p = &spec.paged;
    let (plan, pipeline) = match (&p.plan, p.latency_bound_s, purpose) {
        (Some(path), _, _) => (schedule::read_plan(path)?, None),
        (None, Some(bound), Purpose::Generate { prompts, params }) => {
            // The workload and the costs are the prefill device's (both devices run one model).
            let first = PretrainedFiles::open(model)?.load(&devices[0])?;
            let config = spec.engine_config();
            let workload = schedule::ScheduleWorkload::new(&first, &config, prompts, params.max_new_tokens)?;
            let profile =
                schedule::load_or_profile(p.profile_json.as_deref(), &first.model, workload.max_num_seqs, log)?;
            // Both devices work at once (pipeline stages, or WAA's prefill beside its decode):
            // how much they slow each other down is measured on the engines RRA would run, two
            // virtual engines over the two-stage pipeline, which is kept for RRA.
            drop(first);
            let text = spec.parallel.stage_layers.as_deref();
            let (batch, context) = (workload.max_num_seqs, workload.mean_context());
            let layers = schedule::rra_stage_layers(&profile, DEVICES, text, batch, context)?;
            let files = Arc::new(PretrainedFiles::open(model)?);
            let lm = Arc::new(load_pipeline(spec, &files, &devices, &layers)?);
            // An RRA plan's engines, one per stage, hold up to their share of `max_num_seqs`.
            let seats = batch.div_ceil(DEVICES);
            let interference = engines_interference(spec, &entries, Arc::clone(&lm), profile.clone(), &layers, seats)?;
            writeln!(log, "{}", interference.summary())?;
            // WAA's prefill beside its decode slows each other otherwise: timed on the workload's
            // own steps, the κ WAA's plans are priced at.
            let waa = waa_pair_interference(spec, files, &entries, &devices, &workload)?;
            writeln!(log, "{}", waa.summary([entries[0].as_str(), entries[1].as_str()]))?;
            let interference = interference.priced(Some(waa.kappa));
            let plan = schedule::plan_for(profile, &workload, bound, DEVICES, interference, Some(&layers), None)?;
            (plan, Some(lm))
        }
        // `validate` refuses the other combinations.
        _ => return Err(Box::new(spec.validate(super::EngineKind::Paged, purpose).err().unwrap_or_else(refused))),
    };
    writeln!(log, "{}", schedule::describe(&plan))?;
    let workers = spec.parallel.workers();
    if workers.is_empty() {
        return build_on_plan(spec, model, devices, &plan, pipeline);
    }
    let timeout = spec.parallel.worker_timeout_s.unwrap_or(DEFAULT_WORKER_TIMEOUT_S);
    let (spec, model) = (spec.clone(), model.to_path_buf());
    let engine = WatchedEngine::spawn(workers, Duration::from_secs_f64(timeout), move || {
        build_on_plan(&spec, &model, devices, &plan, pipeline).map_err(|e| e.to_string())
    })?;
    Ok(Box::new(engine))
}

/// The model of `files` in two stages of `layers` layers each over `devices`.
fn load_pipeline(
    spec: &EngineSpec,
    files: &PretrainedFiles,
    devices: &[Device],
    layers: &[usize],
) -> Result<PipelineLm, Box<dyn Error>> {
    let stages = PipelinePlan::new(StageLayout::from_counts(layers)?, 1, devices.to_vec())?
        .with_names(spec.parallel.devices.clone().unwrap_or_default());
    Ok(PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &stages, spec.weight_quant()?)?)
}

/// The layers of each stage a saved RRA `plan` runs on a model of `layers` layers: the plan's own
/// split where it priced one (then `--stage-layers`, if given, must agree), otherwise
/// `--stage-layers` or an even split.
fn saved_plan_layers(spec: &EngineSpec, layers: usize, plan: &ScheduleOutput) -> Result<Vec<usize>, Box<dyn Error>> {
    let given = match spec.parallel.stage_layers.as_deref() {
        Some(text) if text.trim() == "auto" => {
            return Err("--stage-layers auto plans the split with the schedule: give --latency-bound-s instead of \
                        --plan, or the split the plan was made for"
                .into());
        }
        Some(text) => Some(StageLayout::parse(text, layers)?),
        None => None,
    };
    match (&plan.stage_layers, given) {
        (Some(planned), Some(given)) if *planned != given.counts() => Err(format!(
            "the plan was priced on stages of {planned:?} layers and --stage-layers gives {:?}: drop --stage-layers \
             or plan again for that split",
            given.counts()
        )
        .into()),
        (Some(planned), _) => Ok(planned.clone()),
        (None, Some(given)) => Ok(given.counts()),
        (None, None) => Ok(StageLayout::even(layers, DEVICES)?.counts()),
    }
}

/// [`schedule::engine_interference`] over `pipeline`, whose stages are on the devices of
/// `entries`: with a worker among them, watched, so that a worker that dies or stalls is an error
/// naming it.
fn engines_interference(
    spec: &EngineSpec,
    entries: &[String],
    pipeline: Arc<PipelineLm>,
    profile: Profile,
    layers: &[usize],
    seats: usize,
) -> Result<EngineInterference, Box<dyn Error>> {
    let name = entries.join(" → ");
    let what = "timed as two engines over the pipeline";
    let layers = layers.to_vec();
    Ok(watched(&name, what, worker_timeout(spec), move |_| {
        Ok(schedule::engine_interference(&pipeline, &layers, &profile, seats)?)
    })?)
}

/// [`schedule::waa_interference`] on `devices` (`entries`, the prefill device first), each
/// running the checkpoint's first layers as the profiler loads them (again from the first through
/// the model's layers, [`run_models`]): with a worker among them, watched, so that a worker that
/// dies or stalls is an error naming it.
fn waa_pair_interference(
    spec: &EngineSpec,
    files: Arc<PretrainedFiles>,
    entries: &[String],
    devices: &[Device],
    workload: &schedule::ScheduleWorkload,
) -> Result<SideBySide, Box<dyn Error>> {
    let quant = spec.weight_quant()?;
    let threads = stage_pool_threads(devices, None)?;
    let (devices, workload) = (devices.to_vec(), workload.clone());
    let name = entries.join(" → ");
    let name_of_pair = name.clone();
    let what = "timed as WAA's prefill beside its decode";
    Ok(watched(&name, what, worker_timeout(spec), move |heartbeat| {
        let models = run_models(&files, quant, &devices, &name_of_pair, &heartbeat)?;
        let [prefill, decode] = models.as_slice() else {
            return Err(AutoStagesError::Flag {
                flag: "--devices",
                problem: format!("WAA runs on 2 devices, not {}", models.len()),
                fix: "give two --devices entries".into(),
            });
        };
        let threads = [threads.first().copied().flatten(), threads.get(1).copied().flatten()];
        Ok(schedule::waa_interference(&workload, [prefill, decode], threads, files.spec.num_layers)?)
    })?)
}

/// The engine of `plan` on `devices`: WAA's prefill and decode engines, or RRA's pipeline
/// (`pipeline` when already loaded).
fn build_on_plan(
    spec: &EngineSpec,
    model: &Path,
    devices: Vec<Device>,
    plan: &ScheduleOutput,
    pipeline: Option<Arc<PipelineLm>>,
) -> Result<Box<dyn Engine>, Box<dyn Error>> {
    let engine: Box<dyn Engine> = if plan.strategy == Strategy::Rra {
        let files = PretrainedFiles::open(model)?;
        let (config, engines) = schedule::pipelined_engines(plan, DEVICES, spec.engine_config())?;
        let lm = match pipeline {
            Some(lm) => lm,
            None => {
                let layers = saved_plan_layers(spec, files.spec.num_layers, plan)?;
                Arc::new(load_pipeline(spec, &files, &devices, &layers)?)
            }
        };
        paged_engines(lm, Some(files.tokenizer), files.eos_token_ids, config, engines)?
    } else {
        let config = schedule::waa_config(plan, spec.engine_config())?;
        let load = |device: &Device| -> Result<_, Box<dyn Error>> {
            let mut replica = PretrainedFiles::open(model)?.load(device)?;
            if let Some(q) = spec.weight_quant()? {
                replica.model = replica.model.quantize_weights(q)?;
            }
            Ok(replica)
        };
        Box::new(DisaggEngine::new(load(&devices[0])?, load(&devices[1])?, config)?)
    };
    Ok(spec.with_precision(engine))
}
