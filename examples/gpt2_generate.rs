//! Generate text with a GPT-2 model: `cargo run --release --example gpt2_generate -- --help`.
//!
//! Defaults to `openai-community/gpt2` from the Hugging Face hub; pass `--model <dir>` for a local checkpoint.

fn main() -> std::process::ExitCode {
    burn_llm::cli::main(burn_llm::cli::ExampleDefaults {
        name: "gpt2_generate",
        engine: burn_llm::cli::EngineKind::Plain,
        fallback: None,
        model: "openai-community/gpt2",
    })
}
