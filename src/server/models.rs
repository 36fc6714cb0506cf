//! The models a server serves: each [`ServedModel`] has its own engine thread (its own paged
//! engine and KV budget), its own metric series and chat template; [`route`] picks the model a
//! request names, and `GET /v1/models` and `GET /health` list them all.
//!
//! Models whose engines share a device share it first come, first served: each engine loop runs
//! its step as soon as it has work, and the device (a CPU's cores, a GPU's queue, a worker's
//! connection) runs the work in the order it arrives. Nothing else is shared, so one model's
//! failure leaves the others serving.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use burn_llm_models::generation::prepare_prompt;
use burn_llm_models::{ChatTemplate, ModelError, Prompt};
use serde_json::json;

use super::engine_loop::{EngineBuilder, EngineHandle};
use super::errors::{ApiError, ApiResult};
use super::metrics::Metrics;
use super::{AppState, ServerError};

/// A model to serve: its name in the API, where it comes from, and how its engine is built.
pub struct ModelEntry {
    /// The name clients give in `model` (unique on the server).
    pub name: String,
    /// What `--model` named (a directory, a `.gguf` file or a hub id), for the start-up lines.
    pub source: String,
    /// Builds the engine on the model's own thread.
    pub build: EngineBuilder,
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEntry").field("name", &self.name).field("source", &self.source).finish()
    }
}

/// One model being served.
pub struct ServedModel {
    /// Its name in the API.
    pub name: String,
    /// What `--model` named.
    pub source: String,
    /// Its engine thread.
    pub engine: EngineHandle,
    /// Its series of the server's metrics.
    pub metrics: Metrics,
    /// The chat template in use (`--chat-template`, else the model's).
    pub chat_template: Option<ChatTemplate>,
}

/// Fails when two entries share a name (before anything is loaded).
pub fn check_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ServerError> {
    let mut seen = std::collections::BTreeSet::new();
    for name in names {
        if name.is_empty() {
            return Err(ServerError::Config(
                "a served model name is empty: give it one with --served-model-name".into(),
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(ServerError::Config(format!(
                "the served model name {name:?} has a control character: give one without with --served-model-name"
            )));
        }
        if !seen.insert(name) {
            return Err(ServerError::Config(format!(
                "two models are served as `{name}`: give each a different --served-model-name"
            )));
        }
    }
    Ok(())
}

impl ServedModel {
    /// Starts the model's engine thread and waits until the engine is built; `chat_template`
    /// (a Jinja source) replaces the model's own.
    pub fn start(entry: ModelEntry, metrics: Metrics, chat_template: Option<&str>) -> Result<Self, ServerError> {
        let engine = EngineHandle::spawn(&entry.name, entry.build, metrics.clone())
            .map_err(|e| ServerError::Engine(format!("model `{}` ({}): {e}", entry.name, entry.source)))?;
        let tokenizer = engine.info.tokenizer.as_ref();
        let chat_template = match chat_template {
            Some(source) => {
                let special = |id: Option<u32>| {
                    id.and_then(|id| tokenizer.and_then(|t| t.inner().id_to_token(id))).unwrap_or_default()
                };
                let (bos, eos) = (tokenizer.and_then(|t| t.bos_id()), tokenizer.and_then(|t| t.eos_id()));
                Some(ChatTemplate::new(source.to_string(), special(bos), special(eos)))
            }
            None => tokenizer.and_then(|t| t.chat_template().cloned()),
        };
        Ok(Self { name: entry.name, source: entry.source, engine, metrics, chat_template })
    }

    /// Tokenizes and checks prompt `index`: its visible text (for `echo`) and its ids. Empty
    /// prompts, ids outside the vocabulary and prompts over the context are 400s.
    pub fn prepare(&self, index: usize, prompt: &Prompt) -> ApiResult<(String, Vec<u32>)> {
        let spec = &self.engine.info.spec;
        let tokenizer = self.engine.info.tokenizer.as_ref();
        let (text, ids) =
            prepare_prompt(index, prompt, tokenizer, spec.vocab_size, spec.max_positions).map_err(|e| {
                let error = ApiError::bad_request(e.to_string(), Some("prompt"));
                match e {
                    ModelError::PromptTooLong { .. } => error.with_code("context_length_exceeded"),
                    _ => error,
                }
            })?;
        let text = match text {
            Some(t) => t,
            None => self.decode(&ids),
        };
        Ok((text, ids))
    }

    /// The 400 vLLM answers when prompt and completion together exceed the context.
    pub fn check_context(&self, prompt_len: usize, max_tokens: u64) -> ApiResult<()> {
        let max = self.engine.info.spec.max_positions;
        if prompt_len as u64 + max_tokens > max as u64 {
            return Err(ApiError::bad_request(
                format!(
                    "This model's maximum context length is {max} tokens. However, you requested {} tokens ({prompt_len} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.",
                    prompt_len as u64 + max_tokens
                ),
                Some("max_tokens"),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    }

    /// Text of ids (special tokens skipped); empty without a tokenizer.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.engine.info.tokenizer.as_ref().and_then(|t| t.decode(ids).ok()).unwrap_or_default()
    }

    /// One token as text, special tokens included (the `tokens` of logprobs).
    pub fn token_text(&self, id: u32) -> String {
        match &self.engine.info.tokenizer {
            Some(t) => t.inner().decode(&[id], false).unwrap_or_default(),
            None => format!("<{id}>"),
        }
    }
}

/// The model a request's `model` names. One served model also answers requests without
/// `model`; with several, `model` is required (400). A name not served is a 404 listing those
/// that are.
pub fn route<'a>(models: &'a [Arc<ServedModel>], asked: Option<&str>) -> ApiResult<&'a Arc<ServedModel>> {
    let names = || models.iter().map(|m| format!("`{}`", m.name)).collect::<Vec<_>>().join(", ");
    match (asked, models) {
        (Some(name), _) => {
            models.iter().find(|m| m.name == name).ok_or_else(|| ApiError::model_not_found(name, &names()))
        }
        (None, [only]) => Ok(only),
        (None, _) => Err(ApiError::bad_request(
            format!("`model` is required: this server serves {} (see GET /v1/models)", names()),
            Some("model"),
        )
        .with_code("model_required")),
    }
}

/// `GET /v1/models`: every served model.
pub async fn list(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let data: Vec<_> = state
        .models
        .iter()
        .map(|m| {
            json!({
                "id": m.name,
                "object": "model",
                "created": state.started,
                "owned_by": "burn-llm",
                "root": m.name,
                "parent": null,
                "max_model_len": m.engine.info.spec.max_positions,
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data}))
}

/// `GET /health`: each model's state (`ok`, or why it is down); 200 while any model serves,
/// 503 once none does.
pub async fn health(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut serving = 0;
    let mut models = serde_json::Map::new();
    for model in &state.models {
        let status = match model.engine.down() {
            Some(reason) => format!("down: {reason}"),
            None => {
                serving += 1;
                "ok".into()
            }
        };
        models.insert(model.name.clone(), status.into());
    }
    let status = if serving > 0 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(json!({"models": models})))
}
