//! `cargo xtask …`: project tasks that are not library code.
//!
//! - `cargo xtask bench generate [--device D] [--model M]`: prefill and decode throughput of the
//!   plain engine at batch sizes 1, 8 and 32, written to `bench-results/generate.{json,md}`.

mod bench;
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench { which } => bench::run(which),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
