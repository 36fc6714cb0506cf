//! Generate text with a LLaMA model: `cargo run --release --example llama_generate -- --help`.
//!
//! Defaults to `HuggingFaceTB/SmolLM2-135M-Instruct` from the Hugging Face hub; pass `--model <dir>` for a local checkpoint.

fn main() -> std::process::ExitCode {
    burn_llm::cli::main(burn_llm::cli::ExampleDefaults {
        name: "llama_generate",
        engine: burn_llm::cli::EngineKind::Plain,
        model: "HuggingFaceTB/SmolLM2-135M-Instruct",
    })
}
