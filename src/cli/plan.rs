//! The `plan` command line: `plan <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]` runs one planner of `burn-plan` on a JSON file, and
//! `plan profile --model DIR_OR_GGUF|--synthetic NAME --device NAME --out FILE.json
//! [--grid small|full] [--quiet] [--no-engine-step]` measures the profile the planners read
//! (`burn_parallel::profiler::cli`), with the paged engine's measured steps
//! ([`crate::schedule::time_engine_steps`]). Each prints one JSON object: [`run`] and
//! [`run_from`] return it with the exit code (0, or [`EXIT_ERROR`] with `{"error": "…"}`), so that
//! binaries stay thin and tests can run the command in-process.

use std::ffi::OsString;
use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm_models::{CausalLm, DecoderSpec};
use burn_parallel::profiler::{self, EngineStepGrid};
use burn_plan::json::{self, Overrides, Planner};
use burn_plan::placement::Baseline;
use clap::{Parser, ValueEnum};

use crate::DeviceChoice;

pub use burn_plan::json::EXIT_ERROR;

/// Arguments of `plan` with a planner (`plan profile` is [`run_from`]'s).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "plan",
    about = "Plan stages, token slices, placements or schedules from measured costs; prints one JSON object"
)]
pub struct PlanArgs {
    /// Which planner to run.
    pub planner: PlannerName,
    /// The planner's JSON input.
    #[arg(long)]
    pub input: PathBuf,
    /// `schedule`: search every configuration instead of branch-and-bound.
    #[arg(long)]
    pub exhaustive: bool,
    /// `placement`: restrict to a baseline placement.
    #[arg(long, value_enum)]
    pub baseline: Option<Baseline>,
}

/// The planners, by their command-line names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlannerName {
    /// Alpa/AlpaServe stage partitioning.
    Stages,
    /// TeraPipe token slicing (with `"batch"`: the batch extension).
    Slices,
    /// AlpaServe placement.
    Placement,
    /// ExeGPT scheduling.
    Schedule,
}

impl From<PlannerName> for Planner {
    fn from(name: PlannerName) -> Self {
        match name {
            PlannerName::Stages => Planner::Stages,
            PlannerName::Slices => Planner::Slices,
            PlannerName::Placement => Planner::Placement,
            PlannerName::Schedule => Planner::Schedule,
        }
    }
}

/// Runs the planner `args` names on its input file; returns the JSON text to print and the exit
/// code (0, or [`EXIT_ERROR`] with `{"error": "…"}`).
pub fn run(args: &PlanArgs) -> (String, i32) {
    let overrides = Overrides { exhaustive: args.exhaustive, baseline: args.baseline };
    let planned = std::fs::read_to_string(&args.input)
        .map_err(|e| format!("cannot read {}: {e}", args.input.display()))
        .and_then(|text| json::run(args.planner.into(), &text, overrides));
    match planned {
        Ok(out) => (out, 0),
        Err(message) => (json::error_json(&message), EXIT_ERROR),
    }
}

/// Runs `plan` with command-line `args` (the first is the program name): `profile` measures a
/// profile on a device of this build (the whole model through the paged engine too, unless
/// `--no-engine-step`), anything else is a planner's [`PlanArgs`]. `--help` returns the help text
/// and 0; bad arguments a JSON error and [`EXIT_ERROR`].
pub fn run_from<I, T>(args: I) -> (String, i32)
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if args.get(1).is_some_and(|a| a == "profile") {
        return profile(args);
    }
    match json::parse_args::<PlanArgs, _, _>(args) {
        Ok(parsed) => run(&parsed),
        Err(done) => done,
    }
}

/// `plan profile`: the profiler's command line, with devices named as `--devices` names them and
/// the paged engine's steps timed over the model with random weights; a progress bar on stderr
/// (hidden off a terminal).
fn profile(args: Vec<OsString>) -> (String, i32) {
    let device = |name: &str| {
        let choice = DeviceChoice::from_str(name, true)
            .map_err(|_| format!("unknown device `{name}`: use flex, wgpu, vulkan, cuda or metal"))?;
        choice.device().map_err(|e| e.to_string())
    };
    let engine: profiler::cli::EngineTimer<'_> =
        Box::new(|spec: &DecoderSpec, device: &Device, grid: &EngineStepGrid| {
            let model = CausalLm::random(spec.clone(), device).map_err(|e| e.to_string())?;
            crate::schedule::time_engine_steps(&model, grid).map_err(|e| e.to_string())
        });
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points · {msg}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    let mut progress = |p: profiler::ProfileProgress<'_>| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        match p.point {
            Some(point) => bar.set_message(point.to_string()),
            None => bar.finish_and_clear(),
        }
    };
    profiler::cli::run_with_engine(args, device, Some(engine), Some(&mut progress))
}
