//! `POST /v1/chat/completions`: the conversation is rendered with the chat template (the
//! model's, or `--chat-template`; [`super::prompt`]), the assistant's turn opened, and
//! completed; with tools, the reply may become `tool_calls` ([`super::tools`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use burn_llm_models::{FinishReason, Prompt, SequenceDelta};

use super::errors::{ApiError, ApiResult};
use super::prompt::{ChatPrompt, Rendered};
use super::protocol::chat::{AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta};
use super::protocol::{ChatRequest, FinishReasonOut, Usage};
use super::streaming::{self, ChunkFormat};
use super::tools::{self, ToolPlan};
use super::{AppState, ServedModel, logprobs, parse_body, unix_now};

/// The route.
pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: ChatRequest = parse_body(body, state.config.max_body_bytes)?;
    let served = state.model(request.model.as_deref())?;
    let template = served.chat_template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: start the server with --chat-template FILE, or use /v1/completions",
            Some("messages"),
        )
    })?;
    let chat = ChatPrompt {
        messages: &request.messages,
        tools: request.tools.as_deref(),
        tool_choice: request.tool_choice.as_ref(),
        kwargs: request.chat_template_kwargs.as_ref(),
        add_generation_prompt: true,
    };
    let Rendered { text, plan } = chat.render(template)?;
    let tokenizer = served.engine.info.tokenizer.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no tokenizer: use /v1/completions with token ids", None)
    })?;
    let ids = tokenizer.encode_verbatim(&text).map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    let (_, ids) = served.prepare(0, &Prompt::Ids(ids)).map_err(|mut e| {
        e.param = Some("messages".into());
        e
    })?;
    let top = request.logprobs()?;
    let sampling = request.sampling();
    let room = served.engine.info.spec.max_positions.saturating_sub(ids.len()) as u64;
    let max_tokens = request.max_completion_tokens.or(sampling.max_tokens).unwrap_or(room);
    served.check_context(ids.len(), max_tokens.max(1))?;
    let vocab = served.engine.info.spec.vocab_size;
    let mut params = sampling.params(max_tokens, top, vocab, &request.constraints())?;
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
    let include_usage = sampling.include_usage()?;
    let prompt_tokens = ids.len();
    let mut run = served.pick().submit(vec![ids], &params, served.max_waiting.unwrap_or(state.config.max_waiting))?;
    run.accepted().await?;
    let model = served.name.clone();
    let (id, created) = (state.new_id("chatcmpl"), unix_now());
    // The engine reports at least one alternative; `top_logprobs` says how many to show.
    let top = top.map(|_| request.top_logprobs.unwrap_or(0) as usize);
    if sampling.streams() {
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
            (Some(k), Some(steps)) => Some(logprobs::chat(&served, &out.generated_ids, steps, k)),
            _ => None,
        };
        let (content, tool_calls, finish_reason) =
            tools::reply(plan.as_ref(), &out.text, out.finish_reason, &id, choices.len());
        let message = AssistantMessage { role: "assistant".into(), content, tool_calls };
        choices.push(ChatChoice { index: choices.len(), message, logprobs, finish_reason });
    }
    let usage = Usage::new(prompt_tokens, completion_tokens);
    let object = "chat.completion".into();
    Ok(axum::Json(ChatCompletion { id, object, created, model, choices, usage }).into_response())
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
    fn chunk(&self, choices: Vec<ChatChunkChoice>) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        }
    }

    fn choice(&self, index: usize, delta: ChatDelta, reason: Option<FinishReasonOut>) -> ChatChunk {
        self.chunk(vec![ChatChunkChoice { index, delta, logprobs: None, finish_reason: reason }])
    }

    /// The chunks of a held choice once it has finished.
    fn release(&mut self, choice: usize, reason: FinishReason) -> Vec<ChatChunk> {
        let text = self.buffers.get_mut(choice).map(std::mem::take).unwrap_or_default();
        match tools::stream_calls(self.plan.as_ref(), &text, reason, &self.id, choice) {
            Some((content, calls)) => {
                let mut chunks: Vec<ChatChunk> =
                    content.into_iter().map(|c| self.choice(choice, ChatDelta::text(c), None)).collect();
                for call in calls {
                    let delta = ChatDelta { tool_calls: Some(vec![call]), ..ChatDelta::default() };
                    chunks.push(self.choice(choice, delta, None));
                }
                chunks.push(self.choice(choice, ChatDelta::default(), Some(FinishReasonOut::ToolCalls)));
                chunks
            }
            None => vec![self.choice(choice, ChatDelta::text(text), Some(reason.into()))],
        }
    }
}

impl ChunkFormat for ChatChunks {
    type Chunk = ChatChunk;

    fn opening(&mut self) -> Vec<ChatChunk> {
        let role = || ChatDelta { role: Some("assistant".into()), content: Some(String::new()), tool_calls: None };
        (0..self.n).map(|i| self.choice(i, role(), None)).collect()
    }

    fn delta(&mut self, choice: usize, delta: &SequenceDelta) -> Vec<ChatChunk> {
        if self.plan.is_some() {
            if let Some(buffer) = self.buffers.get_mut(choice) {
                buffer.push_str(&delta.text);
            }
            return delta.finish_reason.map(|reason| self.release(choice, reason)).unwrap_or_default();
        }
        let logprobs = match (self.top, &delta.logprobs) {
            (Some(k), Some(steps)) => Some(logprobs::chat(&self.served, &delta.token_ids, steps, k)),
            _ => None,
        };
        if delta.text.is_empty() && logprobs.is_none() && delta.finish_reason.is_none() {
            return Vec::new();
        }
        let finish_reason = delta.finish_reason.map(FinishReasonOut::from);
        let content = ChatDelta::text(delta.text.clone());
        vec![self.chunk(vec![ChatChunkChoice { index: choice, delta: content, logprobs, finish_reason }])]
    }

    fn close(&mut self, choice: usize, reason: FinishReason) -> ChatChunk {
        let text = self.buffers.get_mut(choice).map(std::mem::take).unwrap_or_default();
        self.choice(choice, ChatDelta::text(text), Some(reason.into()))
    }

    fn usage(&self, usage: Usage) -> ChatChunk {
        ChatChunk { usage: Some(usage), ..self.chunk(Vec::new()) }
    }
}
