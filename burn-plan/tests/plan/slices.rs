//! TeraPipe's slicing planner against brute force over every composition, its batch extension
//! against a brute-force knapsack, and slices planned from a profile instead of a table.

use burn_plan::slices::{self, SlicesInput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::close;
use super::profiles::profile;

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

pub(super) fn slices_input(table: Vec<Vec<Option<f64>>>, n: usize, stages: usize, epsilon: Option<f64>) -> SlicesInput {
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
