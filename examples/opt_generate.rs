//! Generate text with a OPT model: `cargo run --release --example opt_generate -- --help`.
//!
//! Defaults to `facebook/opt-125m` from the Hugging Face hub; pass `--model <dir>` for a local checkpoint.

fn main() -> std::process::ExitCode {
    burn_llm::cli::main(burn_llm::cli::ExampleDefaults {
        name: "opt_generate",
        engine: burn_llm::cli::EngineKind::Plain,
        fallback: None,
        model: "facebook/opt-125m",
    })
}
