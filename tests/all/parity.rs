//! Logits and greedy continuations against HF transformers, on every device, alone and batched.

use burn_llm::models::{ContiguousKvCache, Pretrained, Prompt, SamplingParams};

use crate::common::{FIXTURES, devices, fixture, max_abs_diff, reference};

/// Every position's logits within 1e-4 of HF (f32), one prompt at a time.
#[test]
fn logits_match_hf() {
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let pretrained = Pretrained::load(&fixture(name), &device).unwrap();
            let model = &pretrained.model;
            for (i, prompt) in reference.prompts.iter().enumerate() {
                let ids = &prompt.input_ids;
                let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
                let step = cache.begin_step(&[ids]).unwrap();
                let logits = model.forward_all_logits(&step, &mut cache).unwrap();
                assert_eq!(logits.dims(), [1, ids.len(), reference.vocab_size]);
                let logits = logits.into_data().try_into_vec_as::<f32>().unwrap();
                let diff = max_abs_diff(&logits, &prompt.logits);
                assert!(diff <= 1e-4, "{name} on {device_name}, prompt {i}: max |Δlogit| = {diff}");
            }
        }
    }
}

/// The tokenizer gives HF's ids, BOS included.
#[test]
fn tokenizer_matches_hf() {
    for name in FIXTURES {
        let pretrained = Pretrained::load(&fixture(name), &burn::tensor::Device::flex()).unwrap();
        for prompt in reference(name).prompts {
            assert_eq!(pretrained.tokenizer.encode(&prompt.text).unwrap(), prompt.input_ids, "{name}: {}", prompt.text);
        }
    }
}

/// Greedy continuations equal HF's token for token, whether the prompts run as one batch of
/// different lengths or one by one, and the streamed text equals HF's decode.
#[test]
fn greedy_matches_hf_batched_and_alone() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let generator = burn_llm::Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
            let batched = generator.generate(&prompts, &params).unwrap();
            for (i, (out, expected)) in batched.requests.iter().zip(&reference.prompts).enumerate() {
                assert_eq!(out.prompt_ids, expected.input_ids, "{name} prompt {i}");
                assert_eq!(out.generated_ids, expected.greedy_ids, "{name} on {device_name}, prompt {i} in a batch");
                assert_eq!(out.text, expected.greedy_text, "{name} on {device_name}, prompt {i} text");
                let alone = generator.generate(&prompts[i..=i], &params).unwrap();
                assert_eq!(
                    alone.requests[0].generated_ids, expected.greedy_ids,
                    "{name} on {device_name}, prompt {i} alone"
                );
            }
            assert_eq!(batched.timing.generated_tokens, 16 * prompts.len());
        }
    }
}

/// Token-id prompts give the same result as the text they encode.
#[test]
fn id_prompts_equal_text_prompts() {
    let generator =
        burn_llm::Generator::from(Pretrained::load(&fixture("llama"), &burn::tensor::Device::flex()).unwrap());
    let reference = reference("llama");
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let by_text = generator.generate(&[Prompt::Text(reference.prompts[1].text.clone())], &params).unwrap();
    let by_ids = generator.generate(&[Prompt::Ids(reference.prompts[1].input_ids.clone())], &params).unwrap();
    assert_eq!(by_text.requests[0].generated_ids, by_ids.requests[0].generated_ids);
    assert_eq!(by_ids.requests[0].prompt, None);
}
