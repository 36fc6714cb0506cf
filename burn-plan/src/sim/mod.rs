//! The discrete-event simulator the planners share (AlpaServe §4.5's continuous-time simulator;
//! ExeGPT's XSimulator builds its timelines from the same pipeline rule).
//!
//! Semantics, part of the planners' interface:
//! - A group of devices runs a pipeline of stages and serves its queue first-come-first-served.
//! - A request occupies stage `s` for that stage's latency and enters stage `s + 1` when it has
//!   left stage `s` and the previous request has left stage `s + 1`:
//!   `start(r, s) = max(end(r, s − 1), end(r − 1, s))`, `end = start + latency(s)`, with
//!   `end(r, −1)` the time the request is ready (its arrival).
//! - A request attains its SLO when `finish − arrival ≤ slo`. Under [`Admission::All`] every
//!   request is served, however late. Under [`Admission::Slo`] a group takes a request only if
//!   its stage clocks say it will meet its SLO, and drops it at arrival otherwise, as AlpaServe's
//!   group managers do (thesis §4.6: "when a group receives a request, it checks whether it can
//!   serve the request under SLO and rejects the request if it cannot"). The clocks are the
//!   flow-shop rule above, a dropped request holding no stage, run on [`admission_latencies`]:
//!   each stage as it runs while its group's pipeline is full, beside the group's other stages
//!   at the devices' `κ`, so that a pipeline's clocks take requests at the interval it serves
//!   them at. What other groups do is not on a group's clocks (nor on a server's).
//! - Stages that work at once may slow each other down, by the devices' measured interference
//!   `κ` ([`Interference`](crate::interference::Interference)): while `n` stages of any groups hold a request, each
//!   advances at `1 / (1 + κ·(n − 1))` of its own speed (processor sharing). Stages that start
//!   together and take `t_s` alone then all finish after `max t + κ·(Σ t − max t)`, the price the
//!   other planners give a micro-batch. `κ = 0` is AlpaServe's simulator: devices share nothing.
//! - A request goes to the group, among those serving its model, with the fewest requests not yet
//!   finished at its arrival (ties: the lowest group), as AlpaServe's controller does (§4.4.3).
//! - A model may be served step by step ([`Steps`]), as an engine with iteration-level
//!   scheduling serves it: AlpaServe's requests cross the pipeline once, but a generating request
//!   crosses it once per step, its prefill and then each decode step, and each pass queues at
//!   every stage behind what reached it first. Under load, a request's decode steps then wait
//!   behind other requests' prefills at every stage, which one pass per request leaves out. Its
//!   requests hold one of `seats` (the model's engines) from their first pass to their last; the
//!   others wait for one in arrival order. Its stages slow each other by the model's own `κ`
//!   (measured serving, [`crate::placement::MeasuredPipeline`]), and stages of other groups
//!   by the devices'. Admission stays on the clocks above.
//!
//! Workloads are explicit traces or gamma processes (rate, coefficient of variation, seed).

use std::collections::VecDeque;

mod events;
pub use events::StepClocks;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Slack on an SLO comparison (one nanosecond) so that rounding cannot miss an exact deadline.
pub const SLO_SLACK_S: f64 = 1e-9;

/// Which requests a group takes (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Every request, however late it will finish.
    #[default]
    All,
    /// Only requests the group's stage clocks say will meet their model's SLO; the others are
    /// dropped at arrival (AlpaServe's controller).
    Slo,
}

impl Admission {
    /// Whether this is [`Admission::All`] (the default, left out of JSON).
    pub fn is_all(&self) -> bool {
        *self == Self::All
    }

    /// Its name on command lines and in JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Slo => "slo",
        }
    }
}

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

    /// Runs the request as [`Pipeline::run`] does if it leaves the last stage by `deadline`
    /// (`Ok` with when); otherwise leaves the stages as they were and returns `Err` with when it
    /// would have left (the request is dropped).
    pub fn run_by(&mut self, ready: f64, stage_latency: &[f64], deadline: f64) -> Result<f64, f64> {
        let mut t = ready;
        for (&free, &latency) in self.free_at.iter().zip(stage_latency) {
            t = t.max(free) + latency;
        }
        if t <= deadline + SLO_SLACK_S { Ok(self.run(ready, stage_latency)) } else { Err(t) }
    }
}

/// The latencies a group's admission clocks run on, from its stages' latencies alone (any unit):
/// stage `s` as it runs beside the group's other stages at interference `kappa`,
/// `t_s + κ·Σ_{j≠s} min(t_j, t_s)` (the price of stages that start together). The slowest stage
/// then takes a micro-batch's interval `max t + κ·(Σ t − max t)`; one stage keeps its latency.
pub fn admission_latencies(stage_latency: &[f64], kappa: f64) -> Vec<f64> {
    stage_latency
        .iter()
        .enumerate()
        .map(|(s, &t)| {
            let beside: f64 =
                stage_latency.iter().enumerate().filter(|&(j, _)| j != s).map(|(_, &other)| other.min(t)).sum();
            t + kappa.max(0.0) * beside
        })
        .collect()
}

/// What [`simulate_admitting`] drops: nothing, or each request that would miss `slo_s` of its
/// model (indexed by model; models past its end have no SLO and are always taken).
#[derive(Debug, Clone, Copy)]
pub enum Dropping<'a> {
    /// Every request is served ([`Admission::All`]).
    Never,
    /// [`Admission::Slo`] with these SLOs in seconds.
    Late(&'a [f64]),
}

impl Dropping<'_> {
    /// The latest finish `request` may have and still be taken (infinite when never dropped).
    fn deadline(&self, request: &Request) -> f64 {
        match self {
            Self::Never => f64::INFINITY,
            Self::Late(slo) => slo.get(request.model).map_or(f64::INFINITY, |s| request.arrival_s + s),
        }
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
    /// `(model, stage latencies in seconds)` for every model the group holds: one pass of a
    /// request, and what the group's admission clocks run on.
    pub models: Vec<(usize, Vec<f64>)>,
    /// `(model, its steps)` for the models of `models` the group serves step by step; the others
    /// cross the stages once per request.
    pub steps: Vec<(usize, Steps)>,
}

impl Group {
    /// A group whose every model crosses its stages once per request (AlpaServe's simulator).
    pub fn new(stages: usize, models: Vec<(usize, Vec<f64>)>) -> Self {
        Self { stages, models, steps: Vec::new() }
    }
}

/// A model served step by step on a group, as an engine with iteration-level scheduling serves
/// it: each request's prefill, then each of its `decodes` decode steps, is a pass through every
/// stage, and a pass queues at each stage behind whatever reached it first (other requests'
/// prefills included). At most `seats` of the model's requests are in the stages at once (its
/// engines, one sequence each); later ones wait, first come first served.
///
/// A prefill in `prefill_chunks` chunks (vLLM's chunked prefill) is that many passes, each
/// taking its share of the prefill on every stage. No token is sampled between them, so a chunk
/// follows the one before it through the stages: it enters the first stage once that one has
/// left it, and the stages overlap a prompt's chunks as TeraPipe's token slices do. Each decode
/// pass waits for the one before it to leave the last stage (its token).
#[derive(Debug, Clone, PartialEq)]
pub struct Steps {
    /// Each stage's time of the whole prefill (all its chunks), seconds.
    pub prefill: Vec<f64>,
    /// Passes the prefill is computed in (at least 1).
    pub prefill_chunks: usize,
    /// Each stage's time of one decode pass, seconds.
    pub decode: Vec<f64>,
    /// Decode passes after the prefill.
    pub decodes: usize,
    /// Requests of the model in the stages at once (at least 1).
    pub seats: usize,
    /// How much each other busy stage of its group slows one of this model's passes (the
    /// interference its pipeline measured serving); stages of other groups slow it by the
    /// devices' `κ`.
    pub kappa: f64,
}

impl Steps {
    /// The passes its prefill takes (`prefill_chunks`, at least 1).
    pub fn chunks(&self) -> usize {
        self.prefill_chunks.max(1)
    }
}

/// Simulates `requests` (sorted by arrival) on `groups` whose stages interfere by `kappa` (see
/// the module docs; 0: not at all); returns each request's latency (`finish − arrival`) in order,
/// `None` for a request whose model no group serves.
pub fn simulate(groups: &[Group], requests: &[Request], kappa: f64) -> Vec<Option<f64>> {
    simulate_admitting(groups, requests, kappa, Dropping::Never)
}

/// [`simulate`] with the groups dropping requests at arrival as `drop` says (module docs);
/// a dropped request's latency is `None`.
pub fn simulate_admitting(groups: &[Group], requests: &[Request], kappa: f64, drop: Dropping) -> Vec<Option<f64>> {
    if kappa > 0.0 || groups.iter().any(|g| !g.steps.is_empty()) {
        events::Events::new(groups, kappa).run(requests, drop)
    } else {
        simulate_apart(groups, requests, drop)
    }
}

/// [`simulate_admitting`] without interference: each request's timeline in closed form, in FCFS
/// order.
fn simulate_apart(groups: &[Group], requests: &[Request], drop: Dropping) -> Vec<Option<f64>> {
    let mut pipelines: Vec<Pipeline> = groups.iter().map(|g| Pipeline::new(g.stages)).collect();
    // Finish times of each group's unfinished requests, in FCFS order (which is finish order).
    let mut in_flight: Vec<VecDeque<f64>> = vec![VecDeque::new(); groups.len()];
    requests
        .iter()
        .map(|r| {
            for queue in &mut in_flight {
                while queue.front().is_some_and(|&f| f <= r.arrival_s) {
                    queue.pop_front();
                }
            }
            let (gi, lat) = least_loaded(groups, r.model, |g| in_flight[g].len())?;
            let finish = pipelines[gi].run_by(r.arrival_s, lat, drop.deadline(r)).ok()?;
            in_flight[gi].push_back(finish);
            Some(finish - r.arrival_s)
        })
        .collect()
}

/// The group, among those serving `model`, with the fewest unfinished requests (ties: the
/// lowest), and the model's stage latencies on it.
fn least_loaded(groups: &[Group], model: usize, unfinished: impl Fn(usize) -> usize) -> Option<(usize, &[f64])> {
    let mut chosen: Option<(usize, &[f64])> = None;
    let mut chosen_queue = usize::MAX;
    for (gi, g) in groups.iter().enumerate() {
        let Some((_, lat)) = g.models.iter().find(|(m, _)| *m == model) else {
            continue;
        };
        let queue = unfinished(gi);
        if queue < chosen_queue {
            chosen_queue = queue;
            chosen = Some((gi, lat));
        }
    }
    chosen
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

    fn one_stage_groups(latencies: &[f64]) -> Vec<Group> {
        latencies.iter().enumerate().map(|(m, &t)| Group::new(1, vec![(m, vec![t])])).collect()
    }

    /// Up to 3 groups of up to 3 stages serving some of models 0..3, and up to 40 requests for
    /// models 0..4 (model 3 served nowhere), some arriving together.
    pub(super) fn random_case(rng: &mut ChaCha8Rng) -> (Vec<Group>, Vec<Request>) {
        let groups: Vec<Group> = (0..rng.random_range(1..4))
            .map(|_| {
                let stages = rng.random_range(1..4);
                let mut models = Vec::new();
                for m in 0..3 {
                    if rng.random_bool(0.6) {
                        models.push((m, (0..stages).map(|_| rng.random_range(0.05..2.0)).collect()));
                    }
                }
                Group::new(stages, models)
            })
            .collect();
        let mut t = 0.0;
        let requests: Vec<Request> = (0..rng.random_range(1..40))
            .map(|_| {
                t += if rng.random_bool(0.2) { 0.0 } else { rng.random_range(0.0..1.0) };
                Request { arrival_s: t, model: rng.random_range(0..4) }
            })
            .collect();
        (groups, requests)
    }

    #[test]
    fn sim_shared_clock_without_interference_is_the_closed_form() {
        let mut rng = rng(11, 0);
        for case in 0..300 {
            let (groups, requests) = random_case(&mut rng);
            let slo: Vec<f64> = (0..3).map(|_| rng.random_range(0.5..4.0)).collect();
            for drop in [Dropping::Never, Dropping::Late(&slo)] {
                let closed = simulate_apart(&groups, &requests, drop);
                let shared = events::Events::new(&groups, 0.0).run(&requests, drop);
                for (a, b) in closed.iter().zip(&shared) {
                    match (a, b) {
                        (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "case {case}: {closed:?} vs {shared:?}"),
                        _ => assert_eq!(a, b, "case {case} {drop:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn sim_interfering_stages_share_their_speed() {
        // Two stages of 1 s, two requests at 0. r0's stage 1 and r1's stage 0 run together at
        // 1/(1 + κ) speed: both end at 1 + (1 + κ); r1's stage 1 then runs alone.
        let pipeline = [Group::new(2, vec![(0, vec![1.0, 1.0])])];
        let both = [Request { arrival_s: 0.0, model: 0 }; 2];
        assert_eq!(simulate(&pipeline, &both, 0.0), vec![Some(2.0), Some(3.0)]);
        let lat = simulate(&pipeline, &both, 0.5);
        assert!((lat[0].unwrap() - 2.5).abs() < 1e-12 && (lat[1].unwrap() - 3.5).abs() < 1e-12, "{lat:?}");
        // κ = 1: as if the stages took turns.
        let lat = simulate(&pipeline, &both, 1.0);
        assert!((lat[0].unwrap() - 3.0).abs() < 1e-12 && (lat[1].unwrap() - 4.0).abs() < 1e-12, "{lat:?}");
    }

    #[test]
    fn sim_groups_starting_together_end_as_the_interference_prices_them() {
        // Replicas on three devices, 1, 2 and 3 s alone, started together: stage i ends after
        // a_i + κ·Σ_{j≠i} min(a_j, a_i); the last after max + κ·(Σ − max).
        let groups = one_stage_groups(&[1.0, 2.0, 3.0]);
        let requests: Vec<Request> = (0..3).map(|m| Request { arrival_s: 0.0, model: m }).collect();
        let lat = simulate(&groups, &requests, 0.4);
        for (got, want) in lat.iter().zip([1.8, 3.2, 4.2]) {
            assert!((got.unwrap() - want).abs() < 1e-12, "{lat:?}");
        }
        let last = crate::interference::Interference::interval_ms(&[1.0, 2.0, 3.0], 0.4);
        assert!((lat[2].unwrap() - last).abs() < 1e-12);
        // A device idle while the others work is not slowed: one request alone takes its time.
        let alone = simulate(&groups, &[Request { arrival_s: 5.0, model: 1 }], 0.4);
        assert_eq!(alone, vec![Some(2.0)]);
    }

    #[test]
    fn sim_slo_admission_drops_what_would_be_late_and_the_dropped_hold_no_stage() {
        let group = one_stage_groups(&[1.0]);
        let at = |t: f64| Request { arrival_s: t, model: 0 };
        let burst = [at(0.0), at(0.0), at(0.0), at(0.0), at(1.0)];
        assert_eq!(simulate(&group, &burst, 0.0), vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0), Some(4.0)]);
        // SLO 2.5 s: the third and fourth would finish at 3 s and are dropped; the one at 1 s then
        // finds the stage free at 2 s, not at 4 s.
        let slo = [2.5];
        let want = vec![Some(1.0), Some(2.0), None, None, Some(2.0)];
        assert_eq!(simulate_admitting(&group, &burst, 0.0, Dropping::Late(&slo)), want);
        // A model past the SLO list has none and is always taken.
        assert_eq!(simulate_admitting(&group, &burst, 0.0, Dropping::Late(&[])), simulate(&group, &burst, 0.0));
        // Admission reads the stages' own latencies, not the interference: two replicas at κ = 1
        // each take both requests' time, 2 s, past an SLO of 1.5 s that admission expected to meet.
        let two = one_stage_groups(&[1.0, 1.0]);
        let both = [at(0.0), Request { arrival_s: 0.0, model: 1 }];
        let lat = simulate_admitting(&two, &both, 1.0, Dropping::Late(&[1.5, 1.5]));
        assert!(lat.iter().all(|l| l.is_some_and(|l| (l - 2.0).abs() < 1e-12)), "{lat:?}");
        // A pipeline's own stages are on its clocks at κ: stages of 1 s and 0.5 s at κ = 0.6
        // serve a request every 1.3 s (the interval of stages at work together) and admission
        // takes them at that interval, so that what it takes is served as it expects.
        assert_eq!(admission_latencies(&[1.0, 0.5], 0.6), vec![1.3, 0.8]);
        assert_eq!(admission_latencies(&[2.0], 0.6), vec![2.0]);
        let pipeline = [Group::new(2, vec![(0, vec![1.0, 0.5])])];
        let burst = [at(0.0); 6];
        let lat = simulate_admitting(&pipeline, &burst, 0.6, Dropping::Late(&[4.5]));
        let taken: Vec<f64> = lat.iter().flatten().copied().collect();
        assert!(taken.len() < burst.len() && taken.len() >= 2, "{lat:?}");
        assert!(taken.iter().all(|&l| l <= 4.5 + 1e-9), "{lat:?}");
    }

    #[test]
    fn sim_pipeline_follows_the_flow_shop_rule() {
        let mut p = Pipeline::new(2);
        // r0 at 0: stage0 0..1, stage1 1..3. r1 at 0: stage0 1..2, stage1 3..5.
        assert_eq!(p.run(0.0, &[1.0, 2.0]), 3.0);
        assert_eq!(p.run(0.0, &[1.0, 2.0]), 5.0);
        // r2 at 10: idle pipeline.
        assert_eq!(p.run(10.0, &[1.0, 2.0]), 13.0);
        // A request that cannot leave by its deadline is not run: the stages stay as they were.
        assert_eq!(p.run_by(10.0, &[1.0, 2.0], 14.9), Err(15.0));
        assert_eq!(p.run_by(10.0, &[1.0, 2.0], 15.0), Ok(15.0));
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
