//! The planners against brute force on seeded random inputs, the papers' qualitative claims,
//! hand-computed simulator timelines, and bad input through the library and the CLI; pipeline
//! execution against one device (`pipeline/`).

use burn_parallel::plan::cli;
use burn_parallel::plan::placement::{
    self, Arrivals, Baseline, ModelRef, ModelSpec, PlacementInput, PlacementWorkload,
};
use burn_parallel::plan::profile::{
    DecodeTable, EngineStep, EngineStepTable, Extra, PrefillStepTable, PrefillTable, Profile, RunSpread, Spread,
    StepVariation, TpScaling,
};
use burn_parallel::plan::schedule::{self, LengthDistribution, ScheduleError, ScheduleInput};
use burn_parallel::plan::sim::{self, Group, Request};
use burn_parallel::plan::slices::{self, SlicesInput};
use burn_parallel::plan::stages::{self, StagesError, StagesInput, TensorParallel, TpDegree};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[cfg(feature = "runtime")]
mod pipeline;
#[cfg(feature = "profiler")]
#[path = "plan/profiler.rs"]
mod profiler;

#[path = "plan/stage_devices.rs"]
mod stage_devices;

#[path = "plan/stage_groups.rs"]
mod stage_groups;

#[path = "plan/serve_every_model.rs"]
mod serve_every_model;

#[path = "plan/measured_pipelines.rs"]
mod measured_pipelines;

#[path = "plan/slo_admission.rs"]
mod slo_admission;

#[cfg(feature = "flex")]
#[path = "parallel/tensor.rs"]
mod tensor_parallel;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

// ---------------------------------------------------------------- stages

/// Every split of `0..layers` into `stages` non-empty contiguous ranges.
fn partitions(layers: usize, stages: usize) -> Vec<Vec<[usize; 2]>> {
    fn go(start: usize, layers: usize, left: usize, acc: &mut Vec<[usize; 2]>, out: &mut Vec<Vec<[usize; 2]>>) {
        if left == 1 {
            acc.push([start, layers]);
            out.push(acc.clone());
            acc.pop();
            return;
        }
        for end in start + 1..=layers - (left - 1) {
            acc.push([start, end]);
            go(end, layers, left - 1, acc, out);
            acc.pop();
        }
    }
    let mut out = Vec::new();
    go(0, layers, stages, &mut Vec::new(), &mut out);
    out
}

/// Brute-force least bottleneck over partitions and degree choices (`None`: infeasible).
fn stages_brute(input: &StagesInput) -> Option<f64> {
    let layers = input.layer_latency_ms.len();
    let mut options: Vec<(usize, &[f64])> = vec![(1, &input.layer_latency_ms)];
    if let Some(tp) = &input.tensor_parallel {
        options.extend(tp.degrees.iter().map(|d| (d.degree, d.layer_latency_ms.as_slice())));
    }
    let devices = input.tensor_parallel.as_ref().map(|t| t.devices);
    let mut best: Option<f64> = None;
    for p in partitions(layers, input.stages) {
        let choices = options.len().pow(p.len() as u32);
        for mut code in 0..choices {
            let (mut used, mut bottleneck, mut ok) = (0, 0.0f64, true);
            for r in &p {
                let (degree, lat) = options[code % options.len()];
                code /= options.len();
                used += degree;
                bottleneck = bottleneck.max(lat[r[0]..r[1]].iter().sum());
                if let (Some(mem), Some(cap)) = (&input.layer_memory_bytes, input.stage_memory_bytes) {
                    let bytes: u64 = mem[r[0]..r[1]].iter().sum();
                    ok &= bytes.div_ceil(degree as u64) <= cap;
                }
            }
            if devices.is_some_and(|d| used > d) || !ok {
                continue;
            }
            if best.is_none_or(|b| bottleneck < b) {
                best = Some(bottleneck);
            }
        }
    }
    best
}

#[test]
fn plan_stages_match_brute_force_on_random_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..300 {
        let layers = rng.random_range(1..=8);
        let stages = rng.random_range(1..=layers);
        let lat: Vec<f64> = (0..layers).map(|_| rng.random_range(0..20) as f64 * 0.5).collect();
        let mut input = StagesInput { layer_latency_ms: lat.clone(), stages, ..StagesInput::default() };
        if case % 2 == 1 {
            input.layer_memory_bytes = Some((0..layers).map(|_| rng.random_range(1..10)).collect());
            input.stage_memory_bytes = Some(rng.random_range(5..30));
        }
        if case % 3 == 2 && stages <= 3 {
            input.tensor_parallel = Some(TensorParallel {
                devices: stages + rng.random_range(0..=3),
                degrees: vec![TpDegree {
                    degree: 2,
                    layer_latency_ms: lat.iter().map(|l| l * rng.random_range(0.4..0.9)).collect(),
                }],
            });
        }
        let expected = stages_brute(&input);
        match stages::plan(&input) {
            Ok(out) => {
                let best = expected.unwrap_or_else(|| panic!("case {case}: planner found a plan brute force did not"));
                assert!(close(out.bottleneck_ms, best), "case {case}: {} vs {best}", out.bottleneck_ms);
                assert_eq!(out.stages.len(), stages);
                assert_eq!(out.stages[0][0], 0);
                assert_eq!(out.stages[stages - 1][1], layers);
                for w in out.stages.windows(2) {
                    assert_eq!(w[0][1], w[1][0]);
                }
                assert!(out.stages.iter().all(|r| r[0] < r[1]));
                let max = out.stage_latency_ms.iter().copied().fold(0.0, f64::max);
                assert_eq!(max, out.bottleneck_ms);
                if let Some(tp) = &input.tensor_parallel {
                    let degrees = out.tensor_parallel_degrees.as_ref().unwrap();
                    assert!(degrees.iter().sum::<usize>() <= tp.devices);
                }
            }
            Err(StagesError::DoesNotFit { .. }) => assert_eq!(expected, None, "case {case}"),
            Err(e) => panic!("case {case}: {e}"),
        }
    }
}

// ---------------------------------------------------------------- slices

fn random_table(rng: &mut ChaCha8Rng, n: usize) -> Vec<Vec<Option<f64>>> {
    (1..=n).map(|i| (0..n).map(|j| (i + j <= n).then(|| rng.random_range(0..40) as f64 * 0.25)).collect()).collect()
}

fn t_of(table: &[Vec<Option<f64>>], i: usize, j: usize) -> f64 {
    table[i - 1][j].unwrap()
}

fn terapipe_latency(table: &[Vec<Option<f64>>], slices: &[usize], stages: usize) -> f64 {
    let (mut ctx, mut sum, mut max) = (0, 0.0f64, 0.0f64);
    for &l in slices {
        let t = t_of(table, l, ctx);
        sum += t;
        max = max.max(t);
        ctx += l;
    }
    sum + (stages - 1) as f64 * max
}

/// Least `T` over every composition of `n`.
fn slices_brute(table: &[Vec<Option<f64>>], n: usize, stages: usize) -> f64 {
    let mut best = f64::INFINITY;
    for mask in 0u32..1 << (n - 1) {
        let mut slices = Vec::new();
        let mut len = 1;
        for bit in 0..n - 1 {
            if mask >> bit & 1 == 1 {
                slices.push(len);
                len = 1;
            } else {
                len += 1;
            }
        }
        slices.push(len);
        best = best.min(terapipe_latency(table, &slices, stages));
    }
    best
}

fn slices_input(table: Vec<Vec<Option<f64>>>, n: usize, stages: usize, epsilon: Option<f64>) -> SlicesInput {
    SlicesInput { seq_len: n, stages, t_fwd_ms: Some(table), epsilon_ms: epsilon, ..SlicesInput::default() }
}

#[test]
fn plan_slices_match_brute_force_on_all_compositions() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for case in 0..80 {
        let n = if case < 4 { 16 } else { rng.random_range(1..=12) };
        let stages = rng.random_range(1..=6);
        let table = random_table(&mut rng, n);
        let best = slices_brute(&table, n, stages);
        let out = slices::plan(&slices_input(table.clone(), n, stages, None)).unwrap();
        assert_eq!(out.slices.iter().sum::<usize>(), n);
        assert!(close(out.latency_ms, terapipe_latency(&table, &out.slices, stages)));
        assert!(close(out.latency_ms, best), "case {case}: {} vs {best}", out.latency_ms);
        // ε pruning stays within K·ε of the optimum.
        let eps = 0.6;
        let pruned = slices::plan(&slices_input(table, n, stages, Some(eps))).unwrap();
        assert!(pruned.latency_ms <= best + stages as f64 * eps + 1e-9);
    }
}

/// TeraPipe's cost shape: a fixed launch cost, per-token work and attention over the context.
fn attention_table(n: usize) -> Vec<Vec<Option<f64>>> {
    (1..=n)
        .map(|i| {
            (0..n)
                .map(|j| (i + j <= n).then(|| 1.0 + 0.05 * i as f64 + 0.002 * i as f64 * (j as f64 + i as f64 / 2.0)))
                .collect()
        })
        .collect()
}

#[test]
fn plan_slices_shrink_along_the_sequence_and_beat_uniform_slicing() {
    let (n, stages) = (48, 8);
    let table = attention_table(n);
    let out = slices::plan(&slices_input(table.clone(), n, stages, None)).unwrap();
    assert!(out.slices.windows(2).all(|w| w[0] >= w[1]), "{:?}", out.slices);
    assert!(out.slices.first() > out.slices.last(), "{:?}", out.slices);
    let uniform = (1..=n)
        .filter(|m| n % m == 0)
        .map(|m| terapipe_latency(&table, &vec![n / m; m], stages))
        .fold(f64::INFINITY, f64::min);
    assert!(out.latency_ms < uniform, "{} vs uniform {uniform}", out.latency_ms);
}

#[test]
fn plan_slices_batch_extension_matches_brute_force_knapsack() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for _ in 0..20 {
        let (n, stages, batch) = (rng.random_range(1..=6), rng.random_range(1..=4), rng.random_range(1..=6));
        let tables: Vec<_> = (0..batch).map(|_| random_table(&mut rng, n)).collect();
        let per_size: Vec<f64> = tables.iter().map(|t| slices_brute(t, n, stages)).collect();
        // Brute force over integer partitions of the batch.
        fn best_sum(left: usize, max_part: usize, per: &[f64]) -> f64 {
            if left == 0 {
                return 0.0;
            }
            (1..=left.min(max_part)).map(|b| per[b - 1] + best_sum(left - b, b, per)).fold(f64::INFINITY, f64::min)
        }
        let expected = best_sum(batch, batch, &per_size);
        let out = slices::plan_batch(&SlicesInput {
            seq_len: n,
            stages,
            batch: Some(batch),
            t_fwd_ms_by_batch: Some(tables),
            ..SlicesInput::default()
        })
        .unwrap();
        assert!(close(out.latency_ms, expected));
        assert_eq!(out.micro_batches.iter().map(|m| m.batch).sum::<usize>(), batch);
    }
}

// ---------------------------------------------------------------- profile

fn profile(rng: &mut ChaCha8Rng) -> Profile {
    let batch = vec![1.0, 4.0, 16.0];
    let tokens = vec![1.0, 8.0, 64.0];
    let (a, b) = (rng.random_range(0.05..0.5), rng.random_range(0.001..0.02));
    let base_ms = batch.iter().map(|&bb: &f64| tokens.iter().map(|&t: &f64| a + b * bb * t).collect()).collect();
    let (c, d, e) = (rng.random_range(0.05..0.3), rng.random_range(0.001..0.05), rng.random_range(0.0..0.0005));
    let context = vec![0.0, 64.0, 256.0];
    let ms = batch.iter().map(|&bb: &f64| context.iter().map(|&cc: &f64| c + d * bb + e * bb * cc).collect()).collect();
    Profile {
        version: 1,
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
fn engine_table(rng: &mut ChaCha8Rng) -> EngineStepTable {
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

#[test]
fn plan_slices_accept_a_profile_instead_of_the_table() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let p = profile(&mut rng);
    let input = SlicesInput {
        seq_len: 64,
        stages: 4,
        profile: Some(p.clone()),
        unit_tokens: Some(4),
        ..SlicesInput::default()
    };
    let out = slices::plan(&input).unwrap();
    assert_eq!(out.slices.iter().sum::<usize>(), 64);
    assert!(out.slices.iter().all(|s| s % 4 == 0));
    // The same costs as an explicit table (unit 4: 16 units) give the same latency.
    let model = p.cost_model("profile").unwrap();
    let per_stage = p.layers as f64 / 4.0;
    let table: Vec<Vec<Option<f64>>> = (1..=16)
        .map(|i| {
            (0..16)
                .map(|j| (i + j <= 16).then(|| per_stage * model.prefill_layer_ms(1.0, (4 * i) as f64, (4 * j) as f64)))
                .collect()
        })
        .collect();
    let tabled = slices::plan(&slices_input(table, 16, 4, None)).unwrap();
    assert!(close(out.latency_ms, tabled.latency_ms));
}

// ---------------------------------------------------------------- simulator and placement

#[test]
fn plan_sim_matches_hand_computed_timelines() {
    // One group, two stages of 1 s and 2 s; requests at 0, 0, 1, 10.
    let groups = [Group::new(2, vec![(0, vec![1.0, 2.0])])];
    let req = |t: f64| Request { arrival_s: t, model: 0 };
    let lat = sim::simulate(&groups, &[req(0.0), req(0.0), req(1.0), req(10.0)], 0.0);
    // r0: s0 0–1, s1 1–3. r1: s0 1–2, s1 3–5. r2: s0 2–3, s1 5–7. r3: 10–11, 11–13.
    assert_eq!(lat, vec![Some(3.0), Some(5.0), Some(6.0), Some(3.0)]);

    // Two one-stage groups of model 0, one of model 1; shortest queue first, ties to the lowest.
    let groups = [Group::new(1, vec![(0, vec![1.0])]), Group::new(1, vec![(0, vec![1.0]), (1, vec![0.5])])];
    let r = |t: f64, m: usize| Request { arrival_s: t, model: m };
    let lat = sim::simulate(&groups, &[r(0.0, 1), r(0.1, 0), r(0.2, 0), r(0.3, 0), r(0.4, 2)], 0.0);
    // m1 → g1: 0–0.5. m0@0.1 → g0 (queues 0 vs 1): 0.1–1.1. m0@0.2 → g0 (1 vs 1, tie to the
    // lowest): 1.1–2.1. m0@0.3 → g1 (2 vs 1): 0.5–1.5. Model 2: no group serves it.
    assert_eq!(lat[0], Some(0.5));
    assert!(close(lat[1].unwrap(), 1.0));
    assert!(close(lat[2].unwrap(), 1.9));
    assert!(close(lat[3].unwrap(), 1.2));
    assert_eq!(lat[4], None);
}

fn model(name: &str, layers: usize, layer_ms: f64, slo_s: f64) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        layer_latency_ms: vec![layer_ms; layers],
        layer_memory_bytes: vec![1 << 30; layers],
        slo_s,
        tensor_parallel: Vec::new(),
        measured_pipelines: Vec::new(),
    }
}

#[test]
fn plan_placement_reports_hand_computed_latencies_in_trace_order() {
    let input = PlacementInput {
        models: vec![model("a", 3, 100.0, 0.5)],
        devices: 1,
        device_memory_bytes: 3 << 30,
        workload: PlacementWorkload {
            // Out of order on purpose: latencies come back in this order.
            trace: Some(vec![
                (1.0, ModelRef::Name("a".into())),
                (0.0, ModelRef::Index(0)),
                (0.1, ModelRef::Name("a".into())),
                (0.2, ModelRef::Index(0)),
            ]),
            arrivals: None,
            duration_s: None,
            seed: None,
        },
        baseline: None,
        beam: None,
        interference: None,
        serve_every_model: false,
        admission: Default::default(),
    };
    let out = placement::plan(&input).unwrap();
    // 0.0 → 0.3, 0.1 → 0.6, 0.2 → 0.9, 1.0 → 1.3.
    let expected = [0.3, 0.3, 0.5, 0.7];
    for (l, e) in out.latencies_s.iter().zip(expected) {
        assert!(close(l.unwrap(), e), "{:?}", out.latencies_s);
    }
    assert_eq!(out.slo_attainment, 0.75);
    assert_eq!(out.groups[0].models[0].stages, vec![[0, 3]]);
}

#[test]
fn plan_placement_model_parallelism_beats_replication_on_bursty_two_model_traffic() {
    // AlpaServe §4.3.1: two models of 0.4 s, two devices that each hold one model, bursty traffic.
    let input = measured_pipelines::bursty(None);
    let best = placement::plan(&input).unwrap();
    let replication =
        placement::plan(&PlacementInput { baseline: Some(Baseline::Replication), ..input.clone() }).unwrap();
    assert!(replication.groups.iter().all(|g| g.pipeline_stages == 1));
    assert!(best.groups.iter().any(|g| g.pipeline_stages == 2 && g.models.len() == 2), "{:?}", best.groups);
    assert!(
        best.slo_attainment > replication.slo_attainment + 0.02,
        "model parallel {} vs replication {}",
        best.slo_attainment,
        replication.slo_attainment
    );
    assert_eq!(best.latencies_s.len(), replication.latencies_s.len());
}

// ---------------------------------------------------------------- schedule

fn random_lengths(rng: &mut ChaCha8Rng, max: usize) -> LengthDistribution {
    LengthDistribution::Histogram(
        (0..rng.random_range(1..=4)).map(|_| (rng.random_range(1..=max), rng.random_range(0.1..1.0))).collect(),
    )
}

#[test]
fn plan_schedule_branch_and_bound_matches_exhaustive_search() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut feasible = 0;
    for case in 0..200 {
        let mut input = ScheduleInput {
            profile: profile(&mut rng),
            input_lengths: random_lengths(&mut rng, 40),
            output_lengths: random_lengths(&mut rng, 12),
            devices: rng.random_range(1..=4),
            device_memory_bytes: rng.random_range(3_000..40_000),
            latency_bound_s: rng.random_range(0.002..0.3),
            strategies: None,
            max_encode_batch: Some(rng.random_range(1..=12)),
            max_decode_iterations: None,
            max_decode_batch: rng.random_bool(0.4).then(|| rng.random_range(1..=24)),
            latency_percentile: None,
            step_variation: None,
            exhaustive: false,
            // Half the cases with devices that slow each other down: the bounds stay valid.
            interference: if rng.random_bool(0.5) { rng.random_range(0.0..2.0) } else { 0.0 },
            stage_layers: None,
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
        profile: Profile { engine_step_ms: None, ..profile(rng) },
        input_lengths: LengthDistribution::Histogram(vec![(32, 1.0), (64, 1.0)]),
        output_lengths: LengthDistribution::Histogram(vec![(8, 1.0), (16, 1.0), (32, 0.5)]),
        devices: 1,
        device_memory_bytes: 1 << 30,
        latency_bound_s: bound,
        strategies: None,
        max_encode_batch: Some(64),
        max_decode_iterations: None,
        max_decode_batch: None,
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: 0.0,
        stage_layers: None,
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
fn hand_profile(engine_step: Option<EngineStep>) -> Profile {
    Profile {
        version: 1,
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
fn hand_overhead() -> EngineStep {
    EngineStep {
        prefill_ms_fixed: 3.0,
        prefill_ms_per_seq: 1.0,
        prefill_ms_per_token: 0.1,
        decode_ms_fixed: 2.0,
        decode_ms_per_seq: 0.5,
    }
}

/// One device, RRA, outputs of 5 tokens, `B_E = 1`, `N_D ≤ 2`: the hand-computed timelines' input.
fn hand_input(bound: f64, profile: Profile, prompts: LengthDistribution) -> ScheduleInput {
    ScheduleInput {
        profile,
        input_lengths: prompts,
        output_lengths: LengthDistribution::Histogram(vec![(5, 1.0)]),
        devices: 1,
        device_memory_bytes: 1 << 30,
        latency_bound_s: bound,
        strategies: Some(vec![schedule::Strategy::Rra]),
        max_encode_batch: Some(1),
        max_decode_iterations: Some(2),
        max_decode_batch: None,
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: 0.0,
        stage_layers: None,
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
fn replayed(e: f64, i: &[f64], n_d: usize) -> f64 {
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
fn measured_profile(engine_step: Option<EngineStep>) -> Profile {
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
        let mut input = ScheduleInput {
            profile,
            input_lengths: random_lengths(&mut rng, 40),
            output_lengths: random_lengths(&mut rng, 12),
            devices: rng.random_range(1..=3),
            device_memory_bytes: 1 << 30,
            latency_bound_s: rng.random_range(0.01..0.3),
            strategies: None,
            max_encode_batch: Some(rng.random_range(1..=12)),
            max_decode_iterations: None,
            max_decode_batch: None,
            latency_percentile: None,
            step_variation: None,
            exhaustive: false,
            interference: 0.0,
            stage_layers: None,
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
fn plan_cli_rejects_bad_engine_step_tables_with_exit_2() {
    let input = ScheduleInput {
        profile: measured_profile(None),
        input_lengths: LengthDistribution::Histogram(vec![(10, 1.0)]),
        output_lengths: LengthDistribution::Histogram(vec![(5, 1.0)]),
        devices: 1,
        device_memory_bytes: 1 << 30,
        latency_bound_s: 1.0,
        strategies: None,
        max_encode_batch: Some(2),
        max_decode_iterations: None,
        max_decode_batch: None,
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: 0.0,
        stage_layers: None,
    };
    let good = serde_json::to_value(&input).unwrap();
    let (out, code) = cli_run("schedule", &good.to_string(), &[]);
    assert_eq!(code, 0, "{out}");
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
        let (out, code) = cli_run("schedule", &bad.to_string(), &[]);
        assert_eq!(code, 2, "{path}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains(named), "{path}: {error}");
    }
    // NaN is not JSON; a missing table or an unknown field is an error too.
    let text = good.to_string();
    for bad in [
        text.replacen("[[3.0,3.0]", "[[NaN,3.0]", 1),
        text.replacen("\"decode\":{\"batch\"", "\"decodes\":{\"batch\"", 1),
    ] {
        assert_ne!(bad, text);
        let (out, code) = cli_run("schedule", &bad, &[]);
        assert_eq!(code, 2, "{out}");
        assert!(out["error"].as_str().is_some_and(|e| !e.is_empty()), "{out}");
    }
    let mut missing = good.clone();
    missing.pointer_mut(table).unwrap().as_object_mut().unwrap().remove("prefill");
    let (out, code) = cli_run("schedule", &missing.to_string(), &[]);
    assert_eq!(code, 2, "{out}");
}

// ---------------------------------------------------------------- bad input

#[test]
fn plan_bad_input_is_an_error_not_a_panic() {
    let base = StagesInput { layer_latency_ms: vec![1.0, 2.0], stages: 1, ..StagesInput::default() };
    for bad in [
        StagesInput { layer_latency_ms: vec![f64::NAN, 1.0], ..base.clone() },
        StagesInput { layer_latency_ms: vec![-1.0, 1.0], ..base.clone() },
        StagesInput { layer_latency_ms: vec![], ..base.clone() },
        StagesInput { stages: 3, ..base.clone() },
        StagesInput {
            layer_memory_bytes: Some(vec![u64::MAX, u64::MAX]),
            stage_memory_bytes: Some(u64::MAX),
            ..base.clone()
        },
        StagesInput { layer_memory_bytes: Some(vec![1]), stage_memory_bytes: Some(1), ..base.clone() },
    ] {
        assert!(stages::plan(&bad).is_err(), "{bad:?}");
    }
    // Sizes past what the planners can allocate are errors, not aborts.
    let huge = StagesInput { layer_latency_ms: vec![1.0; 4096], stages: 4096, ..base.clone() };
    assert!(matches!(stages::plan(&huge), Err(StagesError::TooLarge { .. })));
    let many = StagesInput { layer_latency_ms: vec![1.0; 5000], ..base.clone() };
    assert!(stages::plan(&many).is_err());
    let batch = SlicesInput {
        seq_len: 4096,
        stages: 2,
        batch: Some(4096),
        profile: Some(profile(&mut ChaCha8Rng::seed_from_u64(1))),
        ..SlicesInput::default()
    };
    assert!(slices::plan_batch(&batch).is_err());
    // The batch extension is its own function.
    assert!(slices::plan(&SlicesInput { batch: Some(1), ..slices_input(vec![vec![Some(1.0)]], 1, 1, None) }).is_err());
    let flood = PlacementInput {
        models: vec![model("a", 1, 1.0, 1.0)],
        devices: 1,
        device_memory_bytes: 1 << 30,
        workload: PlacementWorkload {
            trace: None,
            arrivals: Some(vec![Arrivals { model: ModelRef::Index(0), rate: 1e9, cv: 1.0 }]),
            duration_s: Some(1e9),
            seed: None,
        },
        baseline: None,
        beam: None,
        interference: None,
        serve_every_model: false,
        admission: Default::default(),
    };
    assert!(placement::plan(&flood).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(1.0)]], 2, 1, None)).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(f64::INFINITY)]], 1, 1, None)).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(1.0)]], 1, 0, None)).is_err());
}

/// Writes `json` to a fresh temporary file and runs the CLI on it.
fn cli_run(planner: &str, json: &str, extra: &[&str]) -> (serde_json::Value, i32) {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("burn-parallel-plan-{}-{n}.json", std::process::id()));
    std::fs::write(&path, json).unwrap();
    let mut args = vec!["plan".to_string(), planner.to_string(), "--input".into(), path.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let (out, code) = cli::run(args);
    std::fs::remove_file(&path).ok();
    (serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}")), code)
}

#[test]
fn plan_cli_prints_one_json_object_and_exits_2_on_bad_input() {
    let (out, code) = cli_run("stages", r#"{"layer_latency_ms": [1, 2, 3, 4], "stages": 2}"#, &[]);
    assert_eq!(code, 0);
    assert_eq!(out["stages"], serde_json::json!([[0, 3], [3, 4]]));
    assert_eq!(out["bottleneck_ms"], 6.0);
    let (out, code) = cli_run("slices", r#"{"seq_len": 2, "stages": 2, "t_fwd_ms": [[1, 1], [3, null]]}"#, &[]);
    assert_eq!((code, out["slices"].clone()), (0, serde_json::json!([1, 1])));
    for (planner, json, extra) in [
        ("stages", r#"{"stages": 2}"#, &[][..]),
        ("stages", r#"{"layer_latency_ms": [1, -2], "stages": 1}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [NaN], "stages": 1}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [], "stages": 1}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [1], "stages": 18446744073709551616}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [1e400], "stages": 1}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [1], "stages": 2}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [1], "stages": 1, "typo": 1}"#, &[]),
        ("stages", r#"{"layer_latency_ms": [1], "stages": 1}"#, &["--exhaustive"]),
        ("slices", r#"{"seq_len": 3, "stages": 1, "t_fwd_ms": [[1]]}"#, &[]),
        ("slices", r#"{"seq_len": 100000, "stages": 1, "t_fwd_ms": []}"#, &[]),
        (
            "placement",
            r#"{"models": [], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "a"]]}}"#,
            &[],
        ),
        (
            "placement",
            r#"{"models": [{"name": "a", "layer_latency_ms": [1], "layer_memory_bytes": [10], "slo_s": 1}], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "a"]]}}"#,
            &["--baseline", "replication"],
        ),
        (
            "placement",
            r#"{"models": [{"name": "a", "layer_latency_ms": [1], "layer_memory_bytes": [1], "slo_s": 1}], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "nope"]]}}"#,
            &[],
        ),
        ("schedule", r#"{"devices": 1}"#, &[]),
        ("unknown", "{}", &[]),
    ] {
        let (out, code) = cli_run(planner, json, extra);
        assert_eq!(code, 2, "{planner} {json}: {out}");
        assert!(out["error"].as_str().is_some_and(|e| !e.is_empty()), "{out}");
    }
    let (out, code) = cli::run(["plan", "stages", "--input", "/nonexistent/plan.json"]);
    assert_eq!(code, 2, "{out}");
}

#[test]
fn plan_cli_schedule_exhaustive_flag_and_placement_baseline() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let input = ScheduleInput {
        profile: profile(&mut rng),
        input_lengths: LengthDistribution::Trace(vec![16, 24, 32]),
        output_lengths: LengthDistribution::Histogram(vec![(4, 1.0), (8, 1.0)]),
        devices: 2,
        device_memory_bytes: 1 << 20,
        latency_bound_s: 1.0,
        strategies: None,
        max_encode_batch: Some(8),
        max_decode_iterations: None,
        max_decode_batch: None,
        latency_percentile: None,
        step_variation: None,
        exhaustive: false,
        interference: 0.0,
        stage_layers: None,
    };
    let json = serde_json::to_string(&input).unwrap();
    let (bnb, code) = cli_run("schedule", &json, &[]);
    assert_eq!(code, 0, "{bnb}");
    let (all, code) = cli_run("schedule", &json, &["--exhaustive"]);
    assert_eq!(code, 0, "{all}");
    assert_eq!(all["search"], "exhaustive");
    assert!(close(bnb["throughput_qps"].as_f64().unwrap(), all["throughput_qps"].as_f64().unwrap()));
    let placement = r#"{"models": [{"name": "a", "layer_latency_ms": [100, 100], "layer_memory_bytes": [1, 1], "slo_s": 1}],
        "devices": 2, "device_memory_bytes": 2, "workload": {"arrivals": [{"model": "a", "rate": 2, "cv": 2}], "duration_s": 20, "seed": 3}}"#;
    let (out, code) = cli_run("placement", placement, &["--baseline", "replication"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["baseline"], "replication");
    assert_eq!(out["latencies_s"].as_array().unwrap().len(), out["models"][0]["requests"].as_u64().unwrap() as usize);
}

#[test]
fn plan_sample_inputs_all_plan() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("inputs");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(planner) = ["stages", "slices", "placement", "schedule"].into_iter().find(|p| name.starts_with(p))
        else {
            continue;
        };
        let (out, code) = cli::run(["plan", planner, "--input", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{name}: {out}");
        assert!(serde_json::from_str::<serde_json::Value>(&out).unwrap().is_object());
        ran += 1;
    }
    assert!(ran >= 9, "ran {ran} sample inputs");
    // The profile on its own is a valid profile.
    let text = std::fs::read_to_string(dir.join("profile.json")).unwrap();
    let profile: Profile = serde_json::from_str(&text).unwrap();
    assert!(profile.cost_model("profile").is_ok());
}

#[test]
fn plan_placement_with_unreachable_slo_still_places_every_model() {
    let mut input = PlacementInput {
        models: vec![model("a", 2, 500.0, 0.1)],
        devices: 2,
        device_memory_bytes: 2 << 30,
        workload: PlacementWorkload {
            trace: Some(vec![(0.0, ModelRef::Index(0))]),
            arrivals: None,
            duration_s: None,
            seed: None,
        },
        baseline: None,
        beam: Some(2),
        interference: None,
        serve_every_model: false,
        admission: Default::default(),
    };
    let out = placement::plan(&input).unwrap();
    assert_eq!(out.slo_attainment, 0.0);
    assert!(out.groups.iter().any(|g| !g.models.is_empty()));
    assert!(close(out.latencies_s[0].unwrap(), 1.0));
    input.device_memory_bytes = 1;
    assert!(matches!(placement::plan(&input), Err(placement::PlacementError::NothingFits { .. })));
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
