//! Sampling: filters remove what they should, draws follow the distribution, seeds reproduce;
//! the penalties equal HF transformers' and vLLM's on the fixtures, in every engine.

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm::models::generation::{TokenCounts, apply_penalties, filtered_distribution, sample};
use burn_llm::models::{CausalLm, ContiguousKvCache, Pretrained, Prompt, SamplingParams};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine};
use rand::SeedableRng;

use crate::common::{FIXTURES, devices, fixture, max_abs_diff, reference};

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
    let (probs, ids) = filtered_distribution(logits_of(&[0.1, 0.4, 0.2, 0.3], 1), 1.0, 2, 1.0, 0.0);
    assert_eq!(ids.into_data().try_into_vec_as::<i64>().unwrap(), vec![1, 3]);
    let probs = to_vec(probs);
    assert!((probs[0] - 4.0 / 7.0).abs() < 1e-6 && (probs[1] - 3.0 / 7.0).abs() < 1e-6, "{probs:?}");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let logits = logits_of(&[0.2, 0.5, 0.3], 1);
    let (probs, ids) = filtered_distribution(logits.clone(), 1.0, 0, 0.6, 0.0);
    assert_eq!(ids.into_data().try_into_vec_as::<i64>().unwrap(), vec![1, 2, 0]);
    let probs = to_vec(probs);
    assert!(probs[0] > 0.49 && probs[1] > 0.29 && probs[2] == 0.0, "{probs:?}");
    let (probs, _) = filtered_distribution(logits, 1.0, 0, 0.5, 0.0);
    let probs = to_vec(probs);
    assert!(probs[0] > 0.49 && probs[1] == 0.0 && probs[2] == 0.0, "{probs:?}");
}

#[test]
fn temperature_sharpens() {
    let (probs, _) = filtered_distribution(logits_of(&[0.6, 0.4], 1), 0.5, 0, 1.0, 0.0);
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
    let sampled = sample(logits_of(&[0.5, 0.3, 0.2], rows), &params, &mut rngs, &[], &[]).unwrap();
    for (id, p) in [(0u32, 0.5f64), (1, 0.3), (2, 0.2)] {
        let freq = sampled.ids.iter().filter(|&&i| i == id).count() as f64 / rows as f64;
        assert!((freq - p).abs() < 0.03, "token {id}: frequency {freq} vs probability {p}");
    }
    let top2 = SamplingParams { top_k: 2, ..params };
    let sampled = sample(logits_of(&[0.5, 0.3, 0.2], rows), &top2, &mut rngs, &[], &[]).unwrap();
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

/// top_k = 1 is greedy whatever the temperature, and logprobs report the chosen token first, then
/// the top K in order (greedy: the chosen token is also the first of them).
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
        assert_eq!(step.len(), 4);
        assert_eq!((step[0].id, step[1].id), (*id, *id));
        assert_eq!(step[0].logprob, step[1].logprob);
        assert!(step[1].logprob >= step[2].logprob && step[2].logprob >= step[3].logprob);
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

/// One penalty setting (the cases of `scripts/make_fixtures.py`).
#[derive(Debug, Clone, Copy)]
struct Penalty {
    presence: f32,
    frequency: f32,
    repetition: f32,
}

const PENALTIES: [(&str, Penalty); 5] = [
    ("repetition", Penalty { presence: 0.0, frequency: 0.0, repetition: 1.4 }),
    ("repetition_below_one", Penalty { presence: 0.0, frequency: 0.0, repetition: 0.8 }),
    ("presence", Penalty { presence: 1.5, frequency: 0.0, repetition: 1.0 }),
    ("frequency", Penalty { presence: 0.0, frequency: 0.9, repetition: 1.0 }),
    ("all", Penalty { presence: -0.5, frequency: 0.6, repetition: 1.5 }),
];

impl Penalty {
    fn params(self, max_new_tokens: usize) -> SamplingParams {
        SamplingParams {
            presence_penalty: self.presence,
            frequency_penalty: self.frequency,
            repetition_penalty: self.repetition,
            ignore_eos: true,
            ..SamplingParams::greedy(max_new_tokens)
        }
    }

    /// The reference formula on a host row, written from HF's `RepetitionPenaltyLogitsProcessor`
    /// (gather the logits of the prompt and output tokens, `score < 0 ? score * p : score / p`,
    /// scatter) and vLLM's `apply_penalties` (`logits -= frequency * output_counts`, then
    /// `logits -= presence * (output_counts > 0)`), in vLLM's order.
    fn apply(self, row: &mut [f32], prompt: &[u32], output: &[u32]) {
        let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            let score = row[id as usize];
            row[id as usize] = if score < 0.0 { score * self.repetition } else { score / self.repetition };
        }
        let mut counts = vec![0u32; row.len()];
        for &id in output {
            counts[id as usize] += 1;
        }
        for (logit, &count) in row.iter_mut().zip(&counts) {
            *logit -= self.frequency * count as f32;
        }
        for (logit, &count) in row.iter_mut().zip(&counts) {
            *logit -= self.presence * if count > 0 { 1.0 } else { 0.0 };
        }
    }
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0 as u32
}

/// Greedy decoding with `penalty`, independently of the engines: every step runs the whole
/// sequence through the model with a fresh cache and applies [`Penalty::apply`] on the host.
fn penalized_greedy(model: &CausalLm, prompt: &[u32], n: usize, penalty: Penalty) -> Vec<u32> {
    let device = model.device();
    let mut ids = prompt.to_vec();
    for _ in 0..n {
        let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
        let step = cache.begin_step(&[&ids]).unwrap();
        let mut row = to_vec(model.forward_last_logits(&step, &mut cache).unwrap());
        penalty.apply(&mut row, prompt, &ids[prompt.len()..]);
        ids.push(argmax(&row));
    }
    ids[prompt.len()..].to_vec()
}

/// One case of a fixture's `penalties.json` (HF transformers' outputs, `scripts/make_fixtures.py`):
/// per prompt, HF's greedy continuation and the history of the step whose logits are stored.
struct HfPenaltyCase {
    name: String,
    greedy: Vec<Vec<u32>>,
    histories: Vec<Vec<u32>>,
    /// Per prompt: HF's raw and processed logits of that step.
    raw: Vec<Vec<f32>>,
    processed: Vec<Vec<f32>>,
}

fn hf_penalties(name: &str) -> Vec<HfPenaltyCase> {
    let dir = fixture(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("penalties.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("penalties.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let floats = |key: String| -> Vec<f32> {
        let data = tensors.tensor(&key).unwrap().data().to_vec();
        data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let name = case["name"].as_str().unwrap().to_string();
            let prompts = case["prompts"].as_array().unwrap();
            HfPenaltyCase {
                greedy: prompts.iter().map(|p| ids(&p["greedy_ids"])).collect(),
                histories: prompts.iter().map(|p| ids(&p["step_history"])).collect(),
                raw: (0..prompts.len()).map(|i| floats(format!("raw.{name}.{i}"))).collect(),
                processed: (0..prompts.len()).map(|i| floats(format!("processed.{name}.{i}"))).collect(),
                name,
            }
        })
        .collect()
}

/// The penalties equal HF transformers' `RepetitionPenaltyLogitsProcessor` and vLLM's
/// presence/frequency formula (run in torch by `scripts/make_fixtures.py`) on the fixtures' logits
/// of a step 8 tokens into a penalized greedy continuation, all prompts as one batch, every device.
#[test]
fn penalties_equal_hf_logits_processors() {
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let cases = hf_penalties(name);
            assert_eq!(cases.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), PENALTIES.map(|(n, _)| n));
            for (case, (_, penalty)) in cases.iter().zip(PENALTIES) {
                let rows = case.raw.len();
                let data: Vec<f32> = case.raw.iter().flatten().copied().collect();
                let logits = Tensor::<2>::from_data(TensorData::new(data, [rows, reference.vocab_size]), &device);
                let histories: Vec<TokenCounts> = case
                    .histories
                    .iter()
                    .zip(&reference.prompts)
                    .map(|(h, p)| counts(&p.input_ids, &h[p.input_ids.len()..]))
                    .collect();
                let history: Vec<&TokenCounts> = histories.iter().collect();
                let got = to_vec(apply_penalties(logits, &penalty.params(1), &history).unwrap());
                let expected: Vec<f32> = case.processed.iter().flatten().copied().collect();
                let diff = max_abs_diff(&got, &expected);
                assert!(diff <= 1e-5, "{name} on {device_name}, {}: max |Δ| vs HF = {diff}", case.name);
            }
        }
    }
}

fn counts(prompt: &[u32], output: &[u32]) -> TokenCounts {
    let mut counts = TokenCounts::new(prompt);
    for &id in output {
        counts.push(id);
    }
    counts
}

/// The on-device penalties equal the reference formula on the fixtures' real logits (HF's logits
/// at the last prompt position, with the prompt and its greedy continuation as history), several
/// rows with different histories in one batch, on every device.
#[test]
fn penalties_equal_the_reference_formula_on_fixture_logits() {
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let vocab = reference.vocab_size;
            let rows: Vec<(Vec<f32>, &[u32], &[u32])> = reference
                .prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (p.logits[p.logits.len() - vocab..].to_vec(), &p.input_ids[..], &p.greedy_ids[..2 * i]))
                .collect();
            let data: Vec<f32> = rows.iter().flat_map(|(row, _, _)| row.clone()).collect();
            let logits = Tensor::<2>::from_data(TensorData::new(data, [rows.len(), vocab]), &device);
            let histories: Vec<TokenCounts> = rows.iter().map(|(_, p, o)| counts(p, o)).collect();
            let history: Vec<&TokenCounts> = histories.iter().collect();
            for (case, penalty) in PENALTIES {
                let got = to_vec(apply_penalties(logits.clone(), &penalty.params(1), &history).unwrap());
                let expected: Vec<f32> = rows
                    .iter()
                    .flat_map(|(row, prompt, output)| {
                        let mut row = row.clone();
                        penalty.apply(&mut row, prompt, output);
                        row
                    })
                    .collect();
                let diff = max_abs_diff(&got, &expected);
                assert!(diff <= 1e-6, "{name} on {device_name}, {case}: max |Δ| = {diff}");
            }
            let off = to_vec(apply_penalties(logits.clone(), &SamplingParams::default(), &[]).unwrap());
            assert_eq!(off, to_vec(logits), "{name}: no penalty leaves the logits alone");
        }
    }
}

/// Greedy decoding with each penalty gives the independently computed continuation (and differs
/// from unpenalized greedy somewhere) in the plain, paged and offloading engines, with penalized
/// and unpenalized requests side by side in the paged engine's batches.
#[test]
fn penalized_greedy_is_the_same_in_every_engine() {
    let n = 12;
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
            let plain = burn_llm::Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let offload = crate::offload::engine(name, &device, burn_llm::offload::policy::Policy::all_on_gpu(4), name);
            let config = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(256), ..EngineConfig::default() };
            let mut paged = LlmEngine::new(Pretrained::load(&fixture(name), &device).unwrap(), config).unwrap();
            let mut changed = false;
            let hf = hf_penalties(name);
            for ((case, penalty), hf) in PENALTIES.into_iter().zip(&hf) {
                let what = format!("{name} on {device_name}, {case}");
                let expected: Vec<Vec<u32>> = reference
                    .prompts
                    .iter()
                    .map(|p| penalized_greedy(plain.model(), &p.input_ids, n, penalty))
                    .collect();
                assert_eq!(expected, hf.greedy, "{what}: the reference loop against HF generate");
                changed |= expected.iter().zip(&reference.prompts).any(|(e, p)| e[..] != p.greedy_ids[..n]);
                let params = penalty.params(n);
                let ids = |out: burn_llm::models::GenerationOutput| -> Vec<Vec<u32>> {
                    out.requests.into_iter().map(|r| r.generated_ids).collect()
                };
                assert_eq!(ids(plain.generate(&prompts, &params).unwrap()), expected, "{what}: plain");
                assert_eq!(ids(offload.generate(&prompts, &params).unwrap().0), expected, "{what}: offload");
                // Paged: each penalized request beside an unpenalized one.
                for (i, prompt) in prompts.iter().enumerate() {
                    paged.add_request(format!("{case}-{i}"), prompt.clone(), params.clone()).unwrap();
                    let plain_params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) };
                    paged.add_request(format!("{case}-{i}-plain"), prompt.clone(), plain_params).unwrap();
                }
                let mut got = vec![Vec::new(); prompts.len()];
                while paged.has_unfinished_requests() {
                    for out in paged.step().unwrap() {
                        let Some(done) = out.finished else { continue };
                        let (request, kind) = out.request_id.split_at(case.len() + 1);
                        let i: usize = kind.split('-').next().unwrap().parse().unwrap();
                        let ids = done[0].generated_ids.clone();
                        if kind.ends_with("plain") {
                            assert_eq!(ids, reference.prompts[i].greedy_ids[..n], "{what}: paged, {request}{kind}");
                        } else {
                            got[i] = ids;
                        }
                    }
                }
                assert_eq!(got, expected, "{what}: paged");
            }
            assert!(changed, "{name}: no penalty changed any greedy continuation");
        }
    }
}

/// Penalties are validated, and beam search refuses them (vLLM's beam search takes none).
#[test]
fn penalties_are_validated() {
    let bad = [
        SamplingParams { presence_penalty: 2.5, ..SamplingParams::default() },
        SamplingParams { frequency_penalty: -2.1, ..SamplingParams::default() },
        SamplingParams { repetition_penalty: 0.0, ..SamplingParams::default() },
        SamplingParams { repetition_penalty: f32::NAN, ..SamplingParams::default() },
        SamplingParams {
            beam: Some(burn_llm::BeamSearchParams::new(2)),
            repetition_penalty: 1.2,
            ..SamplingParams::default()
        },
    ];
    for params in bad {
        let err = params.validate(384).unwrap_err().to_string();
        assert!(err.contains("penalt"), "{params:?}: {err}");
    }
}

/// `logprobs` are filled the same way by every engine and path: per generated token, the sampled
/// token's raw log-probability, then the top K; the paged engine's stream deltas concatenate to
/// its final output; with penalties the reported values stay the model's raw distribution.
#[test]
fn logprobs_are_consistent_across_engines_and_streams() {
    let device = Device::flex();
    let name = "llama";
    let reference = reference(name);
    let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
    let plain = burn_llm::Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
    let offload = crate::offload::engine(name, &device, burn_llm::offload::policy::Policy::all_on_gpu(4), "logprobs");
    let config = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(256), ..EngineConfig::default() };
    let mut paged = LlmEngine::new(Pretrained::load(&fixture(name), &device).unwrap(), config).unwrap();
    for penalty in [None, Some(PENALTIES[4].1)] {
        let params = SamplingParams {
            logprobs: Some(3),
            ..penalty.map_or(SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) }, |p| p.params(6))
        };
        let expected = plain.generate(&prompts, &params).unwrap().requests;
        let mut streamed = vec![Vec::new(); prompts.len()];
        let from_paged = paged
            .generate_stream(&prompts, &params, |i, delta| streamed[i].extend(delta.logprobs.clone().unwrap()))
            .unwrap();
        let from_offload = offload.generate(&prompts, &params).unwrap().0.requests;
        for (i, want) in expected.iter().enumerate() {
            let what = format!("prompt {i}, penalty {penalty:?}");
            let steps = want.logprobs.as_ref().unwrap();
            assert_eq!(steps.len(), want.generated_ids.len(), "{what}");
            for (step, &id) in steps.iter().zip(&want.generated_ids) {
                assert_eq!((step.len(), step[0].id), (4, id), "{what}");
            }
            for (label, got) in [
                ("paged", from_paged.requests[i].logprobs.as_ref().unwrap()),
                ("paged stream", &streamed[i]),
                ("offload", from_offload[i].logprobs.as_ref().unwrap()),
            ] {
                assert_eq!(got.len(), steps.len(), "{what}: {label}");
                for (a, b) in got.iter().flatten().zip(steps.iter().flatten()) {
                    assert_eq!(a.id, b.id, "{what}: {label}");
                    assert!((a.logprob - b.logprob).abs() < 1e-4, "{what}: {label} {a:?} vs {b:?}");
                }
            }
        }
        if penalty.is_some() {
            // Raw log-probabilities: the first step's equal a log-softmax of HF's logits.
            let p = &reference.prompts[0];
            let row = &p.logits[p.logits.len() - reference.vocab_size..];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let log_sum = row.iter().map(|x| (x - max).exp()).sum::<f32>().ln() + max;
            let first = expected[0].logprobs.as_ref().unwrap()[0][0];
            assert!((first.logprob - (row[first.id as usize] - log_sum)).abs() < 1e-4, "{first:?}");
        }
    }
}

/// On a GPU the plain engine feeds each decode step the previous step's ids on the device and
/// reads them back while the next step runs (`StaticBatch::feed_on_device`); asking for
/// log-probabilities turns that off. Both give the same tokens and finishes, greedy and seeded,
/// with rows that stop on different steps (a stop id one step before its budget discovered
/// only after the next step was issued).
#[test]
fn device_fed_decode_steps_change_no_output() {
    let expected = reference("llama");
    let prompts: Vec<Prompt> = expected.prompts.iter().map(|p| Prompt::from(p.input_ids.clone())).collect();
    // Stop ids taken from two references' greedy continuations: rows stop at different steps.
    let stops = vec![expected.prompts[0].greedy_ids[3], expected.prompts[1].greedy_ids[6]];
    let greedy = SamplingParams { stop_token_ids: stops, ..SamplingParams::greedy(12) };
    let seeded = SamplingParams { temperature: 1.1, seed: Some(3), ignore_eos: true, ..SamplingParams::greedy(12) };
    for (device_name, device) in devices() {
        let generator = burn_llm::Generator::from(Pretrained::load(&fixture("llama"), &device).unwrap());
        for params in [&greedy, &seeded] {
            let fed = generator.generate(&prompts, params).unwrap();
            let read = generator.generate(&prompts, &SamplingParams { logprobs: Some(1), ..params.clone() }).unwrap();
            let lengths: Vec<usize> = fed.requests.iter().map(|r| r.generated_ids.len()).collect();
            for (i, (a, b)) in fed.requests.iter().zip(&read.requests).enumerate() {
                let what = format!("{device_name}, prompt {i}, temperature {}", params.temperature);
                assert_eq!(a.generated_ids, b.generated_ids, "{what}");
                assert_eq!(a.finish_reason, b.finish_reason, "{what}");
            }
            if params.temperature == 0.0 {
                assert!(lengths.iter().any(|&n| n < 12) && lengths.iter().any(|&n| n != lengths[0]), "{lengths:?}");
            }
        }
    }
}
