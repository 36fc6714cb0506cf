//! What a request is, what comes out of it, and the per-request state that decides when it stops.
//! Shared by every engine so that stopping and streaming behave the same everywhere.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::constraint::ConstraintState;
use super::penalties::TokenCounts;
use super::sampling::{PromptLogprobs, Sampled, SamplingParams, TokenLogprob};
use crate::chat::ChatMessage;
use crate::error::{ModelError, Result};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

/// A prompt, as text or as token ids (vLLM's `prompt_token_ids`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prompt {
    /// Text, tokenized with the model's tokenizer (special tokens added as HF does).
    Text(String),
    /// Token ids, used as given.
    Ids(Vec<u32>),
    /// A conversation, rendered with the model's chat template and the assistant's turn opened.
    Chat(Vec<ChatMessage>),
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt::Text(text.to_string())
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Prompt::Text(text)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Self {
        Prompt::Ids(ids)
    }
}

/// Why a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// It reached `max_new_tokens` or the model's context length.
    Length,
    /// It produced EOS, a stop token id or a stop string.
    Stop,
    /// It was aborted by the caller, or by a serving engine that could never fit it in memory.
    Abort,
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestOutput {
    /// The prompt text, when given as text.
    pub prompt: Option<String>,
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// Generated ids, the stopping token included.
    pub generated_ids: Vec<u32>,
    /// Generated text (special tokens skipped, a stop string cut off).
    pub text: String,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// With `SamplingParams::logprobs = Some(k)`, for each generated token: its log-probability
    /// first, then the top `k` (raw model distribution, see [`super::sampling`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Vec<TokenLogprob>>>,
    /// With `SamplingParams::prompt_logprobs = Some(k)`: per prompt token, its log-probability
    /// given the tokens before it and the top `k` (`None` for the first token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// Wall-clock time of a generation call, measured the same way by every engine
/// ([`GenerationClock`](super::GenerationClock)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// From the call's start until the first token is sampled (time to first token: prompt
    /// preparation, cache set-up and the first forward included).
    pub prefill_s: f64,
    /// The rest of the call.
    pub decode_s: f64,
    /// Prompt tokens processed.
    pub prompt_tokens: usize,
    /// Tokens generated over all requests.
    pub generated_tokens: usize,
    /// Steps run after the one that sampled the first token (each generates at most one token
    /// per active sequence).
    pub decode_steps: usize,
}

impl Timing {
    /// Generated tokens per second of generation (prefill + decode).
    pub fn tokens_per_s(&self) -> f64 {
        let total = self.prefill_s + self.decode_s;
        if total > 0.0 { self.generated_tokens as f64 / total } else { 0.0 }
    }
}

/// Outputs of a batch of requests, in prompt order, and how long it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationOutput {
    /// One output per prompt.
    pub requests: Vec<RequestOutput>,
    /// Timing of the call.
    pub timing: Timing,
}

/// Tokenizes (if needed) and checks one prompt against the model.
pub fn prepare_prompt(
    index: usize,
    prompt: &Prompt,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
    max_positions: usize,
) -> Result<(Option<String>, Vec<u32>)> {
    let (text, ids) = match prompt {
        Prompt::Text(text) => {
            let tokenizer = tokenizer.ok_or_else(|| {
                ModelError::Tokenizer("a text prompt needs a tokenizer; give token ids instead".into())
            })?;
            (Some(text.clone()), tokenizer.encode(text)?)
        }
        Prompt::Ids(ids) => (None, ids.clone()),
        Prompt::Chat(messages) => {
            let tokenizer = tokenizer.ok_or_else(|| {
                ModelError::Tokenizer("a chat prompt needs a tokenizer; give token ids instead".into())
            })?;
            let text = tokenizer.render_chat(messages)?;
            let ids = tokenizer.encode_verbatim(&text)?;
            (Some(text), ids)
        }
    };
    if ids.is_empty() {
        return Err(ModelError::EmptyPrompt { index });
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(ModelError::TokenOutOfVocab { index, id, vocab_size });
    }
    if ids.len() > max_positions {
        return Err(ModelError::PromptTooLong { index, len: ids.len(), max: max_positions });
    }
    Ok((text, ids))
}

/// A request in flight: its tokens so far, its text, and whether (and why) it has finished.
///
/// The prompt is shared, not copied, between clones (an engine's parallel samples and beams).
#[derive(Debug, Clone)]
pub struct RequestState {
    prompt: Option<Arc<str>>,
    prompt_ids: Arc<[u32]>,
    generated: Vec<u32>,
    logprobs: Option<Vec<Vec<TokenLogprob>>>,
    /// Token history for the penalties, kept only when one is on.
    counts: Option<TokenCounts>,
    text: String,
    /// Bytes of `text` already handed to the stream.
    streamed: usize,
    decoder: IncrementalDecoder,
    /// Tokens this request may generate (`max_new_tokens` capped by the context length).
    budget: usize,
    finish: Option<FinishReason>,
    /// Where the output stands in its structured-output constraint, when it has one.
    constraint: Option<ConstraintState>,
}

impl RequestState {
    /// Starts a request; `max_positions` caps its length at the model's context.
    pub fn new(prompt: Option<String>, prompt_ids: Vec<u32>, params: &SamplingParams, max_positions: usize) -> Self {
        let room = (max_positions + 1).saturating_sub(prompt_ids.len());
        Self {
            prompt: prompt.map(Arc::from),
            decoder: IncrementalDecoder::new(&prompt_ids),
            generated: Vec::new(),
            logprobs: params.logprobs.map(|_| Vec::new()),
            counts: params.has_penalties().then(|| TokenCounts::new(&prompt_ids)),
            text: String::new(),
            streamed: 0,
            budget: params.max_new_tokens.min(room).max(1),
            finish: None,
            constraint: None,
            prompt_ids: Arc::from(prompt_ids),
        }
    }

    /// Starts a request as [`RequestState::new`] does, compiling `params.constraint` (when it has
    /// one) with the tokenizer's compiler for `vocab_size` logits ending at `eos_token_ids`. A
    /// constraint without a tokenizer, or one that does not compile, is an error.
    pub fn constrained(
        prompt: Option<String>,
        prompt_ids: Vec<u32>,
        params: &SamplingParams,
        max_positions: usize,
        tokenizer: Option<&Tokenizer>,
        (vocab_size, eos_token_ids): (usize, &[u32]),
    ) -> Result<Self> {
        let mut state = Self::new(prompt, prompt_ids, params, max_positions);
        if let Some(constraint) = &params.constraint {
            let tokenizer = tokenizer.ok_or_else(|| {
                ModelError::Tokenizer("structured outputs need the model's tokenizer, and this model has none".into())
            })?;
            state.constraint = Some(tokenizer.constraint_compiler(vocab_size, eos_token_ids)?.compile(constraint)?);
        }
        Ok(state)
    }

    /// The tokens its constraint allows next (`None` when it has no constraint).
    pub fn allowed_tokens(&mut self) -> Result<Option<llguidance::toktrie::SimpleVob>> {
        self.constraint.as_mut().map(ConstraintState::allowed).transpose()
    }

    /// The prompt's text, when it was given as text.
    pub fn prompt(&self) -> Option<&str> {
        self.prompt.as_deref()
    }

    /// The prompt's ids.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    /// Ids generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Its token history for the penalties (`None` when every penalty is off).
    pub fn token_counts(&self) -> Option<&TokenCounts> {
        self.counts.as_ref()
    }

    /// Tokens this request may still generate in total.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Whether it has finished.
    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Records a sampled token, applies every stop rule, and returns the text that may now be shown
    /// (text that could still turn out to be the start of a stop string is held back).
    pub fn push(
        &mut self,
        id: u32,
        logprobs: Option<Vec<TokenLogprob>>,
        params: &SamplingParams,
        eos_ids: &[u32],
        tokenizer: Option<&Tokenizer>,
    ) -> Result<String> {
        debug_assert!(self.finish.is_none(), "push on a finished request");
        self.generated.push(id);
        if let Some(counts) = self.counts.as_mut() {
            counts.push(id);
        }
        let mut completes_constraint = false;
        if let Some(constraint) = self.constraint.as_mut() {
            let was_complete = constraint.is_complete();
            constraint.commit(id)?;
            completes_constraint = !was_complete && constraint.is_complete() && !eos_ids.contains(&id);
        }
        if let (Some(all), Some(step)) = (self.logprobs.as_mut(), logprobs) {
            all.push(step);
        }
        // A complete structured output ends the request (its end token, if sampled, ends it too).
        let stops_by_id = (!params.ignore_eos && eos_ids.contains(&id))
            || params.stop_token_ids.contains(&id)
            || completes_constraint
            || self.constraint.as_ref().is_some_and(|c| c.is_complete() && eos_ids.contains(&id));
        let at_budget = self.generated.len() >= self.budget;
        if let Some(tokenizer) = tokenizer {
            let mut delta = self.decoder.push(tokenizer, id)?;
            if stops_by_id || at_budget {
                delta.push_str(&self.decoder.flush(tokenizer)?);
            }
            let search_from = floor_char_boundary(&self.text, self.text.len().saturating_sub(max_len(&params.stop)));
            self.text.push_str(&delta);
            if let Some(cut) = params
                .stop
                .iter()
                .filter_map(|s| self.text[search_from..].find(s.as_str()).map(|at| search_from + at))
                .min()
            {
                self.text.truncate(cut);
                self.finish = Some(FinishReason::Stop);
            }
        }
        if self.finish.is_none() {
            if stops_by_id {
                self.finish = Some(FinishReason::Stop);
            } else if at_budget {
                self.finish = Some(FinishReason::Length);
            }
        }
        let visible = if self.finish.is_some() {
            self.text.len()
        } else {
            let hold = max_len(&params.stop).saturating_sub(1);
            floor_char_boundary(&self.text, self.text.len().saturating_sub(hold))
        };
        let start = self.streamed.min(visible);
        let out = self.text[start..visible].to_string();
        self.streamed = visible.max(self.streamed);
        Ok(out)
    }

    /// Stops the request now (an abort), flushing any held-back text; returns that text.
    pub fn abort(&mut self, tokenizer: Option<&Tokenizer>) -> Result<String> {
        if self.finish.is_none() {
            self.finish = Some(FinishReason::Abort);
            if let Some(tokenizer) = tokenizer {
                self.text.push_str(&self.decoder.flush(tokenizer)?);
            }
        }
        let out = self.text[self.streamed.min(self.text.len())..].to_string();
        self.streamed = self.text.len();
        Ok(out)
    }

    /// Why it finished, if it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The final output.
    pub fn into_output(self) -> RequestOutput {
        RequestOutput {
            prompt: self.prompt.as_deref().map(String::from),
            prompt_ids: self.prompt_ids.to_vec(),
            generated_ids: self.generated,
            text: self.text,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            logprobs: self.logprobs,
            prompt_logprobs: None,
        }
    }
}

/// The penalties' token histories of a batch of requests, one per request (empty when every
/// penalty is off): what [`sample`](super::sampling::sample) takes.
pub fn histories(requests: &[RequestState]) -> Vec<&TokenCounts> {
    requests.iter().filter_map(RequestState::token_counts).collect()
}

/// Records one step's sampled tokens for a batch: every unfinished request takes its token (stop
/// rules applied) and `next[i]` becomes what it feeds the model next step (nothing once
/// finished); `on_token(i, id, visible text, finished)` sees each token. Returns the number of
/// tokens generated.
#[allow(clippy::too_many_arguments)]
pub fn record_sampled(
    requests: &mut [RequestState],
    next: &mut [Vec<u32>],
    sampled: Sampled,
    params: &SamplingParams,
    eos_ids: &[u32],
    tokenizer: Option<&Tokenizer>,
    mut on_token: impl FnMut(usize, u32, &str, bool),
) -> Result<usize> {
    let mut logprobs = sampled.logprobs.map(|l| l.into_iter());
    let mut generated = 0;
    for (i, request) in requests.iter_mut().enumerate() {
        let step_logprobs = logprobs.as_mut().and_then(Iterator::next);
        if request.is_finished() {
            next[i].clear();
            continue;
        }
        let id = sampled.ids[i];
        let text = request.push(id, step_logprobs, params, eos_ids, tokenizer)?;
        generated += 1;
        on_token(i, id, &text, request.is_finished());
        next[i] = if request.is_finished() { Vec::new() } else { vec![id] };
    }
    Ok(generated)
}

fn max_len(stops: &[String]) -> usize {
    stops.iter().map(String::len).max().unwrap_or(0)
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_respects_context() {
        let params = SamplingParams::greedy(100);
        let state = RequestState::new(None, vec![1; 10], &params, 16);
        assert_eq!(state.budget(), 7);
        let state = RequestState::new(None, vec![1; 16], &params, 16);
        assert_eq!(state.budget(), 1);
    }

    #[test]
    fn stops_on_eos_and_stop_ids_and_length() {
        let mut params = SamplingParams::greedy(3);
        params.stop_token_ids = vec![7];
        let mut eos = RequestState::new(None, vec![1], &params, 64);
        eos.push(5, None, &params, &[2], None).unwrap();
        eos.push(2, None, &params, &[2], None).unwrap();
        assert_eq!(eos.clone().into_output().finish_reason, FinishReason::Stop);
        assert_eq!(eos.generated(), &[5, 2]);

        let mut stop_id = RequestState::new(None, vec![1], &params, 64);
        stop_id.push(7, None, &params, &[2], None).unwrap();
        assert!(stop_id.is_finished());

        params.ignore_eos = true;
        let mut length = RequestState::new(None, vec![1], &params, 64);
        for _ in 0..3 {
            assert!(!length.is_finished());
            length.push(2, None, &params, &[2], None).unwrap();
        }
        assert_eq!(length.into_output().finish_reason, FinishReason::Length);
    }
}
