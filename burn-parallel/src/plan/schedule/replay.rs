//! The paged engine's ExeGPT schedule (`SchedulingPolicy::Phased` in `burn-paged`) replayed step
//! by step, for RRA's throughput on one device.
//!
//! The closed form of [`super::xsim`] runs every cycle as `B_E` prefills and `N_D` decode
//! iterations at the expected batch `B_D`. The engine does not: it holds at most `⌈B_D⌉`
//! sequences, so a prefill admits only as many queries as seats are free (fewer than `B_E` when
//! the batch is full, and the admission is retried at every later step until a seat frees), and
//! it prefills as soon as `B_E` seats are free (ExeGPT §5.2's runtime adjustment; at once when
//! its batch has emptied) instead of waiting out the `N_D` iterations, so the closed form
//! underrates small-batch plans and overrates plans near the seat limit. The replay runs the
//! engine's rule on a sample of output lengths
//! instead: every step is a prefill when one is due ([`PhasedAdmission::prefill_due`], the rule
//! the engine's scheduler calls: nothing runs, `N_D` decode steps have passed since the last
//! prefill, or `B_E` seats are free) and a seat is free, otherwise a decode step
//! of every running sequence; a prefill of `n` queries takes what the closed form's prefill of
//! `n` does and a decode step of `b` sequences its decode step of `b`.
//!
//! The sample is [`QUERIES`] output lengths at evenly spaced quantiles, in a fixed scrambled
//! order, all queued at the start (the offline setting ExeGPT plans for); throughput is queries
//! over the whole replay. Whatever order the steps come in, they prefill every query and decode
//! every output token, so the run takes at least `N·min_n E(n)/n + W·min_b I(b)/b` (`W` the
//! sample's decode iterations): [`Replay::upper`], the bound the branch-and-bound needs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use burn_llm_models::admission::PhasedAdmission;

use super::lengths::Lengths;

/// Queries in a replay.
pub(crate) const QUERIES: usize = 1024;
/// Step of the scrambled order: coprime with [`QUERIES`], so `i·STRIDE mod QUERIES` visits every
/// quantile once.
const STRIDE: usize = 619;

/// A replay sample: each query's decode iterations (its output length − 1), in queue order.
#[derive(Debug, Clone)]
pub(crate) struct Replay {
    decodes: Vec<u32>,
    /// Mean decode iterations per query over the sample.
    mean_decodes: f64,
}

impl Replay {
    /// The sample of `output`'s lengths (module docs).
    pub fn new(output: &Lengths) -> Self {
        let decodes: Vec<u32> = (0..QUERIES)
            .map(|i| {
                let rank = i * STRIDE % QUERIES;
                let len = output.percentile(100.0 * (rank as f64 + 0.5) / QUERIES as f64);
                u32::try_from(len.saturating_sub(1)).unwrap_or(u32::MAX)
            })
            .collect();
        let mean_decodes = decodes.iter().map(|&d| d as f64).sum::<f64>() / QUERIES as f64;
        Self { decodes, mean_decodes }
    }

    /// Queries per second of the engine running encode batch `b_e`, `n_d` decode steps between
    /// prefills and `seats` sequences at most; `prefill_ms[n − 1]` is a prefill step of `n`
    /// queries (`n ≤ b_e`) and `decode_ms[b − 1]` a decode step of `b` sequences (`b ≤ seats`).
    pub fn throughput(&self, b_e: usize, n_d: usize, seats: usize, prefill_ms: &[f64], decode_ms: &[f64]) -> f64 {
        let seats = seats.max(1);
        let rule = PhasedAdmission { encode_batch: b_e, decode_iterations: n_d, seats };
        // Running sequences by the decode step (counted over the replay) that finishes them.
        let mut running: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(seats);
        let (mut next, mut since_prefill, mut step, mut ms) = (0usize, 0usize, 0u64, 0.0f64);
        loop {
            let waiting = self.decodes.len() - next;
            let free = seats - running.len();
            let due = rule.prefill_due(running.is_empty(), running.len(), since_prefill);
            let admit = b_e.min(free).min(waiting);
            if due && admit > 0 {
                ms += prefill_ms[admit - 1];
                // The prefill emits each query's first token; a one-token output is done.
                let admitted = &self.decodes[next..next + admit];
                running.extend(admitted.iter().filter(|&&d| d > 0).map(|&d| Reverse(step + u64::from(d))));
                next += admit;
                since_prefill = 0;
                continue;
            }
            let Some(&Reverse(first_done)) = running.peek() else {
                break;
            };
            // Decode steps at this batch until a sequence finishes or a prefill falls due; the
            // state does not change before either (free seats change only as sequences finish).
            let mut steps = first_done - step;
            if waiting > 0 && !due {
                steps = steps.min((n_d - since_prefill) as u64);
            }
            ms += steps as f64 * decode_ms[running.len() - 1];
            step += steps;
            since_prefill = since_prefill.saturating_add(steps as usize);
            while running.peek().is_some_and(|&Reverse(done)| done <= step) {
                running.pop();
            }
        }
        if ms > 0.0 { QUERIES as f64 / (ms / 1000.0) } else { f64::INFINITY }
    }

    /// An upper bound on [`Replay::throughput`] for every encode batch up to `prefill_ms.len()`
    /// and every seat count up to `decode_ms.len()`, whatever `n_d` (module docs).
    pub fn upper(&self, prefill_ms: &[f64], decode_ms: &[f64]) -> f64 {
        let cheapest =
            |t: &[f64]| t.iter().enumerate().map(|(i, ms)| ms / (i + 1) as f64).fold(f64::INFINITY, f64::min);
        let per_query = cheapest(prefill_ms) + self.mean_decodes * cheapest(decode_ms);
        // Sums taken in another order may round the other way.
        if per_query > 0.0 { 1000.0 / per_query * (1.0 + 1e-9) } else { f64::INFINITY }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::schedule::LengthDistribution;

    fn lengths(h: Vec<(usize, f64)>) -> Lengths {
        Lengths::new("output", &LengthDistribution::Histogram(h)).unwrap()
    }

    #[test]
    fn replay_follows_the_engine_rule_on_a_hand_computed_timeline() {
        // Every query has 3 tokens: 2 decode steps after its prefill.
        let r = Replay::new(&lengths(vec![(3, 1.0)]));
        let (prefill, decode) = ([10.0, 15.0], [1.0, 1.5, 2.0, 2.5]);
        // B_E 2, N_D 5, 4 seats: prefill 2 (15); 2 seats are free, so 2 more at once (15); all
        // four finish in 2 decodes of 4 (2.5 each) before N_D: the batch is empty, and the next
        // prefill comes at once. 256 cycles of 35 ms.
        let t = r.throughput(2, 5, 4, &prefill, &decode);
        assert!((t - 1024.0 / (256.0 * 35.0 / 1000.0)).abs() < 1e-9, "{t}");
        // N_D 1, 3 seats: prefill 2 (15), decode 2 (1.5); N_D is up with 1 seat free: prefill 1
        // (10); decode 3 (2.0), the first pair leaves; 2 seats free: prefill 2 (15); decode 3, the
        // single one leaves; N_D is up: prefill 1 (10); decode 3, the pair leaves. So a start of
        // 28.5 ms admitting 3, then 340 cycles of 15 + 2 + 10 + 2 ms admitting 3 each; the last
        // query: prefill 1 (10), decode 2 (1.5) and decode 1 (1.0).
        let t = r.throughput(2, 1, 3, &prefill, &decode[..3]);
        let expected = 28.5 + 340.0 * 29.0 + 10.0 + 1.5 + 1.0;
        assert!((t - 1024.0 / (expected / 1000.0)).abs() < 1e-6, "{t} vs {}", 1024.0 / (expected / 1000.0));
        // One seat: a query at a time, whatever B_E.
        let t = r.throughput(2, 1, 1, &prefill, &decode);
        assert!((t - 1024.0 / (1024.0 * 12.0 / 1000.0)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn replay_sample_keeps_the_distribution_and_the_bound_holds() {
        let dist = lengths(vec![(1, 0.25), (9, 0.5), (40, 0.25)]);
        let r = Replay::new(&dist);
        let count = |d: u32| r.decodes.iter().filter(|&&x| x == d).count();
        assert_eq!((count(0), count(8), count(39)), (256, 512, 256));
        // Scrambled: the first quarter of the queue holds every length.
        assert!([0, 8, 39].iter().all(|&d| r.decodes[..256].contains(&d)));
        let prefill: Vec<f64> = (1..=4).map(|n| 10.0 + 3.0 * n as f64).collect();
        let decode: Vec<f64> = (1..=8).map(|b| 2.0 + 0.5 * b as f64 + if b > 1 { 1.0 } else { 0.0 }).collect();
        let upper = r.upper(&prefill, &decode);
        for b_e in 1..=4 {
            for n_d in [1, 2, 5, 40] {
                for seats in b_e..=8 {
                    let t = r.throughput(b_e, n_d, seats, &prefill[..b_e], &decode[..seats]);
                    assert!(t > 0.0 && t <= upper, "{b_e} {n_d} {seats}: {t} > {upper}");
                }
            }
        }
    }
}
