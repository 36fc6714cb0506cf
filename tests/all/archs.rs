//! The newer architectures (Gemma 3, Qwen2, Qwen3, Mistral, Phi-3) against HF transformers:
//! logits and greedy continuations on every device, from safetensors and from the GGUF copy the
//! `gguf` package wrote of each, through the offload engine and the paged engine under
//! preemption; LLaMA 3's RoPE scaling from a GGUF `rope_freqs.weight`.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::Generator;
use burn_llm::models::{CausalLm, Checkpoint, ContiguousKvCache, DecoderSpec, Pretrained, Prompt, SamplingParams};
use burn_llm::offload::policy::Policy;

use crate::common::{devices, fixture, max_abs_diff, reference};

/// The fixtures of the newer architectures (each with a `model.gguf` copy).
pub const ARCH_FIXTURES: [&str; 5] = ["gemma3", "qwen2", "qwen3", "mistral", "phi3"];

/// The fixture's safetensors directory and its GGUF copy.
fn sources(name: &str) -> [(&'static str, PathBuf); 2] {
    [("safetensors", fixture(name)), ("gguf", fixture(name).join("model.gguf"))]
}

/// Every position's logits of prompt `ids`, `[len, vocab]` row-major.
fn logits(model: &CausalLm, ids: &[u32], device: &Device) -> Vec<f32> {
    let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), device);
    let step = cache.begin_step(&[ids]).unwrap();
    model.forward_all_logits(&step, &mut cache).unwrap().into_data().try_into_vec_as::<f32>().unwrap()
}

/// Logits within 1e-4 of HF (f32) on every device, from safetensors and from GGUF, and the
/// tokenizer (HF's `tokenizer.json`, or rebuilt from the GGUF metadata) gives HF's ids.
#[test]
fn logits_match_hf_from_safetensors_and_gguf() {
    for (device_name, device) in devices() {
        for name in ARCH_FIXTURES {
            let reference = reference(name);
            for (source, path) in sources(name) {
                let pretrained = Pretrained::load(&path, &device).unwrap();
                for (i, prompt) in reference.prompts.iter().enumerate() {
                    let what = format!("{name} ({source}) on {device_name}, prompt {i}");
                    assert_eq!(pretrained.tokenizer.encode(&prompt.text).unwrap(), prompt.input_ids, "{what}");
                    let diff = max_abs_diff(&logits(&pretrained.model, &prompt.input_ids, &device), &prompt.logits);
                    assert!(diff <= 1e-4, "{what}: max |Δlogit| = {diff}");
                }
            }
        }
    }
}

/// Greedy continuations equal HF's, batched and alone, from both sources on every device.
#[test]
fn greedy_matches_hf() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) };
    for (device_name, device) in devices() {
        for name in ARCH_FIXTURES {
            let reference = reference(name);
            let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
            for (source, path) in sources(name) {
                let generator = Generator::from(Pretrained::load(&path, &device).unwrap());
                let batched = generator.generate(&prompts, &params).unwrap();
                for (i, (out, expected)) in batched.requests.iter().zip(&reference.prompts).enumerate() {
                    let what = format!("{name} ({source}) on {device_name}, prompt {i}");
                    assert_eq!(out.generated_ids, expected.greedy_ids, "{what} in a batch");
                    assert_eq!(out.text, expected.greedy_text, "{what} text");
                    let alone = generator.generate(&prompts[i..=i], &params).unwrap();
                    assert_eq!(alone.requests[0].generated_ids, expected.greedy_ids, "{what} alone");
                }
            }
        }
    }
}

/// The fixtures exercise their windows: the long prompt is longer than the window, and the same
/// weights attending globally give other logits than HF's.
#[test]
fn sliding_windows_are_exercised() {
    let device = Device::flex();
    for name in ["gemma3", "mistral", "phi3"] {
        let dir = fixture(name);
        let spec = DecoderSpec::from_dir(&dir).unwrap();
        let window = spec.variants.sliding_window.clone().unwrap_or_else(|| panic!("{name} has no window"));
        let reference = reference(name);
        let long = reference.prompts.iter().max_by_key(|p| p.input_ids.len()).unwrap();
        assert!(long.input_ids.len() > window.size, "{name}: the long prompt fits in the window");
        let mut global = spec.clone();
        global.variants.sliding_window = None;
        let model = CausalLm::from_checkpoint(global, &Checkpoint::open(&dir).unwrap(), &device).unwrap();
        let diff = max_abs_diff(&logits(&model, &long.input_ids, &device), &long.logits);
        assert!(diff > 1e-3, "{name}: global attention matches HF's windowed logits ({diff})");
    }
    // Gemma 3: two local layers, then a global one with a RoPE base of its own.
    let spec = DecoderSpec::from_dir(&fixture("gemma3")).unwrap();
    assert_eq!((0..3).map(|i| spec.window(i)).collect::<Vec<_>>(), [Some(8), Some(8), None]);
    let local = spec.variants.sliding_window.unwrap().local_rope.unwrap();
    assert_eq!(local.theta, 10_000.0);
    assert!(matches!(spec.positions, burn_llm::models::config::PositionKind::Rotary(ref r) if r.theta == 1e6));
}

/// LLaMA 3.x GGUF files carry the `llama3` RoPE scaling as `rope_freqs.weight`: the `llama`
/// fixture converted that way gives HF's logits.
#[test]
fn llama3_rope_freqs_match_hf() {
    let device = Device::flex();
    let pretrained = Pretrained::load(&fixture("llama").join("llama3.gguf"), &device).unwrap();
    let burn_llm::models::config::PositionKind::Rotary(rope) = &pretrained.model.spec().positions else {
        panic!("rotary positions expected");
    };
    assert!(matches!(rope.scaling, burn_llm::models::layers::rope::RopeScaling::Factors(_)), "{rope:?}");
    for (i, prompt) in reference("llama").prompts.iter().enumerate() {
        let diff = max_abs_diff(&logits(&pretrained.model, &prompt.input_ids, &device), &prompt.logits);
        assert!(diff <= 1e-4, "prompt {i}: max |Δlogit| = {diff}");
    }
}

/// The paged engine equals plain generation under preemption by swapping and by recomputation.
#[test]
fn paged_engine_under_preemption_equals_plain_generation() {
    use crate::paged::{assert_pool_behaviour, engine, mixed_prompts, one_by_one, pools};
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for (device_name, device) in devices() {
        for name in ARCH_FIXTURES {
            let prompts = mixed_prompts(name);
            let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let expected = one_by_one(&plain, &prompts, &params);
            for (label, cfg) in pools(&prompts, &expected) {
                let what = format!("{name} on {device_name}, {label} pool");
                let mut engine = engine(name, &device, cfg);
                let out = engine.generate(&prompts, &params).unwrap();
                let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
                assert_eq!(got, expected, "{what}");
                assert_pool_behaviour(label, engine.stats(), engine.block_manager().all_blocks_free(), &what);
            }
        }
    }
}

/// The offload engine (weights on disk, KV cache on the host with CPU attention) equals plain
/// generation.
#[test]
fn offload_engine_equals_plain_generation() {
    use burn_llm::offload::policy::{Placement, PolicyShape};
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) };
    let device = Device::flex();
    let base = Policy::all_on_gpu(2);
    let policy = Policy {
        weights: Placement::from_array([0.0, 0.0, 1.0]),
        cache: Placement::from_array([0.0, 1.0, 0.0]),
        shape: PolicyShape { cpu_attention: true, num_gpu_batches: 2, ..base.shape },
        ..base
    };
    for name in ARCH_FIXTURES {
        let reference = reference(name);
        let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
        let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
        let expected: Vec<Vec<u32>> =
            plain.generate(&prompts, &params).unwrap().requests.into_iter().map(|r| r.generated_ids).collect();
        let engine = crate::offload::engine(name, &device, policy, &format!("arch-{name}"));
        let (out, _) = engine.generate(&prompts, &params).unwrap();
        let got: Vec<Vec<u32>> = out.requests.into_iter().map(|r| r.generated_ids).collect();
        assert_eq!(got, expected, "{name}");
    }
}
