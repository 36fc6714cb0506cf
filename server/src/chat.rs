//! `POST /v1/chat/completions`: the conversation is rendered with the chat template (the
//! model's, or `--chat-template`), the assistant's turn opened, and completed; with tools, the
//! reply may become `tool_calls` ([`super::tools`]).

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
use super::tools::{self, ToolPlan};
use super::{AppState, ServedModel, logprobs, parse_body, structured, unix_now};

/// The route.
pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: ChatRequest = parse_body(body, state.config.max_body_bytes)?;
    structured::refuse_unknown(&request.extra)?;
    let served = state.model(request.model.as_deref())?;
    let messages = request.messages()?;
    let plan = ToolPlan::new(request.tools.as_deref(), request.tool_choice.as_ref())?;
    let involves_tools = plan.is_some() || request.messages.iter().any(|m| m.tool_calls.is_some() || m.role == "tool");
    let template = served.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: start the server with --chat-template FILE, or use /v1/completions",
            Some("messages"),
        )
    })?;
    let text = if involves_tools {
        tools::render(template, &request.messages, &messages, plan.as_ref())?
    } else {
        template.render(&messages, true).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?
    };
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
    let mut params = request.sampling.params(max_tokens, top, vocab, &request.constraints)?;
    if let Some(constraint) = plan.as_ref().and_then(ToolPlan::constraint) {
        if params.constraint.is_some() {
            return Err(ApiError::bad_request(
                "tool_choice `required` or a named function constrains the reply itself: drop response_format / guided_*",
                Some("tool_choice"),
            ));
        }
        params.constraint = Some(constraint);
    }
    let plan = plan.filter(ToolPlan::calls_possible);
    let include_usage = request.sampling.include_usage()?;
    let prompt_tokens = ids.len();
    let mut run = served.pick().submit(vec![ids], &params, served.max_waiting.unwrap_or(state.config.max_waiting))?;
    run.accepted().await?;
    let model = served.name.clone();
    let (id, created) = (state.new_id("chatcmpl"), unix_now());
    // The engine reports at least one alternative; `top_logprobs` says how many to show.
    let top = top.map(|_| request.top_logprobs.unwrap_or(0) as usize);
    if request.sampling.streams() {
        let buffers = vec![String::new(); params.n];
        let format = ChatChunks { served, id, created, model, n: params.n, top, plan, buffers };
        return Ok(streaming::sse(run, (params.n, prompt_tokens, include_usage), state.config.request_timeout, format)
            .into_response());
    }
    let outputs = streaming::collect(&mut run, state.config.request_timeout).await?;
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for out in outputs.iter().flatten() {
        completion_tokens += out.generated_ids.len();
        let logprobs = match (top, &out.logprobs) {
            (Some(k), Some(steps)) => logprobs::chat(&served, &out.generated_ids, steps, k),
            _ => Value::Null,
        };
        let (message, reason) = tools::reply(plan.as_ref(), &out.text, out.finish_reason, &id, choices.len());
        choices.push(json!({
            "index": choices.len(),
            "message": message,
            "logprobs": logprobs,
            "finish_reason": reason,
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
    /// With tools that the reply may call: each choice's text is held until it finishes, then
    /// sent as `tool_calls` deltas (OpenAI's: id, type and name first, then the arguments) or as
    /// content.
    plan: Option<ToolPlan>,
    buffers: Vec<String>,
}

impl ChatChunks {
    fn chunk(&self, index: usize, delta: Value, logprobs: Value, reason: Option<FinishReason>) -> Value {
        self.chunk_with(index, delta, logprobs, reason.map_or(Value::Null, finish_reason))
    }

    fn chunk_with(&self, index: usize, delta: Value, logprobs: Value, reason: Value) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
        })
    }

    /// The chunks of a held choice once it has finished.
    fn release(&mut self, choice: usize, reason: FinishReason) -> Vec<Value> {
        let text = self.buffers.get_mut(choice).map(std::mem::take).unwrap_or_default();
        let plan = self.plan.as_ref();
        match tools::stream_calls(plan, &text, reason, &self.id, choice) {
            Some(deltas) => {
                let mut chunks: Vec<Value> =
                    deltas.into_iter().map(|d| self.chunk_with(choice, d, Value::Null, Value::Null)).collect();
                chunks.push(self.chunk_with(choice, json!({}), Value::Null, json!("tool_calls")));
                chunks
            }
            None => {
                let delta = if text.is_empty() { json!({}) } else { json!({"content": text}) };
                vec![self.chunk(choice, delta, Value::Null, Some(reason))]
            }
        }
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&mut self) -> Vec<Value> {
        (0..self.n).map(|i| self.chunk(i, json!({"role": "assistant", "content": ""}), Value::Null, None)).collect()
    }

    fn delta(&mut self, choice: usize, delta: &SequenceDelta) -> Vec<Value> {
        if self.plan.is_some() {
            if let Some(buffer) = self.buffers.get_mut(choice) {
                buffer.push_str(&delta.text);
            }
            return delta.finish_reason.map(|reason| self.release(choice, reason)).unwrap_or_default();
        }
        let logprobs = match (self.top, &delta.logprobs) {
            (Some(k), Some(steps)) => logprobs::chat(&self.served, &delta.token_ids, steps, k),
            _ => Value::Null,
        };
        if delta.text.is_empty() && logprobs.is_null() && delta.finish_reason.is_none() {
            return Vec::new();
        }
        let content = if delta.text.is_empty() { json!({}) } else { json!({"content": delta.text}) };
        vec![self.chunk(choice, content, logprobs, delta.finish_reason)]
    }

    fn close(&mut self, choice: usize, reason: FinishReason) -> Value {
        let text = self.buffers.get_mut(choice).map(std::mem::take).unwrap_or_default();
        let delta = if text.is_empty() { json!({}) } else { json!({"content": text}) };
        self.chunk(choice, delta, Value::Null, Some(reason))
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
