//! q|k|v and gate|up fused into one projection each at load (`CausalLm::fuse_projections`, what
//! the plain and paged engines run on a GPU): HF's logits and greedy continuations still, on every
//! device, for every fixture architecture from safetensors and from GGUF (dense and GGUF-layout
//! quantized weights), and through the paged engine.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::Generator;
use burn_llm::models::{CausalLm, ContiguousKvCache, Pretrained, Prompt, SamplingParams};
use burn_llm::paged::KvCacheMemory;
use burn_llm::spec::{EngineKind, EngineSpec, PagedSpec, Purpose};

use crate::archs::ARCH_FIXTURES;
use crate::common::{FIXTURES, devices, fixture, max_abs_diff, reference};

/// Every position's logits of prompt `ids`, `[len, vocab]` row-major.
fn logits(model: &CausalLm, ids: &[u32], device: &Device) -> Vec<f32> {
    let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), device);
    let step = cache.begin_step(&[ids]).unwrap();
    model.forward_all_logits(&step, &mut cache).unwrap().into_data().try_into_vec_as::<f32>().unwrap()
}

/// Each fixture's safetensors directory, and its GGUF copy where it has one.
fn sources() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = FIXTURES.iter().map(|n| (n.to_string(), fixture(n))).collect();
    for name in ARCH_FIXTURES {
        out.push((name.to_string(), fixture(name)));
        out.push((format!("{name} (gguf)"), fixture(name).join("model.gguf")));
    }
    out
}

/// The fixture's name without the source suffix (its reference outputs).
fn fixture_name(label: &str) -> &str {
    label.split(' ').next().unwrap_or(label)
}

#[test]
fn fused_projections_keep_hf_logits() {
    for (device_name, device) in devices() {
        for (label, path) in sources() {
            let reference = reference(fixture_name(&label));
            let pretrained = Pretrained::load(&path, &device).unwrap();
            let unfused = pretrained.model.clone();
            let fused = pretrained.model.fuse_projections();
            let layer = &fused.layers[0];
            assert!(layer.attn.is_fused(), "{label}: q|k|v were not fused");
            assert_eq!(layer.mlp.gate_up, unfused.layers[0].mlp.gate.is_some(), "{label}: gate|up");
            for (i, prompt) in reference.prompts.iter().enumerate() {
                let what = format!("{label} on {device_name}, prompt {i}");
                let got = logits(&fused, &prompt.input_ids, &device);
                let diff = max_abs_diff(&got, &prompt.logits);
                assert!(diff <= 1e-4, "{what}: max |Δlogit| to HF = {diff}");
                let before = logits(&unfused, &prompt.input_ids, &device);
                let diff = max_abs_diff(&got, &before);
                assert!(diff <= 2e-5, "{what}: max |Δlogit| to the unfused model = {diff}");
            }
        }
    }
}

#[test]
fn fused_projections_keep_hf_greedy() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) };
    for (device_name, device) in devices() {
        for name in ["llama", "gemma3", "qwen3", "phi3", "opt"] {
            let reference = reference(name);
            let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
            let mut pretrained = Pretrained::load(&fixture(name), &device).unwrap();
            pretrained.model = pretrained.model.fuse_projections();
            let out = Generator::from(pretrained).generate(&prompts, &params).unwrap();
            for (i, (out, expected)) in out.requests.iter().zip(&reference.prompts).enumerate() {
                assert_eq!(out.generated_ids[..], expected.greedy_ids[..12], "{name} on {device_name}, prompt {i}");
            }
        }
    }
}

/// The plain and paged engines (which fuse the projections on a GPU, not on Flex) give HF's greedy ids.
#[test]
fn engines_keep_hf_greedy() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    for (device_name, device) in devices() {
        let reference = reference("llama");
        let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
        for kind in [EngineKind::Plain, EngineKind::Paged] {
            let pretrained = Pretrained::load(&fixture("llama"), &device).unwrap();
            // A small KV pool: the default 1 GiB does not fit a software driver's buffers.
            let paged = match kind {
                EngineKind::Paged => {
                    PagedSpec { kv_cache_memory: Some(KvCacheMemory::Blocks(64)), ..PagedSpec::default() }
                }
                _ => PagedSpec::default(),
            };
            let spec = EngineSpec { engine: Some(kind), paged, ..EngineSpec::default() };
            let purpose = Purpose::Generate { prompts: &prompts, params: &params };
            let mut engine = spec
                .init_model(
                    pretrained.model,
                    Some(pretrained.tokenizer),
                    pretrained.eos_token_ids,
                    purpose,
                    &mut std::io::sink(),
                )
                .unwrap();
            let out = engine.generate(&prompts, &params).unwrap().output;
            for (i, (out, expected)) in out.requests.iter().zip(&reference.prompts).enumerate() {
                assert_eq!(out.generated_ids[..], expected.greedy_ids[..8], "{kind:?} on {device_name}, prompt {i}");
            }
        }
    }
}
