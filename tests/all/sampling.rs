//! Sampling: filters remove what they should, draws follow the distribution, seeds reproduce.

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm::models::generation::{filtered_distribution, sample};
use burn_llm::models::{Pretrained, Prompt, SamplingParams};
use rand::SeedableRng;

use crate::common::fixture;

fn logits_of(probs: &[f32], rows: usize) -> Tensor<2> {
    let row: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let data: Vec<f32> = (0..rows).flat_map(|_| row.clone()).collect();
    Tensor::from_data(TensorData::new(data, [rows, probs.len()]), &Device::flex())
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let (probs, ids) = filtered_distribution(logits_of(&[0.1, 0.4, 0.2, 0.3], 1), 1.0, 2, 1.0);
    assert_eq!(ids.into_data().try_into_vec_as::<i64>().unwrap(), vec![1, 3]);
    let probs = to_vec(probs);
    assert!((probs[0] - 4.0 / 7.0).abs() < 1e-6 && (probs[1] - 3.0 / 7.0).abs() < 1e-6, "{probs:?}");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let logits = logits_of(&[0.2, 0.5, 0.3], 1);
    let (probs, ids) = filtered_distribution(logits.clone(), 1.0, 0, 0.6);
    assert_eq!(ids.into_data().try_into_vec_as::<i64>().unwrap(), vec![1, 2, 0]);
    let probs = to_vec(probs);
    assert!(probs[0] > 0.49 && probs[1] > 0.29 && probs[2] == 0.0, "{probs:?}");
    let (probs, _) = filtered_distribution(logits, 1.0, 0, 0.5);
    let probs = to_vec(probs);
    assert!(probs[0] > 0.49 && probs[1] == 0.0 && probs[2] == 0.0, "{probs:?}");
}

#[test]
fn temperature_sharpens() {
    let (probs, _) = filtered_distribution(logits_of(&[0.6, 0.4], 1), 0.5, 0, 1.0);
    let probs = to_vec(probs);
    let expected = 0.36 / (0.36 + 0.16);
    assert!((probs[0] - expected).abs() < 1e-5, "{probs:?} vs {expected}");
}

/// 4000 draws from [0.5, 0.3, 0.2] (top-p 1, top-k 0) land within 3 points of each probability,
/// and top_k = 2 never draws the third token.
#[test]
fn draws_follow_the_distribution() {
    let rows = 4000;
    let params = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
    let mut rngs: Vec<_> = (0..rows as u64).map(rand_chacha::ChaCha8Rng::seed_from_u64).collect();
    let sampled = sample(logits_of(&[0.5, 0.3, 0.2], rows), &params, &mut rngs).unwrap();
    for (id, p) in [(0u32, 0.5f64), (1, 0.3), (2, 0.2)] {
        let freq = sampled.ids.iter().filter(|&&i| i == id).count() as f64 / rows as f64;
        assert!((freq - p).abs() < 0.03, "token {id}: frequency {freq} vs probability {p}");
    }
    let top2 = SamplingParams { top_k: 2, ..params };
    let sampled = sample(logits_of(&[0.5, 0.3, 0.2], rows), &top2, &mut rngs).unwrap();
    assert!(sampled.ids.iter().all(|&i| i != 2));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let generator = burn_llm::Generator::from(Pretrained::load(&fixture("gpt2"), &Device::flex()).unwrap());
    let prompts = [Prompt::from("The licenses"), Prompt::from("GNU")];
    let params = |seed| SamplingParams {
        max_new_tokens: 16,
        temperature: 1.2,
        top_p: 0.95,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let a = generator.generate(&prompts, &params(7)).unwrap();
    let b = generator.generate(&prompts, &params(7)).unwrap();
    let c = generator.generate(&prompts, &params(8)).unwrap();
    assert_eq!(a.requests, b.requests);
    assert_ne!(
        a.requests.iter().map(|r| &r.generated_ids).collect::<Vec<_>>(),
        c.requests.iter().map(|r| &r.generated_ids).collect::<Vec<_>>()
    );
}

/// top_k = 1 is greedy whatever the temperature, and logprobs report the chosen token first.
#[test]
fn top_k_one_is_greedy_and_logprobs_are_sorted() {
    let generator = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    let prompts = [Prompt::from("You should also get your employer")];
    let greedy = generator
        .generate(&prompts, &SamplingParams { ignore_eos: true, logprobs: Some(3), ..SamplingParams::greedy(8) })
        .unwrap();
    let top1 = generator
        .generate(
            &prompts,
            &SamplingParams {
                temperature: 1.5,
                top_k: 1,
                seed: Some(1),
                ignore_eos: true,
                ..SamplingParams::greedy(8)
            },
        )
        .unwrap();
    assert_eq!(greedy.requests[0].generated_ids, top1.requests[0].generated_ids);
    let logprobs = greedy.requests[0].logprobs.as_ref().unwrap();
    assert_eq!(logprobs.len(), 8);
    for (step, id) in logprobs.iter().zip(&greedy.requests[0].generated_ids) {
        assert_eq!(step.len(), 3);
        assert_eq!(step[0].id, *id);
        assert!(step[0].logprob >= step[1].logprob && step[1].logprob >= step[2].logprob);
        assert!(step[0].logprob <= 0.0);
    }
}

/// Stop strings cut the text and end the request; stop ids end it with the id kept.
#[test]
fn stop_strings_and_ids() {
    let generator = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    let prompts = [Prompt::from("The licenses for most software")];
    let free =
        generator.generate(&prompts, &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) }).unwrap();
    let full = &free.requests[0];
    let third = full.generated_ids[2];
    let by_id = generator
        .generate(
            &prompts,
            &SamplingParams { ignore_eos: true, stop_token_ids: vec![third], ..SamplingParams::greedy(16) },
        )
        .unwrap();
    let first = full.generated_ids.iter().position(|&t| t == third).unwrap();
    assert_eq!(by_id.requests[0].generated_ids, full.generated_ids[..=first].to_vec());
    assert_eq!(by_id.requests[0].finish_reason, burn_llm::FinishReason::Stop);

    let stop: String = full.text.chars().skip(3).take(3).collect();
    let by_text = generator
        .generate(
            &prompts,
            &SamplingParams { ignore_eos: true, stop: vec![stop.clone()], ..SamplingParams::greedy(16) },
        )
        .unwrap();
    let out = &by_text.requests[0];
    assert_eq!(out.finish_reason, burn_llm::FinishReason::Stop);
    assert!(!out.text.contains(&stop));
    assert!(full.text.starts_with(&out.text));
    assert_eq!(out.text, full.text[..full.text.find(&stop).unwrap()]);
}
