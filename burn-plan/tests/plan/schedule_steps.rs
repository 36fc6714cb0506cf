//! ExeGPT's planner on measured engine steps: the steady-state decode batch, measured steps and
//! their variation, the latency as a sum of steps, and the one-device adjusted cycle.

use burn_plan::profile::{
    DecodeTable, EngineStep, EngineStepTable, PrefillStepTable, Profile, RunSpread, Spread, StepVariation,
};
use burn_plan::schedule::{self, LengthDistribution, ScheduleError, ScheduleInput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::bad_input::run_json;
use super::close;
use super::profiles::{engine_table, profile};
use super::schedule::{hand_input, hand_overhead, hand_profile, random_lengths, replayed, schedule_input};
use burn_plan::json::{Overrides, Planner};

#[test]
fn plan_schedule_rra_decode_batch_is_the_steady_state_batch_of_mixed_output_lengths() {
    // Outputs of 3 and 41 tokens, 3 : 1, arriving round-robin; one query encoded per phase.
    let pattern = [3usize, 3, 3, 41];
    for n_d in [1usize, 2] {
        let input = ScheduleInput {
            output_lengths: LengthDistribution::Histogram(vec![(3, 3.0), (41, 1.0)]),
            max_decode_iterations: Some(n_d),
            ..hand_input(10.0, hand_profile(None), LengthDistribution::Histogram(vec![(10, 1.0)]))
        };
        let plan = schedule::plan(&input).unwrap();
        let n = plan.decode_iterations.unwrap();
        // Replay the cycle: each phase encodes one query, which then stays in the decode batch
        // for ⌈(S − 1)/N_D⌉ phases. The batch's mean size over the steady state is B_D.
        let mut left: Vec<usize> = Vec::new();
        let (mut total, mut phases) = (0usize, 0usize);
        for phase in 0..4000 {
            left.push((pattern[phase % pattern.len()] - 1).div_ceil(n));
            if phase >= 400 {
                total += left.len();
                phases += 1;
            }
            left.iter_mut().for_each(|k| *k -= 1);
            left.retain(|&k| k > 0);
        }
        let mean = total as f64 / phases as f64;
        // N_D = 1: 2 and 40 phases, E[k] = 11.5; N_D = 2: 1 and 20, E[k] = 5.75 (§6's own sum
        // over arrivals would give 1 / E[1/k] = 2.6 and 1.1).
        let expected = 0.75 * (2.0f64 / n as f64).ceil() + 0.25 * (40.0 / n as f64);
        assert!((mean - expected).abs() < 0.01 * expected, "N_D {n}: replay {mean}, expected {expected}");
        assert_eq!(plan.decode_batch, expected.ceil() as usize, "{plan:?}");
    }
}

/// The hand profile with measured engine steps: a prefill of one 10-token prompt takes 10 ms
/// (20 tokens: 14 ms), decode steps 3 ms at batch 1, 9 ms at batch 2 (three times batch 1, as
/// a CPU head matmul switching kernels makes it) and 10–12 ms at batch 4.
pub(super) fn measured_profile(engine_step: Option<EngineStep>) -> Profile {
    Profile {
        engine_step_ms: Some(EngineStepTable {
            prefill: PrefillStepTable {
                batch: vec![1.0, 2.0],
                tokens: vec![10.0, 20.0],
                ms: vec![vec![10.0, 14.0], vec![16.0, 24.0]],
            },
            decode: DecodeTable {
                batch: vec![1.0, 2.0, 4.0],
                context: vec![0.0, 100.0],
                ms: vec![vec![3.0, 3.0], vec![9.0, 9.0], vec![10.0, 12.0]],
            },
        }),
        ..hand_profile(engine_step)
    }
}

#[test]
fn plan_schedule_simulator_reads_the_measured_engine_steps() {
    let input = hand_input;
    let ten = || LengthDistribution::Histogram(vec![(10, 1.0)]);
    // Decode context 10 + 5/2 = 12.5: I(4) = 10 + 2 × 0.125 = 10.25 ms, I(2) = 9 ms; E = 10 ms.
    // N_D = 1: B_D = 4, throughput 1 / (10 + 10.25) ms, latency 4 × 10 + 4 × 10.25 = 81 ms.
    // N_D = 2: B_D = 2, throughput 1 / (10 + 2 × 9) ms, latency 2 × 10 + 4 × 9 = 56 ms.
    let loose = schedule::plan(&input(1.0, measured_profile(None), ten())).unwrap();
    assert_eq!((loose.decode_iterations, loose.decode_batch), (Some(1), 4));
    assert!(close(loose.throughput_qps, replayed(10.0, &[3.0, 9.0, 9.625, 10.25], 1)), "{loose:?}");
    assert!(close(loose.latency_s, 0.081), "{loose:?}");
    let tight = schedule::plan(&input(0.07, measured_profile(None), ten())).unwrap();
    assert_eq!((tight.decode_iterations, tight.decode_batch), (Some(2), 2));
    assert!(close(tight.throughput_qps, replayed(10.0, &[3.0, 9.0], 2)), "{tight:?}");
    assert!(close(tight.latency_s, 0.056), "{tight:?}");
    // The measured steps supersede a linear overhead in the same profile.
    let overhead = EngineStep { decode_ms_fixed: 50.0, ..EngineStep::default() };
    let both = schedule::plan(&input(1.0, measured_profile(Some(overhead)), ten())).unwrap();
    assert_eq!(both.throughput_qps, loose.throughput_qps);
    // Prompts of 10 or 20 tokens: E is the mean step (10 + 14) / 2 = 12 ms; the p99 query's 4
    // prefills (N_D = 1) hold 4 prompts, z₉₉·σ·√4 = 2.3263 × 5 × 2 tokens beyond the mean (more
    // than its own p99 prompt's 20 − 15), at (14 − 12) / 5 ms per token (batch 1, 15 → 20).
    let mixed = LengthDistribution::Histogram(vec![(10, 1.0), (20, 1.0)]);
    let tail = schedule::plan(&input(1.0, measured_profile(None), mixed)).unwrap();
    // z₉₉ as the planner's rational approximation gives it (the exact 2.3263479 is 1.3e-5 away).
    let z99 = 2.326_335_165;
    // The decode context is now 15 + 5/2 = 17.5: I(4) = 10 + 2 × 0.175 = 10.35 ms.
    let expected = 4.0 * 12.0 + 0.4 * z99 * 5.0 * 2.0 + 4.0 * 10.35;
    assert!((tail.latency_s * 1000.0 - expected).abs() < 1e-6, "{tail:?} vs {expected}");
    assert!(close(tail.throughput_qps, replayed(12.0, &[3.0, 9.0, 9.675, 10.35], 1)), "{tail:?}");
    // An old profile (no `engine_step_ms`) loads; the field round-trips and is left out when absent.
    let json = serde_json::to_value(measured_profile(None)).unwrap();
    let back: Profile = serde_json::from_value(json).unwrap();
    assert_eq!(back, measured_profile(None));
    assert!(!serde_json::to_string(&hand_profile(None)).unwrap().contains("engine_step_ms"));
}

/// ExeGPT §7.9: the latency counts every step at the 99th percentile of its time (the profile's
/// `step_variation`, or the input's in its place); throughput keeps the medians.
#[test]
fn plan_schedule_latency_takes_each_step_at_its_measured_variation() {
    let ten = || LengthDistribution::Histogram(vec![(10, 1.0)]);
    let variation = StepVariation { prefill: 0.5, decode: 0.25, runs: None };
    let varied = Profile { step_variation: Some(variation), ..measured_profile(None) };
    // As above, N_D = 1: latency 4 × 10 × 1.5 + 4 × 10.25 × 1.25 = 111.25 ms, throughput
    // 1 / 20.25 ms; N_D = 2: 2 × 10 × 1.5 + 4 × 9 × 1.25 = 75 ms, 1 / 28 ms.
    let loose = schedule::plan(&hand_input(1.0, varied.clone(), ten())).unwrap();
    assert_eq!((loose.decode_iterations, loose.step_variation), (Some(1), variation));
    assert!(
        close(loose.latency_s, 0.11125) && close(loose.throughput_qps, replayed(10.0, &[3.0, 9.0, 9.625, 10.25], 1)),
        "{loose:?}"
    );
    // 0.09 s: N_D = 1 met it at the medians (81 ms), not at the 99th percentile.
    let tight = schedule::plan(&hand_input(0.09, varied.clone(), ten())).unwrap();
    assert_eq!(tight.decode_iterations, Some(2));
    assert!(close(tight.latency_s, 0.075) && close(tight.throughput_qps, replayed(10.0, &[3.0, 9.0], 2)), "{tight:?}");
    // The input's variation replaces the profile's; 0 gives back the medians.
    let none = StepVariation::default();
    let bare = ScheduleInput { step_variation: Some(none), ..hand_input(0.09, varied.clone(), ten()) };
    let bare = schedule::plan(&bare).unwrap();
    assert_eq!((bare.decode_iterations, bare.step_variation), (Some(1), none));
    assert!(close(bare.latency_s, 0.081), "{bare:?}");
    // Branch-and-bound keeps the exhaustive optimum.
    let exhaustive = schedule::plan(&ScheduleInput { exhaustive: true, ..hand_input(0.09, varied.clone(), ten()) });
    assert_eq!(exhaustive.unwrap().decode_iterations, tight.decode_iterations);
    // Bounds below every 99th-percentile latency: the error names the least reachable one.
    let err = schedule::plan(&hand_input(0.07, varied.clone(), ten())).unwrap_err();
    assert!(matches!(err, ScheduleError::Infeasible { best_latency_s, .. } if close(best_latency_s, 0.075)), "{err:?}");
    // Negative, NaN or absurd variations are input errors naming the field.
    for (bad, field) in [(-0.1, "prefill"), (f64::NAN, "prefill"), (11.0, "prefill")] {
        let v = StepVariation { prefill: bad, decode: 0.0, runs: None };
        let in_profile = Profile { step_variation: Some(v), ..measured_profile(None) };
        let err = schedule::plan(&hand_input(1.0, in_profile, ten())).unwrap_err().to_string();
        assert!(err.contains(&format!("step_variation.{field}")), "{err}");
        let in_input = ScheduleInput { step_variation: Some(v), ..hand_input(1.0, measured_profile(None), ten()) };
        let err = schedule::plan(&in_input).unwrap_err().to_string();
        assert!(err.contains(&format!("step_variation.{field}")), "{err}");
    }
    // Profiles without the field still load; it round-trips.
    let back: Profile = serde_json::from_value(serde_json::to_value(&varied).unwrap()).unwrap();
    assert_eq!(back, varied);
    assert!(!serde_json::to_string(&measured_profile(None)).unwrap().contains("step_variation"));
}

/// With the runs' spread, a latency summing many steps takes the sum at its percentile (mean
/// excess plus z₉₉ standard deviations of the sum), never more than every step at its 99th
/// percentile.
#[test]
fn plan_schedule_latency_takes_the_sum_of_steps_at_its_percentile() {
    let ten = || LengthDistribution::Histogram(vec![(10, 1.0)]);
    let runs =
        RunSpread { decode_steps: 2, prefill: Spread { mean: 0.1, std: 0.2 }, decode: Spread { mean: 0.05, std: 0.1 } };
    let variation = StepVariation { prefill: 0.5, decode: 0.25, runs: Some(runs) };
    let varied = Profile { step_variation: Some(variation), ..measured_profile(None) };
    let z99 = 2.326_335_165;
    // As above: N_D = 1 is 4 prefills of 10 ms and 4 iterations of 10.25 ms (two runs of two);
    // N_D = 2 is 2 prefills and 4 iterations of 9 ms.
    let sum = |k: f64, iteration: f64| {
        let (p, d) = (k * 10.0, 4.0 * iteration);
        let sd = (k * 100.0 * 0.2f64.powi(2) + (d * 0.1).powi(2) / 2.0).sqrt();
        p * 1.1 + d * 1.05 + z99 * sd
    };
    let (one, two) = (sum(4.0, 10.25), sum(2.0, 9.0));
    assert!(one < 100.0 && two < 75.0, "{one} {two}");
    // 0.1 s: N_D = 1 meets it (every step at its 99th percentile, 111.25 ms, did not).
    let loose = schedule::plan(&hand_input(0.1, varied.clone(), ten())).unwrap();
    assert_eq!((loose.decode_iterations, loose.step_variation), (Some(1), variation));
    assert!((loose.latency_s * 1000.0 - one).abs() < 1e-6, "{loose:?} vs {one}");
    assert!(close(loose.throughput_qps, replayed(10.0, &[3.0, 9.0, 9.625, 10.25], 1)), "{loose:?}");
    let tight = schedule::plan(&hand_input(0.09, varied.clone(), ten())).unwrap();
    assert_eq!(tight.decode_iterations, Some(2));
    assert!((tight.latency_s * 1000.0 - two).abs() < 1e-6, "{tight:?} vs {two}");
    // A spread wider than the 99th percentiles says is capped by them.
    let wide = RunSpread { decode: Spread { mean: 0.05, std: 5.0 }, ..runs };
    let wide = ScheduleInput {
        step_variation: Some(StepVariation { runs: Some(wide), ..variation }),
        ..hand_input(1.0, varied.clone(), ten())
    };
    assert!(close(schedule::plan(&wide).unwrap().latency_s, 0.11125));
    // Branch-and-bound keeps the exhaustive optimum.
    let exhaustive = schedule::plan(&ScheduleInput { exhaustive: true, ..hand_input(0.09, varied.clone(), ten()) });
    assert_eq!(exhaustive.unwrap().decode_iterations, tight.decode_iterations);
    // Bad spreads are input errors naming the field; the field round-trips.
    for (field, bad) in [
        ("runs.decode_steps", RunSpread { decode_steps: 0, ..runs }),
        ("runs.prefill.std", RunSpread { prefill: Spread { mean: 0.0, std: f64::NAN }, ..runs }),
        ("runs.decode.mean", RunSpread { decode: Spread { mean: -0.5, std: 0.1 }, ..runs }),
    ] {
        let v = StepVariation { runs: Some(bad), ..variation };
        let input = ScheduleInput { step_variation: Some(v), ..hand_input(1.0, measured_profile(None), ten()) };
        let err = schedule::plan(&input).unwrap_err().to_string();
        assert!(err.contains(&format!("step_variation.{field}")), "{err}");
    }
    let back: Profile = serde_json::from_value(serde_json::to_value(&varied).unwrap()).unwrap();
    assert_eq!(back, varied);
}

/// Branch-and-bound still returns the exhaustive optimum when a measured step costs more per
/// query at a larger batch (its tighter bounds assume the opposite; it must fall back).
#[test]
fn plan_schedule_branch_and_bound_matches_exhaustive_search_with_jumping_engine_steps() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let mut feasible = 0;
    for case in 0..120 {
        let mut profile = profile(&mut rng);
        let mut table = engine_table(&mut rng);
        let jump = rng.random_range(1.0..8.0);
        for row in table.decode.ms.iter_mut().skip(1) {
            row.iter_mut().for_each(|v| *v += jump);
        }
        profile.engine_step_ms = Some(table);
        let lengths = schedule_input(profile, random_lengths(&mut rng, 40), random_lengths(&mut rng, 12));
        let mut input = ScheduleInput {
            devices: rng.random_range(1..=3),
            latency_bound_s: rng.random_range(0.01..0.3),
            max_encode_batch: Some(rng.random_range(1..=12)),
            ..lengths
        };
        let bnb = schedule::plan(&input);
        input.exhaustive = true;
        match (&bnb, &schedule::plan(&input)) {
            (Ok(a), Ok(b)) => {
                feasible += 1;
                assert!(close(a.throughput_qps, b.throughput_qps), "case {case}: {a:?} vs {b:?}");
                assert!(a.latency_s <= input.latency_bound_s);
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "case {case}"),
            (a, b) => panic!("case {case}: {a:?} vs {b:?}"),
        }
    }
    assert!(feasible >= 20, "only {feasible} feasible cases");
}

#[test]
fn plan_json_rejects_bad_engine_step_tables_naming_the_field() {
    let input = ScheduleInput {
        max_encode_batch: Some(2),
        ..schedule_input(
            measured_profile(None),
            LengthDistribution::Histogram(vec![(10, 1.0)]),
            LengthDistribution::Histogram(vec![(5, 1.0)]),
        )
    };
    let good = serde_json::to_value(&input).unwrap();
    let schedule = |text: &str| run_json(Planner::Schedule, text, Overrides::default());
    schedule(&good.to_string()).unwrap();
    let table = "/profile/engine_step_ms";
    for (path, value, named) in [
        ("/decode/ms/1/0", serde_json::json!(-1.0), "engine_step_ms.decode.ms[1][0]"),
        ("/prefill/ms/0/1", serde_json::json!(-0.5), "engine_step_ms.prefill.ms[0][1]"),
        ("/decode/ms", serde_json::json!([]), "engine_step_ms.decode.ms"),
        ("/decode/batch", serde_json::json!([]), "engine_step_ms.decode.batch"),
        ("/prefill/tokens", serde_json::json!([]), "engine_step_ms.prefill.tokens"),
        ("/prefill/batch", serde_json::json!([2.0, 1.0]), "engine_step_ms.prefill.batch[1]"),
        ("/decode/batch", serde_json::json!([0.0, 2.0, 4.0]), "engine_step_ms.decode.batch[0]"),
        ("/decode/ms/2", serde_json::json!([10.0]), "engine_step_ms.decode.ms[2]"),
    ] {
        let mut bad = good.clone();
        *bad.pointer_mut(&format!("{table}{path}")).unwrap() = value;
        let error = schedule(&bad.to_string()).expect_err(path);
        assert!(error.contains(named), "{path}: {error}");
    }
    // NaN is not JSON; a missing table or an unknown field is an error too.
    let text = good.to_string();
    for bad in [
        text.replacen("[[3.0,3.0]", "[[NaN,3.0]", 1),
        text.replacen("\"decode\":{\"batch\"", "\"decodes\":{\"batch\"", 1),
    ] {
        assert_ne!(bad, text);
        let error = schedule(&bad).expect_err(&bad);
        assert!(!error.is_empty());
    }
    let mut missing = good.clone();
    missing.pointer_mut(table).unwrap().as_object_mut().unwrap().remove("prefill");
    assert!(schedule(&missing.to_string()).is_err());
}

/// On one device the percentile query's latency counts the cycle as the engine adjusts it (ExeGPT
/// §5.2): a prefill every `S̄_D·Σ_U P_D(U)` decode steps, not every `N_D`, in a batch refilled to
/// `⌈B_D⌉` seats whenever `B_E` are free.
#[test]
fn plan_schedule_one_device_latency_counts_the_adjusted_cycle() {
    let overhead = hand_overhead();
    // Outputs of 3 and 41 tokens, 3 : 1 (the p99 query decodes 40 steps); prompts of 10 tokens,
    // E = 7.25 ms; a decode step of b sequences 3 + 0.75·b ms (as in the hand timeline above).
    let mut adjusted = 0;
    for bound in [0.2, 0.25, 0.3, 1.0] {
        let input = ScheduleInput {
            output_lengths: LengthDistribution::Histogram(vec![(3, 3.0), (41, 1.0)]),
            max_decode_iterations: Some(40),
            ..hand_input(bound, hand_profile(Some(overhead)), LengthDistribution::Histogram(vec![(10, 1.0)]))
        };
        let plan = schedule::plan(&input).unwrap();
        let n = plan.decode_iterations.unwrap() as f64;
        let phases = 0.75 * (2.0 / n).ceil() + 0.25 * (40.0 / n).ceil();
        let b_d = phases;
        let seats = b_d.ceil();
        // S̄_D = 0.75 × 2 + 0.25 × 40 = 11.5 decode steps per query.
        let gap = (11.5 / phases).min(n);
        let k = (40.0 / gap).ceil();
        let expected = k * 7.25 + 40.0 * (3.0 + 0.75 * seats.max(b_d));
        assert!((plan.latency_s * 1000.0 - expected).abs() < 1e-9, "bound {bound}: {plan:?} vs {expected} ms");
        assert!(plan.latency_s <= bound);
        assert_eq!(plan.decode_batch, seats as usize);
        let exhaustive = schedule::plan(&ScheduleInput { exhaustive: true, ..input }).unwrap();
        // The same optimum: equal throughput, and of equal throughputs the least latency.
        let same = (exhaustive.throughput_qps, exhaustive.latency_s) == (plan.throughput_qps, plan.latency_s);
        assert!(same, "bound {bound}: {plan:?} vs {exhaustive:?}");
        // Completions free seats sooner than every N_D steps: more prefills than the fixed cycle.
        adjusted += usize::from(k > (40.0 / n).ceil());
    }
    assert!(adjusted >= 2, "{adjusted}");
}
