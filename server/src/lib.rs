//! `burn-llm-server`, the OpenAI-compatible HTTP server (the `serve` example; [`launch::main`]
//! and [`launch::ServeArgs`] are its entry point and flags): `axum` routes in front of one or
//! more models, each an [`Engine`](burn_llm::Engine) running its step loop on its own thread; a
//! request's `model` picks the engine.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/completions` | OpenAI/vLLM completions: text, texts or token-id prompts, `n`/`best_of`, `logprobs`, `echo`, `stop`, `seed`, streaming |
//! | `POST /v1/chat/completions` | chat completions with the model's chat template, `logprobs`/`top_logprobs`, streaming |
//! | `GET /v1/models` | the served models |
//! | `GET /health`, `GET /version` | each model's state, and the version (no API key needed) |
//! | `POST /tokenize`, `POST /detokenize` | vLLM's tokenizer endpoints ([`tokenize`]) |
//! | `GET /metrics` | Prometheus text per `model`, vLLM's metrics under `burn_llm:` ([`metrics`]) |
//! | `GET /` | a chat page streaming through `/v1/chat/completions` |
//!
//! Modules: [`protocol`] (every route's request and response types, unknown fields refused at
//! every depth with their path), [`completions`] and [`chat`] (the two generation routes),
//! [`prompt`] (a chat rendered by its template, for chat and `/tokenize` alike), [`tools`],
//! [`streaming`] (engine events to SSE chunks or whole responses), [`logprobs`], [`engine_loop`]
//! (the engine thread), [`models`] (the served models and routing), [`metrics`], [`auth`],
//! [`errors`], [`page`], [`launch`] (flags and main) with [`model_args`] (names, per-model engine
//! flags, each model's [`ServedModelSpec`](model_args::ServedModelSpec)), [`placement`] (models
//! on device groups, AlpaServe) and [`admission`] (requests rejected at arrival when the
//! placement predicts they would miss their SLO).

pub mod admission;
pub mod auth;
pub mod chat;
pub mod completions;
pub mod engine_loop;
pub mod errors;
pub mod launch;
pub mod logprobs;
pub mod metrics;
pub mod model_args;
pub mod models;
pub mod page;
pub mod placement;
pub mod prompt;
pub mod protocol;
pub mod streaming;
pub mod tokenize;
pub mod tools;

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
use serde::de::DeserializeOwned;
use tower_http::cors::CorsLayer;
use tower_http::trace::TraceLayer;

pub use engine_loop::{EngineBuilder, EngineHandle, ModelInfo};
pub use errors::{ApiError, ApiResult};
pub use metrics::{Metrics, MetricsRegistry};
pub use models::{ModelEntry, ServedModel};

/// How the server runs (the `serve` example's flags beyond the engine's).
#[derive(Clone)]
pub struct ServerConfig {
    /// The model name of the one model [`Server::start`] serves ([`Server::start_models`] takes
    /// each model's name from its [`ModelEntry`]).
    pub served_model_name: String,
    /// When set, every `/v1` route needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Engine requests that may wait to start at once, per model (503 beyond).
    pub max_waiting: usize,
    /// A Jinja chat template replacing every model's own (vLLM's `--chat-template`).
    pub chat_template: Option<String>,
    /// The models' placement on device groups (`--placement`), as `/health` shows it.
    pub placement: Option<serde_json::Value>,
    /// How long a generation request may run before it ends with 408 (`--request-timeout-s`).
    pub request_timeout: Option<std::time::Duration>,
    /// Origins CORS allows (`*`: any, the default as in vLLM).
    pub allowed_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            served_model_name: "model".into(),
            api_key: None,
            max_body_bytes: 4 << 20,
            max_waiting: 1024,
            chat_template: None,
            placement: None,
            request_timeout: None,
            allowed_origins: vec!["*".into()],
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
            .field("placement", &self.placement.is_some())
            .field("request_timeout", &self.request_timeout)
            .field("allowed_origins", &self.allowed_origins)
            .finish()
    }
}

/// What can stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// An engine could not be built (its message names the model and says why).
    #[error("{0}")]
    Engine(String),
    /// The models or flags do not make a server (two models with one name, ...).
    #[error("{0}")]
    Config(String),
    /// The metrics registry refused a metric (a bug).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What every route shares.
pub struct AppState {
    /// The server's settings.
    pub config: ServerConfig,
    /// The served models, in the order given.
    pub models: Vec<Arc<ServedModel>>,
    /// Prometheus metrics (every model's series).
    pub metrics: MetricsRegistry,
    /// Unix time the server started (`created` of `/v1/models`).
    pub started: u64,
    next_id: AtomicU64,
}

impl AppState {
    /// The model a request's `model` names (see [`models::route`]).
    pub fn model(&self, asked: Option<&str>) -> ApiResult<Arc<ServedModel>> {
        models::route(&self.models, asked).cloned()
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

/// A request body read as `T` ([`protocol::parse`]): over the size limit is a 413, anything
/// unreadable a 400 naming what is wrong and where (bad JSON, wrong types, missing or unknown
/// fields at any depth, invalid UTF-8).
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> ApiResult<T> {
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit),
        _ => ApiError::bad_request(format!("cannot read the request body: {}", rejection.body_text()), None),
    })?;
    Ok(protocol::parse(&bytes)?)
}

/// The server: its state and routes.
pub struct Server {
    state: Arc<AppState>,
}

impl Server {
    /// Serves one model, named `config.served_model_name`, built by `build`.
    pub fn start(build: EngineBuilder, config: ServerConfig) -> Result<Self, ServerError> {
        let name = config.served_model_name.clone();
        let entry = ModelEntry::new(name.clone(), name, build);
        Self::start_models(vec![entry], config)
    }

    /// Serves `models`: checks that their names differ (before loading anything), then builds
    /// each engine on its own thread, in order. A model that cannot be built stops the start
    /// (the ones already built are stopped) with an error naming it.
    pub fn start_models(models: Vec<ModelEntry>, config: ServerConfig) -> Result<Self, ServerError> {
        if models.is_empty() {
            return Err(ServerError::Config("no model to serve: give --model".into()));
        }
        models::check_names(models.iter().map(|m| m.name.as_str()))?;
        let metrics = MetricsRegistry::new()?;
        let mut served: Vec<Arc<ServedModel>> = Vec::with_capacity(models.len());
        for entry in models {
            let series = metrics.for_model(&entry.name);
            match ServedModel::start(entry, series, config.chat_template.as_deref()) {
                Ok(model) => served.push(Arc::new(model)),
                Err(e) => {
                    served.iter().for_each(|m| m.stop());
                    return Err(e);
                }
            }
        }
        let state = AppState { config, models: served, metrics, started: unix_now(), next_id: AtomicU64::new(0) };
        Ok(Self { state: Arc::new(state) })
    }

    /// The served models, in order.
    pub fn models(&self) -> &[Arc<ServedModel>] {
        &self.state.models
    }

    /// The first (with one model, the only) model being served.
    pub fn info(&self) -> &ModelInfo {
        &self.state.models[0].engine.info
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
            .route("/v1/models", get(models::list))
            .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_key));
        Router::new()
            .merge(v1)
            .route("/", get(page::handle))
            .route("/health", get(models::health))
            .route(
                "/version",
                get(|| async { axum::Json(protocol::models::Version { version: env!("CARGO_PKG_VERSION").into() }) }),
            )
            .route("/metrics", get(metrics_route))
            .route("/tokenize", post(tokenize::tokenize))
            .route("/detokenize", post(tokenize::detokenize))
            .fallback(|uri: Uri| async move { ApiError::no_route(uri.path()) })
            .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
            .layer(cors(&state.config.allowed_origins))
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
        // Streamed tokens are small writes: without TCP_NODELAY each one after the first waits for
        // the client's ACK of the one before (Nagle's algorithm against delayed ACKs).
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            if let Err(err) = tcp.set_nodelay(true) {
                eprintln!("warning: cannot set TCP_NODELAY on a client connection: {err}");
            }
        });
        let result = axum::serve(listener, self.router()).with_graceful_shutdown(shutdown).await;
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.models.iter().for_each(|m| m.stop()))
            .await
            .map_err(std::io::Error::other)?;
        result
    }
}

/// CORS for `origins`: any origin when it holds `*` (vLLM's default), else exactly those (an
/// origin that is not a valid header value is skipped, as it could never match).
fn cors(origins: &[String]) -> CorsLayer {
    if origins.is_empty() || origins.iter().any(|o| o == "*") {
        return CorsLayer::permissive();
    }
    let allowed: Vec<header::HeaderValue> =
        origins.iter().filter_map(|o| header::HeaderValue::from_str(o).ok()).collect();
    CorsLayer::new()
        .allow_origin(tower_http::cors::AllowOrigin::list(allowed))
        .allow_methods(tower_http::cors::Any)
        .allow_headers(tower_http::cors::Any)
}

/// `GET /metrics`.
async fn metrics_route(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}
