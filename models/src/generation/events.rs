//! What engines report while they run: per-token [`StreamEvent`]s for callbacks, and per-step
//! [`StepOutput`]s for step-level engines (add a request, step, abort), shared so that the CLI,
//! the benchmarks and the server read every engine the same way.

use super::request::{FinishReason, RequestOutput};
use super::sampling::{PromptLogprobs, TokenLogprob};

/// One generated token, as streamed to a callback.
#[derive(Debug, Clone, Copy)]
pub struct StreamEvent<'a> {
    /// Index of the request in the prompt list.
    pub request: usize,
    /// Index of the sequence within its request (sample number; 0 when there is one).
    pub sequence: usize,
    /// The token id.
    pub token: u32,
    /// Text that became visible with this token (may be empty).
    pub text: &'a str,
    /// Whether the sequence finished with this token.
    pub finished: bool,
}

/// New tokens of one sequence in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceDelta {
    /// Index of the sequence within its request (sample number).
    pub index: usize,
    /// Tokens generated this step.
    pub token_ids: Vec<u32>,
    /// Text that became visible this step.
    pub text: String,
    /// With `SamplingParams::logprobs`: for each token of `token_ids`, the sampled token's
    /// log-probability first, then the top-K alternatives (as in `RequestOutput::logprobs`).
    pub logprobs: Option<Vec<Vec<TokenLogprob>>>,
    /// Set when this sequence finished.
    pub finish_reason: Option<FinishReason>,
}

impl SequenceDelta {
    /// The delta as per-token events of request `request`: the text rides on the last token, and
    /// so does `finished`.
    pub fn events(&self, request: usize) -> impl Iterator<Item = StreamEvent<'_>> {
        let last = self.token_ids.len().saturating_sub(1);
        self.token_ids.iter().enumerate().map(move |(i, &token)| StreamEvent {
            request,
            sequence: self.index,
            token,
            text: if i == last { self.text.as_str() } else { "" },
            finished: i == last && self.finish_reason.is_some(),
        })
    }
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
    /// With `SamplingParams::prompt_logprobs`: the prompt's log-probabilities, in the step that
    /// computed the prompt (see [`RequestOutput::prompt_logprobs`]).
    pub prompt_logprobs: Option<PromptLogprobs>,
    /// When the engine step that produced this output started (`None` outside a step). A
    /// request's first output carries the start of its prefill step, the moment ExeGPT's latency
    /// is counted from; engines that step on threads of their own (virtual engines) report it
    /// where the caller's clock cannot.
    pub step_started: Option<std::time::Instant>,
}
