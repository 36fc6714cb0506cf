//! `POST /v1/completions` (OpenAI's legacy completions, as vLLM serves them).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use burn_llm_models::{FinishReason, PromptLogprobs, SequenceDelta};

use super::errors::{ApiError, ApiResult};
use super::protocol::completions::{Completion, CompletionChoice, CompletionLogprobs};
use super::protocol::{CompletionRequest, FinishReasonOut, MAX_LOGPROBS, Usage};
use super::streaming::{self, ChunkFormat};
use super::{AppState, ServedModel, logprobs, parse_body, unix_now};

/// The route.
pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: CompletionRequest = parse_body(body, state.config.max_body_bytes)?;
    let sampling = request.sampling();
    let served = state.model(request.model.as_deref())?;
    let echo = request.echo.unwrap_or(false);
    let top = request.logprobs;
    if let Some(k) = top.filter(|&k| k > MAX_LOGPROBS) {
        return Err(ApiError::bad_request(
            format!("logprobs must be at most {MAX_LOGPROBS}, got {k}"),
            Some("logprobs"),
        ));
    }
    let prompts = request.prompt.clone().prompts()?;
    let prepared = prompts.iter().enumerate().map(|(i, p)| served.prepare(i, p)).collect::<ApiResult<Vec<_>>>()?;
    let max_tokens = sampling.max_tokens.unwrap_or(16);
    let vocab = served.engine.info.spec.vocab_size;
    let mut params = sampling.params(max_tokens, top.map(|k| k.max(1) as usize), vocab, &request.constraints())?;
    // `echo` with `logprobs` scores the prompt too (the engine computes every prompt position).
    params.prompt_logprobs = if echo { params.logprobs } else { None };
    for (_, ids) in &prepared {
        served.check_context(ids.len(), max_tokens)?;
    }
    let include_usage = sampling.include_usage()?;
    let prompt_tokens = prepared.iter().map(|(_, ids)| ids.len()).sum();
    let (texts, ids): (Vec<String>, Vec<Vec<u32>>) = prepared.into_iter().unzip();
    // A stream's echoed prompt is scored before any output carries its ids.
    let ids_for_echo = if echo && top.is_some() && sampling.streams() { ids.clone() } else { Vec::new() };
    let mut run = served.pick().submit(ids, &params, served.max_waiting.unwrap_or(state.config.max_waiting))?;
    run.accepted().await?;
    let model = served.name.clone();
    let (id, created) = (state.new_id("cmpl"), unix_now());
    let top = top.map(|k| k as usize);
    if sampling.streams() {
        let n = params.n;
        let format = CompletionChunks {
            offsets: vec![0; texts.len() * n],
            served,
            id,
            created,
            model,
            n,
            echo: echo.then_some(texts),
            prompt_ids: ids_for_echo,
            top,
        };
        return Ok(streaming::sse(run, (n, prompt_tokens, include_usage), state.config.request_timeout, format)
            .into_response());
    }
    let outputs = streaming::collect(&mut run, state.config.request_timeout).await?;
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (prompt, outs) in outputs.iter().enumerate() {
        for out in outs {
            completion_tokens += out.generated_ids.len();
            let prefix = if echo { texts[prompt].as_str() } else { "" };
            let logprobs = match (top, &out.logprobs) {
                (Some(k), Some(steps)) => Some(match out.prompt_logprobs.as_ref().filter(|_| echo) {
                    Some(scored) => logprobs::completion(
                        &served,
                        logprobs::prompt_entries(&out.prompt_ids, scored)
                            .chain(logprobs::entries(&out.generated_ids, steps)),
                        k,
                        &mut 0,
                    ),
                    None => logprobs::completion(
                        &served,
                        logprobs::entries(&out.generated_ids, steps),
                        k,
                        &mut prefix.chars().count(),
                    ),
                }),
                _ => None,
            };
            choices.push(CompletionChoice {
                index: choices.len(),
                text: format!("{prefix}{}", out.text),
                logprobs,
                finish_reason: Some(out.finish_reason.into()),
            });
        }
    }
    let usage = Some(Usage::new(prompt_tokens, completion_tokens));
    let object = "text_completion".into();
    Ok(axum::Json(Completion { id, object, created, model, choices, usage }).into_response())
}

/// Stream chunks of a completion (`object: text_completion`).
struct CompletionChunks {
    served: Arc<ServedModel>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    /// With `echo`: each prompt's text, sent first (with `logprobs`: once the prompt is scored,
    /// with its log-probabilities).
    echo: Option<Vec<String>>,
    /// With `echo` and `logprobs`: each prompt's token ids (empty otherwise).
    prompt_ids: Vec<Vec<u32>>,
    top: Option<usize>,
    /// Per choice: characters of text sent so far (`text_offset`).
    offsets: Vec<usize>,
}

impl CompletionChunks {
    fn chunk(&self, choices: Vec<CompletionChoice>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        }
    }

    fn choice(
        &self,
        index: usize,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        reason: Option<FinishReason>,
    ) -> Completion {
        let finish_reason = reason.map(FinishReasonOut::from);
        self.chunk(vec![CompletionChoice { index, text: text.to_string(), logprobs, finish_reason }])
    }
}

impl ChunkFormat for CompletionChunks {
    type Chunk = Completion;

    fn opening(&mut self) -> Vec<Completion> {
        if self.top.is_some() {
            // The echoed prompt goes out with its log-probabilities (`prompt_logprobs`).
            return Vec::new();
        }
        let Some(texts) = self.echo.take() else { return Vec::new() };
        let mut chunks = Vec::new();
        for (prompt, text) in texts.iter().enumerate() {
            for i in 0..self.n {
                let choice = prompt * self.n + i;
                self.offsets[choice] = text.chars().count();
                chunks.push(self.choice(choice, text, None, None));
            }
        }
        chunks
    }

    fn prompt_logprobs(&mut self, prompt: usize, scored: &PromptLogprobs) -> Vec<Completion> {
        let (Some(k), Some(texts), Some(ids)) = (self.top, &self.echo, self.prompt_ids.get(prompt)) else {
            return Vec::new();
        };
        let Some(text) = texts.get(prompt) else { return Vec::new() };
        // One scored prompt, sent to each of the prompt's `n` choices.
        let mut offset = 0;
        let logprobs = logprobs::completion(&self.served, logprobs::prompt_entries(ids, scored), k, &mut offset);
        let mut chunks = Vec::new();
        for choice in prompt * self.n..(prompt + 1) * self.n {
            if let Some(slot) = self.offsets.get_mut(choice) {
                *slot = offset;
            }
            chunks.push(self.choice(choice, text, Some(logprobs.clone()), None));
        }
        chunks
    }

    fn delta(&mut self, choice: usize, delta: &SequenceDelta) -> Vec<Completion> {
        let logprobs = match (self.top, &delta.logprobs, self.offsets.get_mut(choice)) {
            (Some(k), Some(steps), Some(offset)) => {
                Some(logprobs::completion(&self.served, logprobs::entries(&delta.token_ids, steps), k, offset))
            }
            _ => None,
        };
        if delta.text.is_empty() && logprobs.is_none() && delta.finish_reason.is_none() {
            return Vec::new();
        }
        vec![self.choice(choice, &delta.text, logprobs, delta.finish_reason)]
    }

    fn close(&mut self, choice: usize, reason: FinishReason) -> Completion {
        self.choice(choice, "", None, Some(reason))
    }

    fn usage(&self, usage: Usage) -> Completion {
        Completion { usage: Some(usage), ..self.chunk(Vec::new()) }
    }
}
