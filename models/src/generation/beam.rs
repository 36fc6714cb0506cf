//! The user's beam-search settings (vLLM's `use_beam_search`, HF's `num_beams`,
//! `length_penalty`, `early_stopping`), carried by [`SamplingParams`](super::SamplingParams).

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// When the search may stop before `max_new_tokens` (HF's `early_stopping`). Serialised in
/// lowercase (`"heuristic"`, `"eager"`, `"never"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EarlyStopping {
    /// HF's default, `early_stopping=False`: stop once all `width` hypothesis slots are finished
    /// and the best live beam, scored with the *current* generated length, is no better than the
    /// worst hypothesis.
    #[default]
    Heuristic,
    /// `early_stopping=True`: stop as soon as all `width` hypothesis slots are finished.
    Eager,
    /// `early_stopping="never"`: like [`Heuristic`](Self::Heuristic), but with a positive length
    /// penalty the best live beam is scored with the longest possible length (`max_new_tokens`),
    /// so the search only stops when no live beam can still win (canonical beam search).
    Never,
}

/// Beam search settings of a request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BeamSearchParams {
    /// Live candidates kept per step (HF `num_beams`).
    pub width: usize,
    /// Scores are divided by `generated_length ^ length_penalty` (HF's convention).
    pub length_penalty: f32,
    /// When the search may stop before `max_new_tokens` (HF's `early_stopping`).
    pub early_stopping: EarlyStopping,
}

impl BeamSearchParams {
    /// HF's defaults for `width` beams: length penalty 1, heuristic early stopping.
    pub fn new(width: usize) -> Self {
        Self { width, length_penalty: 1.0, early_stopping: EarlyStopping::Heuristic }
    }

    /// Rejects a zero width and a non-finite length penalty.
    pub fn validate(&self) -> Result<()> {
        if self.width == 0 {
            return Err(ModelError::InvalidSampling("the beam width must be at least 1".into()));
        }
        if !self.length_penalty.is_finite() {
            return Err(ModelError::InvalidSampling("the length penalty must be finite".into()));
        }
        Ok(())
    }
}
