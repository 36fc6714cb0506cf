//! Batch invariance (issue 32 §6): on Flex's default kernels a request's greedy tokens and
//! log-probabilities do not depend on which other requests share its steps. The same prompts run
//! alone, in batches of 4, 16 and 32 beside other prompts, arriving while the others decode
//! (prefill rows in decode steps), and under chunked prefill (prompt chunks beside decode rows),
//! through the paged engine, and in the plain engine's left-padded static batch; every run must
//! give each prompt the same ids and log-probabilities (within 1e-6). Models: the tiny fixtures
//! as loaded (dense `f32` products; sliding windows on Gemma 3 and Mistral), the LLaMA fixture
//! with its projections in GGUF's layout (4-bit groups of 32 along the input: the default 8-bit
//! input-row integer path), and the real SmolLM2 Q4_1.

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::tensor::{Device, Tensor};
use burn_llm::Generator;
use burn_llm::kernels::{QuantSpec, quantize};
use burn_llm::models::layers::projection::{Projection, QLinear};
use burn_llm::models::{Pretrained, Prompt, RequestOutput, SamplingParams, StepOutput};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine, PreemptionMode};
use rand::{Rng, SeedableRng};

use crate::archs::ARCH_FIXTURES;
use crate::common::{FIXTURES, fixture};
use crate::real_model::smollm2;

/// What a request produced: its ids and, per step, the log-probabilities returned with them.
type Trace = (Vec<u32>, Vec<(u32, f32)>);
/// Named prompts added to the engine together.
type Wave = Vec<(String, Prompt)>;

fn trace(out: &RequestOutput) -> Trace {
    let logprobs = out.logprobs.iter().flatten().flatten().map(|l| (l.id, l.logprob)).collect();
    (out.generated_ids.clone(), logprobs)
}

/// An engine over `pretrained` with a roomy pool; steps of at most `budget` tokens with chunked
/// prefill when `budget` is set.
fn engine(pretrained: Pretrained, budget: Option<usize>) -> LlmEngine {
    let config = EngineConfig {
        block_size: 16,
        kv_cache_memory: KvCacheMemory::Blocks(512),
        max_num_seqs: 64,
        preemption: PreemptionMode::Auto,
        max_num_batched_tokens: budget,
        chunked_prefill: budget.is_some(),
        ..EngineConfig::default()
    };
    LlmEngine::new(pretrained, config).unwrap()
}

/// Runs `waves` of requests: the first added at once, each later one after `gap` more steps, then
/// steps until all finish; returns every request's trace by id.
fn drive(engine: &mut LlmEngine, waves: &[Wave], params: &SamplingParams, gap: usize) -> HashMap<String, Trace> {
    let mut traces = HashMap::new();
    let mut collect = |outputs: Vec<StepOutput>| {
        for out in outputs {
            if let Some(finished) = out.finished {
                traces.insert(out.request_id.clone(), trace(&finished[0]));
            }
        }
    };
    for (w, wave) in waves.iter().enumerate() {
        for (id, prompt) in wave {
            engine.add_request(id.clone(), prompt.clone(), params.clone()).unwrap();
        }
        if w + 1 < waves.len() {
            for _ in 0..gap {
                collect(engine.step().unwrap());
            }
        }
    }
    while engine.has_unfinished_requests() {
        collect(engine.step().unwrap());
    }
    assert!(engine.block_manager().all_blocks_free(), "blocks leaked");
    traces
}

/// Seeded prompts of 1 to 24 ids below `vocab` (ids from 3: past the usual special tokens).
fn fillers(count: usize, vocab: u32, seed: u64) -> Vec<Prompt> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let len = rng.random_range(1..=24);
            Prompt::Ids((0..len).map(|_| rng.random_range(3..vocab)).collect())
        })
        .collect()
}

fn named(prefix: &str, prompts: &[Prompt]) -> Wave {
    prompts.iter().enumerate().map(|(i, p)| (format!("{prefix}{i}"), p.clone())).collect()
}

/// Asserts that `targets` get the same traces alone as in batches of 4, 16 and 32 (with other
/// prompts, all at once and arriving during the others' decode) and under chunked prefill;
/// `load` builds a fresh model each time.
fn assert_batch_invariant(
    what: &str,
    load: &dyn Fn() -> Pretrained,
    targets: &[Prompt],
    vocab: u32,
    new_tokens: usize,
) {
    let params = SamplingParams { ignore_eos: true, logprobs: Some(2), ..SamplingParams::greedy(new_tokens) };
    let alone: Vec<Trace> = targets
        .iter()
        .map(|p| {
            drive(&mut engine(load(), None), &[named("t", std::slice::from_ref(p))], &params, 0).remove("t0").unwrap()
        })
        .collect();
    let others = fillers(32, vocab, 7);
    let targets = named("t", targets);
    let with = |n: usize| [targets.clone(), named("f", &others[..n.saturating_sub(targets.len())])].concat();
    // (label, waves, steps between waves, step budget)
    let runs: Vec<(&str, Vec<Wave>, usize, Option<usize>)> = vec![
        ("batch of 4", vec![targets.clone()], 0, None),
        ("batch of 16", vec![with(16)], 0, None),
        ("batch of 32", vec![with(32)], 0, None),
        ("arriving during 28 decodes", vec![named("f", &others[..28]), targets.clone()], 3, None),
        ("chunked prefill, steps of 7 tokens", vec![with(16)], 0, Some(7)),
        ("chunked prefill beside decodes", vec![named("f", &others[..12]), targets.clone()], 2, Some(20)),
    ];
    for (label, waves, gap, budget) in runs {
        let got = drive(&mut engine(load(), budget), &waves, &params, gap);
        for (i, expected) in alone.iter().enumerate() {
            let (ids, logprobs) = got.get(&format!("t{i}")).expect("every target finishes");
            assert_eq!(ids, &expected.0, "{what}: prompt {i}, {label}: ids differ from the prompt alone");
            assert_eq!(logprobs.len(), expected.1.len(), "{what}: prompt {i}, {label}");
            for (step, (a, b)) in logprobs.iter().zip(&expected.1).enumerate() {
                assert!(
                    a.0 == b.0 && (a.1 - b.1).abs() <= 1e-6,
                    "{what}: prompt {i}, {label}, log-probability {step}: {a:?} vs {b:?} alone"
                );
            }
        }
    }
}

/// Prompts of a fixture's vocabulary: varied lengths (1 to 20 ids).
fn targets(vocab: u32) -> Vec<Prompt> {
    fillers(4, vocab, 11)
}

fn vocab_of(path: &Path) -> u32 {
    Pretrained::load(path, &Device::flex()).unwrap().model.spec.vocab_size as u32
}

/// Asserts that the plain engine's static batch gives `targets` the traces they get alone when
/// they share it with 12 other prompts: every sequence is left-padded to the longest prompt, and
/// a local layer's window hides different slots of each row.
fn assert_static_batch_invariant(
    what: &str,
    pretrained: Pretrained,
    targets: &[Prompt],
    vocab: u32,
    new_tokens: usize,
) {
    let generator = Generator::from(pretrained);
    let params = SamplingParams { ignore_eos: true, logprobs: Some(2), ..SamplingParams::greedy(new_tokens) };
    let batch = [targets, &fillers(12, vocab, 5)].concat();
    let together = generator.generate(&batch, &params).unwrap();
    for (i, prompt) in targets.iter().enumerate() {
        let alone = generator.generate(std::slice::from_ref(prompt), &params).unwrap();
        let ((ids, logprobs), (expected_ids, expected)) = (trace(&together.requests[i]), trace(&alone.requests[0]));
        assert_eq!(ids, expected_ids, "{what}: prompt {i} (static batch): ids differ from the prompt alone");
        assert_eq!(logprobs.len(), expected.len(), "{what}: prompt {i}");
        for (step, (a, b)) in logprobs.iter().zip(&expected).enumerate() {
            assert!(
                a.0 == b.0 && (a.1 - b.1).abs() <= 1e-6,
                "{what}: prompt {i} (static batch), log-probability {step}: {a:?} vs {b:?} alone"
            );
        }
    }
}

/// The plain engine on every tiny fixture, the sliding-window ones (Gemma 3, Mistral: windows
/// shorter than prompt + generation) included.
#[test]
fn static_batch_is_invariant_on_every_fixture() {
    for name in FIXTURES.iter().chain(&ARCH_FIXTURES) {
        let path = fixture(name);
        let vocab = vocab_of(&path);
        assert_static_batch_invariant(
            name,
            Pretrained::load(&path, &Device::flex()).unwrap(),
            &targets(vocab),
            vocab,
            12,
        );
    }
}

/// Every tiny fixture as loaded (`f32` weights: the register-tiled dense products), the
/// sliding-window architectures included.
#[test]
fn greedy_is_batch_invariant_on_dense_fixtures() {
    for name in FIXTURES.iter().chain(&ARCH_FIXTURES) {
        let path = fixture(name);
        let vocab = vocab_of(&path);
        let load = || Pretrained::load(&path, &Device::flex()).unwrap();
        assert_batch_invariant(name, &load, &targets(vocab), vocab, 10);
    }
}

/// `p` as GGUF stores a `Q4_0`/`Q4_1` weight: `[out, in]`, 4-bit groups of 32 along the input.
fn gguf_layout(p: Projection) -> Projection {
    let Projection::Dense(linear) = p else { return p };
    let w: Tensor<2> = linear.weight.val().transpose();
    let w = Tensor::from_data(w.into_data(), &Device::flex());
    let q = quantize(w, QuantSpec::new(4, 32, 1).unwrap()).unwrap();
    Projection::Quantized(QLinear::from_out_in(q, linear.bias.map(|b| Param::from_tensor(b.val()))))
}

/// The LLaMA fixture with its projections in GGUF's layout: the default integer path (8-bit
/// input rows, integer block dots).
#[test]
fn greedy_is_batch_invariant_on_the_integer_path() {
    let path = fixture("llama");
    let vocab = vocab_of(&path);
    let load = || {
        let mut pretrained = Pretrained::load(&path, &Device::flex()).unwrap();
        for layer in &mut pretrained.model.layers {
            let (attn, mlp) = (&mut layer.attn, &mut layer.mlp);
            for p in [&mut attn.q, &mut attn.o, &mut mlp.up, &mut mlp.down] {
                *p = gguf_layout(p.clone());
            }
            attn.k = attn.k.take().map(gguf_layout);
            attn.v = attn.v.take().map(gguf_layout);
            mlp.gate = mlp.gate.take().map(gguf_layout);
        }
        assert!(matches!(&pretrained.model.layers[0].attn.q, Projection::Quantized(q) if q.input_grouped));
        pretrained
    };
    assert_batch_invariant("llama, GGUF-layout Q4", &load, &targets(vocab), vocab, 10);
}

/// The real SmolLM2 Q4_1 (Q8_0 tied head) on its shipped blocks, default precision.
#[test]
fn smollm2_greedy_is_batch_invariant() {
    let path = smollm2();
    let load = || Pretrained::load(&path, &Device::flex()).unwrap();
    let targets: Vec<Prompt> =
        ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are"]
            .into_iter()
            .map(Prompt::from)
            .collect();
    assert_batch_invariant("SmolLM2 Q4_1", &load, &targets, 49152, 12);
}
