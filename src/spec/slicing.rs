//! `--prefill-slices`: how the paged engine cuts a pipelined prefill into token slices
//! (TeraPipe). `uniform:N` needs nothing measured; `auto` runs TeraPipe's planner
//! ([`PlannedSlices`]) over each stage device's profile, read from the same cached per-device
//! profiler as `--stage-layers auto` ([`profile_stage_device`], over [`slicing_grid`], a host-CPU
//! stage measured with the threads it gets when stages run concurrently), over the links
//! between consecutive stages, measured (watched when a worker is at either end), and at the stage
//! devices' interference on a prefill step ([`interference_of`] over [`PREFILL_KAPPA_TOKENS`]
//! tokens), measured at every start like `--stage-layers auto`'s: devices that slow each other
//! while the slices overlap (workers sharing the host's cores) make slicing pay less, and the
//! planner and its prediction price that.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use burn_llm_models::{PretrainedFiles, UniformSlices};
use burn_parallel::pipeline::slicing::{slicing_grid, stage_costs};
use burn_parallel::pipeline::{PipelinePlan, PlannedSlices};

use super::EngineSpec;
use burn_parallel::profiler::OverlapStep;

use super::auto_stages::{AutoStagesError, interference_of, measure, profile_stage_device, worker_timeout};
use super::parallel::{PrefillSlices, PrefillSlicingChoice};

/// Tokens of the prefill step the stage devices' interference is measured on: a typical slice of
/// a long prompt (fewer when the model's positions are fewer).
pub const PREFILL_KAPPA_TOKENS: usize = 256;

/// The stages' costs for TeraPipe's planner: each stage device's cached profile, the measured
/// link into each stage after the first, and the devices' measured interference (logged).
pub fn planned_slices(
    spec: &EngineSpec,
    dir: &Path,
    files: &PretrainedFiles,
    plan: &PipelinePlan,
    log: &mut dyn Write,
) -> Result<PlannedSlices, Box<dyn std::error::Error>> {
    let (grid, hidden, timeout) = (slicing_grid(), files.spec.hidden_size, worker_timeout(spec));
    let rank0 = |stage: usize| plan.stage_device_names(stage)[0].clone();
    let profile = |stage: usize, device: &burn::tensor::Device, threads: Option<usize>| {
        profile_stage_device(spec, dir, files, &rank0(stage), device, &grid, threads, None, &mut *log)
            .map(|p| p.profile)
    };
    let link = |stage: usize, from: &burn::tensor::Device, to: &burn::tensor::Device| {
        measure(&[rank0(stage - 1), rank0(stage)], from, to, hidden, timeout)
    };
    let costs = stage_costs::<AutoStagesError>(plan, None, hidden * 4, profile, link)?;
    let stages = plan.layout().stages().len();
    let names: Vec<String> = (0..stages).map(rank0).collect();
    let devices: Vec<burn::tensor::Device> = (0..stages).map(|s| plan.stage_devices(s)[0].clone()).collect();
    let step = OverlapStep::prefill(PREFILL_KAPPA_TOKENS.min(files.spec.max_positions));
    let kappa = interference_of(spec, dir, &names, &devices, step, log)?.kappa;
    Ok(PlannedSlices::new(costs)?.with_interference(kappa)?)
}

/// The paged engine's prefill slicing for the model at `dir` split as `plan`, and a line for the
/// start-up log describing it (`None` when prefills run in one pass).
pub fn prefill_slicing(
    spec: &EngineSpec,
    dir: &Path,
    files: &PretrainedFiles,
    plan: &PipelinePlan,
    log: &mut dyn Write,
) -> Result<(PrefillSlicingChoice, Option<String>), Box<dyn std::error::Error>> {
    Ok(match spec.parallel.prefill_slices {
        None | Some(PrefillSlices::Off) => (None, None),
        Some(PrefillSlices::Uniform(n)) => {
            let uniform = UniformSlices::new(n).ok_or("--prefill-slices uniform:N needs N ≥ 1")?;
            (Some(Arc::new(uniform)), Some(format!("prefill slices: uniform:{n}")))
        }
        Some(PrefillSlices::Auto) => {
            let planner = planned_slices(spec, dir, files, plan, log)?;
            let len = files.spec.max_positions.min(2048);
            let planned = planner.plan(len, 0);
            let line = format!(
                "prefill slices: auto (TeraPipe planner over the stages' measured profiles and links at interference κ = {:.2}; a {len}-token prompt: {} slices, predicted first token after {:.0} ms, one pass {:.0} ms)",
                planner.interference(),
                planned.slices.len(),
                planned.latency_ms,
                planner.predicted_ms(&[len], 0),
            );
            (Some(Arc::new(planner)), Some(line))
        }
    })
}
