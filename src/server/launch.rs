//! The `serve` example's command line: the engine flags every example takes ([`EngineSpec`],
//! `--engine paged` by default) plus the server's own, and the entry point that serves until
//! SIGINT or SIGTERM. The prompt and sampling flags of the `*_generate` examples are not taken:
//! each request brings its own. `--model` repeats to serve several models; see [`model_args`]
//! for names and per-model engine flags.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::model_args::{self, GivenFlags};
use super::{ModelEntry, Server, ServerConfig, ServerError};
use crate::engine::Engine;
use crate::spec::{EngineKind, EngineSpec, Purpose};

/// Environment variable read for the API key when `--api-key` is not given.
pub const API_KEY_ENV: &str = "BURN_LLM_API_KEY";

/// Flags of the `serve` example. Parse them with [`ServeArgs::try_parse_from`] or
/// [`ServeArgs::parse`] (these inherent functions keep the engine flags as given, which
/// `--model-engine-args` needs; clap's trait functions of the same names do not).
#[derive(Debug, Clone, Parser)]
#[command(about = "OpenAI-compatible HTTP server for an LLM on Burn", long_about = None)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every /v1 route (default: the BURN_LLM_API_KEY
    /// environment variable; none when neither is set).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Requests that may wait to start at once (503 beyond).
    #[arg(long, default_value_t = 1024)]
    pub max_waiting: usize,
    /// Model: a local HF directory (config.json, *.safetensors, tokenizer.json), a `.gguf` file or
    /// a hub id. Repeat it to serve several models, each on its own engine.
    #[arg(long, required = true)]
    pub model: Vec<String>,
    /// Model name in the API, one per --model in the same order (default: the model's directory
    /// name or file stem; a hub id keeps its id).
    #[arg(long)]
    pub served_model_name: Vec<String>,
    /// Engine flags for one model, `NAME='FLAGS'` (NAME its served name): they replace the shared
    /// engine flags they name, for that model (e.g. `b='--kv-cache-memory 256MiB --dtype f32'`).
    #[arg(long, value_name = "NAME=FLAGS")]
    pub model_engine_args: Vec<String>,
    /// A Jinja chat template file replacing every model's own.
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Seconds a generation request may take before it ends with 408 (streamed: an error event)
    /// and its KV blocks are freed; none by default.
    #[arg(long)]
    pub request_timeout_s: Option<f64>,
    /// Origins allowed by CORS, comma-separated or repeated (default `*`, as vLLM's).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub allowed_origins: Vec<String>,
    /// The engine: the engine flags of the `*_generate` examples (`--engine paged` by default),
    /// shared by every model.
    #[command(flatten)]
    pub engine: EngineSpec,
    /// The engine flags as given on the command line (set by [`ServeArgs::try_parse_from`]).
    #[arg(skip)]
    pub given_engine_flags: Option<GivenFlags>,
}

impl ServeArgs {
    /// Parses `argv` (its first item the program name), keeping the engine flags as given.
    pub fn try_parse_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Self::command().try_get_matches_from(argv)?;
        let mut args = <Self as FromArgMatches>::from_arg_matches(&matches)?;
        args.given_engine_flags = Some(GivenFlags::from_matches(&matches));
        Ok(args)
    }

    /// Parses the process's arguments, exiting with clap's message when they are wrong.
    pub fn parse() -> Self {
        Self::try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Each model's name, `--model` argument and engine spec (with the server's default engine),
    /// checked: names paired in order and distinct, `--model-engine-args` naming served models,
    /// every model's flags valid for serving. Nothing is loaded.
    pub fn model_specs(&self) -> Result<Vec<ModelSpec>, ServerError> {
        let names = model_args::names(&self.model, &self.served_model_name)?;
        super::models::check_names(names.iter().map(String::as_str))?;
        let overrides = model_args::overrides(&self.model_engine_args, &names)?;
        let mut specs = Vec::with_capacity(names.len());
        for (name, model) in names.into_iter().zip(&self.model) {
            let spec = match overrides.iter().find(|(n, _)| *n == name) {
                Some((_, flags)) => {
                    let given = self.given_engine_flags.as_ref().ok_or_else(|| {
                        ServerError::Config(
                            "--model-engine-args needs the flags as given: parse them with ServeArgs::try_parse_from"
                                .into(),
                        )
                    })?;
                    given
                        .model_spec(flags)
                        .map_err(|e| ServerError::Config(format!("--model-engine-args {name}: {e}")))?
                        .with_default_engine(EngineKind::Paged)
                }
                None => self.engine_spec(),
            };
            spec.validate(spec.kind(), Purpose::Serve).map_err(|e| {
                let whose = if self.model.len() > 1 { format!("model `{name}`: ") } else { String::new() };
                ServerError::Config(format!("{whose}{e}"))
            })?;
            specs.push(ModelSpec { name, source: model.clone(), spec });
        }
        Ok(specs)
    }

    /// The models to serve, checked as [`ServeArgs::model_specs`] does; each builds its engine on
    /// its own thread when the server starts.
    pub fn model_entries(&self) -> Result<Vec<ModelEntry>, ServerError> {
        Ok(self.model_specs()?.into_iter().map(ModelSpec::entry).collect())
    }

    /// The server settings these flags describe (the key from the flag or the environment).
    /// `served_model_name` is the first model's name.
    pub fn server_config(&self) -> Result<ServerConfig, Box<dyn std::error::Error>> {
        let name = model_args::names(&self.model, &self.served_model_name)?.into_iter().next();
        let chat_template = match &self.chat_template {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--chat-template {}: cannot read it: {e}", path.display()))?,
            ),
            None => None,
        };
        let api_key = self.api_key.clone().or_else(|| std::env::var(API_KEY_ENV).ok()).filter(|k| !k.is_empty());
        let request_timeout = match self.request_timeout_s {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 => Some(std::time::Duration::from_secs_f64(s)),
            Some(s) => return Err(format!("--request-timeout-s must be a positive number of seconds, got {s}").into()),
        };
        Ok(ServerConfig {
            served_model_name: name.unwrap_or_else(|| "model".into()),
            api_key,
            max_body_bytes: self.max_body_bytes,
            max_waiting: self.max_waiting,
            chat_template,
            request_timeout,
            allowed_origins: self.allowed_origins.clone(),
        })
    }

    /// The shared engine spec, with the server's default engine (paged).
    pub fn engine_spec(&self) -> EngineSpec {
        self.engine.clone().with_default_engine(EngineKind::Paged)
    }
}

/// One model of the command line, before it is loaded: a placement fills in its
/// `spec.parallel.devices` (clearing `spec.device`) before [`ModelSpec::entry`].
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Its served name.
    pub name: String,
    /// Its `--model` argument.
    pub source: String,
    /// Its engine flags: the shared ones with its `--model-engine-args`.
    pub spec: EngineSpec,
}

impl ModelSpec {
    /// The model to serve: its engine is built from `spec` on the model's own thread.
    pub fn entry(self) -> ModelEntry {
        let Self { name, source, spec } = self;
        let model = source.clone();
        let build: super::EngineBuilder = Box::new(move || -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
            let dir = burn_llm_models::hub::resolve_model(&model)?;
            spec.init(&dir, Purpose::Serve, &mut std::io::stderr())
        });
        ModelEntry { name, source, build }
    }
}

/// Entry point of the `serve` example.
pub fn main() -> ExitCode {
    let args = ServeArgs::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", super::engine_loop::error_chain(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Checks every model's flags, loads the models, binds, and serves until SIGINT/SIGTERM.
pub fn run(args: &ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let models = args.model_entries()?;
    let config = server_config_logged(args)?;
    let server = Server::start_models(models, config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
        for model in server.models() {
            let info = &model.engine.info;
            let placement = info.placement.as_ref().map(|p| format!(" · {p}")).unwrap_or_default();
            eprintln!(
                "model `{}`: {} ({} engine, context {}{placement})",
                model.name, model.source, info.engine, info.spec.max_positions
            );
        }
        let count = server.models().len();
        let what = if count == 1 { "1 model".to_string() } else { format!("{count} models") };
        eprintln!("serving {what} on http://{} · chat page at / · Ctrl-C stops", listener.local_addr()?);
        server.serve(listener, shutdown_signal()).await?;
        eprintln!("stopped");
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

/// The config, with one line on what protects it (never the key itself).
fn server_config_logged(args: &ServeArgs) -> Result<ServerConfig, Box<dyn std::error::Error>> {
    let config = args.server_config()?;
    if config.api_key.is_some() {
        eprintln!("API key required on /v1 routes");
    }
    Ok(config)
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
