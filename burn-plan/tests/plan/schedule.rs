//! ExeGPT's planner: branch-and-bound against exhaustive search, its throughput-latency trade,
//! the pipeline's stage split, and the simulator against a hand-computed timeline.

use burn_plan::profile::{DecodeTable, EngineStep, Extra, PrefillTable, Profile};
use burn_plan::schedule::{self, LengthDistribution, ScheduleError, ScheduleInput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::close;
use super::profiles::profile;

pub(super) fn random_lengths(rng: &mut ChaCha8Rng, max: usize) -> LengthDistribution {
    LengthDistribution::Histogram(
        (0..rng.random_range(1..=4)).map(|_| (rng.random_range(1..=max), rng.random_range(0.1..1.0))).collect(),
    )
}

#[test]
fn plan_schedule_branch_and_bound_matches_exhaustive_search() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut feasible = 0;
    for case in 0..200 {
        let lengths = schedule_input(profile(&mut rng), random_lengths(&mut rng, 40), random_lengths(&mut rng, 12));
        let mut input = ScheduleInput {
            devices: rng.random_range(1..=4),
            device_memory_bytes: rng.random_range(3_000..40_000),
            latency_bound_s: rng.random_range(0.002..0.3),
            max_encode_batch: Some(rng.random_range(1..=12)),
            max_decode_batch: rng.random_bool(0.4).then(|| rng.random_range(1..=24)),
            // Half the cases with devices that slow each other down: the bounds stay valid.
            interference: if rng.random_bool(0.5) { rng.random_range(0.0..2.0) } else { 0.0 },
            // And a quarter with a `κ` of its own at a larger batch, above or below the first.
            interference_at_batch: rng.random_bool(0.25).then(|| schedule::BatchInterference {
                batch: rng.random_range(1.0..6.0),
                kappa: rng.random_range(0.0..2.0),
            }),
            waa_interference: None,
            ..lengths
        };
        let bnb = schedule::plan(&input);
        input.exhaustive = true;
        let all = schedule::plan(&input);
        match (&bnb, &all) {
            (Ok(a), Ok(b)) => {
                feasible += 1;
                assert!(close(a.throughput_qps, b.throughput_qps), "case {case}: {a:?} vs {b:?}");
                // Never violates its own bound.
                assert!(a.latency_s <= input.latency_bound_s && b.latency_s <= input.latency_bound_s);
            }
            (
                Err(ScheduleError::Infeasible { best_latency_s: x, .. }),
                Err(ScheduleError::Infeasible { best_latency_s: y, .. }),
            ) => {
                assert!(close(*x, *y) && *x > input.latency_bound_s, "case {case}");
                // The reported best latency is reachable.
                input.latency_bound_s = *x;
                input.exhaustive = false;
                assert!(schedule::plan(&input).is_ok(), "case {case}");
            }
            (Err(ScheduleError::DoesNotFit { .. }), Err(ScheduleError::DoesNotFit { .. })) => {}
            _ => panic!("case {case}: {bnb:?} vs {all:?}"),
        }
    }
    assert!(feasible >= 15, "only {feasible} feasible cases");
}

#[test]
fn plan_schedule_trades_throughput_for_latency() {
    // Costs whose time per query never grows with the batch (no measured engine steps, which may
    // jump): the case where the search's tighter bounds apply.
    let input = |bound: f64, rng: &mut ChaCha8Rng| ScheduleInput {
        latency_bound_s: bound,
        max_encode_batch: Some(64),
        ..schedule_input(
            Profile { engine_step_ms: None, ..profile(rng) },
            LengthDistribution::Histogram(vec![(32, 1.0), (64, 1.0)]),
            LengthDistribution::Histogram(vec![(8, 1.0), (16, 1.0), (32, 0.5)]),
        )
    };
    let mut last = 0.0;
    for bound in [0.5, 1.0, 2.0, 8.0] {
        let mut i = input(bound, &mut ChaCha8Rng::seed_from_u64(4));
        let out = schedule::plan(&i).unwrap();
        assert!(out.throughput_qps >= last, "bound {bound}: {out:?}");
        assert!(out.latency_s <= bound);
        assert_eq!(out.latency_output_tokens, 32);
        last = out.throughput_qps;
        // Branch-and-bound reaches the exhaustive optimum with a fraction of the simulations.
        i.exhaustive = true;
        let all = schedule::plan(&i).unwrap();
        assert!(close(all.throughput_qps, out.throughput_qps));
        assert!(out.simulations * 4 < all.simulations, "{} vs {}", out.simulations, all.simulations);
    }
}

/// One layer table entry per phase, so that every step's time is hand-computable: 2 layers of
/// 1 ms per prefill and 0.5 ms per decode step at any batch, an LM head of 0.25 ms per row, and
/// the engine's step overhead (prefill 3 ms + 1 ms per sequence + 0.1 ms per token; decode
/// 2 ms + 0.5 ms per sequence).
pub(super) fn hand_profile(engine_step: Option<EngineStep>) -> Profile {
    Profile {
        version: burn_plan::profile::PROFILE_VERSION,
        model: None,
        device: None,
        layers: 2,
        prefill: PrefillTable {
            batch: vec![1.0],
            tokens: vec![1.0, 10.0],
            base_ms: vec![vec![1.0, 1.0]],
            context_ms: [0.0; 4],
        },
        decode: DecodeTable { batch: vec![1.0], context: vec![0.0], ms: vec![vec![0.5]] },
        weight_bytes_per_layer: 1,
        kv_bytes_per_token_per_layer: 1,
        embedding: Extra { weight_bytes: 1, ms_per_token: 0.0 },
        lm_head: Extra { weight_bytes: 1, ms_per_token: 0.25 },
        tensor_parallel: vec![],
        engine_step,
        engine_step_ms: None,
        call_ms: 0.0,
        step_variation: None,
    }
}

/// The hand profile's engine overhead (see [`hand_profile`]).
pub(super) fn hand_overhead() -> EngineStep {
    EngineStep {
        prefill_ms_fixed: 3.0,
        prefill_ms_per_seq: 1.0,
        prefill_ms_per_token: 0.1,
        decode_ms_fixed: 2.0,
        decode_ms_per_seq: 0.5,
    }
}

/// One device, RRA, outputs of 5 tokens, `B_E = 1`, `N_D ≤ 2`: the hand-computed timelines' input.
/// A schedule input of `profile` with these input and output lengths: one device of 1 GiB, a
/// bound of 1 s, and the planner's defaults for the rest (what its JSON may leave out).
pub(super) fn schedule_input(
    profile: Profile,
    input_lengths: LengthDistribution,
    output_lengths: LengthDistribution,
) -> ScheduleInput {
    ScheduleInput {
        profile,
        input_lengths,
        output_lengths,
        devices: 1,
        device_memory_bytes: 1 << 30,
        latency_bound_s: 1.0,
        strategies: None,
        max_encode_batch: None,
        max_decode_iterations: None,
        max_decode_batch: None,
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: 0.0,
        interference_at_batch: None,
        waa_interference: None,
        stage_layers: None,
    }
}

pub(super) fn hand_input(bound: f64, profile: Profile, prompts: LengthDistribution) -> ScheduleInput {
    ScheduleInput {
        latency_bound_s: bound,
        strategies: Some(vec![schedule::Strategy::Rra]),
        max_encode_batch: Some(1),
        max_decode_iterations: Some(2),
        ..schedule_input(profile, prompts, LengthDistribution::Histogram(vec![(5, 1.0)]))
    }
}

/// The stages a decode step is priced in over a pipeline: equal layer shares, the engine's
/// step overhead on the first stage (it launches the step), the LM head on the last.
#[test]
fn plan_schedule_decode_stage_times_carry_the_overhead_first_and_the_head_last() {
    let cost = hand_profile(Some(hand_overhead())).cost_model("profile").unwrap();
    // One layer of 0.5 ms each; 2 + 0.5 ms overhead at one sequence; a 0.25 ms head.
    let two = schedule::decode_stage_ms(&cost, &[1, 1], 1.0, 10.0);
    assert!(two.len() == 2 && close(two[0], 3.0) && close(two[1], 0.75), "{two:?}");
    let one = schedule::decode_stage_ms(&cost, &[2], 1.0, 10.0);
    assert!(one.len() == 1 && close(one[0], 3.75), "{one:?}");
    // Two sequences: the per-sequence overhead and the head grow with the batch.
    let batch = schedule::decode_stage_ms(&cost, &[1, 1], 2.0, 10.0);
    assert!(close(batch[0], 3.5) && close(batch[1], 1.0), "{batch:?}");
}

/// The hand profile with `layers` layers (0.5 ms a decode step each) and a head of `head_ms` a
/// sequence, nothing else on either stage.
fn headed_profile(layers: usize, head_ms: f64) -> Profile {
    Profile { layers, lm_head: Extra { weight_bytes: 1, ms_per_token: head_ms }, ..hand_profile(None) }
}

/// Alpa's stage planner over the profile (`balanced_stage_layers`): a head worth four layers
/// moves layers forward, 7 + (3 and the head) being 3.5 ms against 3.5 ms where the even 5 + 5
/// leaves the second stage at 4.5 ms; the head's cost grows with the batch; the last stage keeps
/// a layer however heavy the head; more stages than layers is an error.
#[test]
fn plan_schedule_a_heavy_head_moves_layers_to_the_first_stage() {
    let split = |layers: usize, head_ms: f64, batch: f64| {
        let cost = headed_profile(layers, head_ms).cost_model("profile").unwrap();
        schedule::balanced_stage_layers(&cost, 2, batch, 0.0, 0.0)
    };
    assert_eq!(split(10, 2.0, 1.0).unwrap(), vec![7, 3]);
    assert_eq!(split(10, 0.0, 1.0).unwrap(), vec![5, 5], "no head: even");
    assert_eq!(split(4, 20.0, 1.0).unwrap(), vec![3, 1], "the last stage keeps a layer");
    assert_eq!(split(10, 2.0, 2.0).unwrap(), vec![9, 1], "two sequences: the head is worth 8 layers");
    let cost = headed_profile(2, 1.0).cost_model("profile").unwrap();
    assert!(schedule::balanced_stage_layers(&cost, 3, 1.0, 0.0, 0.0).is_err());
}

/// The planner prices RRA over two devices on the split it is given (`stage_layers`), says so
/// in its output, prices the even split given as a list as the even split, and refuses a split
/// that is not the model's.
#[test]
fn plan_schedule_prices_the_split_it_is_given() {
    let input = |stage_layers: Option<Vec<usize>>| ScheduleInput {
        devices: 2,
        max_encode_batch: Some(4),
        max_decode_iterations: None,
        max_decode_batch: Some(4),
        stage_layers,
        ..hand_input(1e3, headed_profile(10, 2.0), LengthDistribution::Histogram(vec![(10, 1.0)]))
    };
    let even = schedule::plan(&input(None)).unwrap();
    let balanced = schedule::plan(&input(Some(vec![7, 3]))).unwrap();
    assert_eq!(even.stage_layers, None);
    assert_eq!(balanced.stage_layers, Some(vec![7, 3]));
    assert!(balanced.throughput_qps > even.throughput_qps, "{balanced:?} against {even:?}");
    let listed = schedule::plan(&input(Some(vec![5, 5]))).unwrap();
    assert!(close(listed.throughput_qps, even.throughput_qps), "{listed:?} against {even:?}");
    for bad in [vec![5, 4], vec![10, 0], vec![]] {
        match schedule::plan(&input(Some(bad.clone()))) {
            Err(ScheduleError::Input(e)) => assert!(e.to_string().contains("stage_layers"), "{bad:?}: {e}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

/// One device's RRA throughput as the planner replays the engine (1024 queries queued at once)
/// when `B_E` = 1, every query decodes `c·n_d` steps and the plan holds `c` seats (`i[b − 1]` a
/// decode step of `b`): a seat is free, so the engine prefills again at once (ExeGPT §5.2's
/// adjustment) until all `c` are taken; the `c` queries decode together and leave together, and
/// the cycle repeats (`c` divides 1024): `1 / (e + n_d·i[c − 1])`, the closed form's steady state.
/// Before the adjustment the batch filled one seat a phase and drained the same way.
pub(super) fn replayed(e: f64, i: &[f64], n_d: usize) -> f64 {
    assert_eq!(1024 % i.len(), 0);
    1000.0 / (e + n_d as f64 * i[i.len() - 1])
}

#[test]
fn plan_schedule_simulator_with_engine_overhead_matches_a_hand_computed_timeline() {
    let overhead = hand_overhead();
    let input = |bound: f64, step: Option<EngineStep>, max_decode_batch: Option<usize>| ScheduleInput {
        max_decode_batch,
        ..hand_input(bound, hand_profile(step), LengthDistribution::Histogram(vec![(10, 1.0)]))
    };
    // B_E = 1 prompt of 10 tokens: E = 2 layers × 1 + head 0.25 + overhead 3 + 1 + 10 × 0.1
    // = 7.25 ms. 5 output tokens: the prefill emits the first, 4 decode iterations follow.
    // N_D = 1: 4 phases, B_D = 4, I = 2 × 0.5 + 4 × 0.25 + 2 + 4 × 0.5 = 6 ms;
    //   throughput 1 / (7.25 + 6) ms, latency 4 × 7.25 + 4 × 6 = 53 ms.
    // N_D = 2: 2 phases, B_D = 2, I = 1 + 0.5 + 2 + 1 = 4.5 ms;
    //   throughput 1 / (7.25 + 2 × 4.5) ms, latency 2 × 7.25 + 4 × 4.5 = 32.5 ms.
    let loose = schedule::plan(&input(1.0, Some(overhead), None)).unwrap();
    assert_eq!((loose.decode_iterations, loose.decode_batch), (Some(1), 4));
    assert!(close(loose.throughput_qps, replayed(7.25, &[3.75, 4.5, 5.25, 6.0], 1)), "{loose:?}");
    assert!(close(loose.latency_s, 0.053), "{loose:?}");
    let tight = schedule::plan(&input(0.04, Some(overhead), None)).unwrap();
    assert_eq!((tight.decode_iterations, tight.decode_batch), (Some(2), 2));
    assert!(close(tight.throughput_qps, replayed(7.25, &[3.75, 4.5], 2)), "{tight:?}");
    assert!(close(tight.latency_s, 0.0325), "{tight:?}");
    // The engine cannot decode 4 at once: the loose bound also gets N_D = 2.
    let capped = schedule::plan(&input(1.0, Some(overhead), Some(3))).unwrap();
    assert_eq!(capped.decode_iterations, Some(2));
    assert!(matches!(schedule::plan(&input(1.0, Some(overhead), Some(1))), Err(ScheduleError::DoesNotFit { .. })));
    // Without the overhead (an old profile): E = 2.25 ms, I(N_D = 1) = 1 + 1 = 2 ms.
    let bare = schedule::plan(&input(1.0, None, None)).unwrap();
    assert!(close(bare.throughput_qps, replayed(2.25, &[1.25, 1.5, 1.75, 2.0], 1)), "{bare:?}");
    assert!(close(bare.latency_s, (4.0 * 2.25 + 4.0 * 2.0) / 1000.0), "{bare:?}");
    // An old profile's JSON (no `engine_step`) still loads, and the field round-trips.
    let mut json = serde_json::to_value(hand_profile(Some(overhead))).unwrap();
    let back: Profile = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back.engine_step, Some(overhead));
    json.as_object_mut().unwrap().remove("engine_step");
    let old: Profile = serde_json::from_value(json).unwrap();
    assert_eq!(old.engine_step, None);
    assert!(!serde_json::to_string(&old).unwrap().contains("engine_step"));
    // A negative overhead is an input error naming the field.
    let bad = EngineStep { decode_ms_per_seq: -1.0, ..overhead };
    let err = schedule::plan(&input(1.0, Some(bad), None)).unwrap_err().to_string();
    assert!(err.contains("engine_step.decode_ms_per_seq"), "{err}");
}

/// WAA's decoder holds `B_E·(S̄_D − 1)` queries (ExeGPT §4.1, §6): outputs of 5 tokens need a
/// decode batch of 4 at the least, so a cap of 3 fits no WAA plan, and the error says why and
/// what to do; a cap of 4 fits one; RRA still plans under the cap of 3.
#[test]
fn plan_schedule_waa_names_its_least_decode_batch_when_the_cap_is_below_it() {
    let waa = |cap| ScheduleInput {
        devices: 2,
        strategies: Some(vec![schedule::Strategy::WaaC, schedule::Strategy::WaaM]),
        max_decode_batch: Some(cap),
        ..hand_input(1.0, hand_profile(Some(hand_overhead())), LengthDistribution::Histogram(vec![(10, 1.0)]))
    };
    let error = schedule::plan(&waa(3)).unwrap_err();
    assert!(matches!(error, ScheduleError::DoesNotFit { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("WAA decodes B_E·(S̄_D − 1) = 4") && text.contains("max_decode_batch 3"), "{text}");
    let plan = schedule::plan(&waa(4)).unwrap();
    assert_eq!((plan.encode_batch, plan.decode_batch), (1, 4), "{plan:?}");
    let rra = ScheduleInput { strategies: None, ..waa(3) };
    assert_eq!(schedule::plan(&rra).unwrap().strategy, schedule::Strategy::Rra);
}

/// WAA's period is `max + κ·min` of its encoder's step and its decoder's iteration at the pair's
/// own interference (`waa_interference`, measured side by side), which stands in for the pipeline
/// stages' `interference` in WAA's price only; without it WAA takes the stages'.
#[test]
fn plan_schedule_prices_waa_at_its_own_interference() {
    use schedule::Strategy::{Rra, WaaC, WaaM};
    let input = |stages: f64, waa: Option<f64>, strategies: Vec<schedule::Strategy>| ScheduleInput {
        devices: 2,
        strategies: Some(strategies),
        interference: stages,
        waa_interference: waa,
        ..hand_input(1e3, hand_profile(Some(hand_overhead())), LengthDistribution::Histogram(vec![(10, 1.0)]))
    };
    let waa = |stages, waa| schedule::plan(&input(stages, waa, vec![WaaC, WaaM])).unwrap().throughput_qps;
    let apart = waa(0.0, None);
    let shared = waa(0.0, Some(1.0));
    assert!(shared < apart, "devices that take turns serve less: {shared} against {apart}");
    assert!(close(shared, waa(1.0, None)), "without its own κ WAA is priced at the stages'");
    assert!(close(apart, waa(1.0, Some(0.0))), "its own κ replaces the stages' for WAA");
    let rra = |waa| schedule::plan(&input(0.5, waa, vec![Rra])).unwrap().throughput_qps;
    assert_eq!(rra(None), rra(Some(3.0)), "RRA's pipeline is priced at the stages' κ alone");
    let error = schedule::plan(&input(0.0, Some(-0.1), vec![WaaC])).unwrap_err().to_string();
    assert!(error.contains("waa_interference"), "{error}");
}

/// RRA over two devices runs as two virtual engines, one step each per round through the stages
/// (ExeGPT's plan as `schedule::pipelined_engines` runs it), and the planner replays that: the
/// hand profile over two stages of one layer, a prompt of 10 tokens, outputs of 5 tokens, `B_E`
/// = 1. A prefill's stages take 1 + 5 ms (its layer and the engine's overhead) and 1 + 0.25 ms
/// (its layer and the head), a decode step of `b` sequences 0.5 + 2 + 0.5·b and 0.5 + 0.25·b ms.
/// At `N_D` = 1, `B_D` = 4: each engine holds 2 seats, prefills twice (the second at once, a seat
/// being free) and decodes both 4 times. A round of two prefills takes the first stage's 2 × 6 ms
/// (at `κ`, each pass's other stage adds `κ`·1.25 ms), one of two decodes of 2 the first stage's
/// 2 × 3.5 ms (plus `κ`·1 ms each): 4 queries every 2 + 4 rounds. With a `κ` measured at a larger
/// batch, decode rounds take it interpolated at their batch, prefill rounds the larger batch's.
#[test]
fn plan_schedule_replays_rra_over_a_pipeline_as_virtual_engines() {
    let input = |kappa: f64, at_batch: Option<(f64, f64)>| ScheduleInput {
        devices: 2,
        interference: kappa,
        interference_at_batch: at_batch.map(|(batch, kappa)| schedule::BatchInterference { batch, kappa }),
        ..hand_input(1.0, hand_profile(Some(hand_overhead())), LengthDistribution::Histogram(vec![(10, 1.0)]))
    };
    // (κ at one sequence, κ at a larger batch, the prefill rounds' κ, the decode rounds' κ)
    for (one, at_batch, prefill, decode) in [
        (0.0, None, 0.0, 0.0),
        (0.5, None, 0.5, 0.5),
        (0.0, Some((3.0, 1.0)), 1.0, 0.5),
        (0.5, Some((3.0, 0.1)), 0.5, 0.5),
    ] {
        let plan = schedule::plan(&input(one, at_batch)).unwrap();
        assert_eq!((plan.decode_iterations, plan.decode_batch, plan.pipeline_stages), (Some(1), 4, 2), "{plan:?}");
        let prefills = 2.0 * (6.0 + prefill * 1.25);
        let decodes = 2.0 * (3.5 + decode * 1.0);
        let expected = 4.0 / ((2.0 * prefills + 4.0 * decodes) / 1000.0);
        assert!(close(plan.throughput_qps, expected), "κ {one} {at_batch:?}: {plan:?} against {expected}");
    }
    for (bad, field) in [((0.5, 1.0), "interference_at_batch.batch"), ((2.0, -1.0), "interference_at_batch.kappa")] {
        let error = schedule::plan(&input(0.0, Some(bad))).unwrap_err().to_string();
        assert!(error.contains(field), "{bad:?}: {error}");
    }
}
