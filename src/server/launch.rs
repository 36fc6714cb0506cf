//! The `serve` example's command line: the engine flags every example takes ([`EngineSpec`],
//! `--engine paged` by default) plus the server's own, and the entry point that serves until
//! SIGINT or SIGTERM. The prompt and sampling flags of the `*_generate` examples are not taken:
//! each request brings its own.

use std::process::ExitCode;

use clap::Parser;

use super::{Server, ServerConfig};
use crate::engine::Engine;
use crate::spec::{EngineKind, EngineSpec, Purpose};

/// Environment variable read for the API key when `--api-key` is not given.
pub const API_KEY_ENV: &str = "BURN_LLM_API_KEY";

/// Flags of the `serve` example.
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
    /// a hub id.
    #[arg(long)]
    pub model: String,
    /// Model name in the API (default: the --model argument).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// A Jinja chat template file replacing the model's own.
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// The engine: the engine flags of the `*_generate` examples (`--engine paged` by default).
    #[command(flatten)]
    pub engine: EngineSpec,
}

impl ServeArgs {
    /// The server settings these flags describe (the key from the flag or the environment).
    pub fn server_config(&self) -> Result<ServerConfig, Box<dyn std::error::Error>> {
        let model = self.model.clone();
        let chat_template = match &self.chat_template {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--chat-template {}: cannot read it: {e}", path.display()))?,
            ),
            None => None,
        };
        let api_key = self.api_key.clone().or_else(|| std::env::var(API_KEY_ENV).ok()).filter(|k| !k.is_empty());
        Ok(ServerConfig {
            served_model_name: self.served_model_name.clone().unwrap_or(model),
            api_key,
            max_body_bytes: self.max_body_bytes,
            max_waiting: self.max_waiting,
            chat_template,
        })
    }

    /// The engine spec, with the server's default engine (paged).
    pub fn engine_spec(&self) -> EngineSpec {
        self.engine.clone().with_default_engine(EngineKind::Paged)
    }

    /// Builds the engine the flags describe (on the engine thread, which then owns it).
    pub fn engine_builder(&self) -> super::EngineBuilder {
        let spec = self.engine_spec();
        let model = self.model.clone();
        Box::new(move || -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
            let dir = burn_llm_models::hub::resolve_model(&model)?;
            spec.init(&dir, Purpose::Serve, &mut std::io::stderr())
        })
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

/// Loads the model, binds, and serves until SIGINT/SIGTERM.
pub fn run(args: &ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let spec = args.engine_spec();
    spec.validate(spec.kind(), Purpose::Serve)?;
    let config = server_config_logged(args)?;
    let server = Server::start(args.engine_builder(), config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
        let info = server.info();
        let placement = info.placement.as_ref().map(|p| format!(" · {p}")).unwrap_or_default();
        eprintln!(
            "serving {} ({} engine, context {}{placement}) on http://{} · chat page at / · Ctrl-C stops",
            args.model,
            info.engine,
            info.spec.max_positions,
            listener.local_addr()?
        );
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
