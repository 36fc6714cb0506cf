//! What [`LlmEngine::step`](crate::LlmEngine::step) reports.

use burn_llm_models::{FinishReason, RequestOutput};

/// New tokens of one sequence in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceDelta {
    /// Index of the sequence within its request (sample number).
    pub index: usize,
    /// Tokens generated this step.
    pub token_ids: Vec<u32>,
    /// Text that became visible this step.
    pub text: String,
    /// Set when this sequence finished.
    pub finish_reason: Option<FinishReason>,
}

/// Progress of one request in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The caller's request id.
    pub request_id: String,
    /// Incremental output of its sequences (empty for beam search, whose candidates change until
    /// the end).
    pub sequences: Vec<SequenceDelta>,
    /// The final outputs, best first, once the request has finished.
    pub finished: Option<Vec<RequestOutput>>,
}
