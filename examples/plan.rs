//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]`: runs one planner and prints one JSON object on
//! stdout (an `{"error": …}` object and exit code 2 on bad input).

use std::io::Write;

fn main() {
    let (json, code) = burn_llm::parallel::plan::cli::run(std::env::args_os());
    // A closed stdout (`| head`) is not worth a panic.
    let _ = writeln!(std::io::stdout(), "{json}");
    std::process::exit(code);
}
