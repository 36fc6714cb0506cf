//! Stage turns: when several callers run pipelines at once (the paged engine's virtual engines,
//! each stepping on its own thread, and other models' engines on the same devices), a device takes
//! one caller's stage at a time, in the order they reach it, and a caller keeps its turn until it
//! has issued its output's hand-over to the next stage.
//!
//! Without turns, two callers issuing to the same device at once interleave their operations, and
//! both reach the next stage together: the stages take turns instead of overlapping. The turn also
//! covers the hand-over (a worker's expose of the output), so that it is issued before the other
//! caller's work for the same device.
//!
//! - A device that runs a queue (a worker, a GPU) has one turn shared by every pipeline in the
//!   process that has a stage on it, so that models placed on the same devices issue to them first
//!   come, first served. A stage on the host CPU (Flex) has a turn of its own: it computes in its
//!   own thread pool as it issues.
//! - A worker runs what a client process sends it in the order it arrives, so turns set the order
//!   in which callers' stages run there.
//! - The hand-over from stage `s` to `s + 1` goes out under both stages' turns. Between devices
//!   that run queues (two workers), it is two operations: the source exposes the output, and the
//!   target downloads it, waiting in its queue until the source has it. Issued under the source's
//!   turn only, the download could reach the target among another caller's operations for it
//!   (which the client's fusion holds back until that caller flushes) and stall them until the
//!   source had computed this caller's stage; the target would idle instead of overlapping.
//! - Turns are ranked in the order they were made. A caller holds stage `s`'s turn while it waits
//!   for `s + 1`'s only when `s + 1`'s ranks higher; otherwise it gives up `s`'s first (and the
//!   download may wait as above). Every wait with a turn held is thus for a higher rank, so
//!   pipelines that visit the same devices in different orders cannot deadlock.
//! - One caller alone always finds its turns free; its results never depend on them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use burn::tensor::{Device, Tensor};
use burn_llm_models::device::is_host_device;
use burn_llm_models::{KvCache, LanguageModel, ModelError, Result, StepInput};

use super::model::PipelineLm;

/// One turn per stage, with its rank (see the [module docs](self)).
#[derive(Debug)]
pub(super) struct StageTurns {
    turns: Vec<Arc<Turn>>,
}

/// A device's turn and its rank: turns made earlier rank lower.
#[derive(Debug)]
struct Turn {
    rank: u64,
    lock: Mutex<()>,
}

impl Turn {
    fn new() -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Arc::new(Self { rank: NEXT.fetch_add(1, Ordering::Relaxed), lock: Mutex::new(()) })
    }
}

/// The turns of the queue-running devices in use, by device.
fn device_turns() -> &'static Mutex<HashMap<String, Weak<Turn>>> {
    static TURNS: OnceLock<Mutex<HashMap<String, Weak<Turn>>>> = OnceLock::new();
    TURNS.get_or_init(Default::default)
}

impl StageTurns {
    /// Turns for stages on `devices` (see the [module docs](self)).
    pub fn new(devices: &[Device]) -> Self {
        let keys: Vec<Option<String>> =
            devices.iter().map(|d| (!is_host_device(d)).then(|| format!("{d:?}"))).collect();
        Self::of_keys(&keys)
    }

    /// Turns for stages whose devices run queues under `Some(key)` (shared by every pipeline with
    /// a stage on that key) or compute as they issue (`None`, a turn of the stage's own).
    fn of_keys(keys: &[Option<String>]) -> Self {
        let mut shared = device_turns().lock().unwrap_or_else(PoisonError::into_inner);
        shared.retain(|_, turn| turn.strong_count() > 0);
        let turns = keys
            .iter()
            .map(|key| {
                let Some(key) = key else { return Turn::new() };
                if let Some(turn) = shared.get(key).and_then(Weak::upgrade) {
                    return turn;
                }
                let turn = Turn::new();
                shared.insert(key.clone(), Arc::downgrade(&turn));
                turn
            })
            .collect();
        Self { turns }
    }

    /// Waits for stage `stage`'s turn. A caller that panicked holding it leaves nothing half-done
    /// that the next needs (the lock guards no data), so a poisoned turn is taken as is.
    pub fn take(&self, stage: usize) -> MutexGuard<'_, ()> {
        self.turns[stage].lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a caller holding stage `stage - 1`'s turn may wait for `stage`'s before it gives the
    /// first up: `stage`'s turn ranks higher (see the [module docs](self)).
    fn hand_over_under_both(&self, stage: usize) -> bool {
        stage > 0 && self.turns[stage - 1].rank < self.turns[stage].rank
    }

    /// Stage `stage`'s turn, taken before the hand-over into it while stage `stage - 1`'s is still
    /// held, where the ranks allow; `None` where the hand-over goes out under `stage - 1`'s alone.
    pub fn take_for_hand_over(&self, stage: usize) -> Option<MutexGuard<'_, ()>> {
        self.hand_over_under_both(stage).then(|| self.take(stage))
    }

    /// From stage `stage - 1`, whose turn is `held`, to `stage`: runs `hand_over` under both turns
    /// where the ranks allow, else under `held` alone; gives `held` up; returns `stage`'s turn and
    /// what `hand_over` returned.
    pub fn pass<'a, T>(
        &'a self,
        stage: usize,
        held: MutexGuard<'a, ()>,
        hand_over: impl FnOnce() -> T,
    ) -> (MutexGuard<'a, ()>, T) {
        let next = self.take_for_hand_over(stage);
        let out = hand_over();
        drop(held);
        (next.unwrap_or_else(|| self.take(stage)), out)
    }
}

impl PipelineLm {
    /// One step through every stage on the calling thread, taking each stage's turn (see the
    /// [module docs](self)): the result equals the stages run in order, as
    /// [`LanguageModel::forward`]'s default runs them.
    pub(super) fn forward_in_turns(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        let last = self.stages().len() - 1;
        let mut turn = self.turns().take(0);
        let mut hidden = self.embed(step);
        for s in 0..last {
            hidden = self.run_stage_layers(s, hidden, cache)?;
            // The hand-over sends the stage's work: the next caller may then issue its own.
            (turn, hidden) = self.turns().pass(s + 1, turn, || self.hand_over(hidden, self.stages()[s + 1].device()));
        }
        let out = self.finish(self.run_stage_layers(last, hidden, cache)?);
        // The last stage's work goes out before the next caller's: a lazy device (fusion over a
        // worker) would otherwise hold it until this caller reads the logits.
        let device = self.stages()[last].device();
        let flushed = device.flush();
        drop(turn);
        flushed.map_err(|e| ModelError::Device(format!("stage {last} on {device:?}: {e:?}")))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::StageTurns;

    fn keys(names: &[&str]) -> Vec<Option<String>> {
        names.iter().map(|n| Some(format!("turns-test-{n}"))).collect()
    }

    #[test]
    fn a_hand_over_waits_under_both_turns_only_towards_a_later_made_turn() {
        let forward = StageTurns::of_keys(&keys(&["rank-a", "rank-b"]));
        let backward = StageTurns::of_keys(&keys(&["rank-b", "rank-a"]));
        assert!(forward.hand_over_under_both(1));
        assert!(!backward.hand_over_under_both(1));
        assert!(!forward.hand_over_under_both(0));
        // A host stage's own turn is made after the shared one before it.
        let host_after = StageTurns::of_keys(&[keys(&["rank-a"]).remove(0), None]);
        assert!(host_after.hand_over_under_both(1));
    }

    #[test]
    fn pipelines_over_the_same_devices_in_opposite_orders_do_not_deadlock() {
        let forward = StageTurns::of_keys(&keys(&["cycle-a", "cycle-b", "cycle-c"]));
        let backward = StageTurns::of_keys(&keys(&["cycle-c", "cycle-b", "cycle-a"]));
        let (done, finished) = channel();
        for turns in [forward, backward] {
            let turns = std::sync::Arc::new(turns);
            for _ in 0..2 {
                let (turns, done) = (turns.clone(), done.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let mut turn = turns.take(0);
                        for stage in 1..3 {
                            (turn, _) = turns.pass(stage, turn, std::thread::yield_now);
                        }
                        drop(turn);
                    }
                    let _ = done.send(());
                });
            }
        }
        for _ in 0..4 {
            assert!(finished.recv_timeout(Duration::from_secs(60)).is_ok(), "callers deadlocked on their turns");
        }
    }
}
