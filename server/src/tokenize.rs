//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: a `prompt` (special tokens added
//! unless `add_special_tokens: false`) or chat `messages` (rendered with the chat template, the
//! assistant's turn opened unless `add_generation_prompt: false`) → `{count, max_model_len,
//! tokens, token_strs}`; `tokens` → `{prompt}`. Like vLLM's, they sit outside `/v1` and need no
//! API key.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use burn_llm_models::{Prompt, Tokenizer};
use serde::Deserialize;
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::protocol::{MessageInput, chat_messages};
use super::structured::refuse_unknown;
use super::{AppState, ServedModel, parse_body};

/// `/tokenize`'s body: a completion prompt or a chat.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// A conversation to render and tokenize.
    pub messages: Option<Vec<MessageInput>>,
    /// Add the tokenizer's special tokens (prompt: yes by default; chat: no, the template writes
    /// them).
    pub add_special_tokens: Option<bool>,
    /// Chat: open the assistant's turn (default yes).
    pub add_generation_prompt: Option<bool>,
    /// Also return each token's string.
    pub return_token_strs: Option<bool>,
    /// Every other field (a 400).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `/detokenize`'s body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<i64>,
    /// Every other field (a 400).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

fn tokenizer_of(served: &ServedModel) -> ApiResult<&Tokenizer> {
    served.engine.info.tokenizer.as_ref().ok_or_else(|| ApiError::bad_request("this model has no tokenizer", None))
}

/// `POST /tokenize`.
pub async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: TokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
    refuse_unknown(&request.extra)?;
    let served = state.model(request.model.as_deref())?;
    let tokenizer = tokenizer_of(&served)?;
    let bad = |e: burn_llm_models::ModelError, param| ApiError::bad_request(e.to_string(), Some(param));
    let ids = match (&request.prompt, &request.messages) {
        (Some(prompt), None) => if request.add_special_tokens.unwrap_or(true) {
            tokenizer.encode(prompt)
        } else {
            tokenizer.encode_verbatim(prompt)
        }
        .map_err(|e| bad(e, "prompt"))?,
        (None, Some(messages)) => {
            let template = served.chat_template.as_ref().ok_or_else(|| {
                ApiError::bad_request("this model has no chat template: tokenize a prompt instead", Some("messages"))
            })?;
            let text = template
                .render(&chat_messages(messages)?, request.add_generation_prompt.unwrap_or(true))
                .map_err(|e| bad(e, "messages"))?;
            let ids = if request.add_special_tokens.unwrap_or(false) {
                tokenizer.encode(&text)
            } else {
                tokenizer.encode_verbatim(&text)
            };
            ids.map_err(|e| bad(e, "messages"))?
        }
        _ => return Err(ApiError::bad_request("give either `prompt` or `messages`", Some("prompt"))),
    };
    let token_strs = request
        .return_token_strs
        .unwrap_or(false)
        .then(|| ids.iter().map(|&id| tokenizer.inner().id_to_token(id).unwrap_or_default()).collect::<Vec<_>>());
    Ok(axum::Json(json!({
        "count": ids.len(),
        "max_model_len": served.engine.info.spec.max_positions,
        "tokens": ids,
        "token_strs": token_strs,
    }))
    .into_response())
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let request: DetokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
    refuse_unknown(&request.extra)?;
    let served = state.model(request.model.as_deref())?;
    let ids = request
        .tokens
        .iter()
        .map(|&id| {
            u32::try_from(id)
                .map_err(|_| ApiError::bad_request(format!("tokens: {id} is not a token id"), Some("tokens")))
        })
        .collect::<ApiResult<Vec<u32>>>()?;
    let (_, ids) = served.prepare(0, &Prompt::Ids(ids)).map_err(|mut e| {
        e.param = Some("tokens".into());
        e
    })?;
    let text = tokenizer_of(&served)?.decode(&ids).map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(axum::Json(json!({"prompt": text})).into_response())
}
