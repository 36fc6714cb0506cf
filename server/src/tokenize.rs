//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: a `prompt` (special tokens added
//! unless `add_special_tokens: false`) or chat `messages` (rendered exactly as
//! `/v1/chat/completions` renders them, with the same `tools`, `tool_choice` and
//! `chat_template_kwargs` ([`super::prompt`]), the assistant's turn opened unless
//! `add_generation_prompt: false`) → `{count, max_model_len, tokens, token_strs}`; `tokens` →
//! `{prompt}`. Like vLLM's, they sit outside `/v1` and need no API key.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use burn_llm_models::{Prompt, Tokenizer};

use super::errors::{ApiError, ApiResult};
use super::prompt::ChatPrompt;
use super::protocol::tokenize::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use super::{AppState, ServedModel, parse_body};

fn tokenizer_of(served: &ServedModel) -> ApiResult<&Tokenizer> {
    served.engine.info.tokenizer.as_ref().ok_or_else(|| ApiError::bad_request("this model has no tokenizer", None))
}

/// `POST /tokenize`.
pub async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let request: TokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
    let served = state.model(request.model.as_deref())?;
    let tokenizer = tokenizer_of(&served)?;
    let bad = |e: burn_llm_models::ModelError, param| ApiError::bad_request(e.to_string(), Some(param));
    let chat_only = [
        ("tools", request.tools.is_some()),
        ("tool_choice", request.tool_choice.is_some()),
        ("chat_template_kwargs", request.chat_template_kwargs.is_some()),
        ("add_generation_prompt", request.add_generation_prompt.is_some()),
    ];
    let ids = match (&request.prompt, &request.messages) {
        (Some(prompt), None) => {
            if let Some((field, _)) = chat_only.into_iter().find(|(_, given)| *given) {
                return Err(ApiError::bad_request(format!("{field} goes with `messages`, not `prompt`"), Some(field)));
            }
            if request.add_special_tokens.unwrap_or(true) {
                tokenizer.encode(prompt)
            } else {
                tokenizer.encode_verbatim(prompt)
            }
            .map_err(|e| bad(e, "prompt"))?
        }
        (None, Some(messages)) => {
            let template = served.chat_template.as_ref().ok_or_else(|| {
                ApiError::bad_request("this model has no chat template: tokenize a prompt instead", Some("messages"))
            })?;
            let chat = ChatPrompt {
                messages,
                tools: request.tools.as_deref(),
                tool_choice: request.tool_choice.as_ref(),
                kwargs: request.chat_template_kwargs.as_ref(),
                add_generation_prompt: request.add_generation_prompt.unwrap_or(true),
            };
            let text = chat.render(template)?.text;
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
    let max_model_len = served.engine.info.spec.max_positions;
    Ok(axum::Json(TokenizeResponse { count: ids.len(), max_model_len, tokens: ids, token_strs }).into_response())
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let request: DetokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
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
    let prompt =
        tokenizer_of(&served)?.decode(&ids).map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(axum::Json(DetokenizeResponse { prompt }).into_response())
}
