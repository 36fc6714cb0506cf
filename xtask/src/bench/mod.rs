//! Benchmarks. Each writes `bench-results/<name>.{json,md}` with the machine it ran on.

mod generate;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum Which {
    /// Prefill and decode tokens/s of the plain engine at batch sizes 1, 8, 32.
    Generate(generate::Args),
}

/// Runs one benchmark.
pub fn run(which: Which) -> Result<(), Box<dyn std::error::Error>> {
    match which {
        Which::Generate(args) => generate::run(args),
    }
}
