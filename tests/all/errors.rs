//! Bad input is an error that names the problem, never a panic.

use std::fs;

use burn::tensor::Device;
use burn_llm::models::{ModelError, Pretrained, Prompt, SamplingParams};

use crate::common::{fixture, scratch_copy};

fn load(dir: &std::path::Path) -> Result<Pretrained, ModelError> {
    Pretrained::load(dir, &Device::flex())
}

fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut value: serde_json::Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut value);
    fs::write(path, value.to_string()).unwrap();
}

#[test]
fn missing_weights() {
    let dir = scratch_copy("opt");
    fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn missing_shard() {
    let dir = scratch_copy("llama-tied-sharded");
    fs::remove_file(dir.path().join("model-00002-of-00005.safetensors")).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("model-00002-of-00005.safetensors"), "{err}");
}

#[test]
fn truncated_weights() {
    let dir = scratch_copy("gpt2");
    let path = dir.path().join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    for keep in [0, 5, 100, bytes.len() / 2, bytes.len() - 1] {
        fs::write(&path, &bytes[..keep]).unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(matches!(err, ModelError::CorruptWeights { .. }), "truncated to {keep}: {err}");
    }
}

#[test]
fn garbage_header() {
    let dir = scratch_copy("llama");
    let path = dir.path().join("model.safetensors");
    let mut bytes = fs::read(&path).unwrap();
    for b in bytes.iter_mut().skip(8).take(40) {
        *b = b'#';
    }
    fs::write(&path, &bytes).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptWeights { .. }), "{err}");
}

#[test]
fn tensor_with_wrong_shape() {
    let dir = scratch_copy("opt");
    edit_config(dir.path(), |c| c["ffn_dim"] = 100.into());
    let err = load(dir.path()).unwrap_err();
    match &err {
        ModelError::ShapeMismatch { name, expected, found } => {
            assert!(name.contains("fc1"), "{err}");
            // HF `Linear` layout, `[out, in]`, as in the file.
            assert_eq!((expected.as_slice(), found.as_slice()), (&[100, 64][..], &[128, 64][..]));
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }
}

#[test]
fn unknown_architecture() {
    let dir = scratch_copy("gpt2");
    edit_config(dir.path(), |c| c["model_type"] = "bert".into());
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "bert"), "{err}");
}

#[test]
fn invalid_config_values() {
    let dir = scratch_copy("llama");
    edit_config(dir.path(), |c| c["num_key_value_heads"] = 3.into());
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("num_key_value_heads"), "{err}");

    let dir = scratch_copy("llama");
    edit_config(dir.path(), |c| c["rope_parameters"]["rope_type"] = "yarn".into());
    let err = load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("yarn"), "{err}");

    let dir = scratch_copy("opt");
    fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(matches!(load(dir.path()).unwrap_err(), ModelError::InvalidConfig { .. }));
}

#[test]
fn missing_tokenizer() {
    let dir = scratch_copy("llama");
    fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let err = load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn bad_prompts() {
    let generator = burn_llm::Generator::from(load(&fixture("opt")).unwrap());
    let params = SamplingParams::greedy(4);
    let too_long = Prompt::Ids(vec![5; 129]);
    let err = generator.generate(&[Prompt::from("ok"), too_long], &params).unwrap_err();
    assert!(matches!(err, ModelError::PromptTooLong { index: 1, len: 129, max: 128 }), "{err}");

    let err = generator.generate(&[Prompt::Ids(vec![2, 384])], &params).unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfVocab { id: 384, vocab_size: 384, .. }), "{err}");

    let err = generator.generate(&[Prompt::Ids(vec![])], &params).unwrap_err();
    assert!(matches!(err, ModelError::EmptyPrompt { index: 0 }), "{err}");

    for bad in [
        SamplingParams { temperature: -1.0, ..params.clone() },
        SamplingParams { top_p: 0.0, ..params.clone() },
        SamplingParams { max_new_tokens: 0, ..params.clone() },
        SamplingParams { logprobs: Some(10_000), ..params.clone() },
    ] {
        let err = generator.generate(&[Prompt::from("ok")], &bad).unwrap_err();
        assert!(matches!(err, ModelError::InvalidSampling(_)), "{err}");
    }
}

/// A prompt that fills the context still gets one token, then stops with `length`.
#[test]
fn generation_stops_at_the_context_length() {
    let generator = burn_llm::Generator::from(load(&fixture("gpt2")).unwrap());
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(50) };
    let out = generator.generate(&[Prompt::Ids(vec![7; 120]), Prompt::Ids(vec![9; 128])], &params).unwrap();
    assert_eq!(out.requests[0].generated_ids.len(), 9);
    assert_eq!(out.requests[1].generated_ids.len(), 1);
    assert!(out.requests.iter().all(|r| r.finish_reason == burn_llm::FinishReason::Length));
}
