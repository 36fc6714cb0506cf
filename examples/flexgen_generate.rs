//! FlexGen-style offloaded generation: `cargo run --release --example flexgen_generate -- --help`.
//!
//! Places weights and KV cache across the device, host memory and disk (`--gpu-mem`, `--cpu-mem`,
//! `--offload-dir`) by the policy FlexGen's cost model finds (`--policy auto`) or the one given
//! (`--percent wg wc cg cc hg hc --gbs N --num-gb M`), then generates with the zig-zag block
//! schedule. Defaults to `facebook/opt-125m`; any OPT, LLaMA, GPT-2 directory or GGUF file works.

fn main() -> std::process::ExitCode {
    burn_llm::cli::main(burn_llm::cli::ExampleDefaults {
        name: "flexgen_generate",
        model: "facebook/opt-125m",
        engine: burn_llm::cli::EngineKind::Offload,
        fallback: None,
    })
}
