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

use super::admission::SloGate;
use super::engine_loop::{EngineBuilder, EngineHandle};
use super::errors::{ApiError, ApiResult};
use super::metrics::Metrics;
use super::protocol::models::{Health, ModelCard, ModelList};
use super::{AppState, ServerError};

/// A model to serve: its name in the API, where it comes from, and how its engine is built.
pub struct ModelEntry {
    /// The name clients give in `model` (unique on the server).
    pub name: String,
    /// What `--model` named (a directory, a `.gguf` file or a hub id), for the start-up lines.
    pub source: String,
    /// Builds the engine on the model's own thread.
    pub build: EngineBuilder,
    /// Builders of further replicas (a placement's other groups serving the model), each an
    /// engine on its own thread; requests go to the replica with the fewest in flight.
    pub replicas: Vec<EngineBuilder>,
    /// Its own chat template (Jinja source), replacing the server's `--chat-template` for it.
    pub chat_template: Option<String>,
    /// Its own `--max-waiting`, replacing the server's for it.
    pub max_waiting: Option<usize>,
    /// `--admission slo`: the admission of each engine (the first, then the replicas), or none.
    pub gates: Vec<SloGate>,
}

impl ModelEntry {
    /// A model served by one engine, with the server's chat template and `--max-waiting`.
    pub fn new(name: impl Into<String>, source: impl Into<String>, build: EngineBuilder) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            build,
            replicas: Vec::new(),
            chat_template: None,
            max_waiting: None,
            gates: Vec::new(),
        }
    }
}

impl std::fmt::Debug for ModelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelEntry")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("replicas", &(1 + self.replicas.len()))
            .finish()
    }
}

/// One model being served.
pub struct ServedModel {
    /// Its name in the API.
    pub name: String,
    /// What `--model` named.
    pub source: String,
    /// Its engine thread (the first replica's).
    pub engine: EngineHandle,
    /// The engine threads of its other replicas.
    pub replicas: Vec<EngineHandle>,
    /// Its series of the server's metrics.
    pub metrics: Metrics,
    /// The chat template in use (`--chat-template`, else the model's).
    pub chat_template: Option<ChatTemplate>,
    /// Its own `--max-waiting` (else the server's).
    pub max_waiting: Option<usize>,
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
    /// Starts the model's engine threads (one per replica) and waits until each engine is built;
    /// the entry's chat template, else `chat_template` (a Jinja source), replaces the model's own.
    pub fn start(entry: ModelEntry, metrics: Metrics, chat_template: Option<&str>) -> Result<Self, ServerError> {
        let ModelEntry { name, source, build, replicas: builders, chat_template: own_template, max_waiting, gates } =
            entry;
        if !gates.is_empty() && gates.len() != 1 + builders.len() {
            return Err(ServerError::Config(format!(
                "model `{name}` has {} admission gates for its {} engines: give one per engine or none",
                gates.len(),
                1 + builders.len()
            )));
        }
        let mut gates = gates.into_iter();
        let gated = |handle: EngineHandle, gate: Option<SloGate>| match gate {
            Some(gate) => handle.with_gate(gate),
            None => handle,
        };
        let chat_template = own_template.as_deref().or(chat_template);
        let several = !builders.is_empty();
        let fail = |i: usize, e: String| {
            let which = if several { format!(" replica {i}") } else { String::new() };
            ServerError::Engine(format!("model `{name}` ({source}){which}: {e}"))
        };
        let engine = gated(EngineHandle::spawn(&name, build, metrics.clone()).map_err(|e| fail(0, e))?, gates.next());
        let mut replicas = Vec::with_capacity(builders.len());
        let mut failed = None;
        for (i, build) in builders.into_iter().enumerate() {
            match EngineHandle::spawn(&name, build, metrics.clone()) {
                Ok(handle) => replicas.push(gated(handle, gates.next())),
                Err(e) => {
                    failed = Some(fail(i + 1, e));
                    break;
                }
            }
        }
        if let Some(e) = failed {
            std::iter::once(&engine).chain(&replicas).for_each(EngineHandle::stop);
            return Err(e);
        }
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
        Ok(Self { name, source, engine, replicas, metrics, chat_template, max_waiting })
    }

    /// Every replica's engine thread.
    pub fn engines(&self) -> impl Iterator<Item = &EngineHandle> {
        std::iter::once(&self.engine).chain(&self.replicas)
    }

    /// The replica a new request goes to: of those up, the one with the fewest requests in flight
    /// (the first on a tie); the first replica when all are down (it answers why).
    pub fn pick(&self) -> &EngineHandle {
        self.engines().filter(|e| e.down().is_none()).min_by_key(|e| e.outstanding()).unwrap_or(&self.engine)
    }

    /// Why the model no longer serves: every replica is down (the first one's reason).
    pub fn down(&self) -> Option<String> {
        let reasons: Vec<String> = self.engines().map_while(EngineHandle::down).collect();
        (reasons.len() == 1 + self.replicas.len()).then(|| reasons[0].clone())
    }

    /// Stops every replica's engine thread.
    pub fn stop(&self) {
        self.engines().for_each(EngineHandle::stop);
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
    let data = state
        .models
        .iter()
        .map(|m| ModelCard {
            id: m.name.clone(),
            object: "model".into(),
            created: state.started,
            owned_by: "burn-llm".into(),
            root: m.name.clone(),
            parent: None,
            max_model_len: m.engine.info.spec.max_positions,
        })
        .collect();
    axum::Json(ModelList { object: "list".into(), data })
}

/// `GET /health`: each model's state (`ok`, or why it is down); 200 while any model serves,
/// 503 once none does.
pub async fn health(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut serving = 0;
    let mut models = std::collections::BTreeMap::new();
    for model in &state.models {
        let replicas_down: Vec<String> = model.engines().filter_map(EngineHandle::down).collect();
        let status = match model.down() {
            Some(reason) => format!("down: {reason}"),
            None if replicas_down.is_empty() => {
                serving += 1;
                "ok".into()
            }
            None => {
                serving += 1;
                format!(
                    "ok ({} of {} replicas down: {})",
                    replicas_down.len(),
                    1 + model.replicas.len(),
                    replicas_down[0]
                )
            }
        };
        models.insert(model.name.clone(), status);
    }
    let status = if serving > 0 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(Health { models, placement: state.config.placement.clone() }))
}
