//! What can go wrong in a beam search: parameters that make no sense, or a malformed step input.

use thiserror::Error;

/// Errors of [`BeamSearch`](super::BeamSearch): invalid parameters or a malformed step input.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BeamError {
    /// The user's [`BeamSearchParams`](burn_llm_models::BeamSearchParams) are invalid (width 0, a
    /// length penalty that is not finite); the message says which.
    #[error("{0}")]
    Params(String),
    /// `num_return` is 0.
    #[error("num_return must be at least 1")]
    ZeroNumReturn,
    /// More hypotheses requested than there are beams (HF raises the same error).
    #[error("num_return ({num_return}) must not exceed beam_width ({beam_width})")]
    NumReturnExceedsBeamWidth {
        /// Requested hypotheses.
        num_return: usize,
        /// Beam width.
        beam_width: usize,
    },
    /// `max_new_tokens` is 0 (HF raises the same error).
    #[error("max_new_tokens must be at least 1")]
    ZeroMaxNewTokens,
    /// `max(2, 1 + n_eos) * beam_width` overflows `usize`.
    #[error("max(2, 1 + number of EOS ids) * beam_width overflows")]
    TooManyCandidates,
    /// The vocabulary size is 0 or token ids would not fit in `u32`.
    #[error("invalid vocabulary size {0}")]
    InvalidVocab(usize),
    /// `beam_width * vocab` is smaller than the number of candidates HF keeps per step
    /// (`torch.topk` would fail).
    #[error("vocabulary of {vocab} tokens too small: beam search keeps {candidates} candidates per step")]
    VocabTooSmall {
        /// Vocabulary size.
        vocab: usize,
        /// Candidates per step.
        candidates: usize,
    },
    /// `logprobs.len()` is not `live_beams * vocab`.
    #[error("expected {live_beams} live beams x {vocab} log-probabilities, got {got} values")]
    LogprobsShape {
        /// Live beams expected ([`BeamSearch::num_live_beams`](super::BeamSearch::num_live_beams)).
        live_beams: usize,
        /// Vocabulary size passed.
        vocab: usize,
        /// Length of the slice passed.
        got: usize,
    },
    /// [`BeamSearch::step`](super::BeamSearch::step) was called after it reported `done`.
    #[error("the beam search is already done")]
    AlreadyDone,
}
