//! The event-driven simulation, for stages that interfere and for models served step by step
//! (see the [module docs](super)); without either, [`super::simulate_apart`]'s closed form gives
//! the same timelines.
//!
//! Each busy stage keeps the work it has left, in seconds of its own time, and advances at its
//! speed `1 / (1 + κ_own·(busy in its group − 1) + κ·(busy in other groups))`, where `κ_own` is
//! the stepped model's own measured `κ` (its pipeline's stages as they slowed each other serving)
//! and the devices' `κ` otherwise. The next event is the first stage to finish or the next
//! arrival, whichever comes first (a stage finishing when a request arrives finishes first).
//!
//! A group that serves a model step by step keeps its admission clocks as [`StepClocks`]: this
//! same simulation of the group alone, on the requests it has taken.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use super::{Dropping, Group, Pipeline, Request, SLO_SLACK_S, admission_latencies, least_loaded};

/// A request on its way through its group.
#[derive(Debug, Clone, Copy)]
struct Flight {
    group: usize,
    /// Its model's place in the group's `models`.
    slot: usize,
    /// Its model's place in the group's `steps`, when served step by step.
    steps: Option<usize>,
    /// Passes through the stages it has finished (while fewer than its prefill's chunks, it is
    /// prefilling), or its one pass.
    passes: usize,
    /// Passes that have left the first stage (a chunked prefill issues its next chunk then).
    first_stage_passes: usize,
}

/// A stage at work: its request and the work it has left, seconds of the stage's own time.
#[derive(Debug, Clone, Copy)]
struct Busy {
    request: usize,
    left: f64,
}

/// A group's admission clocks (module docs of [`super`]).
#[derive(Debug, Clone)]
enum Clock {
    /// The flow-shop rule on each model's [`admission_latencies`] (in the group's `models` order).
    Flow(Pipeline, Vec<Vec<f64>>),
    /// The group's own step-by-step timeline.
    Steps(Box<StepClocks>),
}

/// The admission clocks of a group that serves models step by step: the simulator's timeline of
/// the group alone (its stages slowing each other as the simulation has them, other groups not
/// on it), on the requests it has taken. A request is taken if, added to that timeline, it would
/// finish by its deadline; the requests taken before it may then finish later than they were
/// expected to, as they would on the group.
#[derive(Debug, Clone)]
pub struct StepClocks {
    events: Events<'static>,
    next: usize,
}

impl StepClocks {
    /// Idle clocks of `group`, whose models outside its `steps` feel the devices' `kappa`.
    pub fn new(group: Group, kappa: f64) -> Self {
        Self { events: Events::with(Cow::Owned(vec![group]), kappa, false), next: 0 }
    }

    /// Takes a request of `model` arriving at `at` (seconds, never earlier than the last one) if
    /// it would leave the group by `deadline`: `Ok` with when it would, advancing the clocks;
    /// otherwise `Err` with when, and the clocks keep only what they had.
    pub fn take_by(&mut self, at: f64, model: usize, deadline: f64) -> Result<f64, f64> {
        let request = Request { arrival_s: at, model };
        self.events.run_until(at, &mut |_, _| {});
        let mut trial = self.events.clone();
        trial.arrive(self.next, &request, Dropping::Never);
        let mut finish = f64::INFINITY;
        let index = self.next;
        trial.run_until(f64::INFINITY, &mut |i, t| {
            if i == index {
                finish = t;
            }
        });
        if finish > deadline + SLO_SLACK_S {
            return Err(finish);
        }
        self.events.arrive(self.next, &request, Dropping::Never);
        self.next += 1;
        Ok(finish)
    }
}

/// The simulation's state (see the module docs).
#[derive(Debug, Clone)]
pub(super) struct Events<'g> {
    groups: Cow<'g, [Group]>,
    kappa: f64,
    /// Requests waiting for each stage of each group, in the order they reached it.
    waiting: Vec<Vec<VecDeque<usize>>>,
    busy: Vec<Vec<Option<Busy>>>,
    /// Each stepped model's requests holding one of its seats on a group, and those waiting for
    /// one (indexed like the group's `steps`).
    seated: Vec<Vec<usize>>,
    queued: Vec<Vec<VecDeque<usize>>>,
    /// Requests dispatched to each group and not finished.
    unfinished: Vec<usize>,
    flights: HashMap<usize, Flight>,
    /// Each group's admission clocks (none for clocks themselves, which take every request).
    clocks: Vec<Clock>,
    now: f64,
}

impl<'g> Events<'g> {
    pub(super) fn new(groups: &'g [Group], kappa: f64) -> Self {
        Self::with(Cow::Borrowed(groups), kappa, true)
    }

    fn with(groups: Cow<'g, [Group]>, kappa: f64, clocks: bool) -> Self {
        let clocks = match clocks {
            true => groups
                .iter()
                .map(|g| match g.steps.is_empty() {
                    true => Clock::Flow(
                        Pipeline::new(g.stages),
                        g.models.iter().map(|(_, lat)| admission_latencies(lat, kappa)).collect(),
                    ),
                    false => Clock::Steps(Box::new(StepClocks::new(g.clone(), kappa))),
                })
                .collect(),
            false => Vec::new(),
        };
        Self {
            waiting: groups.iter().map(|g| vec![VecDeque::new(); g.stages]).collect(),
            busy: groups.iter().map(|g| vec![None; g.stages]).collect(),
            seated: groups.iter().map(|g| vec![0; g.steps.len()]).collect(),
            queued: groups.iter().map(|g| vec![VecDeque::new(); g.steps.len()]).collect(),
            unfinished: vec![0; groups.len()],
            flights: HashMap::new(),
            clocks,
            now: 0.0,
            groups,
            kappa,
        }
    }

    pub(super) fn run(mut self, requests: &[Request], drop: Dropping) -> Vec<Option<f64>> {
        let mut finished = vec![None; requests.len()];
        for (index, request) in requests.iter().enumerate() {
            self.run_until(request.arrival_s, &mut |i, t| finished[i] = Some(t));
            self.arrive(index, request, drop);
        }
        self.run_until(f64::INFINITY, &mut |i, t| finished[i] = Some(t));
        finished.iter().zip(requests).map(|(f, r)| f.map(|t| t - r.arrival_s)).collect()
    }

    /// Runs every stage that finishes by `until` (one finishing exactly then first, before an
    /// arrival then), telling `finished` each request that leaves its group and when; then moves
    /// the clock to `until` (if finite).
    fn run_until(&mut self, until: f64, finished: &mut dyn FnMut(usize, f64)) {
        loop {
            let speeds = self.speeds();
            let done = speeds
                .iter()
                .filter_map(|&(g, s, speed)| Some((self.now + self.busy[g][s]?.left / speed, g, s)))
                .min_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
            match done {
                Some((at, g, s)) if at <= until => {
                    self.advance(at, &speeds);
                    self.stage_done(g, s, finished);
                }
                _ => {
                    if until.is_finite() {
                        self.advance(until, &speeds);
                    }
                    return;
                }
            }
        }
    }
    /// Every busy stage `(group, stage)` and its speed now.
    fn speeds(&self) -> Vec<(usize, usize, f64)> {
        let per_group: Vec<usize> = self.busy.iter().map(|g| g.iter().flatten().count()).collect();
        let total: usize = per_group.iter().sum();
        let mut out = Vec::with_capacity(total);
        for (g, stages) in self.busy.iter().enumerate() {
            for (s, busy) in stages.iter().enumerate() {
                let Some(busy) = busy else { continue };
                let own = self.own_kappa(busy.request);
                let slowdown = 1.0 + own * (per_group[g] - 1) as f64 + self.kappa * (total - per_group[g]) as f64;
                out.push((g, s, 1.0 / slowdown));
            }
        }
        out
    }

    /// The `κ` a request's stages feel from the other busy stages of its group.
    fn own_kappa(&self, request: usize) -> f64 {
        match self.flights.get(&request) {
            Some(&Flight { group, steps: Some(k), .. }) => self.groups[group].steps[k].1.kappa,
            _ => self.kappa,
        }
    }

    /// Moves the clock to `to`, every busy stage doing its share of work meanwhile.
    fn advance(&mut self, to: f64, speeds: &[(usize, usize, f64)]) {
        let elapsed = (to - self.now).max(0.0);
        for &(g, s, speed) in speeds {
            if let Some(busy) = &mut self.busy[g][s] {
                busy.left = (busy.left - elapsed * speed).max(0.0);
            }
        }
        self.now = to;
    }

    /// Routes, admits and queues request `index`.
    fn arrive(&mut self, index: usize, request: &Request, drop: Dropping) {
        let Some((g, _)) = least_loaded(&self.groups, request.model, |g| self.unfinished[g]) else { return };
        let group = &self.groups[g];
        let Some(slot) = group.models.iter().position(|(m, _)| *m == request.model) else { return };
        let steps = group.steps.iter().position(|(m, _)| *m == request.model);
        let seats = steps.map_or(usize::MAX, |k| group.steps[k].1.seats.max(1));
        if !matches!(drop, Dropping::Never) && !self.admit(g, slot, request, drop.deadline(request)) {
            return;
        }
        self.flights.insert(index, Flight { group: g, slot, steps, passes: 0, first_stage_passes: 0 });
        self.unfinished[g] += 1;
        match steps {
            Some(k) if self.seated[g][k] >= seats => self.queued[g][k].push_back(index),
            Some(k) => {
                self.seated[g][k] += 1;
                self.enqueue(g, 0, index);
            }
            None => self.enqueue(g, 0, index),
        }
    }

    /// Whether group `g`'s clocks take `request` (its model at `slot` of the group's `models`)
    /// by `deadline`, advancing them if they do.
    fn admit(&mut self, g: usize, slot: usize, request: &Request, deadline: f64) -> bool {
        match self.clocks.get_mut(g) {
            Some(Clock::Flow(pipeline, latency)) => {
                pipeline.run_by(request.arrival_s, &latency[slot], deadline).is_ok()
            }
            Some(Clock::Steps(clocks)) => clocks.take_by(request.arrival_s, request.model, deadline).is_ok(),
            None => true,
        }
    }

    /// Stage `s` of group `g` has finished its request's pass there.
    fn stage_done(&mut self, g: usize, s: usize, finished: &mut dyn FnMut(usize, f64)) {
        let Some(Busy { request, .. }) = self.busy[g][s].take() else { return };
        let stages = self.groups[g].stages;
        if s + 1 < stages {
            self.enqueue(g, s + 1, request);
            if s == 0 && self.next_chunk(g, request) {
                self.enqueue(g, 0, request);
            }
        } else if let Some(flight) = self.flights.get_mut(&request) {
            flight.passes += 1;
            let flight = *flight;
            // A request that crosses once has one whole "prefill" pass and no decodes.
            let steps = flight.steps.map(|k| &self.groups[g].steps[k].1);
            let (chunks, decodes) = steps.map_or((1, 0), |steps| (steps.chunks(), steps.decodes));
            if flight.passes < chunks && stages > 1 {
                // Its next chunk left for the first stage when this one left it.
            } else if flight.passes < chunks + decodes {
                self.enqueue(g, 0, request);
            } else {
                self.flights.remove(&request);
                finished(request, self.now);
                self.unfinished[g] -= 1;
                if let Some(k) = flight.steps {
                    self.seated[g][k] -= 1;
                    if let Some(seated) = self.queued[g][k].pop_front() {
                        self.seated[g][k] += 1;
                        self.enqueue(g, 0, seated);
                    }
                }
            }
        }
        self.start_next(g, s);
    }

    /// Counts a pass of `request` leaving group `g`'s first stage (of several); whether it was a
    /// prefill chunk with another to follow it.
    fn next_chunk(&mut self, g: usize, request: usize) -> bool {
        let Some(flight) = self.flights.get_mut(&request) else { return false };
        let Some(k) = flight.steps else { return false };
        flight.first_stage_passes += 1;
        flight.first_stage_passes < self.groups[g].steps[k].1.chunks()
    }

    fn enqueue(&mut self, g: usize, s: usize, request: usize) {
        self.waiting[g][s].push_back(request);
        self.start_next(g, s);
    }

    /// Starts the stage's next waiting request if the stage is free.
    fn start_next(&mut self, g: usize, s: usize) {
        if self.busy[g][s].is_some() {
            return;
        }
        if let Some(request) = self.waiting[g][s].pop_front() {
            let left = self.flights.get(&request).map_or(0.0, |&f| self.stage_latency(f, s));
            self.busy[g][s] = Some(Busy { request, left });
        }
    }

    /// The time a request's current pass takes on stage `s` alone.
    fn stage_latency(&self, flight: Flight, s: usize) -> f64 {
        let group = &self.groups[flight.group];
        match flight.steps {
            Some(k) => {
                let steps = &group.steps[k].1;
                let chunks = steps.chunks();
                match flight.passes < chunks {
                    true => steps.prefill.get(s).map_or(0.0, |t| t / chunks as f64),
                    false => steps.decode.get(s).copied().unwrap_or(0.0),
                }
            }
            None => group.models[flight.slot].1.get(s).copied().unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Dropping, Group, Request, Steps, simulate, simulate_admitting};
    use super::StepClocks;
    use crate::sim::rng;
    use crate::sim::tests::random_case;
    use rand::Rng;

    fn stepped(prefill: [f64; 2], decode: [f64; 2], decodes: usize, seats: usize, kappa: f64) -> [Group; 1] {
        let steps =
            Steps { prefill: prefill.to_vec(), prefill_chunks: 1, decode: decode.to_vec(), decodes, seats, kappa };
        let once = prefill.iter().zip(decode).map(|(p, d)| p + d * decodes as f64).collect();
        [Group { steps: vec![(0, steps)], ..Group::new(2, vec![(0, once)]) }]
    }

    fn close(got: &[Option<f64>], want: &[f64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g.is_some_and(|g| (g - w).abs() < 1e-9))
    }

    #[test]
    fn stepped_requests_cross_the_stages_once_per_step_and_decodes_wait_behind_prefills() {
        let group = stepped([1.0, 1.0], [0.1, 0.1], 2, 2, 0.0);
        let at = |t: f64| Request { arrival_s: t, model: 0 };
        // Alone: a prefill pass, then two decode passes.
        assert!(close(&simulate(&group, &[at(0.0)], 0.0), &[2.4]));
        // Two at once: r0's first decode reaches stage 1 at 2.1 while r1's prefill holds it until
        // 3, so r0 ends at 3.3 (not 2.4, as one pass per request would have it); r1 at 3.4.
        assert!(close(&simulate(&group, &[at(0.0), at(0.0)], 0.0), &[3.3, 3.4]));
        // One seat: the second request starts only when the first has ended.
        let one_seat = stepped([1.0, 1.0], [0.1, 0.1], 2, 1, 0.0);
        assert!(close(&simulate(&one_seat, &[at(0.0), at(0.0)], 0.0), &[2.4, 4.8]));
    }

    #[test]
    fn a_chunked_prefill_overlaps_its_chunks_through_the_stages() {
        let at = |t: f64| Request { arrival_s: t, model: 0 };
        let chunked = |stages: usize, decodes: usize, seats: usize| {
            let steps = Steps {
                prefill: vec![1.0; stages],
                prefill_chunks: 4,
                decode: vec![0.1; stages],
                decodes,
                seats,
                kappa: 0.0,
            };
            let once = vec![1.0 + 0.1 * decodes as f64; stages];
            [Group { steps: vec![(0, steps)], ..Group::new(stages, vec![(0, once)]) }]
        };
        // Alone over two stages: four chunks of 0.25 s a stage, the second stage one chunk behind
        // the first (1.25 s, against 2 s whole), then two decode passes (0.4 s).
        assert!(close(&simulate(&chunked(2, 2, 2), &[at(0.0)], 0.0), &[1.65]));
        // Two at once: a chunk queues at the first stage behind what reached it first, so the
        // first stage takes the two prompts' chunks in turn and the second follows a chunk
        // behind: r0's prefill ends at 2.0, r1's at 2.25 (whole, r1 would end at 3.0).
        assert!(close(&simulate(&chunked(2, 0, 2), &[at(0.0), at(0.0)], 0.0), &[2.0, 2.25]));
        // On one stage the chunks only follow each other: the whole prefill, then the decodes.
        assert!(close(&simulate(&chunked(1, 2, 1), &[at(0.0)], 0.0), &[1.2]));
    }

    #[test]
    fn a_stepped_group_admits_on_its_own_timeline() {
        let group = stepped([1.0, 1.0], [0.1, 0.1], 2, 2, 0.0);
        let at = |t: f64| Request { arrival_s: t, model: 0 };
        // Taken together, the two end at 3.3 and 3.4 (above): under an SLO of 3.35 s the second
        // is dropped, and the first, alone, ends at 2.4; under 3.45 s both are taken.
        let lat = simulate_admitting(&group, &[at(0.0), at(0.0)], 0.0, Dropping::Late(&[3.35]));
        assert!(lat[1].is_none() && close(&lat[..1], &[2.4]), "{lat:?}");
        let lat = simulate_admitting(&group, &[at(0.0), at(0.0)], 0.0, Dropping::Late(&[3.45]));
        assert!(close(&lat, &[3.3, 3.4]), "{lat:?}");
        // The clocks themselves: a refused request leaves them as they were.
        let mut clocks = StepClocks::new(group[0].clone(), 0.0);
        assert!((clocks.take_by(0.0, 0, 10.0).unwrap() - 2.4).abs() < 1e-9);
        assert!((clocks.take_by(0.0, 0, 3.0).unwrap_err() - 3.4).abs() < 1e-9);
        assert!((clocks.take_by(1.0, 0, 10.0).unwrap() - 3.4).abs() < 1e-9, "as if the refused one never came");
    }

    #[test]
    fn a_stepped_model_feels_its_own_kappa_from_its_group() {
        let at = |t: f64| Request { arrival_s: t, model: 0 };
        // r0's stage 1 and r1's stage 0 run together at 1/(1 + 0.5): both end at 2.5.
        let slowed = stepped([1.0, 1.0], [0.0, 0.0], 0, 2, 0.5);
        assert!(close(&simulate(&slowed, &[at(0.0), at(0.0)], 0.0), &[2.5, 3.5]));
        // Its own κ, not the devices', within its group.
        let apart = stepped([1.0, 1.0], [0.0, 0.0], 0, 2, 0.0);
        assert!(close(&simulate(&apart, &[at(0.0), at(0.0)], 0.5), &[2.0, 3.0]));
        // A replica on another device, busy meanwhile, slows it by the devices' κ.
        let mut groups = apart.to_vec();
        groups.push(Group::new(1, vec![(1, vec![2.0])]));
        let both = [at(0.0), Request { arrival_s: 0.0, model: 1 }];
        // The pipeline's one busy stage and the replica run at 1/(1 + 0.5) throughout: stage 0
        // ends at 1.5, stage 1 at 3; the replica's 2 s end at 3 too.
        assert!(close(&simulate(&groups, &both, 0.5), &[3.0, 3.0]));
        // At κ 0 across devices, neither slows the other.
        assert!(close(&simulate(&groups, &both, 0.0), &[2.0, 2.0]));
    }

    #[test]
    fn one_step_with_seats_for_all_is_the_one_pass_simulation() {
        let mut r = rng(5, 0);
        for case in 0..200 {
            let kappa = if r.random_bool(0.3) { 0.0 } else { r.random_range(0.0..1.5) };
            let (groups, requests) = random_case(&mut r);
            let as_steps: Vec<Group> = groups
                .iter()
                .map(|g| {
                    let steps = g.models.iter().map(|(m, lat)| {
                        let steps = Steps {
                            prefill: lat.clone(),
                            prefill_chunks: 1,
                            decode: vec![9.0; g.stages],
                            decodes: 0,
                            seats: 1 << 30,
                            kappa,
                        };
                        (*m, steps)
                    });
                    Group { steps: steps.collect(), ..g.clone() }
                })
                .collect();
            let once = simulate(&groups, &requests, kappa);
            let stepped = simulate(&as_steps, &requests, kappa);
            for (a, b) in once.iter().zip(&stepped) {
                match (a, b) {
                    (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "case {case}: {once:?} vs {stepped:?}"),
                    _ => assert_eq!(a, b, "case {case}"),
                }
            }
        }
    }
}
