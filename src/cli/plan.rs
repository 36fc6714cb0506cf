//! The `plan` command line: `plan <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]`. [`run`] returns the JSON to print and the exit code,
//! so the example binary stays a two-liner and tests can run the CLI in-process.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::placement::{self, Baseline, PlacementInput};
use super::schedule::{self, ScheduleInput};
use super::slices::{self, SlicesInput};
use super::stages::{self, StagesInput};

/// Exit code of every failure: bad arguments, bad input, infeasible problems.
pub const EXIT_ERROR: i32 = 2;

/// Arguments of `plan`.
#[derive(Debug, Parser)]
#[command(
    name = "plan",
    about = "Plan stages, token slices, placements or schedules from measured costs; prints one JSON object"
)]
struct Args {
    /// Which planner to run.
    planner: Planner,
    /// The planner's JSON input.
    #[arg(long)]
    input: PathBuf,
    /// `schedule`: search every configuration instead of branch-and-bound.
    #[arg(long)]
    exhaustive: bool,
    /// `placement`: restrict to a baseline placement.
    #[arg(long, value_enum)]
    baseline: Option<Baseline>,
}

/// The planners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Planner {
    /// Alpa/AlpaServe stage partitioning.
    Stages,
    /// TeraPipe token slicing (with `"batch"`: the batch extension).
    Slices,
    /// AlpaServe placement.
    Placement,
    /// ExeGPT scheduling.
    Schedule,
}

/// Runs `plan` with `args` (the first is the program name); returns the JSON text to print and
/// the exit code (0, or [`EXIT_ERROR`] with `{"error": "…"}`). `--help` returns the help text
/// and 0.
pub fn run<I, T>(args: I) -> (String, i32)
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match parse_args::<Args, _, _>(args) {
        Ok(a) => a,
        Err(done) => return done,
    };
    match dispatch(&args) {
        Ok(json) => (json, 0),
        Err(message) => error(message),
    }
}

/// Parses command-line `args` into `A`; `Err` holds what to print and the exit code instead (the
/// help text and 0, or a JSON error and [`EXIT_ERROR`]).
pub(crate) fn parse_args<A, I, T>(args: I) -> Result<A, (String, i32)>
where
    A: Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    A::try_parse_from(args).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => (e.to_string(), 0),
        _ => error(e.to_string()),
    })
}

/// `{"error": message}` and [`EXIT_ERROR`].
pub(crate) fn error(message: String) -> (String, i32) {
    let message = message.trim().to_string();
    (serde_json::json!({ "error": message }).to_string(), EXIT_ERROR)
}

fn dispatch(args: &Args) -> Result<String, String> {
    if args.exhaustive && args.planner != Planner::Schedule {
        return Err("--exhaustive only applies to `schedule`".into());
    }
    if args.baseline.is_some() && args.planner != Planner::Placement {
        return Err("--baseline only applies to `placement`".into());
    }
    let text =
        std::fs::read_to_string(&args.input).map_err(|e| format!("cannot read {}: {e}", args.input.display()))?;
    match args.planner {
        Planner::Stages => to_json(stages::plan(&parse::<StagesInput>(&text)?)),
        Planner::Slices => {
            let input = parse::<SlicesInput>(&text)?;
            if input.batch.is_some() { to_json(slices::plan_batch(&input)) } else { to_json(slices::plan(&input)) }
        }
        Planner::Placement => {
            let mut input = parse::<PlacementInput>(&text)?;
            if args.baseline.is_some() {
                input.baseline = args.baseline;
            }
            to_json(placement::plan(&input))
        }
        Planner::Schedule => {
            let mut input = parse::<ScheduleInput>(&text)?;
            input.exhaustive |= args.exhaustive;
            to_json(schedule::plan(&input))
        }
    }
}

fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid input: {e}"))
}

fn to_json<T: Serialize, E: std::fmt::Display>(result: Result<T, E>) -> Result<String, String> {
    let value = result.map_err(|e| e.to_string())?;
    serde_json::to_string(&value).map_err(|e| format!("cannot write the output: {e}"))
}
