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
//! - A worker runs each client thread's operations on a thread of its own, so turns order what
//!   reaches it, not what it runs: two callers' stages on one worker can still share its cores.
//! - A caller never holds two turns: it gives up stage `s`'s before it waits for `s + 1`'s, so
//!   pipelines that visit the same devices in different orders cannot deadlock.
//! - One caller alone always finds its turns free; its results never depend on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use burn::tensor::{Device, Tensor};
use burn_llm_models::device::is_host_device;
use burn_llm_models::{KvCache, LanguageModel, ModelError, Result, StepInput};

use super::model::PipelineLm;

/// One turn per stage.
#[derive(Debug)]
pub(super) struct StageTurns {
    turns: Vec<Arc<Mutex<()>>>,
}

/// The turns of the queue-running devices in use, by device.
fn device_turns() -> &'static Mutex<HashMap<String, Weak<Mutex<()>>>> {
    static TURNS: OnceLock<Mutex<HashMap<String, Weak<Mutex<()>>>>> = OnceLock::new();
    TURNS.get_or_init(Default::default)
}

impl StageTurns {
    /// Turns for stages on `devices` (see the [module docs](self)).
    pub fn new(devices: &[Device]) -> Self {
        let mut shared = device_turns().lock().unwrap_or_else(PoisonError::into_inner);
        shared.retain(|_, turn| turn.strong_count() > 0);
        let turns = devices
            .iter()
            .map(|device| {
                if is_host_device(device) {
                    return Arc::new(Mutex::new(()));
                }
                let key = format!("{device:?}");
                if let Some(turn) = shared.get(&key).and_then(Weak::upgrade) {
                    return turn;
                }
                let turn = Arc::new(Mutex::new(()));
                shared.insert(key, Arc::downgrade(&turn));
                turn
            })
            .collect();
        Self { turns }
    }

    /// Waits for stage `stage`'s turn. A caller that panicked holding it leaves nothing half-done
    /// that the next needs (the lock guards no data), so a poisoned turn is taken as is.
    pub fn take(&self, stage: usize) -> MutexGuard<'_, ()> {
        self.turns[stage].lock().unwrap_or_else(PoisonError::into_inner)
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
            hidden = self.hand_over(hidden, self.stages()[s + 1].device());
            // The hand-over has sent the stage's work: the next caller may issue its own. Given
            // up before waiting for the next stage's turn, so that no caller holds two.
            drop(turn);
            turn = self.turns().take(s + 1);
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
