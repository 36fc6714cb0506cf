//! Stage turns: when several callers run one [`PipelineLm`] at once (the paged engine's virtual
//! engines, each stepping on its own thread), each stage takes their work one caller at a time,
//! in the order they reach it, and a caller keeps its turn on stage `s` until it has handed its
//! output over to stage `s + 1`.
//!
//! A device runs the work it is sent in the order it arrives. Without turns, two callers issuing
//! to the same stage at once interleave their operations, the stage shares itself between them
//! and both reach the next stage together, so the stages take turns instead of overlapping. A
//! caller's turn also covers the hand-over (the worker's expose of its output): otherwise the
//! other caller's work for the same stage, issued in between, would queue before it, and the
//! next stage would wait for both. Holding the turn of stage `s` while waiting for that of
//! `s + 1` cannot deadlock: turns are only ever taken in stage order.
//!
//! One caller alone always finds the turns free; its results do not depend on them.

use std::sync::{Mutex, MutexGuard, PoisonError};

use burn::tensor::Tensor;
use burn_llm_models::{KvCache, ModelError, Result, StepInput};

use super::model::PipelineLm;

/// One turn per stage.
#[derive(Debug, Default)]
pub(super) struct StageTurns {
    turns: Vec<Mutex<()>>,
}

impl StageTurns {
    /// Turns for `stages` stages.
    pub fn new(stages: usize) -> Self {
        Self { turns: (0..stages).map(|_| Mutex::new(())).collect() }
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
    /// [`LanguageModel::forward`](burn_llm_models::LanguageModel::forward)'s default runs them.
    pub(super) fn forward_in_turns(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        let mut held = self.turns().take(0);
        let mut hidden = burn_llm_models::LanguageModel::embed(self, step);
        for s in 0..self.stages().len() {
            if s > 0 {
                let next = self.turns().take(s);
                hidden = self.hand_over(hidden, self.stages()[s].device());
                // The stage before is free once its output's hand-over has been issued.
                held = next;
            }
            hidden = self.run_stage_layers(s, hidden, cache)?;
        }
        let out = burn_llm_models::LanguageModel::finish(self, hidden);
        // Send the last stage's work before the next caller's: a lazy device (fusion over a
        // worker) would otherwise hold it until this caller reads the logits.
        let last = self.stages().len() - 1;
        let device = self.stages()[last].device();
        device.flush().map_err(|e| ModelError::Device(format!("stage {last} on {device:?}: {e:?}")))?;
        drop(held);
        Ok(out)
    }
}
