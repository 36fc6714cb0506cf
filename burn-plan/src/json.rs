//! The planners over JSON text: what a command line runs once it has read its input file. Each
//! planner's input is parsed (`deny_unknown_fields`, so a typo is an error naming it), planned,
//! and the output written back as JSON; every failure is one message, which [`error_json`] turns
//! into the `{"error": …}` object a command line prints with exit code [`EXIT_ERROR`].

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::placement::{self, Baseline, PlacementInput};
use crate::schedule::{self, ScheduleInput};
use crate::slices::{self, SlicesInput};
use crate::stages::{self, StagesInput};

/// Exit code of every failure of a planner command line: bad arguments, bad input, infeasible
/// problems.
pub const EXIT_ERROR: i32 = 2;

/// The planners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planner {
    /// Alpa/AlpaServe stage partitioning ([`stages::plan`]).
    Stages,
    /// TeraPipe token slicing ([`slices::plan`]; with `"batch"`, [`slices::plan_batch`]).
    Slices,
    /// AlpaServe placement ([`placement::plan`]).
    Placement,
    /// ExeGPT scheduling ([`schedule::plan`]).
    Schedule,
}

/// What a command line may set over the input file: each field overrides the input's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `schedule`: search every configuration instead of branch-and-bound.
    pub exhaustive: bool,
    /// `placement`: restrict to a baseline placement.
    pub baseline: Option<Baseline>,
}

/// Runs `planner` on the JSON input `text` with `overrides`; returns the output as JSON text, or
/// the message saying what is wrong (an override the planner does not take, input that does not
/// parse, a planner's error).
pub fn run(planner: Planner, text: &str, overrides: Overrides) -> Result<String, String> {
    if overrides.exhaustive && planner != Planner::Schedule {
        return Err("--exhaustive only applies to `schedule`".into());
    }
    if overrides.baseline.is_some() && planner != Planner::Placement {
        return Err("--baseline only applies to `placement`".into());
    }
    match planner {
        Planner::Stages => to_json(stages::plan(&parse::<StagesInput>(text)?)),
        Planner::Slices => {
            let input = parse::<SlicesInput>(text)?;
            if input.batch.is_some() { to_json(slices::plan_batch(&input)) } else { to_json(slices::plan(&input)) }
        }
        Planner::Placement => {
            let mut input = parse::<PlacementInput>(text)?;
            if overrides.baseline.is_some() {
                input.baseline = overrides.baseline;
            }
            to_json(placement::plan(&input))
        }
        Planner::Schedule => {
            let mut input = parse::<ScheduleInput>(text)?;
            input.exhaustive |= overrides.exhaustive;
            to_json(schedule::plan(&input))
        }
    }
}

/// `{"error": message}` (trimmed), the one JSON object a planner command line prints on failure.
pub fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message.trim() }).to_string()
}

/// Parses command-line `args` (the first is the program name) into `A`; `Err` holds what to
/// print and the exit code instead: the help text and 0, or the JSON error and [`EXIT_ERROR`].
#[cfg(feature = "clap")]
pub fn parse_args<A, I, T>(args: I) -> Result<A, (String, i32)>
where
    A: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    A::try_parse_from(args).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => (e.to_string(), 0),
        _ => (error_json(&e.to_string()), EXIT_ERROR),
    })
}

fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| format!("invalid input: {e}"))
}

fn to_json<T: Serialize, E: std::fmt::Display>(result: Result<T, E>) -> Result<String, String> {
    let value = result.map_err(|e| e.to_string())?;
    serde_json::to_string(&value).map_err(|e| format!("cannot write the output: {e}"))
}
