//! The example CLI: flag parsing, a JSON run on a local fixture, clear errors.

use burn_llm::cli::{run, ExampleDefaults, GenerateArgs};
use clap::Parser;

use crate::common::fixture;

const DEFAULTS: ExampleDefaults = ExampleDefaults {
    name: "test_generate",
    model: "facebook/opt-125m",
};

fn args(extra: &[&str]) -> GenerateArgs {
    let mut argv = vec!["test_generate"];
    argv.extend_from_slice(extra);
    GenerateArgs::try_parse_from(argv).unwrap()
}

#[test]
fn flags_become_sampling_params_and_prompts() {
    let a = args(&[
        "--prompt", "a", "--prompt-ids", "1,2,3", "--prompt", "b", "--max-new-tokens", "5", "--temperature", "0.7",
        "--top-k", "40", "--top-p", "0.9", "--seed", "3", "--logprobs", "2", "--stop", "\n", "--device", "flex", "--json",
    ]);
    let p = a.sampling();
    assert_eq!((p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.logprobs), (5, 0.7, 40, 0.9, Some(3), Some(2)));
    assert_eq!(p.stop, vec!["\n".to_string()]);
    let prompts = a.prompts();
    assert_eq!(prompts.len(), 3);
    assert_eq!(prompts[2], burn_llm::Prompt::Ids(vec![1, 2, 3]));
    assert!(GenerateArgs::try_parse_from(["x", "--prompt-ids", "1,a"]).is_err());
    assert!(GenerateArgs::try_parse_from(["x", "--device", "tpu"]).is_err());
}

#[test]
fn json_run_on_a_local_model() {
    let dir = fixture("gpt2");
    let a = args(&["--model", dir.to_str().unwrap(), "--prompt", "GNU", "--max-new-tokens", "4", "--device", "flex", "--json", "--logprobs", "2"]);
    run(&a, DEFAULTS).unwrap();
    let a = args(&["--model", dir.to_str().unwrap(), "--prompt", "GNU", "--prompt", "The", "--max-new-tokens", "3", "--device", "flex"]);
    run(&a, DEFAULTS).unwrap();
}

#[test]
fn missing_model_directory_is_a_clear_error() {
    let a = args(&["--model", "./no/such/model", "--device", "flex"]);
    let err = run(&a, DEFAULTS).unwrap_err().to_string();
    assert!(err.contains("no/such/model"), "{err}");
}
