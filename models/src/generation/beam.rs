//! Beam search parameters as the user gives them (vLLM's `use_beam_search`, Hugging Face's
//! `num_beams` / `length_penalty` / `early_stopping`). The engines that run beam search add what
//! a run derives from the rest of the request (how many sequences to return, the token budget,
//! the EOS ids).

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// How a beam search ranks and stops (HF's `num_beams`, `length_penalty`, `early_stopping`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BeamSearchParams {
    /// Number of beams (HF `num_beams`): live candidates kept per step. `1` means greedy search,
    /// as in HF.
    pub width: usize,
    /// Exponent of the length normalisation (HF `length_penalty`, default 1.0): a finished
    /// sequence scores `sum_logprobs / generated_len^length_penalty`. Positive values favour
    /// longer sequences, negative values shorter ones, 0 disables normalisation.
    pub length_penalty: f32,
    /// When the search may stop before `max_new_tokens` (HF `early_stopping`).
    pub early_stopping: EarlyStopping,
}

impl BeamSearchParams {
    /// `width` beams with HF's defaults otherwise: length penalty 1.0,
    /// [`EarlyStopping::Heuristic`].
    pub fn new(width: usize) -> Self {
        Self { width, length_penalty: 1.0, early_stopping: EarlyStopping::Heuristic }
    }

    /// The same parameters with another length penalty.
    pub fn with_length_penalty(mut self, length_penalty: f32) -> Self {
        self.length_penalty = length_penalty;
        self
    }

    /// The same parameters with another stopping rule.
    pub fn with_early_stopping(mut self, early_stopping: EarlyStopping) -> Self {
        self.early_stopping = early_stopping;
        self
    }

    /// Rejects a width of 0 and a length penalty that is NaN or infinite.
    pub fn validate(&self) -> Result<()> {
        let fail = |m: String| Err(ModelError::InvalidSampling(m));
        if self.width == 0 {
            return fail("the beam width must be at least 1".into());
        }
        if !self.length_penalty.is_finite() {
            return fail(format!("the length penalty must be finite, got {}", self.length_penalty));
        }
        Ok(())
    }
}

/// When the search may stop before `max_new_tokens` (HF's `early_stopping`). Serialised in
/// lowercase (`"heuristic"`, `"eager"`, `"never"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EarlyStopping {
    /// HF's default, `early_stopping=False`: stop once all `width` finished-sequence slots are
    /// filled and the best live beam, scored with the *current* generated length, is no better
    /// than the worst of them.
    #[default]
    Heuristic,
    /// `early_stopping=True`: stop as soon as all `width` finished-sequence slots are filled.
    Eager,
    /// `early_stopping="never"`: like [`Heuristic`](Self::Heuristic), but with a positive length
    /// penalty the best live beam is scored with the longest possible length (`max_new_tokens`),
    /// so the search only stops when no live beam can still win (canonical beam search).
    Never,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_has_hf_defaults() {
        let p = BeamSearchParams::new(4);
        assert_eq!((p.width, p.length_penalty, p.early_stopping), (4, 1.0, EarlyStopping::Heuristic));
        assert!(p.validate().is_ok());
    }

    #[test]
    fn invalid_beam_params_are_errors() {
        for bad in [
            BeamSearchParams::new(0),
            BeamSearchParams::new(2).with_length_penalty(f32::NAN),
            BeamSearchParams::new(2).with_length_penalty(f32::NEG_INFINITY),
        ] {
            assert!(matches!(bad.validate(), Err(ModelError::InvalidSampling(_))), "{bad:?}");
        }
        assert!(BeamSearchParams::new(1).with_length_penalty(-2.0).validate().is_ok());
    }

    #[test]
    fn early_stopping_serde_names() {
        for (v, name) in [
            (EarlyStopping::Heuristic, "\"heuristic\""),
            (EarlyStopping::Eager, "\"eager\""),
            (EarlyStopping::Never, "\"never\""),
        ] {
            assert_eq!(serde_json::to_string(&v).unwrap(), name);
            assert_eq!(serde_json::from_str::<EarlyStopping>(name).unwrap(), v);
        }
        assert_eq!(EarlyStopping::default(), EarlyStopping::Heuristic);
    }
}
