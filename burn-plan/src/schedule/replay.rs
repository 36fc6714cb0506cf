//! The paged engine's ExeGPT schedule (`SchedulingPolicy::Phased` in `burn-paged`) replayed step
//! by step, for RRA's throughput: on one device, and over a pipeline as the engine runs it there,
//! one virtual engine per decoder micro-batch.
//!
//! The closed form of [`super::xsim`] runs every cycle as `B_E` prefills and `N_D` decode
//! iterations at the expected batch `B_D`. The engine does not: it holds at most `⌈B_D⌉`
//! sequences, so a prefill admits only as many queries as seats are free (fewer than `B_E` when
//! the batch is full, and the admission is retried at every later step until a seat frees), and
//! it prefills as soon as `B_E` seats are free (ExeGPT §5.2's runtime adjustment; at once when
//! its batch has emptied) instead of waiting out the `N_D` iterations, so the closed form
//! underrates small-batch plans and overrates plans near the seat limit. The replay runs the
//! engine's rule on a sample of output lengths instead: every step is a prefill when one is due
//! ([`PhasedAdmission::prefill_due`], the rule the engine's scheduler calls: nothing runs, `N_D`
//! decode steps have passed since the last prefill, or `B_E` seats are free) and a seat is free,
//! otherwise a decode step of every running sequence.
//!
//! **Virtual engines.** Over `P` stages the plan runs as `M = P` engines (the facade's
//! `schedule::pipelined_engines`), each with `⌈B_E/M⌉` queries a prefill and `⌈⌈B_D⌉/M⌉` seats,
//! and the queue dealt to them in turn (all queued at once, each to the engine with the fewest
//! unfinished requests). Each engine samples a step's logits before it schedules the next, and a
//! device takes the engines' stages in the order they reach it, so while every engine has work
//! they take one step each per *round*, in the same order at every stage. A round of steps whose
//! stages take `t_j` alone lasts `max(Σ_j (t_j[s*] + κ·(Σ t_j − t_j[s*])), max_j Σ t_j)`, `s*` the
//! stage with the most work and `κ` the devices' interference: the busiest stage's work, each
//! step's other stages overlapping it by `κ`, unless one step's own pass through the stages is
//! longer. With equal steps this is the closed form's `cyclic`. Without interference it is the
//! flow shop's steady period for two engines over two stages whatever their steps (tested against
//! the [event simulator](crate::sim::Pipeline)), and a lower bound on it for more. One
//! engine alone takes `Σ t`, its pass (one device: its step). A prefill of `n` queries costs what the closed form's prefill of
//! `n` does, a decode step of `b` sequences its decode step of `b`.
//!
//! The sample is [`QUERIES`] output lengths at evenly spaced quantiles, in a fixed scrambled
//! order, all queued at the start (the offline setting ExeGPT plans for); throughput is queries
//! over the whole replay. Whatever order the steps come in, they prefill every query and decode
//! every output token, and a round lasts at least its steps' times on any one stage, so the run
//! takes at least `N·min_n E_s(n)/n + W·min_b I_s(b)/b` for every stage `s` (`W` the sample's
//! decode iterations): [`Replay::upper`], the bound the branch-and-bound needs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::admission::PhasedAdmission;

use super::BatchInterference;
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

/// What a replay runs: `engines` virtual engines, each prefilling `encode_batch` queries at most
/// and holding `seats` sequences, with `decode_iterations` decode steps between prefills;
/// `prefill_ms[n − 1]` holds the stage times of a prefill of `n` queries (`n ≤ encode_batch`),
/// `decode_ms[b − 1]` those of a decode step of `b` sequences (`b ≤ seats`), one time per stage;
/// `interference` is the devices' `κ` by the engines' decode batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Engines<'a> {
    pub engines: usize,
    pub encode_batch: usize,
    pub decode_iterations: usize,
    pub seats: usize,
    pub prefill_ms: &'a [Vec<f64>],
    pub decode_ms: &'a [Vec<f64>],
    pub interference: EngineKappa,
}

/// The devices' `κ` by the decode batch each engine runs: `one` at one sequence each, and, where
/// measured, `at`'s at its batch; linear between, held beyond, never below `one` (so that a round
/// never costs less at a larger batch). A prefill, a batch of many tokens, takes the larger
/// batch's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct EngineKappa {
    pub one: f64,
    pub at: Option<BatchInterference>,
}

impl EngineKappa {
    /// `κ` of engines decoding `batch` sequences each.
    pub fn at(&self, batch: f64) -> f64 {
        match self.at {
            Some(at) if at.batch > 1.0 => {
                let share = ((batch - 1.0) / (at.batch - 1.0)).clamp(0.0, 1.0);
                self.one + share * (at.kappa - self.one).max(0.0)
            }
            _ => self.one,
        }
    }

    /// `κ` of rounds holding a prefill.
    pub fn prefill(&self) -> f64 {
        self.at(f64::INFINITY)
    }
}

/// One engine's next step: a prefill of `n` queries, or decode steps of the whole batch, as many
/// as `horizon` before its state changes (a sequence finishes or a prefill falls due).
#[derive(Debug, Clone, Copy)]
enum Step {
    Prefill(usize),
    Decode { batch: usize, horizon: u64 },
}

/// One virtual engine replaying its share of the queue.
struct Engine {
    /// Its queries' decode iterations, in queue order.
    queue: Vec<u32>,
    /// The first query not yet admitted.
    next: usize,
    /// Running sequences by the decode step (counted over its replay) that finishes them.
    running: BinaryHeap<Reverse<u64>>,
    since_prefill: usize,
    /// Decode steps run.
    step: u64,
}

impl Engine {
    fn new(queue: Vec<u32>) -> Self {
        Self { queue, next: 0, running: BinaryHeap::new(), since_prefill: 0, step: 0 }
    }

    /// The step the engine's scheduler takes next under `rule` (`None`: it has nothing left).
    fn next_step(&self, rule: &PhasedAdmission) -> Option<Step> {
        let waiting = self.queue.len() - self.next;
        let used = self.running.len();
        let due = rule.prefill_due(self.running.is_empty(), used, self.since_prefill);
        let admit = rule.encode_batch.min(rule.seats - used).min(waiting);
        if due && admit > 0 {
            return Some(Step::Prefill(admit));
        }
        let &Reverse(first_done) = self.running.peek()?;
        // The state does not change before a sequence finishes or a prefill falls due (free seats
        // change only as sequences finish).
        let mut horizon = first_done - self.step;
        if waiting > 0 && !due {
            horizon = horizon.min((rule.decode_iterations - self.since_prefill) as u64);
        }
        Some(Step::Decode { batch: used, horizon })
    }

    /// Admits the next `n` queries; the prefill emits each one's first token, so a one-token
    /// output is done.
    fn prefill(&mut self, n: usize) {
        let step = self.step;
        let admitted = &self.queue[self.next..self.next + n];
        self.running.extend(admitted.iter().filter(|&&d| d > 0).map(|&d| Reverse(step + u64::from(d))));
        self.next += n;
        self.since_prefill = 0;
    }

    /// Runs `steps` decode steps of the whole batch.
    fn decode(&mut self, steps: u64) {
        self.step += steps;
        self.since_prefill = self.since_prefill.saturating_add(steps as usize);
        while self.running.peek().is_some_and(|&Reverse(done)| done <= self.step) {
            self.running.pop();
        }
    }
}

/// A round of one step per engine whose stages take `steps[j]` alone, interfering by `kappa`
/// (module docs).
fn round_ms(steps: &[&[f64]], kappa: f64) -> f64 {
    let pass = |t: &[f64]| t.iter().sum::<f64>();
    if let [one] = steps {
        return pass(one);
    }
    let stages = steps.iter().map(|t| t.len()).min().unwrap_or(0);
    let load = |s: usize| steps.iter().map(|t| t[s]).sum::<f64>();
    let Some(busiest) = (0..stages).max_by(|&a, &b| load(a).total_cmp(&load(b))) else {
        return 0.0;
    };
    let overlapped: f64 = steps.iter().map(|t| t[busiest] + kappa.max(0.0) * (pass(t) - t[busiest])).sum();
    steps.iter().map(|t| pass(t)).fold(overlapped, f64::max)
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

    /// Queries per second of `run`'s engines over the sample (module docs).
    pub fn throughput(&self, run: &Engines<'_>) -> f64 {
        let m = run.engines.max(1);
        let rule = PhasedAdmission {
            encode_batch: run.encode_batch,
            decode_iterations: run.decode_iterations,
            seats: run.seats.max(1),
        };
        let mut engines: Vec<Engine> =
            (0..m).map(|j| Engine::new(self.decodes.iter().skip(j).step_by(m).copied().collect())).collect();
        let mut steps: Vec<(usize, Step)> = Vec::with_capacity(m);
        let mut times: Vec<&[f64]> = Vec::with_capacity(m);
        let mut ms = 0.0f64;
        loop {
            steps.clear();
            steps.extend(engines.iter().enumerate().filter_map(|(j, e)| e.next_step(&rule).map(|s| (j, s))));
            if steps.is_empty() {
                break;
            }
            // Rounds until some engine's step changes: one where any prefills.
            let rounds = steps
                .iter()
                .map(|(_, s)| match s {
                    Step::Prefill(_) => 1,
                    Step::Decode { horizon, .. } => *horizon,
                })
                .min()
                .unwrap_or(1);
            times.clear();
            times.extend(steps.iter().map(|(_, s)| match *s {
                Step::Prefill(n) => run.prefill_ms[n - 1].as_slice(),
                Step::Decode { batch, .. } => run.decode_ms[batch - 1].as_slice(),
            }));
            let kappa = steps
                .iter()
                .map(|(_, s)| match *s {
                    Step::Prefill(_) => run.interference.prefill(),
                    Step::Decode { batch, .. } => run.interference.at(batch as f64),
                })
                .fold(0.0, f64::max);
            ms += rounds as f64 * round_ms(&times, kappa);
            for &(j, s) in &steps {
                match s {
                    Step::Prefill(n) => engines[j].prefill(n),
                    Step::Decode { .. } => engines[j].decode(rounds),
                }
            }
        }
        if ms > 0.0 { QUERIES as f64 / (ms / 1000.0) } else { f64::INFINITY }
    }

    /// An upper bound on [`Replay::throughput`] for every engine count, every encode batch up to
    /// `prefill_ms.len()`, every seat count up to `decode_ms.len()` and every `N_D`, with the step
    /// tables' meaning of [`Engines`] (module docs).
    pub fn upper(&self, prefill_ms: &[Vec<f64>], decode_ms: &[Vec<f64>]) -> f64 {
        let cheapest = |t: &[Vec<f64>], s: usize| {
            t.iter().enumerate().map(|(i, ms)| ms[s] / (i + 1) as f64).fold(f64::INFINITY, f64::min)
        };
        let stages = prefill_ms.iter().chain(decode_ms).map(Vec::len).min().unwrap_or(0);
        let per_query = (0..stages)
            .map(|s| cheapest(prefill_ms, s) + self.mean_decodes * cheapest(decode_ms, s))
            .fold(0.0, f64::max);
        // Sums taken in another order may round the other way.
        if per_query > 0.0 { 1000.0 / per_query * (1.0 + 1e-9) } else { f64::INFINITY }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::LengthDistribution;
    use crate::schedule::xsim::cyclic;
    use crate::sim::Pipeline;

    fn lengths(h: Vec<(usize, f64)>) -> Lengths {
        Lengths::new("output", &LengthDistribution::Histogram(h)).unwrap()
    }

    /// One time per step: one device.
    fn one_stage(t: &[f64]) -> Vec<Vec<f64>> {
        t.iter().map(|&ms| vec![ms]).collect()
    }

    /// One engine on one device.
    fn one_device<'a>(
        b_e: usize,
        n_d: usize,
        seats: usize,
        prefill: &'a [Vec<f64>],
        decode: &'a [Vec<f64>],
    ) -> Engines<'a> {
        Engines {
            engines: 1,
            encode_batch: b_e,
            decode_iterations: n_d,
            seats,
            prefill_ms: prefill,
            decode_ms: decode,
            interference: EngineKappa::default(),
        }
    }

    #[test]
    fn replay_follows_the_engine_rule_on_a_hand_computed_timeline() {
        // Every query has 3 tokens: 2 decode steps after its prefill.
        let r = Replay::new(&lengths(vec![(3, 1.0)]));
        let (prefill, decode) = (one_stage(&[10.0, 15.0]), one_stage(&[1.0, 1.5, 2.0, 2.5]));
        // B_E 2, N_D 5, 4 seats: prefill 2 (15); 2 seats are free, so 2 more at once (15); all
        // four finish in 2 decodes of 4 (2.5 each) before N_D: the batch is empty, and the next
        // prefill comes at once. 256 cycles of 35 ms.
        let t = r.throughput(&one_device(2, 5, 4, &prefill, &decode));
        assert!((t - 1024.0 / (256.0 * 35.0 / 1000.0)).abs() < 1e-9, "{t}");
        // N_D 1, 3 seats: prefill 2 (15), decode 2 (1.5); N_D is up with 1 seat free: prefill 1
        // (10); decode 3 (2.0), the first pair leaves; 2 seats free: prefill 2 (15); decode 3, the
        // single one leaves; N_D is up: prefill 1 (10); decode 3, the pair leaves. So a start of
        // 28.5 ms admitting 3, then 340 cycles of 15 + 2 + 10 + 2 ms admitting 3 each; the last
        // query: prefill 1 (10), decode 2 (1.5) and decode 1 (1.0).
        let t = r.throughput(&one_device(2, 1, 3, &prefill, &decode[..3]));
        let expected = 28.5 + 340.0 * 29.0 + 10.0 + 1.5 + 1.0;
        assert!((t - 1024.0 / (expected / 1000.0)).abs() < 1e-6, "{t} vs {}", 1024.0 / (expected / 1000.0));
        // One seat: a query at a time, whatever B_E.
        let t = r.throughput(&one_device(2, 1, 1, &prefill, &decode));
        assert!((t - 1024.0 / (1024.0 * 12.0 / 1000.0)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn replay_runs_virtual_engines_in_rounds_over_the_stages() {
        // Two engines over two stages, one seat each: each prefills a query (stages 4 and 2 ms)
        // and decodes it twice (1 and 3 ms), in step with the other. At κ = 0.5 a round of two
        // prefills takes 2 × (4 + 0.5 × 2) = 10 ms (stage 0 is the busier), a round of two
        // decodes 2 × (3 + 0.5 × 1) = 7 ms (stage 1): 512 rounds of 10 + 2 × 7 ms.
        let r = Replay::new(&lengths(vec![(3, 1.0)]));
        let (prefill, decode) = (vec![vec![4.0, 2.0]], vec![vec![1.0, 3.0]]);
        let run = Engines {
            engines: 2,
            encode_batch: 1,
            decode_iterations: 100,
            seats: 1,
            prefill_ms: &prefill,
            decode_ms: &decode,
            interference: EngineKappa { one: 0.5, at: None },
        };
        let t = r.throughput(&run);
        assert!((t - 1024.0 / (512.0 * 24.0 / 1000.0)).abs() < 1e-9, "{t}");
        // One engine alone passes each step through the stages: 6 + 2 × 4 ms a query.
        let t = r.throughput(&Engines { engines: 1, ..run });
        assert!((t - 1024.0 / (1024.0 * 14.0 / 1000.0)).abs() < 1e-9, "{t}");
        assert!(t <= r.upper(&prefill, &decode));
    }

    #[test]
    fn a_round_is_the_closed_form_cycle_and_the_flow_shop_period() {
        // Equal steps: the closed form's `cyclic`, at any interference.
        let t = [3.0, 5.0, 1.0];
        for kappa in [0.0, 0.3, 1.0, 2.5] {
            for m in [2usize, 3] {
                let round = round_ms(&vec![&t[..]; m], kappa);
                assert!((round - cyclic(&t, m as f64, kappa)).abs() < 1e-9, "κ {kappa} m {m}: {round}");
            }
        }
        // Two different steps cycling through two stages, each taken in turn at both (the
        // event simulator's flow shop): without interference the steady period is the round.
        let times = [1.0, 2.0, 3.0, 5.0, 8.0, 13.0];
        for i in 0..times.len() {
            for k in 0..times.len() {
                let a = [times[i], times[(i + k) % 6]];
                let b = [times[(i * k + 1) % 6], times[k]];
                let mut p = Pipeline::new(2);
                let (mut ready, mut finishes) = ([0.0; 2], Vec::new());
                for _ in 0..40 {
                    let first = p.run(ready[0], &a);
                    ready = [first, p.run(ready[1], &b)];
                    finishes.push(ready[0]);
                }
                let period = finishes[39] - finishes[38];
                let round = round_ms(&[&a[..], &b[..]], 0.0);
                assert!((period - round).abs() < 1e-9, "{a:?} {b:?}: {period} against {round}");
            }
        }
    }

    #[test]
    fn replay_sample_keeps_the_distribution_and_the_bound_holds() {
        let dist = lengths(vec![(1, 0.25), (9, 0.5), (40, 0.25)]);
        let r = Replay::new(&dist);
        let count = |d: u32| r.decodes.iter().filter(|&&x| x == d).count();
        assert_eq!((count(0), count(8), count(39)), (256, 512, 256));
        // Scrambled: the first quarter of the queue holds every length.
        assert!([0, 8, 39].iter().all(|&d| r.decodes[..256].contains(&d)));
        // One device, then two stages of unequal shares (the bound holds at every engine count).
        let one: (Vec<Vec<f64>>, Vec<Vec<f64>>) = (
            one_stage(&(1..=4).map(|n| 10.0 + 3.0 * n as f64).collect::<Vec<_>>()),
            one_stage(&(1..=8).map(|b| 2.0 + 0.5 * b as f64 + if b > 1 { 1.0 } else { 0.0 }).collect::<Vec<_>>()),
        );
        let split = |t: &[Vec<f64>]| t.iter().map(|s| vec![0.7 * s[0], 0.4 * s[0]]).collect::<Vec<_>>();
        let two = (split(&one.0), split(&one.1));
        for (engines, (prefill, decode)) in [(1, &one), (2, &two), (1, &two)] {
            let upper = r.upper(prefill, decode);
            for b_e in 1..=4 {
                for n_d in [1, 2, 5, 40] {
                    for seats in b_e..=8 {
                        let run = Engines {
                            engines,
                            encode_batch: b_e,
                            decode_iterations: n_d,
                            seats,
                            prefill_ms: &prefill[..b_e],
                            decode_ms: &decode[..seats],
                            interference: EngineKappa {
                                one: 0.1,
                                at: Some(BatchInterference { batch: 4.0, kappa: 0.6 }),
                            },
                        };
                        let t = r.throughput(&run);
                        assert!(t > 0.0 && t <= upper, "{engines} {b_e} {n_d} {seats}: {t} > {upper}");
                    }
                }
            }
        }
    }
}
