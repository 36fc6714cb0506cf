//! Least-squares fits of measured times: TeraPipe's context overhead
//! `t_ctx(i, j) = a0 + a1·i + a2·j + a3·i·j` with every coefficient ≥ 0 (the profile's
//! `prefill.context_ms`), the serving engine's per-step overhead (`engine_step`), and a per-token
//! cost as a slope through the origin; and the tables of the serving engine's measured steps
//! (`engine_step_ms`), which are not fitted but tabulated.

use burn_plan::check::InputError;
use burn_plan::profile::{
    CostModel, DecodeTable, EngineStep, EngineStepTable, PrefillStepTable, Profile, RunSpread, Spread, StepVariation,
};

/// One measurement of the context overhead: a slice of `tokens` tokens after `context` tokens
/// took `overhead_ms` longer than the same slice without context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextSample {
    /// Tokens in the slice (`i`).
    pub tokens: f64,
    /// Tokens of context before it (`j`).
    pub context: f64,
    /// Measured `t(i, j) − t(i, 0)` in milliseconds (may be negative from noise).
    pub overhead_ms: f64,
}

/// `[a0, a1, a2, a3]` minimising `Σ (a0 + a1·i + a2·j + a3·i·j − overhead)²` subject to every
/// `a ≥ 0` (all zeros without samples). Exact non-negative least squares: with four unknowns,
/// every set of free coefficients is solved and the best feasible one kept.
pub fn context_overhead(samples: &[ContextSample]) -> [f64; 4] {
    let rows: Vec<[f64; 4]> = samples.iter().map(|s| [1.0, s.tokens, s.context, s.tokens * s.context]).collect();
    let ys: Vec<f64> = samples.iter().map(|s| s.overhead_ms).collect();
    non_negative_least_squares(&rows, &ys)
}

/// What one timed step of the serving engine did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// It prefilled the prompts of its sequences.
    Prefill,
    /// It decoded one token of each of its sequences.
    Decode,
}

/// One timed step of the serving engine (see [`engine_step`]). Give every timing of a point as
/// its own sample: the tables keep each point's median, and [`step_variation`] reads the spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// Prefill or decode.
    pub kind: StepKind,
    /// Sequences in the step.
    pub batch: usize,
    /// New tokens per sequence (the prompt length for a prefill, 1 for a decode).
    pub tokens: usize,
    /// Tokens of context per sequence before the step.
    pub context: usize,
    /// Wall-clock milliseconds of the step.
    pub ms: f64,
    /// Which timed run of the engine the step was part of: the steps of one run (a prefill and
    /// the decode steps after it) were timed one after another. [`step_variation`] reads the
    /// spread of a run's decode steps together, as a request's latency sums consecutive steps.
    pub run: usize,
}

/// The engine's per-step overhead: the part of each sample's time the profile's tables do not
/// predict (`ms − cost.prefill_compute_ms(…)` or `… decode_compute_ms(…)`), fitted by exact
/// non-negative least squares as `fixed + per_seq·batch + per_token·batch·tokens` for prefills
/// and `fixed + per_seq·batch` for decodes. An engine faster than the tables gets zeros.
pub fn engine_step(cost: &CostModel, samples: &[StepSample]) -> EngineStep {
    let fit = |kind: StepKind| {
        let (rows, ys): (Vec<[f64; 4]>, Vec<f64>) = samples
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| {
                let (b, t) = (s.batch as f64, s.tokens as f64);
                match kind {
                    StepKind::Prefill => ([1.0, b, b * t, 0.0], s.ms - cost.prefill_compute_ms(b, t)),
                    StepKind::Decode => ([1.0, b, 0.0, 0.0], s.ms - cost.decode_compute_ms(b, s.context as f64)),
                }
            })
            .unzip();
        non_negative_least_squares(&rows, &ys)
    };
    let (prefill, decode) = (fit(StepKind::Prefill), fit(StepKind::Decode));
    EngineStep {
        prefill_ms_fixed: prefill[0],
        prefill_ms_per_seq: prefill[1],
        prefill_ms_per_token: prefill[2],
        decode_ms_fixed: decode[0],
        decode_ms_per_seq: decode[1],
    }
}

/// The serving engine's measured steps as tables (the profile's `engine_step_ms`): for each
/// kind, the median time of the samples at each (batch, prompt tokens) or (batch, context) point.
/// The tables keep the lengths measured at every batch, and the batches measured at all of them
/// (a table is a full grid); `None` when a kind has no sample.
pub fn engine_step_table(samples: &[StepSample]) -> Option<EngineStepTable> {
    let (batch, tokens, ms) = step_grid(samples, StepKind::Prefill, |s| s.tokens)?;
    let prefill = PrefillStepTable { batch, tokens, ms };
    let (batch, context, ms) = step_grid(samples, StepKind::Decode, |s| s.context)?;
    Some(EngineStepTable { prefill, decode: DecodeTable { batch, context, ms } })
}

/// A table's batch axis, length axis and `ms[batch][length]`.
type StepGrid = (Vec<f64>, Vec<f64>, Vec<Vec<f64>>);

/// The full grid of `kind`'s samples over (batch, `length`) (see [`engine_step_table`]).
fn step_grid(samples: &[StepSample], kind: StepKind, length: fn(&StepSample) -> usize) -> Option<StepGrid> {
    let of_kind: Vec<StepSample> = samples.iter().copied().filter(|s| s.kind == kind).collect();
    let sorted = |mut v: Vec<usize>| {
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut batches = sorted(of_kind.iter().map(|s| s.batch).collect());
    let mut lengths = sorted(of_kind.iter().map(length).collect());
    let at = |b: usize, l: usize| -> Vec<f64> {
        of_kind.iter().filter(|s| s.batch == b && length(s) == l).map(|s| s.ms).collect()
    };
    lengths.retain(|&l| batches.iter().all(|&b| !at(b, l).is_empty()));
    if lengths.is_empty() {
        // No length is measured at every batch: keep the batch measured most, and the batches
        // measured at all of its lengths.
        let best = batches.iter().copied().max_by_key(|&b| of_kind.iter().filter(|s| s.batch == b).count())?;
        lengths = sorted(of_kind.iter().filter(|s| s.batch == best).map(length).collect());
        batches.retain(|&b| lengths.iter().all(|&l| !at(b, l).is_empty()));
    }
    let ms = batches.iter().map(|&b| lengths.iter().map(|&l| median(at(b, l))).collect()).collect();
    let axis = |v: &[usize]| v.iter().map(|&x| x as f64).collect();
    Some((axis(&batches), axis(&lengths), ms))
}

/// Sets `profile`'s `engine_step` ([`engine_step`]), `engine_step_ms` ([`engine_step_table`])
/// and `step_variation` ([`step_variation`]) from the engine's timed steps.
pub fn engine_steps(profile: &mut Profile, samples: &[StepSample]) -> Result<(), InputError> {
    let cost = profile.cost_model("profile")?;
    profile.engine_step = Some(engine_step(&cost, samples));
    profile.engine_step_ms = engine_step_table(samples);
    profile.step_variation = step_variation(samples);
    Ok(())
}

/// The 99th-percentile variation of the engine's steps (ExeGPT §7.9, the profile's
/// `step_variation`), measured over what a request's latency adds up. Each timed run of a point
/// (samples sharing `run`) gives one ratio per kind: the mean of its steps of that kind over the
/// point's median step (a prefill run has one step; a decode run the steps a request decodes one
/// after another, so a stall shared by neighbouring steps counts fully and one step's hiccup is
/// averaged as a request's sum averages it). The ratios are pooled by kind; the 99th percentile
/// of the pooled ratios (nearest rank, so with fewer than 100 ratios the largest), minus 1,
/// between 0 and [`StepVariation::MAX`] (a step preempted for many times its length on a loaded
/// machine would otherwise make every bound infeasible). `runs` holds the pooled ratios' mean
/// (minus 1, at least 0) and standard deviation, capped the same way, and the decode steps per
/// run (their mean count, rounded), for latencies that sum many runs. `None` when no point was
/// run twice.
pub fn step_variation(samples: &[StepSample]) -> Option<StepVariation> {
    // (99th percentile, spread, steps per run) of one kind's pooled ratios.
    let of_kind = |kind: StepKind| -> Option<(f64, Spread, usize)> {
        let point = |s: &&StepSample| (s.batch, s.tokens, s.context);
        let mut of_kind: Vec<&StepSample> = samples.iter().filter(|s| s.kind == kind).collect();
        of_kind.sort_by_key(|s| (point(s), s.run));
        let (mut ratios, mut steps, mut runs_counted) = (Vec::new(), 0usize, 0usize);
        for timed in of_kind.chunk_by(|a, b| point(a) == point(b)) {
            let middle = median(timed.iter().map(|s| s.ms).collect());
            let runs: Vec<&[&StepSample]> = timed.chunk_by(|a, b| a.run == b.run).collect();
            if runs.len() > 1 && middle > 0.0 {
                ratios.extend(runs.iter().map(|run| run.iter().map(|s| s.ms).sum::<f64>() / run.len() as f64 / middle));
                steps += runs.iter().map(|run| run.len()).sum::<usize>();
                runs_counted += runs.len();
            }
        }
        ratios.sort_by(f64::total_cmp);
        let rank = (0.99 * ratios.len() as f64).ceil() as usize;
        let p99 = ratios.get(rank.checked_sub(1)?)?;
        let n = ratios.len() as f64;
        let mean = ratios.iter().sum::<f64>() / n;
        let std = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
        let cap = |v: f64| v.clamp(0.0, StepVariation::MAX);
        let spread = Spread { mean: cap(mean - 1.0), std: cap(std) };
        Some((cap(p99 - 1.0), spread, (steps as f64 / runs_counted as f64).round() as usize))
    };
    let (prefill, decode) = (of_kind(StepKind::Prefill), of_kind(StepKind::Decode));
    if prefill.is_none() && decode.is_none() {
        return None;
    }
    let runs = RunSpread {
        decode_steps: decode.map_or(1, |d| d.2.max(1)),
        prefill: prefill.map_or(Spread::default(), |p| p.1),
        decode: decode.map_or(Spread::default(), |d| d.1),
    };
    Some(StepVariation { prefill: prefill.map_or(0.0, |p| p.0), decode: decode.map_or(0.0, |d| d.0), runs: Some(runs) })
}

/// The middle value (the upper one of an even count); 0 without values.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// `a` minimising `Σ (rows[k]·a − ys[k])²` subject to every `a ≥ 0` (all zeros without rows).
/// Exact: with four unknowns, every set of free coefficients is solved and the best feasible one
/// kept. A column of zeros is never freed.
fn non_negative_least_squares(rows: &[[f64; 4]], ys: &[f64]) -> [f64; 4] {
    // Columns scaled to a largest entry of 1, so that the normal equations stay well conditioned.
    let scale: [f64; 4] = std::array::from_fn(|c| {
        let max = rows.iter().map(|r| r[c].abs()).fold(0.0, f64::max);
        if max > 0.0 { max } else { 1.0 }
    });
    let residual = |a: &[f64; 4]| -> f64 {
        rows.iter()
            .zip(ys)
            .map(|(r, y)| {
                let fit: f64 = (0..4).map(|c| a[c] * r[c]).sum();
                (fit - y).powi(2)
            })
            .sum()
    };
    let mut best = ([0.0; 4], residual(&[0.0; 4]));
    for mask in 1u32..16 {
        let free: Vec<usize> = (0..4).filter(|c| mask & (1 << c) != 0).collect();
        let Some(solution) = least_squares(rows, ys, &free, &scale) else {
            continue;
        };
        let mut a = [0.0; 4];
        for (&c, &x) in free.iter().zip(&solution) {
            a[c] = x / scale[c];
        }
        if a.iter().all(|&x| x >= 0.0 && x.is_finite()) {
            let r = residual(&a);
            if r < best.1 {
                best = (a, r);
            }
        }
    }
    best.0
}

/// Unconstrained least squares over the columns `free` (scaled by `scale`), by the normal
/// equations; `None` when they are singular (too few distinct samples for those columns).
fn least_squares(rows: &[[f64; 4]], ys: &[f64], free: &[usize], scale: &[f64; 4]) -> Option<Vec<f64>> {
    let n = free.len();
    let mut m = vec![vec![0.0; n + 1]; n];
    for (r, y) in rows.iter().zip(ys) {
        let x: Vec<f64> = free.iter().map(|&c| r[c] / scale[c]).collect();
        for i in 0..n {
            for k in 0..n {
                m[i][k] += x[i] * x[k];
            }
            m[i][n] += x[i] * y;
        }
    }
    solve(m)
}

/// Gaussian elimination with partial pivoting on an augmented `n × (n + 1)` matrix.
fn solve(mut m: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = m.len();
    let norm = m.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()));
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() <= 1e-12 * norm.max(f64::MIN_POSITIVE) {
            return None;
        }
        m.swap(col, pivot);
        let (top, below) = m.split_at_mut(col + 1);
        let pivot_row = &top[col];
        for row in below {
            let f = row[col] / pivot_row[col];
            for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let rest: f64 = (row + 1..n).map(|k| m[row][k] * x[k]).sum();
        x[row] = (m[row][n] - rest) / m[row][row];
    }
    Some(x)
}

/// The least-squares slope `c` of `y = c·x` through the points `(xs[k], ys[k])`, clamped at 0
/// (0 without points).
pub fn slope_through_origin(xs: &[f64], ys: &[f64]) -> f64 {
    let xx: f64 = xs.iter().map(|x| x * x).sum();
    let xy: f64 = xs.iter().zip(ys).map(|(x, y)| x * y).sum();
    if xx > 0.0 { (xy / xx).max(0.0) } else { 0.0 }
}

/// The fixed cost of one pass (`Profile::call_ms`) from a step of the first layer alone taking
/// `one_ms` and the same step through `layers` layers taking `all_ms`: with `one = o + l` and
/// `all = o + layers·l`, `o = (layers·one − all) / (layers − 1)`, kept within `[0, one]` (0 when
/// only one layer was run: nothing separates the two).
pub fn call_ms(one_ms: f64, all_ms: f64, layers: usize) -> f64 {
    if layers < 2 || !(one_ms.is_finite() && all_ms.is_finite()) {
        return 0.0;
    }
    let k = layers as f64;
    ((k * one_ms - all_ms) / (k - 1.0)).clamp(0.0, one_ms.max(0.0))
}

/// Share of a point's time kept as its layers' cost when noise put the point below the fixed
/// cost: the planners need positive per-layer times.
const LEAST_LAYER_SHARE: f64 = 0.05;

/// Steps of `layers` layers that took `rows` ms each, as per-layer times: the fixed `call_ms`
/// taken off, the rest divided by the layers (never below [`LEAST_LAYER_SHARE`] of the point).
pub fn per_layer(rows: Vec<Vec<f64>>, call_ms: f64, layers: usize) -> Vec<Vec<f64>> {
    let k = layers.max(1) as f64;
    rows.into_iter()
        .map(|row| row.into_iter().map(|t| (t - call_ms).max(LEAST_LAYER_SHARE * t) / k).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_cost_of_a_pass_is_separated_from_the_layers() {
        // o = 2 ms per pass, l = 0.25 ms per layer, 4 layers.
        let (one, all) = (2.25, 3.0);
        assert!((call_ms(one, all, 4) - 2.0).abs() < 1e-12);
        let table = per_layer(vec![vec![all, 2.0 + 4.0 * 1.5]], call_ms(one, all, 4), 4);
        assert!((table[0][0] - 0.25).abs() < 1e-12 && (table[0][1] - 1.5).abs() < 1e-12, "{table:?}");
        // One layer run: nothing to separate; noise never makes the cost negative or above one layer's step.
        assert_eq!(call_ms(1.0, 0.5, 1), 0.0);
        assert_eq!(call_ms(1.0, 9.0, 4), 0.0);
        assert_eq!(call_ms(1.0, 0.1, 4), 1.0);
        // A point below the fixed cost keeps a positive per-layer time.
        assert!(per_layer(vec![vec![0.5]], 1.0, 4)[0][0] > 0.0);
    }

    fn samples(a: [f64; 4], noise: impl Fn(usize) -> f64) -> Vec<ContextSample> {
        let mut out = Vec::new();
        for (k, (i, j)) in
            [1.0, 16.0, 64.0, 256.0].iter().flat_map(|&i| [32.0, 128.0, 512.0].map(|j| (i, j))).enumerate()
        {
            out.push(ContextSample {
                tokens: i,
                context: j,
                overhead_ms: a[0] + a[1] * i + a[2] * j + a[3] * i * j + noise(k),
            });
        }
        out
    }

    #[test]
    fn profile_fit_recovers_exact_context_coefficients() {
        let a = [0.01, 0.002, 0.0003, 0.00004];
        let fit = context_overhead(&samples(a, |_| 0.0));
        for (f, t) in fit.iter().zip(a) {
            assert!((f - t).abs() <= 1e-9 * (1.0 + t), "{fit:?} vs {a:?}");
        }
    }

    #[test]
    fn profile_fit_keeps_coefficients_non_negative() {
        // Overhead falling with the slice length: the best non-negative fit drops `a1`.
        let fit = context_overhead(&samples([0.5, -0.001, 0.0, 0.0], |k| 0.01 * (k % 3) as f64));
        assert!(fit.iter().all(|&a| a >= 0.0), "{fit:?}");
        assert_eq!(fit[1], 0.0);
        assert!(fit[0] > 0.0);
        // Pure noise around zero, and no samples at all: no negative cost.
        let fit = context_overhead(&samples([0.0; 4], |k| if k % 2 == 0 { -0.1 } else { 0.05 }));
        assert!(fit.iter().all(|&a| a >= 0.0), "{fit:?}");
        assert_eq!(context_overhead(&[]), [0.0; 4]);
    }

    fn cost() -> CostModel {
        use burn_plan::profile::{DecodeTable, Extra, PrefillTable, Profile};
        let profile = Profile {
            version: burn_plan::profile::PROFILE_VERSION,
            model: None,
            device: None,
            layers: 2,
            prefill: PrefillTable {
                batch: vec![1.0, 4.0],
                tokens: vec![1.0, 16.0],
                base_ms: vec![vec![1.0, 2.0], vec![2.0, 8.0]],
                context_ms: [0.0; 4],
            },
            decode: DecodeTable {
                batch: vec![1.0, 4.0],
                context: vec![0.0, 64.0],
                ms: vec![vec![0.5, 0.6], vec![1.0, 1.2]],
            },
            weight_bytes_per_layer: 1,
            kv_bytes_per_token_per_layer: 1,
            embedding: Extra { weight_bytes: 1, ms_per_token: 0.01 },
            lm_head: Extra { weight_bytes: 1, ms_per_token: 0.25 },
            tensor_parallel: vec![],
            engine_step: None,
            engine_step_ms: None,
            call_ms: 0.0,
            step_variation: None,
        };
        profile.cost_model("p").unwrap()
    }

    fn steps(cost: &CostModel, overhead: EngineStep, noise: f64) -> Vec<StepSample> {
        let mut out = Vec::new();
        for (k, (batch, tokens)) in [(1usize, 8usize), (1, 16), (2, 8), (4, 16), (3, 4)].into_iter().enumerate() {
            let (b, t) = (batch as f64, tokens as f64);
            let jitter = if k % 2 == 0 { noise } else { -noise };
            let ms = cost.prefill_compute_ms(b, t) + overhead.prefill_ms(b, t) + jitter;
            out.push(StepSample { kind: StepKind::Prefill, batch, tokens, context: 0, ms, run: 0 });
            for step in 0..3 {
                let context = tokens + step;
                let ms = cost.decode_compute_ms(b, context as f64) + overhead.decode_ms(b) - jitter;
                out.push(StepSample { kind: StepKind::Decode, batch, tokens: 1, context, ms, run: 0 });
            }
        }
        out
    }

    #[test]
    fn profile_fit_recovers_the_engine_step_overhead() {
        let cost = cost();
        let truth = EngineStep {
            prefill_ms_fixed: 3.0,
            prefill_ms_per_seq: 1.0,
            prefill_ms_per_token: 0.1,
            decode_ms_fixed: 2.0,
            decode_ms_per_seq: 0.5,
        };
        let fit = engine_step(&cost, &steps(&cost, truth, 0.0));
        let pairs = [
            (fit.prefill_ms_fixed, truth.prefill_ms_fixed),
            (fit.prefill_ms_per_seq, truth.prefill_ms_per_seq),
            (fit.prefill_ms_per_token, truth.prefill_ms_per_token),
            (fit.decode_ms_fixed, truth.decode_ms_fixed),
            (fit.decode_ms_per_seq, truth.decode_ms_per_seq),
        ];
        for (f, t) in pairs {
            assert!((f - t).abs() < 1e-9, "{fit:?} vs {truth:?}");
        }
        // An engine faster than the tables has no overhead, never a negative one.
        let fast = engine_step(&cost, &steps(&cost, EngineStep::default(), 0.3));
        assert!(fast.decode_ms_per_seq >= 0.0 && fast.prefill_ms_per_token >= 0.0, "{fast:?}");
        let none: Vec<StepSample> =
            steps(&cost, EngineStep::default(), 0.0).into_iter().map(|s| StepSample { ms: s.ms * 0.5, ..s }).collect();
        assert_eq!(engine_step(&cost, &none), EngineStep::default());
        assert_eq!(engine_step(&cost, &[]), EngineStep::default());
    }

    #[test]
    fn profile_fit_step_variation_is_the_pooled_99th_percentile_of_runs_over_each_points_median() {
        let sample = |kind, batch, ms, run| StepSample { kind, batch, tokens: 4, context: 0, ms, run };
        let mut samples = vec![];
        for (run, ms) in [10.0, 10.0, 12.0].into_iter().enumerate() {
            samples.push(sample(StepKind::Prefill, 1, ms, run));
        }
        for (run, ms) in [20.0, 25.0, 20.0].into_iter().enumerate() {
            samples.push(sample(StepKind::Prefill, 2, ms, run));
        }
        // Decode points of one run each: no spread to read.
        samples.push(sample(StepKind::Decode, 1, 3.0, 0));
        samples.push(sample(StepKind::Decode, 2, 9.0, 0));
        let v = step_variation(&samples).unwrap();
        assert!((v.prefill - 0.25).abs() < 1e-12 && v.decode == 0.0, "{v:?}");
        // 200 runs of one step: the 99th percentile is the 198th ratio, below the two largest.
        let mut many: Vec<StepSample> = (0..200).map(|run| sample(StepKind::Decode, 1, 4.0, run)).collect();
        many[0].ms = 40.0;
        many[1].ms = 8.0;
        many[2].ms = 5.0;
        let v = step_variation(&many).unwrap();
        assert!((v.decode - 0.25).abs() < 1e-12 && v.prefill == 0.0, "{v:?}");
        // Runs of four decode steps: a run's ratio is its mean over the point's median (4 ms).
        // One step at 8 ms in a run of four is a run 25% slow; two such runs, one 50% slow.
        let runs = [[8.0, 4.0, 4.0, 4.0], [4.0, 4.0, 4.0, 4.0], [4.0, 8.0, 8.0, 4.0], [4.0, 4.0, 4.0, 4.0]];
        let of_runs: Vec<StepSample> = runs
            .iter()
            .enumerate()
            .flat_map(|(run, steps)| steps.iter().map(move |&ms| sample(StepKind::Decode, 1, ms, run)))
            .collect();
        assert!((step_variation(&of_runs).unwrap().decode - 0.5).abs() < 1e-12);
        // `runs`: the ratios' (1.25, 1, 1.5, 1) mean excess and standard deviation, four steps a run.
        let spread = step_variation(&of_runs).unwrap().runs.unwrap();
        assert_eq!((spread.decode_steps, spread.prefill), (4, Spread::default()));
        let std = (0.171875f64 / 3.0).sqrt();
        assert!((spread.decode.mean - 0.1875).abs() < 1e-12 && (spread.decode.std - std).abs() < 1e-12, "{spread:?}");
        // The order the samples come in does not matter; each run's steps are read together.
        let mut shuffled = of_runs.clone();
        shuffled.reverse();
        assert_eq!(step_variation(&shuffled), step_variation(&of_runs));
        // Faster-than-median samples never make the variation negative; one run per point gives none.
        let fast = [sample(StepKind::Decode, 1, 4.0, 0), sample(StepKind::Decode, 1, 2.0, 1)];
        let fast = step_variation(&fast).unwrap();
        assert_eq!((fast.decode, fast.runs.unwrap().decode.mean), (0.0, 0.0));
        assert_eq!(step_variation(&samples[6..]), None);
        assert_eq!(step_variation(&of_runs[..4]), None);
        // A step preempted for 30 times its length is capped at the largest variation a profile takes.
        let preempted = [1.0, 1.0, 30.0].into_iter().enumerate().map(|(run, ms)| sample(StepKind::Prefill, 1, ms, run));
        assert_eq!(step_variation(&preempted.collect::<Vec<_>>()).unwrap().prefill, StepVariation::MAX);
    }

    #[test]
    fn profile_fit_slope_through_origin() {
        assert!((slope_through_origin(&[1.0, 4.0], &[2.0, 8.0]) - 2.0).abs() < 1e-12);
        assert_eq!(slope_through_origin(&[], &[]), 0.0);
        assert_eq!(slope_through_origin(&[2.0], &[-1.0]), 0.0);
    }
}
