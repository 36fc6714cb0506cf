//! The paged engine with group-quantized KV blocks (`--kv-quant 8|4`): greedy outputs equal the
//! plain engine's with the same quantized cache (the same codes for the same keys), under swap and
//! recompute preemption, with prefix-cache hits and beams; a byte budget buys the blocks the
//! quantized layout's size says.

use burn::tensor::Device;
use burn_llm::BeamSearchParams;
use burn_llm::Generator;
use burn_llm::kernels::QuantSpec;
use burn_llm::models::cache::{KV_QUANT_AXIS, fit_kv_quant, kv_quant};
use burn_llm::models::{Pretrained, Prompt, SamplingParams};
use burn_llm::paged::cache::PagedKvCache;
use burn_llm::paged::memory::Location;
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine, PreemptionMode};

use crate::common::{FIXTURES, devices, fixture, reference};
use crate::paged::{assert_pool_behaviour, config, engine, mixed_prompts, one_by_one, pools};

/// `--kv-quant bits` with its default group along the head (fitted to each model when it is
/// built).
fn kv(bits: u32) -> QuantSpec {
    kv_quant(bits, None).unwrap()
}

fn quantized(cfg: EngineConfig, bits: u32) -> EngineConfig {
    EngineConfig { kv_quant: Some(kv(bits)), ..cfg }
}

/// Greedy outputs of the paged engine with 8- and 4-bit KV blocks equal the plain engine's with
/// the same `--kv-quant`, on every fixture and device, in a roomy pool and in pools so small that
/// groups are swapped out and back (codes, scales and minimums through host memory) or
/// recomputed; no block leaks.
#[test]
fn quantized_greedy_equals_plain_with_the_same_kv_quant() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let prompts = mixed_prompts(name);
            for bits in [8, 4] {
                let pretrained = Pretrained::load(&fixture(name), &device).unwrap();
                let spec = fit_kv_quant(pretrained.model.kv_layout(), kv(bits)).unwrap();
                let plain = Generator::from(pretrained).with_kv_quantization(spec).unwrap();
                let expected = one_by_one(&plain, &prompts, &params);
                for (label, cfg) in pools(&prompts, &expected) {
                    let what = format!("{name} on {device_name}, kv{bits}, {label} pool");
                    let mut engine = engine(name, &device, quantized(cfg, bits));
                    let out = engine.generate(&prompts, &params).unwrap();
                    let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
                    assert_eq!(got, expected, "{what}");
                    assert_pool_behaviour(label, engine.stats(), engine.block_manager().all_blocks_free(), &what);
                }
            }
        }
    }
}

/// A prompt seen before maps its full blocks from the prefix cache (quantized blocks reused as
/// they are) and generates what the plain engine with the same `--kv-quant` generates.
#[test]
fn quantized_prefix_cache_hits_give_the_same_tokens() {
    let device = Device::flex();
    let reference = reference("llama");
    let long = &reference.prompts.iter().max_by_key(|p| p.input_ids.len()).unwrap().input_ids;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    for bits in [8, 4] {
        let pretrained = Pretrained::load(&fixture("llama"), &device).unwrap();
        let spec = fit_kv_quant(pretrained.model.kv_layout(), kv(bits)).unwrap();
        let plain = Generator::from(pretrained).with_kv_quantization(spec).unwrap();
        let expected = one_by_one(&plain, &[Prompt::Ids(long.clone())], &params);
        let mut paged = engine("llama", &device, quantized(config(64, 4, PreemptionMode::Auto), bits));
        for round in 0..2 {
            let out = paged.generate(&[Prompt::Ids(long.clone())], &params).unwrap();
            assert_eq!(out.requests[0].generated_ids, expected[0], "kv{bits} round {round}");
        }
        let full_blocks = (long.len() - 1) / 4 * 4;
        assert_eq!(paged.stats().cached_tokens, full_blocks, "kv{bits}: every full prompt block is reused");
    }
}

/// Beam search forks a beam's blocks (copy-on-write of the last, partly filled one) every step:
/// with 8-bit KV blocks it returns the same beams whatever the block size (other blocks are then
/// shared and copied, so a copy that lost a block's scales or minimums would show); no block
/// leaks. (Against float blocks the beams may differ: 8-bit keys move near-tied scores.)
#[test]
fn quantized_beams_fork_their_blocks() {
    for name in FIXTURES {
        let reference = reference(name);
        let params = SamplingParams {
            n: 2,
            ignore_eos: true,
            beam: Some(BeamSearchParams::new(4)),
            ..SamplingParams::greedy(8)
        };
        let run = |block_size: usize, bits: Option<u32>| {
            let cfg = EngineConfig { kv_quant: bits.map(kv), ..config(256, block_size, PreemptionMode::Auto) };
            let mut engine = engine(name, &Device::flex(), cfg);
            let beams: Vec<Vec<Vec<u32>>> = reference
                .prompts
                .iter()
                .map(|p| {
                    let out = engine.generate(&[Prompt::Ids(p.input_ids.clone())], &params).unwrap();
                    out.requests.iter().map(|r| r.generated_ids.clone()).collect()
                })
                .collect();
            assert!(engine.block_manager().all_blocks_free(), "{name}: blocks leaked");
            beams
        };
        assert_eq!(run(4, Some(8)), run(16, Some(8)), "{name}: kv8 beams depend on the block size");
    }
}

/// A byte budget buys `budget / block_bytes` blocks, a quantized block taking its codes plus a
/// scale and minimum per group in the model's dtype: for `f32` heads of 16 in `g` groups,
/// `kv_heads · block_size · (16 · bits / 8 + g · 2 · 4)` bytes per layer for K and for V. 8-bit
/// blocks (one group: 64 doesn't tile the head) hold 64 / 24, 4-bit ones in the default groups of
/// 8 64 / 24 and in FlexGen's groups (`--compress-cache`: one group here) 64 / 16 times the
/// tokens of `f32` ones in the same budget.
#[test]
fn a_byte_budget_buys_more_quantized_blocks() {
    let device = Device::flex();
    let pretrained = Pretrained::load(&fixture("llama"), &device).unwrap();
    let layout = pretrained.model.kv_layout();
    assert_eq!(layout.head_dim, 16, "the formula below is written for the fixture's heads");
    let block_size = 4;
    let per_layer = |bytes_per_slot: usize| 2 * layout.num_layers * layout.num_kv_heads * block_size * bytes_per_slot;
    let budget = 1 << 20;
    let flexgen = QuantSpec::flexgen(KV_QUANT_AXIS);
    let blocks = |quant: Option<QuantSpec>| {
        let cfg = EngineConfig {
            kv_cache_memory: KvCacheMemory::Bytes(budget as u64),
            kv_quant: quant,
            ..config(0, block_size, PreemptionMode::Auto)
        };
        let engine = LlmEngine::new(Pretrained::load(&fixture("llama"), &device).unwrap(), cfg).unwrap();
        engine.block_manager().total_blocks(Location::Device)
    };
    let float = per_layer(16 * 4);
    let kv8 = per_layer(16 + 2 * 4);
    // 4-bit codes in groups of 8 (`--kv-group-size 8`): two scales and minimums per head.
    let kv4 = per_layer(8 + 2 * 2 * 4);
    let kv4g8 = kv_quant(4, Some(8)).unwrap();
    let kv4_flexgen = per_layer(8 + 2 * 4);
    let fitted = |spec| Some(fit_kv_quant(layout, spec).unwrap());
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, None), float);
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(kv(8))), kv8);
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(kv4g8)), kv4);
    // The default 4-bit groups of 32 do not tile the fixture's 16-wide heads: one group per head.
    assert_eq!(fitted(kv(4)), fitted(flexgen));
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(flexgen)), kv4_flexgen);
    assert_eq!(blocks(None), budget / float);
    assert_eq!(blocks(Some(kv(8))), budget / kv8);
    assert_eq!(blocks(Some(kv4g8)), budget / kv4);
    assert_eq!(blocks(Some(flexgen)), budget / kv4_flexgen);
    assert!(blocks(Some(kv(8))) > 2 * blocks(None) && blocks(Some(flexgen)) > 3 * blocks(None));
}
