//! The discrete-event simulator the planners share (AlpaServe §4.5's continuous-time simulator;
//! ExeGPT's XSimulator builds its timelines from the same pipeline rule).
//!
//! Semantics, part of the planners' interface:
//! - A group of devices runs a pipeline of stages and serves its queue first-come-first-served.
//! - A request occupies stage `s` for that stage's latency and enters stage `s + 1` when it has
//!   left stage `s` and the previous request has left stage `s + 1`:
//!   `start(r, s) = max(end(r, s − 1), end(r − 1, s))`, `end = start + latency(s)`, with
//!   `end(r, −1)` the time the request is ready (its arrival).
//! - Requests are never dropped; a request attains its SLO when `finish − arrival ≤ slo`.
//! - A request goes to the group, among those serving its model, with the fewest requests not yet
//!   finished at its arrival (ties: the lowest group), as AlpaServe's controller does (§4.4.3).
//!
//! Workloads are explicit traces or gamma processes (rate, coefficient of variation, seed).

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One pipeline's stages, each free from some time on.
#[derive(Debug, Clone)]
pub struct Pipeline {
    free_at: Vec<f64>,
}

impl Pipeline {
    /// A pipeline of `stages` idle stages.
    pub fn new(stages: usize) -> Self {
        Self { free_at: vec![0.0; stages] }
    }

    /// Runs the next request in FCFS order, ready at `ready`, through the stages with the given
    /// latencies (one per stage); returns when it leaves the last stage.
    pub fn run(&mut self, ready: f64, stage_latency: &[f64]) -> f64 {
        let mut t = ready;
        for (free, &latency) in self.free_at.iter_mut().zip(stage_latency) {
            t = t.max(*free) + latency;
            *free = t;
        }
        t
    }
}

/// A request: when it arrives and which model it asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Arrival time in seconds.
    pub arrival_s: f64,
    /// Index of the model.
    pub model: usize,
}

/// A group as the simulator sees it: its stage count and, for each model it serves, the
/// latency of each stage in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Pipeline stages of the group.
    pub stages: usize,
    /// `(model, stage latencies in seconds)` for every model the group holds.
    pub models: Vec<(usize, Vec<f64>)>,
}

/// Simulates `requests` (sorted by arrival) on `groups`; returns each request's latency
/// (`finish − arrival`) in order, `None` for a request whose model no group serves.
pub fn simulate(groups: &[Group], requests: &[Request]) -> Vec<Option<f64>> {
    let mut pipelines: Vec<Pipeline> = groups.iter().map(|g| Pipeline::new(g.stages)).collect();
    // Finish times of each group's unfinished requests, in FCFS order (which is finish order).
    let mut in_flight: Vec<VecDeque<f64>> = vec![VecDeque::new(); groups.len()];
    requests
        .iter()
        .map(|r| {
            let mut chosen: Option<(usize, &[f64])> = None;
            let mut chosen_queue = usize::MAX;
            for (gi, g) in groups.iter().enumerate() {
                let Some((_, lat)) = g.models.iter().find(|(m, _)| *m == r.model) else {
                    continue;
                };
                let queue = &mut in_flight[gi];
                while queue.front().is_some_and(|&f| f <= r.arrival_s) {
                    queue.pop_front();
                }
                if queue.len() < chosen_queue {
                    chosen_queue = queue.len();
                    chosen = Some((gi, lat));
                }
            }
            let (gi, lat) = chosen?;
            let finish = pipelines[gi].run(r.arrival_s, lat);
            in_flight[gi].push_back(finish);
            Some(finish - r.arrival_s)
        })
        .collect()
}

/// Arrival times of a gamma process over `[0, duration_s)`: inter-arrival gaps with mean
/// `1/rate` and coefficient of variation `cv` (shape `1/cv²`; `cv = 0` gives even spacing,
/// `cv = 1` a Poisson process), from `rng`; at most `limit` of them.
pub fn gamma_arrivals(rate: f64, cv: f64, duration_s: f64, limit: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        let gap = if cv == 0.0 {
            1.0 / rate
        } else {
            let shape = 1.0 / (cv * cv);
            gamma(shape, rng) / (shape * rate)
        };
        t += gap;
        if t >= duration_s || out.len() == limit {
            return out;
        }
        out.push(t);
    }
}

/// A seeded generator for stream `stream` (one per model) of seed `seed`.
pub fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A unit-scale gamma sample (Marsaglia–Tsang; shapes below 1 boosted by `U^(1/shape)`).
fn gamma(shape: f64, rng: &mut ChaCha8Rng) -> f64 {
    if shape < 1.0 {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        return gamma(shape + 1.0, rng) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = rng.random();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// A standard normal sample (Box–Muller).
pub(crate) fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_pipeline_follows_the_flow_shop_rule() {
        let mut p = Pipeline::new(2);
        // r0 at 0: stage0 0..1, stage1 1..3. r1 at 0: stage0 1..2, stage1 3..5.
        assert_eq!(p.run(0.0, &[1.0, 2.0]), 3.0);
        assert_eq!(p.run(0.0, &[1.0, 2.0]), 5.0);
        // r2 at 10: idle pipeline.
        assert_eq!(p.run(10.0, &[1.0, 2.0]), 13.0);
    }

    #[test]
    fn sim_gamma_arrivals_have_the_asked_rate_and_cv() {
        let mut r = rng(7, 0);
        let times = gamma_arrivals(50.0, 3.0, 2000.0, usize::MAX, &mut r);
        let n = times.len() as f64;
        assert!((n / 2000.0 - 50.0).abs() < 5.0, "rate {}", n / 2000.0);
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 3.0).abs() < 0.5, "cv {cv}");
        assert_eq!(times, gamma_arrivals(50.0, 3.0, 2000.0, usize::MAX, &mut rng(7, 0)));
    }
}
