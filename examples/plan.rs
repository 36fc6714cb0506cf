//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]`: runs one planner and prints one JSON object on
//! stdout (an `{"error": …}` object and exit code 2 on bad input).
//!
//! `cargo run --release --example plan -- profile --model DIR_OR_GGUF|--synthetic NAME
//! --device flex|wgpu|… --out FILE.json [--grid small|full]`: measures the profile the planners
//! read on a device of this build (see `burn_parallel::profiler`), with the paged engine's
//! measured steps (`engine_step_ms` and the linear `engine_step`, timed by
//! `burn_llm::schedule::time_engine_steps`; `--no-engine-step` skips them).

use burn::tensor::Device;
use burn_llm::DeviceChoice;
use burn_llm::models::{CausalLm, DecoderSpec};
use burn_llm::parallel::profiler::EngineStepGrid;
use burn_llm::parallel::{plan, profiler};
use clap::ValueEnum;

use std::io::Write;

fn main() {
    let args: Vec<_> = std::env::args_os().collect();
    let (json, code) = if args.get(1).is_some_and(|a| a == "profile") {
        let device = |name: &str| {
            let choice = DeviceChoice::from_str(name, true)
                .map_err(|_| format!("unknown device `{name}`: use flex, wgpu, vulkan, cuda or metal"))?;
            choice.device().map_err(|e| e.to_string())
        };
        // The whole model (random weights) through the paged engine, against the layer tables.
        let engine: profiler::cli::EngineTimer<'_> =
            Box::new(|spec: &DecoderSpec, device: &Device, grid: &EngineStepGrid| {
                let model = CausalLm::random(spec.clone(), device).map_err(|e| e.to_string())?;
                burn_llm::schedule::time_engine_steps(&model, grid).map_err(|e| e.to_string())
            });
        // The library draws nothing: the bar on stderr is this command's (hidden off a terminal).
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
    } else {
        plan::cli::run(args)
    };
    // A closed stdout (`| head`) is not worth a panic.
    let _ = writeln!(std::io::stdout(), "{json}");
    std::process::exit(code);
}
