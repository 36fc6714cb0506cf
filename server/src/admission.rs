//! `serve --admission slo`: a request the placement predicts would miss its model's SLO is
//! rejected at arrival (503, code `slo_unattainable`), as AlpaServe's group managers reject them
//! (thesis §4.6: "when a group receives a request, it checks whether it can serve the request
//! under SLO and rejects the request if it cannot").
//!
//! Each placement group keeps its stages' clocks ([`GroupClock`]): when each stage is next free,
//! by the flow-shop rule the simulator runs ([`burn_plan::sim::Pipeline`]), on the
//! latencies the placement priced for each model on the group as they run while the group's
//! pipeline is full ([`burn_plan::sim::admission_latencies`]). A request is taken only if it
//! leaves the last stage by its arrival plus its SLO; taken, it advances the clocks; rejected, it
//! leaves them as they were, so it holds no stage that a later request could use. The clocks run
//! on the placement's prices, exactly as the simulator's do: the prediction
//! (`placement::evaluate` with `admission: "slo"`) rejects the same requests a server whose
//! devices run as priced rejects.
//!
//! Devices that run slower than priced leave the group's real queue behind its clocks, and the
//! clocks alone would then take requests that can no longer make their SLO, each of which then
//! delays the requests behind it. AlpaServe's group manager checks a request against the queue
//! it actually has; here each taken request reports when it finished ([`Taken`]), and while the
//! group still has requests in flight, the last one's lateness against its predicted finish (the
//! lag, never negative) is added to every prediction. Once the group has nothing in flight the lag
//! is zero again, so a group whose devices run as priced keeps the simulator's admissions.
//!
//! A group whose models the placement serves step by step (its pipeline timed serving,
//! [`burn_plan::sim::Steps`]) keeps the simulator's own timeline of the group instead
//! ([`StepClocks`]): a request is taken if, added to the requests taken before it, it would leave
//! by its deadline there, each of their decode steps queueing behind the others' prefills.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn_plan::sim::{Pipeline, StepClocks};

use super::errors::ApiError;

/// The stage clocks of one placement group, shared by the engines of every model on it.
#[derive(Debug)]
pub struct GroupClock {
    /// The group's index in the placement (in messages).
    group: usize,
    /// Time zero of the clocks.
    epoch: Instant,
    stages: Mutex<Clocks>,
    behind: Mutex<Behind>,
}

/// How the group's real queue stands against its clocks (see the [module docs](self)).
#[derive(Debug, Default)]
struct Behind {
    /// Requests taken and not yet finished.
    in_flight: usize,
    /// Seconds the last request to finish came after its predicted finish (0 when it came in
    /// time, or when nothing is in flight).
    lag_s: f64,
}

/// The flow-shop clocks of one-pass groups, or a stepped group's timeline.
#[derive(Debug, Clone)]
enum Clocks {
    Flow(Pipeline),
    Steps(Box<StepClocks>),
}

impl GroupClock {
    /// The clocks of group `group`, of `stages` idle stages, from now on.
    pub fn new(group: usize, stages: usize) -> Arc<Self> {
        Self::with(group, Clocks::Flow(Pipeline::new(stages)))
    }

    /// The step-by-step clocks of group `group` from now on (its gates name their model by its
    /// index in the clocks' group).
    pub fn stepped(group: usize, clocks: StepClocks) -> Arc<Self> {
        Self::with(group, Clocks::Steps(Box::new(clocks)))
    }

    fn with(group: usize, clocks: Clocks) -> Arc<Self> {
        Arc::new(Self { group, epoch: Instant::now(), stages: Mutex::new(clocks), behind: Mutex::default() })
    }

    /// Seconds since the clocks' time zero.
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// How the group's real queue stands against its clocks, locked. A poisoned lock (as for the
    /// clocks) only means another request panicked while holding it: the counts are plain
    /// numbers, still valid.
    fn behind(&self) -> std::sync::MutexGuard<'_, Behind> {
        self.behind.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request the gate took: reports when it finished to its group's clocks, at the latest when
/// dropped (its response sent, or its client gone).
#[derive(Debug)]
pub struct Taken {
    clock: Arc<GroupClock>,
    /// When the clocks predicted it to finish (its last prompt), seconds since their time zero.
    due_s: f64,
    /// Whether its finish was reported (once only).
    reported: bool,
}

impl Taken {
    /// Reports the request finished at `at_s` (seconds since the clocks' time zero).
    fn finish_at(&mut self, at_s: f64) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        let mut behind = self.clock.behind();
        behind.in_flight = behind.in_flight.saturating_sub(1);
        behind.lag_s = match behind.in_flight {
            0 => 0.0,
            _ => (at_s - self.due_s).max(0.0),
        };
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let now = self.clock.now();
        self.finish_at(now);
    }
}

/// One model's admission on one group (one replica's engine).
#[derive(Debug, Clone)]
pub struct SloGate {
    clock: Arc<GroupClock>,
    /// The model's index in step-by-step clocks.
    model: usize,
    /// The model's latency on each of the group's stages, in seconds.
    stage_latency_s: Vec<f64>,
    /// The model's SLO in seconds.
    slo_s: f64,
}

impl SloGate {
    /// The gate of a model whose stages on `clock`'s group take `stage_latency_ms` and whose
    /// requests must finish within `slo_s`.
    pub fn new(clock: Arc<GroupClock>, stage_latency_ms: &[f64], slo_s: f64) -> Self {
        Self { clock, model: 0, stage_latency_s: stage_latency_ms.iter().map(|ms| ms / 1000.0).collect(), slo_s }
    }

    /// The gate of model `model` (its index in the clocks' group) on step-by-step clocks.
    pub fn stepped(clock: Arc<GroupClock>, model: usize, slo_s: f64) -> Self {
        Self { clock, model, stage_latency_s: Vec::new(), slo_s }
    }

    /// Takes `count` requests arriving now if every one of them would meet the SLO, advancing
    /// the group's clocks (their finish reported through the returned [`Taken`]); otherwise takes
    /// none and answers the 503 naming why (for `model`).
    pub fn admit(&self, model: &str, count: usize) -> Result<Taken, ApiError> {
        let now = self.clock.now();
        // Held across the check and the count below, so that admissions and reports take turns.
        let mut behind = self.clock.behind();
        let lag = behind.lag_s;
        let deadline = now + self.slo_s - lag;
        // A poisoned lock only means another request panicked while holding it: the clocks are
        // plain numbers, still valid.
        let mut stages = self.clock.stages.lock().unwrap_or_else(|e| e.into_inner());
        let mut after = stages.clone();
        let mut due_s = now;
        for _ in 0..count {
            let taken = match &mut after {
                Clocks::Flow(pipeline) => pipeline.run_by(now, &self.stage_latency_s, deadline),
                Clocks::Steps(clocks) => clocks.take_by(now, self.model, deadline),
            };
            match taken {
                Ok(finish) => due_s = due_s.max(finish),
                Err(finish) => {
                    let predicted = finish + lag - now;
                    let lagging = match lag > 0.0 {
                        true => format!(", running {lag:.2} s behind its clocks"),
                        false => String::new(),
                    };
                    return Err(ApiError::unavailable(format!(
                        "model `{model}` would finish this request in {predicted:.2} s, past its SLO of {:.2} s \
                         (its group {} is busy with earlier requests{lagging}): rejected at arrival by --admission \
                         slo; retry later",
                        self.slo_s, self.clock.group
                    ))
                    .with_code("slo_unattainable"));
                }
            }
        }
        *stages = after;
        behind.in_flight += 1;
        Ok(Taken { clock: self.clock.clone(), due_s, reported: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_takes_what_its_clocks_can_serve_in_time_and_two_models_share_them() {
        // Two stages of 0.4 s and 0.6 s, SLO 2.5 s: requests at once finish at 1.0, 1.6, 2.2 and
        // would at 2.8, so the fourth is rejected and the clocks stay where the third left them.
        let clock = GroupClock::new(3, 2);
        let a = SloGate::new(clock.clone(), &[400.0, 600.0], 2.5);
        for _ in 0..3 {
            a.admit("a", 1).unwrap();
        }
        let err = a.admit("a", 1).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(err.message.contains("past its SLO of 2.50 s") && err.message.contains("group 3"), "{}", err.message);
        // Another model on the same group queues behind `a`'s requests: with a looser SLO it fits.
        let b = SloGate::new(clock.clone(), &[100.0, 100.0], 3.0);
        b.admit("b", 1).unwrap();
        // Several prompts of one request are taken together or not at all: seven more would end
        // by 3.0 s, an eighth at 3.1 s.
        let before = clock.stages.lock().unwrap().clone();
        assert!(b.admit("b", 8).is_err());
        let after = clock.stages.lock().unwrap().clone();
        assert_eq!(format!("{before:?}"), format!("{after:?}"));
    }

    #[test]
    fn a_stepped_group_takes_what_its_own_timeline_serves_in_time() {
        use burn_plan::sim::{Group, StepClocks, Steps};
        // Two stages, a prefill pass of 1 s on each and two decode passes of 0.1 s on each, two
        // seats. Alone a request takes 2.4 s; two at once end at 3.3 and 3.4 s (the first one's
        // decode steps wait behind the second's prefill), so under an SLO of 3.35 s the second
        // is refused, and a request of the other model on the group, one pass of 0.5 s per
        // stage, is taken behind them.
        let steps = Steps {
            prefill: vec![1.0, 1.0],
            prefill_chunks: 1,
            decode: vec![0.1, 0.1],
            decodes: 2,
            seats: 2,
            kappa: 0.0,
        };
        let group = Group { steps: vec![(0, steps)], ..Group::new(2, vec![(0, vec![1.2, 1.2]), (1, vec![0.5, 0.5])]) };
        let clock = GroupClock::stepped(1, StepClocks::new(group, 0.0));
        let a = SloGate::stepped(clock.clone(), 0, 3.35);
        a.admit("a", 1).unwrap();
        let err = a.admit("a", 1).unwrap_err();
        assert!(err.message.contains("past its SLO of 3.35 s") && err.message.contains("group 1"), "{}", err.message);
        let b = SloGate::stepped(clock.clone(), 1, 10.0);
        b.admit("b", 1).unwrap();
        // Two prompts of one request are taken together or not at all.
        assert!(a.admit("a", 2).is_err());
    }

    #[test]
    fn a_group_running_behind_its_clocks_takes_only_what_it_can_still_serve_in_time() {
        // As above, the clocks alone take three requests at once, ending at 1.0, 1.6 and 2.2 s.
        let clock = GroupClock::new(0, 2);
        let a = SloGate::new(clock.clone(), &[400.0, 600.0], 2.5);
        let mut first = a.admit("a", 1).unwrap();
        let second = a.admit("a", 1).unwrap();
        // The first finishes a second late: the group runs 1 s behind, so the third, due at 2.2 s
        // on the clocks, would end at 3.2 s.
        first.finish_at(first.due_s + 1.0);
        let err = a.admit("a", 1).unwrap_err();
        assert!(err.message.contains("in 3.20 s") && err.message.contains("1.00 s behind"), "{}", err.message);
        // The rejection left the clocks as they were; with nothing in flight the lag is gone and
        // the clocks alone decide again.
        drop(second);
        let mut third = a.admit("a", 1).unwrap();
        // A request finishing early leaves no lag behind it (never negative).
        let fourth = GroupClock::new(1, 2);
        let b = SloGate::new(fourth.clone(), &[400.0, 600.0], 2.5);
        let (mut early, _later) = (b.admit("b", 1).unwrap(), b.admit("b", 1).unwrap());
        early.finish_at(early.due_s - 0.5);
        assert_eq!(fourth.behind().lag_s, 0.0);
        b.admit("b", 1).unwrap();
        // A request reports once: dropped after its report, it counts nothing more.
        third.finish_at(third.due_s);
        drop(third);
        assert_eq!(clock.behind().in_flight, 0);
    }
}
