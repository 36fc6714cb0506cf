//! `POST /v1/chat/completions`: the conversation is rendered with the chat template (the
//! model's, or `--chat-template`), the assistant's turn opened, and completed.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use burn_llm_models::{FinishReason, Prompt, SequenceDelta};
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::protocol::ChatRequest;
use super::streaming::{self, ChunkFormat, finish_reason, usage};
use super::{AppState, ServedModel, logprobs, parse_body, unix_now};

/// The route.
pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: ChatRequest = parse_body(body, state.config.max_body_bytes)?;
    let served = state.model(request.model.as_deref())?;
    let messages = request.messages()?;
    let template = served.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: start the server with --chat-template FILE, or use /v1/completions",
            Some("messages"),
        )
    })?;
    let text = template.render(&messages, true).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    let tokenizer = served.engine.info.tokenizer.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no tokenizer: use /v1/completions with token ids", None)
    })?;
    let ids = tokenizer.encode_verbatim(&text).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    let (_, ids) = served.prepare(0, &Prompt::Ids(ids)).map_err(|mut e| {
        e.param = Some("messages".into());
        e
    })?;
    let top = request.logprobs()?;
    let room = served.engine.info.spec.max_positions.saturating_sub(ids.len()) as u64;
    let max_tokens = request.max_completion_tokens.or(request.sampling.max_tokens).unwrap_or(room);
    served.check_context(ids.len(), max_tokens.max(1))?;
    let vocab = served.engine.info.spec.vocab_size;
    let params = request.sampling.params(max_tokens, top, vocab)?;
    let include_usage = request.sampling.include_usage()?;
    let prompt_tokens = ids.len();
    let mut run = served.pick().submit(vec![ids], &params, served.max_waiting.unwrap_or(state.config.max_waiting))?;
    run.accepted().await?;
    let model = served.name.clone();
    let (id, created) = (state.new_id("chatcmpl"), unix_now());
    // The engine reports at least one alternative; `top_logprobs` says how many to show.
    let top = top.map(|_| request.top_logprobs.unwrap_or(0) as usize);
    if request.sampling.streams() {
        let format = ChatChunks { served, id, created, model, n: params.n, top };
        return Ok(streaming::sse(run, params.n, prompt_tokens, include_usage, format).into_response());
    }
    let outputs = streaming::collect(&mut run).await?;
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for out in outputs.iter().flatten() {
        completion_tokens += out.generated_ids.len();
        let logprobs = match (top, &out.logprobs) {
            (Some(k), Some(steps)) => logprobs::chat(&served, &out.generated_ids, steps, k),
            _ => Value::Null,
        };
        choices.push(json!({
            "index": choices.len(),
            "message": {"role": "assistant", "content": out.text},
            "logprobs": logprobs,
            "finish_reason": finish_reason(out.finish_reason),
        }));
    }
    Ok(axum::Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// Stream chunks of a chat completion (`object: chat.completion.chunk`).
struct ChatChunks {
    served: Arc<ServedModel>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    top: Option<usize>,
}

impl ChatChunks {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, reason: Option<FinishReason>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason.map(finish_reason)}],
        })
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&mut self) -> Vec<Value> {
        (0..self.n).map(|i| self.chunk(i, json!({"role": "assistant", "content": ""}), Value::Null, None)).collect()
    }

    fn delta(&mut self, choice: usize, delta: &SequenceDelta) -> Option<Value> {
        let logprobs = match (self.top, &delta.logprobs) {
            (Some(k), Some(steps)) => logprobs::chat(&self.served, &delta.token_ids, steps, k),
            _ => Value::Null,
        };
        if delta.text.is_empty() && logprobs.is_null() && delta.finish_reason.is_none() {
            return None;
        }
        let content = if delta.text.is_empty() { json!({}) } else { json!({"content": delta.text}) };
        Some(self.chunk(choice, content, logprobs, delta.finish_reason))
    }

    fn close(&mut self, choice: usize, reason: FinishReason) -> Value {
        self.chunk(choice, json!({}), Value::Null, Some(reason))
    }

    fn usage(&self, usage: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        })
    }
}
