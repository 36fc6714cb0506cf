//! The paged engine (`burn-paged`) against plain generation and HF: greedy parity with many
//! concurrent requests, under forced preemption by swap and by recomputation, with FCFS and with
//! ExeGPT's phased schedule, prefix caching,
//! beam search against HF, parallel sampling, and a stress run that must lose no request and
//! leak no block.

use std::sync::{Arc, Mutex};

use burn::tensor::Device;
use burn_llm::BeamSearchParams;
use burn_llm::Generator;
use burn_llm::models::{Pretrained, Prompt, SamplingParams};
use burn_llm::paged::memory::Location;
use burn_llm::paged::{
    EngineConfig, EngineStats, GenerateProgress, KvCacheMemory, KvReservation, LlmEngine, PagedError, PreemptionMode,
    SchedulingPolicy,
};

use crate::common::{FIXTURES, devices, fixture, reference};

pub fn engine(name: &str, device: &Device, config: EngineConfig) -> LlmEngine {
    LlmEngine::new(Pretrained::load(&fixture(name), device).unwrap(), config).unwrap()
}

pub fn config(blocks: usize, block_size: usize, preemption: PreemptionMode) -> EngineConfig {
    EngineConfig {
        block_size,
        kv_cache_memory: KvCacheMemory::Blocks(blocks),
        swap_space: 1 << 26,
        max_num_seqs: 64,
        preemption,
        ..EngineConfig::default()
    }
}

/// Prompts of mixed lengths: the fixtures' reference prompts plus token-id prompts cut from them.
pub fn mixed_prompts(name: &str) -> Vec<Prompt> {
    let reference = reference(name);
    let mut prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
    for (i, p) in reference.prompts.iter().enumerate() {
        for cut in [1 + i, p.input_ids.len() / 2 + 1, 3 * i + 2] {
            prompts.push(Prompt::Ids(p.input_ids[..cut.min(p.input_ids.len())].to_vec()));
        }
    }
    prompts
}

fn prompt_len(p: &Prompt) -> usize {
    match p {
        Prompt::Ids(ids) => ids.len(),
        // Text prompts are the reference prompts; their ids are at most this long.
        _ => 64,
    }
}

/// Greedy outputs of the paged engine equal the plain engine's token for token, for every
/// architecture and device, with a roomy pool, and with pools so small that groups are
/// preempted by swapping and by recomputation; block accounting returns to empty.
#[test]
fn greedy_equals_plain_generation_with_and_without_preemption() {
    assert_greedy_parity(|cfg| cfg);
}

/// The same parity under ExeGPT's phased (RRA) schedule: prefills of 3 requests, then 4 decode
/// iterations over at most 5 sequences, with and without forced preemption.
#[test]
fn phased_schedule_greedy_equals_plain_generation() {
    let scheduling = SchedulingPolicy::Phased { encode_batch: 3, decode_batch: 5, decode_iterations: 4 };
    assert_greedy_parity(|cfg| EngineConfig { scheduling, ..cfg });
}

/// Runs [`mixed_prompts`] greedily on every fixture and device through the paged engine with each
/// pool (roomy, tight with swapping, tight with recomputation) after `adapt` sets the rest of
/// its configuration, and asserts the outputs equal plain generation's, that the tight pools
/// preempted the way they say, that requests were batched, and that no block leaked.
fn assert_greedy_parity(adapt: impl Fn(EngineConfig) -> EngineConfig) {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let prompts = mixed_prompts(name);
            let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let expected = one_by_one(&plain, &prompts, &params);
            for (label, cfg) in pools(&prompts, &expected) {
                let cfg = adapt(cfg);
                let what = format!("{name} on {device_name}, {label} pool, {:?}", cfg.scheduling);
                let mut engine = engine(name, &device, cfg);
                let out = engine.generate(&prompts, &params).unwrap();
                let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
                assert_eq!(got, expected, "{what}");
                assert_pool_behaviour(label, engine.stats(), engine.block_manager().all_blocks_free(), &what);
            }
        }
    }
}

/// Greedy outputs of `plain` for each prompt on its own: the reference a batched engine must equal.
pub fn one_by_one(plain: &Generator, prompts: &[Prompt], params: &SamplingParams) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| plain.generate(std::slice::from_ref(p), params).unwrap().requests[0].generated_ids.clone())
        .collect()
}

/// A roomy pool, and pools so small that groups must be preempted by swapping and by
/// recomputation: they hold the longest of `prompts` with its `expected` output and little more.
pub fn pools(prompts: &[Prompt], expected: &[Vec<u32>]) -> [(&'static str, EngineConfig); 3] {
    let longest = prompts.iter().zip(expected).map(|(p, e)| prompt_len(p) + e.len()).max().unwrap_or(0);
    let tight = longest.div_ceil(4) + 2;
    [
        ("roomy", config(256, 16, PreemptionMode::Auto)),
        ("swap", config(tight, 4, PreemptionMode::Swap)),
        ("recompute", config(tight, 4, PreemptionMode::Recompute)),
    ]
}

/// Asserts that a run in pool `label` of [`pools`] preempted the way the pool says, batched
/// requests, and left no block in use.
pub fn assert_pool_behaviour(label: &str, stats: EngineStats, all_blocks_free: bool, what: &str) {
    match label {
        "swap" => assert!(stats.swaps > 0, "{what}: no swap happened"),
        "recompute" => assert!(stats.recomputes > 0, "{what}: no recomputation happened"),
        _ => assert_eq!(stats.swaps + stats.recomputes, 0, "{what}"),
    }
    assert!(stats.average_batch() > 1.5, "{what}: batching ({})", stats.average_batch());
    assert!(all_blocks_free, "{what}: blocks leaked");
}

/// A request whose prompt shares full blocks with an earlier one maps them from the prefix cache
/// and computes only the rest, with the same output.
#[test]
fn prefix_cache_hits_give_the_same_tokens() {
    let device = Device::flex();
    let reference = reference("llama");
    let long = &reference.prompts.iter().max_by_key(|p| p.input_ids.len()).unwrap().input_ids;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let mut fresh = engine("llama", &device, config(64, 4, PreemptionMode::Auto));
    let baseline = fresh.generate(&[Prompt::Ids(long.clone())], &params).unwrap();
    assert_eq!(fresh.stats().cached_tokens, 0);
    let again = fresh.generate(&[Prompt::Ids(long.clone())], &params).unwrap();
    assert_eq!(again.requests[0].generated_ids, baseline.requests[0].generated_ids);
    let full_blocks = (long.len() - 1) / 4 * 4;
    assert_eq!(fresh.stats().cached_tokens, full_blocks, "every full prompt block is reused");
}

/// Beam search returns HF's `generate(num_beams=4, num_return_sequences=2)` sequences on every
/// fixture.
#[test]
fn beam_search_equals_hf() {
    for name in FIXTURES {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap();
        let mut engine = engine(name, &Device::flex(), config(128, 4, PreemptionMode::Auto));
        for p in json["prompts"].as_array().unwrap() {
            let beam = &p["beam"];
            let ids: Vec<u32> = p["input_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let params = SamplingParams {
                n: beam["num_return_sequences"].as_u64().unwrap() as usize,
                beam: Some(BeamSearchParams {
                    length_penalty: beam["length_penalty"].as_f64().unwrap() as f32,
                    ..BeamSearchParams::new(beam["num_beams"].as_u64().unwrap() as usize)
                }),
                ..SamplingParams::greedy(beam["max_new_tokens"].as_u64().unwrap() as usize)
            };
            let out = engine.generate(&[Prompt::Ids(ids.clone())], &params).unwrap();
            assert!(out.requests.iter().all(|r| r.prompt_ids == ids), "{name}: every beam carries the prompt");
            let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
            let expected: Vec<Vec<u32>> = beam["sequences"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
                .collect();
            assert_eq!(got, expected, "{name}: {}", p["text"]);
        }
        assert!(engine.block_manager().all_blocks_free());
    }
}

/// `generate` draws nothing itself: it reports every step to the progress hook, requests finished
/// never going down, the last report with every request finished and every token counted.
#[test]
fn generate_reports_progress_to_the_hook() {
    let prompts = mixed_prompts("gpt2");
    let mut engine = engine("gpt2", &Device::flex(), config(256, 4, PreemptionMode::Auto));
    let reports: Arc<Mutex<Vec<GenerateProgress>>> = Arc::default();
    let sink = Arc::clone(&reports);
    engine.set_progress(Some(Box::new(move |p| sink.lock().unwrap().push(p))));
    let out = engine.generate(&prompts, &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(4) }).unwrap();
    let reports = reports.lock().unwrap();
    let last = reports.last().expect("one report per step");
    assert_eq!((last.finished, last.requests), (prompts.len(), prompts.len()));
    assert_eq!(last.generated_tokens, out.timing.generated_tokens);
    assert!(reports.windows(2).all(|w| w[0].finished <= w[1].finished && w[0].elapsed_s <= w[1].elapsed_s));
}

/// `n` seeded samples: reproducible, different from each other, and sharing the prompt's blocks
/// (fewer blocks in use than `n` separate copies would need).
#[test]
fn parallel_samples_are_reproducible_and_share_the_prompt() {
    let device = Device::flex();
    let reference = reference("gpt2");
    let prompt = Prompt::Ids(reference.prompts[0].input_ids.clone());
    let prompt_len = reference.prompts[0].input_ids.len();
    let params =
        SamplingParams { temperature: 1.0, seed: Some(7), ignore_eos: true, n: 4, ..SamplingParams::greedy(8) };
    let run = || {
        let mut engine = engine("gpt2", &device, config(256, 4, PreemptionMode::Auto));
        engine.add_request("r", prompt.clone(), params.clone()).unwrap();
        let mut peak = 0;
        let mut finished = None;
        while engine.has_unfinished_requests() {
            for out in engine.step().unwrap() {
                if out.finished.is_some() {
                    finished = out.finished;
                }
            }
            peak = peak.max(engine.block_manager().used_blocks(Location::Device));
        }
        (finished.unwrap(), peak)
    };
    let (a, peak) = run();
    let (b, _) = run();
    assert_eq!(a.len(), 4);
    assert_eq!(a, b, "seeded samples are reproducible");
    assert!(a.iter().any(|s| s.generated_ids != a[0].generated_ids), "samples differ");
    let per_copy = (prompt_len + 8).div_ceil(4);
    assert!(peak < 4 * per_copy, "prompt blocks are shared: peak {peak} blocks vs {} unshared", 4 * per_copy);
    let shared = prompt_len / 4;
    assert!(peak <= 4 * per_copy - 3 * shared + 4, "peak {peak} blocks");
}

/// 1 000 requests of random lengths through a pool that forces constant preemption, with random
/// aborts: every request ends (finished or aborted), nothing is lost, no block leaks.
#[test]
fn stress_thousand_requests_with_aborts() {
    let device = Device::flex();
    let mut engine = engine("llama", &device, config(24, 4, PreemptionMode::Auto));
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let total = 1000;
    let mut added = 0;
    let mut ended = std::collections::HashSet::new();
    let mut aborted = 0;
    let mut live: Vec<String> = Vec::new();
    while ended.len() < total {
        while added < total && live.len() < 48 {
            let len = 1 + (next() % 20) as usize;
            let prompt: Vec<u32> = (0..len).map(|_| 3 + (next() % 300) as u32).collect();
            let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(1 + (next() % 12) as usize) };
            let id = format!("req-{added}");
            engine.add_request(id.clone(), Prompt::Ids(prompt), params).unwrap();
            live.push(id);
            added += 1;
        }
        if next() % 10 == 0 && !live.is_empty() {
            let id = live.swap_remove((next() % live.len() as u64) as usize);
            assert!(engine.abort(&id).is_some());
            assert!(ended.insert(id));
            aborted += 1;
        }
        for out in engine.step().unwrap() {
            if out.finished.is_some() {
                live.retain(|l| *l != out.request_id);
                assert!(ended.insert(out.request_id.clone()), "{} finished twice", out.request_id);
            }
        }
    }
    assert!(aborted > 10);
    assert!(!engine.has_unfinished_requests());
    let stats = engine.stats();
    assert!(stats.swaps + stats.recomputes > 20, "the pool must force preemption: {stats:?}");
    assert!(engine.block_manager().all_blocks_free(), "blocks leaked");
}

/// Bad requests and configurations are errors that leave the engine usable.
#[test]
fn bad_requests_are_errors() {
    let device = Device::flex();
    let mut e = engine("opt", &device, config(64, 4, PreemptionMode::Auto));
    let ok = SamplingParams::greedy(2);
    e.add_request("a", Prompt::Ids(vec![2, 10]), ok.clone()).unwrap();
    assert!(matches!(e.add_request("a", Prompt::Ids(vec![2, 10]), ok.clone()), Err(PagedError::DuplicateRequest(_))));
    let bad = SamplingParams { n: 3, best_of: Some(2), ..ok.clone() };
    assert!(matches!(
        e.add_request("b", Prompt::Ids(vec![2]), bad),
        Err(PagedError::Model(burn_llm::ModelError::InvalidSampling(_)))
    ));
    let beam_sampling = SamplingParams { temperature: 0.7, beam: Some(BeamSearchParams::new(2)), ..ok.clone() };
    assert!(e.add_request("c", Prompt::Ids(vec![2]), beam_sampling).is_err());
    assert!(e.add_request("d", Prompt::Ids(vec![]), ok.clone()).is_err());
    while e.has_unfinished_requests() {
        e.step().unwrap();
    }

    // A prompt whose blocks outnumber the whole device pool is refused up front, naming the pool;
    // one that fits still runs.
    let mut small = engine("opt", &device, config(3, 4, PreemptionMode::Auto));
    let err = small.add_request("long", Prompt::Ids(vec![2; 13]), ok.clone()).unwrap_err();
    assert!(matches!(err, PagedError::PromptExceedsKvPool { needed: 4, blocks: 3, .. }), "{err}");
    assert!(err.to_string().contains("--kv-cache-memory") && err.to_string().contains("13 tokens"), "{err}");
    small.add_request("fits", Prompt::Ids(vec![2; 12]), SamplingParams::greedy(1)).unwrap();
    let mut finished = Vec::new();
    while small.has_unfinished_requests() {
        finished.extend(small.step().unwrap().into_iter().filter(|o| o.finished.is_some()).map(|o| o.request_id));
    }
    assert_eq!(finished, ["fits"]);

    let tiny = EngineConfig { kv_cache_memory: KvCacheMemory::Bytes(10), ..EngineConfig::default() };
    let err = LlmEngine::new(Pretrained::load(&fixture("opt"), &device).unwrap(), tiny).unwrap_err();
    assert!(matches!(err, PagedError::KvBudget { .. }), "{err}");
    assert!(err.to_string().contains("--kv-cache-memory"));
    let small =
        EngineConfig { kv_cache_memory: KvCacheMemory::Bytes(600_000), block_size: 1024, ..EngineConfig::default() };
    let err = LlmEngine::new(Pretrained::load(&fixture("opt"), &device).unwrap(), small).unwrap_err().to_string();
    assert!(err.contains("budget of 585.9 KiB"), "byte figures use a unit that shows them: {err}");
}

/// The baselines of the vLLM paper as scheduling policies of the paged engine (Orca with max,
/// power-of-two and oracle reservations; request-level static batching) give plain generation's
/// greedy tokens, never preempt, and batch no more requests than their reservations allow: with
/// 80 blocks of 4 slots and the fixtures' 128 positions, max-length reservations run at most two
/// requests at once, exact ones more.
#[test]
fn reserving_schedules_greedy_equal_plain_generation() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
    let device = Device::flex();
    for name in ["opt", "llama"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
        let expected: Vec<Vec<u32>> =
            plain.generate(&prompts, &params).unwrap().requests.into_iter().map(|r| r.generated_ids).collect();
        let mut batches = Vec::new();
        for scheduling in [
            SchedulingPolicy::Orca(KvReservation::Max),
            SchedulingPolicy::Orca(KvReservation::Pow2),
            SchedulingPolicy::Orca(KvReservation::Oracle),
            SchedulingPolicy::Static,
        ] {
            let what = format!("{name}, {}", scheduling.name());
            let cfg = EngineConfig { scheduling, ..config(80, 4, PreemptionMode::Auto) };
            let mut engine = engine(name, &device, cfg);
            let out = engine.generate(&prompts, &params).unwrap();
            let got: Vec<Vec<u32>> = out.requests.into_iter().map(|r| r.generated_ids).collect();
            assert_eq!(got, expected, "{what}");
            let stats = engine.stats();
            assert_eq!(stats.swaps + stats.recomputes, 0, "{what}: a reservation was outgrown");
            assert!(engine.block_manager().all_blocks_free(), "{what}: blocks leaked");
            batches.push(stats.average_batch());
        }
        let [max, pow2, oracle, fixed] = batches[..] else { unreachable!() };
        assert!(max <= 2.0 && fixed <= 2.0, "{name}: max-length reservations batch ≤ 2 ({max}, {fixed})");
        assert!(oracle > max && pow2 > max && oracle >= pow2, "{name}: {oracle} ≥ {pow2} > {max}");
        assert!(fixed <= max, "{name}: static batching never batches more than Orca (Max) ({fixed} vs {max})");
    }
}

/// `prompt_logprobs`: every prompt token after the first gets HF's log-probability (log-softmax of
/// the reference logits of the position before it, within 1e-4) and its top alternatives; the
/// first gets none. A repeated prompt is computed again (no prefix-cache hit) and scores the
/// same; parallel samples share the prompt's scores; the plain engine refuses the request.
#[test]
fn prompt_logprobs_equal_hf_and_skip_the_prefix_cache() {
    let k = 3;
    for (label, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let vocab = reference.vocab_size;
            let mut paged = engine(name, &device, config(64, 4, PreemptionMode::Auto));
            let params = SamplingParams { prompt_logprobs: Some(k), ignore_eos: true, ..SamplingParams::greedy(2) };
            for (i, p) in reference.prompts.iter().enumerate() {
                for round in 0..2 {
                    let cached_before = paged.stats().cached_tokens;
                    let out = paged.generate(&[Prompt::Ids(p.input_ids.clone())], &params).unwrap();
                    assert_eq!(paged.stats().cached_tokens, cached_before, "{label}/{name}: no prefix-cache hit");
                    let scored = out.requests[0].prompt_logprobs.as_ref().expect("prompt_logprobs");
                    assert_eq!(scored.len(), p.input_ids.len(), "{label}/{name} prompt {i} round {round}");
                    assert!(scored[0].is_none());
                    for (t, entry) in scored.iter().enumerate().skip(1) {
                        let entry = entry.as_ref().unwrap();
                        let row = &p.logits[(t - 1) * vocab..t * vocab];
                        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let lse = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
                        let expected = row[p.input_ids[t] as usize] - lse;
                        assert_eq!(entry[0].id, p.input_ids[t]);
                        assert!(
                            (entry[0].logprob - expected).abs() < 1e-4,
                            "{label}/{name} prompt {i} token {t}: {} vs HF {expected}",
                            entry[0].logprob
                        );
                        assert_eq!(entry.len(), k + 1);
                        let argmax = (0..vocab).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
                        assert!((entry[1].logprob - (row[argmax] - lse)).abs() < 1e-4, "{label}/{name}: top-1");
                        assert!(entry[1..].windows(2).all(|w| w[0].logprob >= w[1].logprob));
                    }
                }
            }
            // Parallel samples share the prompt's scores.
            let p = &reference.prompts[0];
            let sampled = SamplingParams { n: 2, temperature: 1.0, seed: Some(3), ..params.clone() };
            let out = paged.generate(&[Prompt::Ids(p.input_ids.clone())], &sampled).unwrap();
            assert_eq!(out.requests.len(), 2);
            assert_eq!(out.requests[0].prompt_logprobs, out.requests[1].prompt_logprobs);
            assert_eq!(out.requests[0].prompt_logprobs.as_ref().unwrap().len(), p.input_ids.len());
        }
    }
    let plain = Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    let params = SamplingParams { prompt_logprobs: Some(1), ..SamplingParams::greedy(2) };
    let err = plain.generate(&[Prompt::Text("Hello".into())], &params).unwrap_err().to_string();
    assert!(err.contains("prompt log-probabilities") && err.contains("--engine paged"), "{err}");
}
