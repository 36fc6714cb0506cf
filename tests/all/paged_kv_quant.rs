//! The paged engine with group-quantized KV blocks (`--kv-quant 8|4`): with 8-bit blocks greedy
//! outputs equal the plain engine's with the same quantized cache (the same codes for the same
//! keys); 4-bit blocks hold keys per channel over each block's tokens (KIVI, with a float tail of
//! each unfinished block), so their outputs are checked against the paged engine itself running
//! each prompt alone in a roomy pool. Both under swap and recompute preemption, with prefix-cache
//! hits, forks and beams; a byte budget buys the blocks the quantized layout's size says.

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

/// Greedy outputs of the paged engine with 8-bit KV blocks equal the plain engine's with the same
/// `--kv-quant`, on every fixture and device, in a roomy pool and in pools so small that groups
/// are swapped out and back (codes, scales and minimums through host memory) or recomputed; no
/// block leaks.
#[test]
fn quantized_greedy_equals_plain_with_the_same_kv_quant() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let prompts = mixed_prompts(name);
            let bits = 8;
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

/// The paged engine with 4-bit blocks (keys per channel) gives, batched in a roomy pool and in one
/// so small that groups are swapped out and back (codes and float key tails through host memory),
/// the greedy outputs it gives each prompt alone in a roomy pool, on every fixture and device; no
/// block leaks. Recomputed groups (tails rebuilt) agree on most sequences but not all: their
/// prompt and output are computed again in one prefill, whose queries read an unfinished block
/// quantized over all its tokens where each decode step read it over the tokens so far, so deeper
/// layers' keys move a little and a near-tied greedy choice can flip.
#[test]
fn per_channel_kv4_greedy_survives_swap_and_recompute() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let prompts = mixed_prompts(name);
            let mut alone = engine(name, &device, quantized(config(256, 8, PreemptionMode::Auto), 4));
            let expected: Vec<Vec<u32>> = prompts
                .iter()
                .map(|p| alone.generate(std::slice::from_ref(p), &params).unwrap().requests[0].generated_ids.clone())
                .collect();
            let [(_, roomy), (_, swap), (_, recompute)] = pools(&prompts, &expected);
            // Blocks of 8 (4-bit channel codes fill whole words), as tight as `pools` makes them.
            let tight = |cfg: EngineConfig| {
                let KvCacheMemory::Blocks(n) = cfg.kv_cache_memory else { unreachable!() };
                EngineConfig { block_size: 8, kv_cache_memory: KvCacheMemory::Blocks(n.div_ceil(2) + 1), ..cfg }
            };
            let runs = [
                ("roomy", EngineConfig { block_size: 8, ..roomy }),
                ("swap", tight(swap)),
                ("recompute", tight(recompute)),
            ];
            for (label, cfg) in runs {
                let what = format!("{name} on {device_name}, per-channel kv4, {label} pool");
                let mut engine = engine(name, &device, quantized(cfg, 4));
                let out = engine.generate(&prompts, &params).unwrap();
                let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
                if label == "recompute" {
                    let same = got.iter().zip(&expected).filter(|(g, e)| g == e).count();
                    assert!(4 * same >= 3 * expected.len(), "{what}: {same} of {} sequences as alone", expected.len());
                    let first = |ids: &[Vec<u32>]| ids.iter().map(|s| s.first().copied()).collect::<Vec<_>>();
                    assert_eq!(first(&got), first(&expected), "{what}: first tokens");
                } else {
                    assert_eq!(got, expected, "{what}");
                }
                assert_pool_behaviour(label, engine.stats(), engine.block_manager().all_blocks_free(), &what);
            }
        }
    }
}

/// Two greedy samples of one prompt fork its partly filled last block (copy-on-write of its codes
/// and its float key tail): both equal the single greedy output, with 4-bit blocks of 8 and 16
/// tokens; beams (a fork every step) run without leaking a block.
#[test]
fn per_channel_kv4_forks_copy_their_tails() {
    let device = Device::flex();
    for name in FIXTURES {
        let reference = reference(name);
        for block_size in [8, 16] {
            let cfg = quantized(config(256, block_size, PreemptionMode::Auto), 4);
            let mut engine = engine(name, &device, cfg);
            for p in &reference.prompts {
                let prompt = [Prompt::Ids(p.input_ids.clone())];
                let one = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
                let single = engine.generate(&prompt, &one).unwrap().requests[0].generated_ids.clone();
                let two = engine.generate(&prompt, &SamplingParams { n: 2, ..one.clone() }).unwrap();
                for r in &two.requests {
                    assert_eq!(r.generated_ids, single, "{name}, blocks of {block_size}: forked sample");
                }
                let beams = SamplingParams { n: 2, beam: Some(BeamSearchParams::new(4)), ..one };
                let out = engine.generate(&prompt, &beams).unwrap();
                assert_eq!(out.requests.len(), 2, "{name}: beams");
            }
            assert!(engine.block_manager().all_blocks_free(), "{name}, blocks of {block_size}: blocks leaked");
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
    for (bits, block_size) in [(8, 4), (4, 8)] {
        let mut paged = engine("llama", &device, quantized(config(64, block_size, PreemptionMode::Auto), bits));
        // 8-bit blocks hold the plain engine's codes; 4-bit ones (keys per channel) are checked
        // against their own first, uncached run.
        let expected = if bits == 8 {
            let pretrained = Pretrained::load(&fixture("llama"), &device).unwrap();
            let spec = fit_kv_quant(pretrained.model.kv_layout(), kv(bits)).unwrap();
            let plain = Generator::from(pretrained).with_kv_quantization(spec).unwrap();
            one_by_one(&plain, &[Prompt::Ids(long.clone())], &params).remove(0)
        } else {
            paged.generate(&[Prompt::Ids(long.clone())], &params).unwrap().requests[0].generated_ids.clone()
        };
        let cached_before = paged.stats().cached_tokens;
        for round in 0..2 {
            let out = paged.generate(&[Prompt::Ids(long.clone())], &params).unwrap();
            assert_eq!(out.requests[0].generated_ids, expected, "kv{bits} round {round}");
        }
        let full_blocks = (long.len() - 1) / block_size * block_size;
        let rounds = if bits == 8 { 1 } else { 2 };
        assert_eq!(
            paged.stats().cached_tokens - cached_before,
            rounds * full_blocks,
            "kv{bits}: every full prompt block is reused"
        );
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
/// scale and minimum per group in the model's dtype: for `f32` heads of 16, per layer and head,
/// values in groups of `g` along the head take `block_size · (16 · bits / 8 + 16 / g · 2 · 4)`
/// bytes, and 4-bit keys (per channel over the block's tokens) `block_size · 8 + 16 · 2 · 4`.
/// 4-bit caches also keep a float key tail per sequence run at once (`max_num_seqs` of them,
/// `block_size · 16 · 4` bytes a layer and head), taken from the budget first. 8-bit blocks (one
/// group: 64 doesn't tile the head) and 4-bit ones in FlexGen's groups (`--compress-cache`: one
/// group here) hold over twice the tokens of `f32` ones in the same budget (4-bit ones less than
/// their codes alone say on these 16-wide heads: a channel's scale and minimum over 8 tokens, and
/// the tails).
#[test]
fn a_byte_budget_buys_more_quantized_blocks() {
    let device = Device::flex();
    let pretrained = Pretrained::load(&fixture("llama"), &device).unwrap();
    let layout = pretrained.model.kv_layout();
    assert_eq!(layout.head_dim, 16, "the formula below is written for the fixture's heads");
    let block_size = 8;
    let heads = layout.num_layers * layout.num_kv_heads;
    let budget = 1 << 20;
    let flexgen = QuantSpec::flexgen(KV_QUANT_AXIS);
    let cfg = |quant: Option<QuantSpec>| EngineConfig {
        kv_cache_memory: KvCacheMemory::Bytes(budget as u64),
        kv_quant: quant,
        ..config(0, block_size, PreemptionMode::Auto)
    };
    let blocks = |quant: Option<QuantSpec>| {
        let engine = LlmEngine::new(Pretrained::load(&fixture("llama"), &device).unwrap(), cfg(quant)).unwrap();
        engine.block_manager().total_blocks(Location::Device)
    };
    let float = 2 * heads * block_size * 16 * 4;
    let kv8 = 2 * heads * block_size * (16 + 2 * 4);
    let keys4 = heads * (block_size * 8 + 16 * 2 * 4);
    let values4 = |groups: usize| heads * block_size * (8 + groups * 2 * 4);
    let (kv4g8, kv4_flexgen) = (keys4 + values4(2), keys4 + values4(1));
    let tail = heads * block_size * 16 * 4;
    let seqs = config(0, block_size, PreemptionMode::Auto).max_num_seqs;
    let kv4g8_spec = kv_quant(4, Some(8)).unwrap();
    let fitted = |spec| Some(fit_kv_quant(layout, spec).unwrap());
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, None), float);
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(kv(8))), kv8);
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(kv4g8_spec)), kv4g8);
    assert_eq!(PagedKvCache::tail_bytes(&layout, block_size), tail);
    // The default 4-bit groups of 32 do not tile the fixture's 16-wide heads: one group per head.
    assert_eq!(fitted(kv(4)), fitted(flexgen));
    assert_eq!(PagedKvCache::block_bytes(&layout, block_size, fitted(flexgen)), kv4_flexgen);
    assert_eq!(blocks(None), budget / float);
    assert_eq!(blocks(Some(kv(8))), budget / kv8);
    assert_eq!(blocks(Some(kv4g8_spec)), (budget - seqs * tail) / kv4g8);
    assert_eq!(blocks(Some(flexgen)), (budget - seqs * tail) / kv4_flexgen);
    assert!(blocks(Some(kv(8))) > 2 * blocks(None) && blocks(Some(flexgen)) > 2 * blocks(None));
    // A budget too small for every sequence's tail buys one tail per block.
    let small = 40 * (kv4_flexgen + tail);
    let tiny = EngineConfig { kv_cache_memory: KvCacheMemory::Bytes(small as u64), ..cfg(fitted(flexgen)) };
    assert_eq!(tiny.device_blocks(kv4_flexgen, tail, 0, true).unwrap().0, 40);
    // 4-bit channel codes fill whole words only in blocks of a multiple of 8 tokens.
    let err = LlmEngine::new(
        Pretrained::load(&fixture("llama"), &device).unwrap(),
        EngineConfig { block_size: 4, ..cfg(Some(kv(4))) },
    )
    .unwrap_err();
    assert!(err.to_string().contains("multiple of 8"), "{err}");
}
