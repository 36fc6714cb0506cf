//! Seeded random cost profiles for the planners' tests.

use burn_plan::profile::{
    DecodeTable, EngineStep, EngineStepTable, Extra, PrefillStepTable, PrefillTable, Profile, RunSpread, Spread,
    StepVariation, TpScaling,
};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub(super) fn profile(rng: &mut ChaCha8Rng) -> Profile {
    let batch = vec![1.0, 4.0, 16.0];
    let tokens = vec![1.0, 8.0, 64.0];
    let (a, b) = (rng.random_range(0.05..0.5), rng.random_range(0.001..0.02));
    let base_ms = batch.iter().map(|&bb: &f64| tokens.iter().map(|&t: &f64| a + b * bb * t).collect()).collect();
    let (c, d, e) = (rng.random_range(0.05..0.3), rng.random_range(0.001..0.05), rng.random_range(0.0..0.0005));
    let context = vec![0.0, 64.0, 256.0];
    let ms = batch.iter().map(|&bb: &f64| context.iter().map(|&cc: &f64| c + d * bb + e * bb * cc).collect()).collect();
    Profile {
        version: burn_plan::profile::PROFILE_VERSION,
        model: None,
        device: None,
        layers: rng.random_range(2..=8),
        prefill: PrefillTable { batch: batch.clone(), tokens, base_ms, context_ms: [0.0, 0.0, 0.0, 0.0001] },
        decode: DecodeTable { batch, context, ms },
        weight_bytes_per_layer: 1000,
        kv_bytes_per_token_per_layer: 2,
        embedding: Extra { weight_bytes: 500, ms_per_token: 0.0001 },
        lm_head: Extra { weight_bytes: 500, ms_per_token: rng.random_range(0.0..0.05) },
        tensor_parallel: vec![TpScaling { degree: 2, time_scale: rng.random_range(0.5..0.9), sync_ms_per_layer: 0.01 }],
        engine_step: rng.random_bool(0.7).then(|| EngineStep {
            prefill_ms_fixed: rng.random_range(0.0..2.0),
            prefill_ms_per_seq: rng.random_range(0.0..0.3),
            prefill_ms_per_token: rng.random_range(0.0..0.01),
            decode_ms_fixed: rng.random_range(0.0..2.0),
            decode_ms_per_seq: rng.random_range(0.0..0.3),
        }),
        call_ms: 0.0,
        engine_step_ms: rng.random_bool(0.5).then(|| engine_table(rng)),
        step_variation: rng.random_bool(0.5).then(|| StepVariation {
            prefill: rng.random_range(0.0..0.5),
            decode: rng.random_range(0.0..0.3),
            runs: rng.random_bool(0.5).then(|| RunSpread {
                decode_steps: rng.random_range(1..=8),
                prefill: Spread { mean: rng.random_range(0.0..0.1), std: rng.random_range(0.0..0.4) },
                decode: Spread { mean: rng.random_range(0.0..0.1), std: rng.random_range(0.0..0.4) },
            }),
        }),
    }
}

/// Measured engine steps, whole model: half of them jump from batch 1 to batch 2 (a CPU's
/// matmul switching kernels), so that the time per sequence grows there.
pub(super) fn engine_table(rng: &mut ChaCha8Rng) -> EngineStepTable {
    let jump = if rng.random_bool(0.5) { rng.random_range(0.5..6.0) } else { 0.0 };
    let (p0, p1) = (rng.random_range(0.5..4.0), rng.random_range(0.001..0.02));
    let (d0, d1, d2) = (rng.random_range(0.5..4.0), rng.random_range(0.0..0.5), rng.random_range(0.0..0.001));
    let step = |b: f64| if b > 1.0 { jump } else { 0.0 };
    let prefill_batch = vec![1.0, 2.0, 4.0, 8.0];
    let tokens = vec![8.0, 64.0];
    let decode_batch = vec![1.0, 2.0, 3.0, 8.0];
    let context = vec![0.0, 128.0];
    EngineStepTable {
        prefill: PrefillStepTable {
            ms: prefill_batch.iter().map(|&b| tokens.iter().map(|&t| p0 + step(b) + p1 * b * t).collect()).collect(),
            batch: prefill_batch,
            tokens,
        },
        decode: DecodeTable {
            ms: decode_batch
                .iter()
                .map(|&b| context.iter().map(|&c| d0 + step(b) + d1 * b + d2 * b * c).collect())
                .collect(),
            batch: decode_batch,
            context,
        },
    }
}

/// The profile the Burn profiler measured on SmolLM2-135M on Flex (a sample input) plans.
#[test]
fn profile_measured_on_smollm2_is_a_valid_planner_input() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("inputs/smollm2-flex-profile.json");
    let p: burn_plan::profile::Profile = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(p.layers, 30);
    let sliced = burn_plan::slices::plan(&burn_plan::slices::SlicesInput {
        seq_len: 256,
        stages: 3,
        profile: Some(p),
        unit_tokens: Some(16),
        ..burn_plan::slices::SlicesInput::default()
    })
    .unwrap();
    assert_eq!(sliced.slices.iter().sum::<usize>(), 256);
}
