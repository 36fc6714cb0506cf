//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]`: runs one planner and prints one JSON object on
//! stdout (an `{"error": …}` object and exit code 2 on bad input).
//!
//! `cargo run --release --example plan -- profile --model DIR_OR_GGUF|--synthetic NAME
//! --device flex|wgpu|… --out FILE.json [--grid small|full]`: measures the profile the planners
//! read on a device of this build (see `burn_parallel::profiler`), with the paged engine's
//! measured steps (`engine_step_ms` and the linear `engine_step`, timed by
//! `burn_llm::schedule::time_engine_steps`; `--no-engine-step` skips them).
//!
//! Both are `burn_llm::cli::plan::run_from`.

use std::io::Write;

fn main() {
    let (json, code) = burn_llm::cli::plan::run_from(std::env::args_os());
    // A closed stdout (`| head`) is not worth a panic.
    let _ = writeln!(std::io::stdout(), "{json}");
    std::process::exit(code);
}
