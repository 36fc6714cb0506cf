//! The OpenAI-compatible HTTP server (the `serve` example): `axum` routes in front of an
//! [`Engine`] that runs its step loop on its own thread.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/completions` | OpenAI/vLLM completions: text, texts or token-id prompts, `n`/`best_of`, `logprobs`, `echo`, `stop`, `seed`, streaming |
//! | `POST /v1/chat/completions` | chat completions with the model's chat template, `logprobs`/`top_logprobs`, streaming |
//! | `GET /v1/models` | the served model |
//! | `GET /health`, `GET /version` | liveness and version (no API key needed) |
//! | `GET /metrics` | Prometheus text: queues, KV blocks, token counters, TTFT/TPOT/e2e histograms, preemptions |
//! | `GET /` | a chat page streaming through `/v1/chat/completions` |
//!
//! Modules: [`protocol`] (request bodies), [`completions`] and [`chat`] (the two generation routes),
//! [`streaming`] (engine events to SSE chunks or whole responses), [`logprobs`], [`engine_loop`]
//! (the engine thread), [`metrics`], [`auth`], [`errors`], [`page`], [`launch`] (flags and main).

pub mod auth;
pub mod chat;
pub mod completions;
pub mod engine_loop;
pub mod errors;
pub mod launch;
pub mod logprobs;
pub mod metrics;
pub mod page;
pub mod protocol;
pub mod streaming;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use burn_llm_models::generation::prepare_prompt;
use burn_llm_models::{ChatTemplate, ModelError, Prompt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tower_http::cors::CorsLayer;
use tower_http::trace::TraceLayer;

pub use engine_loop::{EngineBuilder, EngineHandle, ModelInfo};
pub use errors::{ApiError, ApiResult};
pub use metrics::Metrics;

/// How the server runs (the `serve` example's flags beyond the engine's).
#[derive(Clone)]
pub struct ServerConfig {
    /// The model name clients give in `model` and `/v1/models` lists.
    pub served_model_name: String,
    /// When set, every `/v1` route needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Engine requests that may wait to start at once (503 beyond).
    pub max_waiting: usize,
    /// A Jinja chat template replacing the model's own (vLLM's `--chat-template`).
    pub chat_template: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            served_model_name: "model".into(),
            api_key: None,
            max_body_bytes: 4 << 20,
            max_waiting: 1024,
            chat_template: None,
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    /// The API key is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("served_model_name", &self.served_model_name)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_waiting", &self.max_waiting)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// What can stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The engine could not be built (its message says why).
    #[error("{0}")]
    Engine(String),
    /// The metrics registry refused a metric (a bug).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What every route shares.
pub struct AppState {
    /// The server's settings.
    pub config: ServerConfig,
    /// The engine thread.
    pub engine: EngineHandle,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// The chat template in use (`--chat-template`, else the model's).
    pub chat_template: Option<ChatTemplate>,
    /// Unix time the server started (`created` of `/v1/models`).
    pub started: u64,
    next_id: AtomicU64,
}

impl AppState {
    /// A 404 unless `model` is absent or the served name.
    pub fn check_model(&self, model: Option<&str>) -> ApiResult<()> {
        match model {
            Some(m) if m != self.config.served_model_name => {
                Err(ApiError::model_not_found(m, &self.config.served_model_name))
            }
            _ => Ok(()),
        }
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

    /// A fresh response id with OpenAI's prefix (`cmpl`, `chatcmpl`).
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A request body as JSON: over the size limit is a 413, anything unreadable a 400 naming what
/// is wrong (bad JSON, wrong types, missing fields, invalid UTF-8).
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> ApiResult<T> {
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit),
        _ => ApiError::bad_request(format!("cannot read the request body: {}", rejection.body_text()), None),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "the request body has a field of the wrong type or value",
            _ => "the request body is not valid JSON",
        };
        ApiError::bad_request(format!("{what}: {e}"), None).with_code("invalid_request_body")
    })
}

/// The server: its state and routes.
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// Builds the engine on its own thread and gets the routes ready.
    pub fn start(build: EngineBuilder, config: ServerConfig) -> Result<Self, ServerError> {
        let metrics = Metrics::new()?;
        let engine = EngineHandle::spawn(build, metrics.clone()).map_err(ServerError::Engine)?;
        let chat_template = match &config.chat_template {
            Some(source) => {
                let tokenizer = engine.info.tokenizer.as_ref();
                let special = |id: Option<u32>| {
                    id.and_then(|id| tokenizer.and_then(|t| t.inner().id_to_token(id))).unwrap_or_default()
                };
                let (bos, eos) = (tokenizer.and_then(|t| t.bos_id()), tokenizer.and_then(|t| t.eos_id()));
                Some(ChatTemplate::new(source.clone(), special(bos), special(eos)))
            }
            None => engine.info.tokenizer.as_ref().and_then(|t| t.chat_template().cloned()),
        };
        let state =
            AppState { config, engine, metrics, chat_template, started: unix_now(), next_id: AtomicU64::new(0) };
        Ok(Self { state: Arc::new(state) })
    }

    /// The model being served.
    pub fn info(&self) -> &ModelInfo {
        &self.state.engine.info
    }

    /// The metrics as `/metrics` shows them.
    pub fn metrics_text(&self) -> String {
        self.state.metrics.render()
    }

    /// Every route, with the body limit, CORS and request tracing.
    pub fn router(&self) -> Router {
        let state = self.state.clone();
        let v1 = Router::new()
            .route("/v1/completions", post(completions::handle))
            .route("/v1/chat/completions", post(chat::handle))
            .route("/v1/models", get(models))
            .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_key));
        Router::new()
            .merge(v1)
            .route("/", get(page::handle))
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/version", get(|| async { axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})) }))
            .route("/metrics", get(metrics_route))
            .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
            .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
            .layer(CorsLayer::permissive())
            .layer(TraceLayer::new_for_http())
            .with_state(state)
    }

    /// Serves on `listener` until `shutdown` resolves, then stops accepting, lets open responses
    /// finish, and stops the engine thread (aborting anything left).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let result = axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await;
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.engine.stop()).await.map_err(std::io::Error::other)?;
        result
    }
}

/// `GET /v1/models`.
async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let name = &state.config.served_model_name;
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": state.started,
            "owned_by": "burn-llm",
            "root": name,
            "parent": null,
            "max_model_len": state.engine.info.spec.max_positions,
        }],
    }))
}

/// `GET /metrics`.
async fn metrics_route(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}
