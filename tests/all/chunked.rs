//! Chunked prefill in the paged engine (vLLM's): prompts longer than a step's token budget are
//! computed in chunks beside the running decodes, with greedy outputs equal to plain generation
//! (and so to unchunked prefill) on every fixture, under preemption by swap and by recomputation,
//! with prefix-cache hits on partly prefilled prompts, with parallel samples, best-of and beams,
//! with prompt log-probabilities assembled over chunks, and through two pipeline stages with
//! TeraPipe token slices.

use std::sync::Arc;

use burn::tensor::Device;
use burn_llm::BeamSearchParams;
use burn_llm::Generator;
use burn_llm::models::{GenerationOutput, PrefillSlicing, Pretrained, Prompt, SamplingParams, UniformSlices};
use burn_llm::paged::{EngineConfig, LlmEngine, PagedError, PreemptionMode};

use crate::common::{FIXTURES, devices, fixture, reference};
use crate::paged::{assert_pool_behaviour, config, engine, mixed_prompts, one_by_one, pools};
use crate::parallel::pipeline;

/// The generated ids of every returned sequence.
fn ids(out: &GenerationOutput) -> Vec<Vec<u32>> {
    out.requests.iter().map(|r| r.generated_ids.clone()).collect()
}

/// `cfg` with steps of at most `budget` tokens, chunked prefill on or off.
fn budgeted(cfg: EngineConfig, budget: usize, chunked_prefill: bool) -> EngineConfig {
    EngineConfig { max_num_batched_tokens: Some(budget), chunked_prefill, ..cfg }
}

/// Greedy outputs with steps of 8 tokens (most prompts span several chunks, computed beside the
/// other requests' decodes) equal plain generation on every fixture and device, in a roomy pool
/// and in pools that force preemption by swapping and by recomputation; no block leaks.
#[test]
fn chunked_prefill_greedy_equals_plain_generation() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let prompts = mixed_prompts(name);
            let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let expected = one_by_one(&plain, &prompts, &params);
            for (label, cfg) in pools(&prompts, &expected) {
                let what = format!("{name} on {device_name}, {label} pool, chunks of 8");
                let mut engine = engine(name, &device, budgeted(cfg, 8, true));
                assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected, "{what}");
                let stats = engine.stats();
                assert!(stats.partial_prefills > 0, "{what}: no prompt was chunked");
                assert_pool_behaviour(label, stats, engine.block_manager().all_blocks_free(), &what);
            }
        }
    }
}

/// A prompt longer than `max_num_batched_tokens` is refused without chunked prefill (the error
/// says what to raise) and completes with it, with plain generation's tokens.
#[test]
fn a_prompt_longer_than_the_step_budget_completes() {
    let device = Device::flex();
    let long = reference("llama").prompts[2].input_ids.clone();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let plain = Generator::from(Pretrained::load(&fixture("llama"), &device).unwrap());
    let expected = one_by_one(&plain, &[Prompt::Ids(long.clone())], &params);
    let base = config(64, 4, PreemptionMode::Auto);
    let mut unchunked = engine("llama", &device, budgeted(base.clone(), 16, false));
    let err = unchunked.add_request("r", Prompt::Ids(long.clone()), params.clone()).unwrap_err();
    assert!(matches!(err, PagedError::PromptTooLong { len: 56, max: 16, .. }), "{err}");
    let mut chunked = engine("llama", &device, budgeted(base, 16, true));
    assert_eq!(ids(&chunked.generate(&[Prompt::Ids(long)], &params).unwrap()), expected);
    assert_eq!(chunked.stats().partial_prefills, 3, "56 tokens in steps of 16: three chunks before the last");
}

/// Requests sharing a long prompt, admitted while its first copy is still being prefilled in
/// chunks, map the blocks its chunks have computed and give the same tokens.
#[test]
fn prefix_cache_hits_on_partly_prefilled_prompts() {
    let device = Device::flex();
    let long = reference("gpt2").prompts[2].input_ids.clone();
    let mut extended = long.clone();
    extended.extend_from_slice(&reference("gpt2").prompts[1].input_ids);
    let prompts = vec![Prompt::Ids(long.clone()), Prompt::Ids(long), Prompt::Ids(extended)];
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let plain = Generator::from(Pretrained::load(&fixture("gpt2"), &device).unwrap());
    let expected = one_by_one(&plain, &prompts, &params);
    let mut engine = engine("gpt2", &device, budgeted(config(128, 4, PreemptionMode::Auto), 16, true));
    assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected);
    let stats = engine.stats();
    assert!(stats.partial_prefills > 0 && stats.cached_tokens >= 2 * 48, "{stats:?}");
}

/// Seeded parallel samples, best-of and beam search give the same outputs with and without
/// chunked prefill: nothing is sampled, no random stream advances and nothing forks before the
/// last chunk.
#[test]
fn samples_best_of_and_beams_are_unchanged_by_chunking() {
    let device = Device::flex();
    let prompts: Vec<Prompt> = reference("opt").prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
    let sampled = SamplingParams { temperature: 1.0, seed: Some(11), ignore_eos: true, ..SamplingParams::greedy(6) };
    let all = [
        SamplingParams { n: 3, ..sampled.clone() },
        SamplingParams { n: 2, best_of: Some(4), ..sampled },
        SamplingParams { n: 2, beam: Some(BeamSearchParams::new(3)), ..SamplingParams::greedy(6) },
    ];
    for params in all {
        let run = |chunked: bool| {
            let cfg = config(128, 4, PreemptionMode::Swap);
            let cfg = if chunked { budgeted(cfg, 8, true) } else { EngineConfig { chunked_prefill: false, ..cfg } };
            let mut engine = engine("opt", &device, cfg);
            let out = engine.generate(&prompts, &params).unwrap();
            assert_eq!(engine.stats().partial_prefills > 0, chunked);
            assert!(engine.block_manager().all_blocks_free());
            ids(&out)
        };
        assert_eq!(run(true), run(false), "{params:?}");
    }
}

/// Prompt log-probabilities assembled over chunks equal those of the whole prompt in one step,
/// on one device and through two pipeline stages with each chunk cut into 3 token slices.
#[test]
fn prompt_logprobs_over_chunks_equal_one_step() {
    let device = Device::flex();
    let prompts: Vec<Prompt> = reference("llama").prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
    let params = SamplingParams { prompt_logprobs: Some(2), ignore_eos: true, ..SamplingParams::greedy(3) };
    let whole = engine("llama", &device, config(128, 4, PreemptionMode::Auto)).generate(&prompts, &params).unwrap();
    let cfg = budgeted(config(128, 4, PreemptionMode::Auto), 7, true);
    let mut chunked = engine("llama", &device, cfg.clone());
    assert_same_prompt_logprobs(&chunked.generate(&prompts, &params).unwrap(), &whole);
    assert!(chunked.stats().partial_prefills > 0);
    let (model, files) = pipeline("llama", &[Device::flex(), Device::flex()]);
    let sliced = EngineConfig { prefill_slicing: Some(Arc::new(UniformSlices::new(3).unwrap())), ..cfg };
    let mut staged = LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, sliced).unwrap();
    assert_same_prompt_logprobs(&staged.generate(&prompts, &params).unwrap(), &whole);
}

/// Asserts `a` and `b` generated the same tokens with the same prompt log-probabilities (ids
/// equal, log-probabilities within 1e-4).
fn assert_same_prompt_logprobs(a: &GenerationOutput, b: &GenerationOutput) {
    assert_eq!(ids(a), ids(b));
    for (a, b) in a.requests.iter().zip(&b.requests) {
        let (a, b) = (a.prompt_logprobs.as_ref().unwrap(), b.prompt_logprobs.as_ref().unwrap());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            match (x, y) {
                (None, None) => {}
                (Some(x), Some(y)) => {
                    let ids = |e: &[burn_llm::models::TokenLogprob]| e.iter().map(|t| t.id).collect::<Vec<_>>();
                    assert_eq!(ids(x), ids(y));
                    assert!(x.iter().zip(y).all(|(p, q)| (p.logprob - q.logprob).abs() < 1e-4), "{x:?} vs {y:?}");
                }
                _ => panic!("positions differ: {x:?} vs {y:?}"),
            }
        }
    }
}

/// Through two pipeline stages on flex with uniform token slices (3 per prefill chunk, each a
/// micro-batch of its own), greedy outputs equal plain generation on one device, with chunked
/// prefill, in a roomy pool and under preemption by swap and by recomputation.
#[test]
fn sliced_pipeline_prefill_equals_one_device() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let slicing = Arc::new(UniformSlices::new(3).unwrap());
    for name in ["llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = one_by_one(&plain, &prompts, &params);
        for (pool, cfg) in pools(&prompts, &expected) {
            for budget in [16, 512] {
                let what = format!("{name}, {pool} pool, steps of {budget} tokens");
                let (model, files) = pipeline(name, &[Device::flex(), Device::flex()]);
                let cfg =
                    EngineConfig { prefill_slicing: Some(slicing.clone()), ..budgeted(cfg.clone(), budget, true) };
                let mut engine = LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, cfg).unwrap();
                assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected, "{what}");
                assert_pool_behaviour(pool, engine.stats(), engine.block_manager().all_blocks_free(), &what);
            }
        }
    }
    // Uneven slices (the first token alone) give the same tokens; a slicing that does not cover
    // the chunk is an error, not a wrong answer: the runner does slice over stages.
    let prompts = mixed_prompts("llama");
    let plain = Generator::from(Pretrained::load(&fixture("llama"), &Device::flex()).unwrap());
    let expected = one_by_one(&plain, &prompts, &params);
    for (slicing, ok) in [(Slicing::FirstAlone, true), (Slicing::OneTooMany, false)] {
        let (model, files) = pipeline("llama", &[Device::flex(), Device::flex()]);
        let cfg = EngineConfig { prefill_slicing: Some(Arc::new(slicing)), ..config(256, 4, PreemptionMode::Auto) };
        let mut engine = LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, cfg).unwrap();
        match engine.generate(&prompts, &params) {
            Ok(out) => assert!(ok && ids(&out) == expected, "{slicing:?}"),
            Err(e) => assert!(!ok && e.to_string().contains("prefill slicing"), "{slicing:?}: {e}"),
        }
    }
}

/// Test slicings: the first token alone, then the rest; or one token more than the chunk has.
#[derive(Debug, Clone, Copy)]
enum Slicing {
    FirstAlone,
    OneTooMany,
}

impl PrefillSlicing for Slicing {
    fn slices(&self, len: usize, _context: usize) -> Vec<usize> {
        match self {
            Self::FirstAlone => vec![1, len - 1],
            Self::OneTooMany => vec![len + 1],
        }
    }
}

/// SmolLM2 with exact matmuls: greedy outputs with prompts prefilled in chunks of 32 tokens
/// beside each other's decodes equal those of whole prompts.
#[test]
fn smollm2_chunked_prefill_equals_whole_prompts() {
    use burn_llm::kernels::{MatmulPrecision, with_matmul_precision};

    let prompts: Vec<Prompt> = [
        "The history of the printing press begins in the fifteenth century, when ".repeat(4),
        "Write a short poem about the sea.".to_string(),
        "Paris is the capital of France. Berlin is the capital of Germany. Rome is".to_string(),
    ]
    .into_iter()
    .map(Prompt::from)
    .collect();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let run = |cfg: EngineConfig| {
        let pretrained = Pretrained::load(&crate::real_model::smollm2(), &Device::flex()).unwrap();
        let mut engine = LlmEngine::new(pretrained, cfg).unwrap();
        let out = with_matmul_precision(MatmulPrecision::Exact, || engine.generate(&prompts, &params)).unwrap();
        (ids(&out), engine.stats().partial_prefills)
    };
    let base = config(64, 16, PreemptionMode::Auto);
    let (whole, none) = run(EngineConfig { chunked_prefill: false, ..base.clone() });
    let (chunked, partial) = run(budgeted(base, 32, true));
    assert_eq!((none, partial > 0), (0, true));
    assert_eq!(chunked, whole);
}

/// The CLI: chunked prefill is the default, `--no-chunked-prefill` turns it off; with steps of one
/// token the prompt is prefilled a token at a time and gives the plain engine's text, and without
/// chunking it is refused with an error that says what to change.
#[test]
fn the_cli_flag_turns_chunking_off() {
    use burn_llm::cli::GenerateArgs;
    use clap::Parser;

    let parse = |flags: &[&str]| GenerateArgs::try_parse_from([&["x"], flags].concat()).unwrap();
    assert!(parse(&["--engine", "paged"]).engine.engine_config().chunked_prefill);
    assert!(!parse(&["--engine", "paged", "--no-chunked-prefill"]).engine.engine_config().chunked_prefill);
    let plain = crate::parallel::cli(&["--device", "flex"]).unwrap();
    let paged = ["--device", "flex", "--engine", "paged", "--kv-cache-memory", "blocks:64"];
    let chunked = crate::parallel::cli(&[&paged[..], &["--max-num-batched-tokens", "1"]].concat()).unwrap();
    assert_eq!(crate::parallel::text(&chunked), crate::parallel::text(&plain));
    let err = crate::parallel::cli(&[&paged[..], &["--max-num-batched-tokens", "1", "--no-chunked-prefill"]].concat())
        .unwrap_err();
    assert!(err.contains("--no-chunked-prefill") && err.contains("--max-num-batched-tokens"), "{err}");
}
