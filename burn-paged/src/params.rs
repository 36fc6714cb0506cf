//! Per-request parameters of the paged engine: the foundation's [`SamplingParams`] plus vLLM's
//! parallel sampling (`n`, `best_of`) and beam search.

use burn_llm_models::{BeamSearchParams, SamplingParams};
use serde::{Deserialize, Serialize};

use crate::error::{PagedError, Result};

/// Everything a request asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestParams {
    /// Sampling, stopping and output options, as for plain generation.
    pub sampling: SamplingParams,
    /// Sequences returned.
    pub n: usize,
    /// Sequences generated (≥ `n`); the `n` with the highest cumulative log-probability are
    /// returned. `None` means `n`.
    pub best_of: Option<usize>,
    /// Beam search instead of sampling; returns the `n` best beams.
    pub beam: Option<BeamSearchParams>,
}

impl From<SamplingParams> for RequestParams {
    fn from(sampling: SamplingParams) -> Self {
        Self { sampling, n: 1, best_of: None, beam: None }
    }
}

impl RequestParams {
    /// Sequences the request runs at once (its seats in the batch).
    pub fn width(&self) -> usize {
        match &self.beam {
            Some(b) => b.width,
            None => self.best_of.unwrap_or(self.n),
        }
    }

    /// Checks the settings against each other and the vocabulary.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        self.sampling.validate(vocab_size)?;
        let fail = |m: String| Err(PagedError::InvalidParams(m));
        if self.n == 0 {
            return fail("n must be at least 1".into());
        }
        if let Some(best_of) = self.best_of.filter(|&b| b < self.n) {
            return fail(format!("best_of ({best_of}) must be at least n ({})", self.n));
        }
        if let Some(beam) = &self.beam {
            beam.validate()?;
            if self.n > beam.width {
                return fail(format!("n ({}) cannot exceed the beam width ({})", self.n, beam.width));
            }
            if !self.sampling.is_greedy() {
                return fail("beam search is deterministic: use temperature 0".into());
            }
            if self.best_of.is_some() {
                return fail("best_of does not apply to beam search (the beam width does)".into());
            }
        }
        Ok(())
    }
}
