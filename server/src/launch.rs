//! The `serve` example's command line: the engine flags every example takes ([`EngineSpec`],
//! `--engine paged` by default) plus the server's own, and the entry point that serves until
//! SIGINT or SIGTERM. The prompt and sampling flags of the `*_generate` examples are not taken:
//! each request brings its own. `--model` repeats to serve several models; see [`model_args`]
//! for names and per-model engine flags.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};

use burn_plan::serving::ServingWorkload;
use burn_plan::sim::Admission;

use super::model_args::{self, GivenFlags, ServedModelSpec, ServingFlags};
use super::placement::ServingPlacement;
use super::{ModelEntry, Server, ServerConfig, ServerError};
use burn_llm::spec::{EngineKind, EngineSpec, Purpose};

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
    /// Place the models on groups of the `--devices` pool (AlpaServe): `auto` (planned on the
    /// simulator from start-up profiles and `--workload`), `replicate` (whole replicas on single
    /// devices) or `manual:NAME=0,1;NAME=2` (each model's device groups by hand; see the README).
    #[arg(long)]
    pub placement: Option<super::placement::PlacementChoice>,
    /// `--placement`: the workload JSON (per model: rate, cv, slo_s, optional prompt_tokens and
    /// max_tokens; duration_s, seed) the placement is planned for and predicted on.
    #[arg(long, value_name = "FILE.json")]
    pub workload: Option<std::path::PathBuf>,
    /// `slo`: reject at arrival (503, code `slo_unattainable`) a request that the placement
    /// predicts would miss its model's SLO, as AlpaServe does (needs --placement and --workload;
    /// the prediction drops the same requests). `all`: serve every request, however late.
    #[arg(long, value_enum, default_value_t = Admission::All)]
    pub admission: Admission,
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
    pub fn model_specs(&self) -> Result<Vec<ServedModelSpec>, ServerError> {
        let names = model_args::names(&self.model, &self.served_model_name)?;
        super::models::check_names(names.iter().map(String::as_str))?;
        let overrides = model_args::overrides(&self.model_engine_args, &names)?;
        let mut specs = Vec::with_capacity(names.len());
        for (name, model) in names.into_iter().zip(&self.model) {
            let (spec, serving) = match overrides.iter().find(|(n, _)| *n == name) {
                Some((_, flags)) => {
                    let given = self.given_engine_flags.as_ref().ok_or_else(|| {
                        ServerError::Config(
                            "--model-engine-args needs the flags as given: parse them with ServeArgs::try_parse_from"
                                .into(),
                        )
                    })?;
                    let (spec, serving) = given
                        .model_spec(flags)
                        .map_err(|e| ServerError::Config(format!("--model-engine-args {name}: {e}")))?;
                    (spec.with_default_engine(EngineKind::Paged), serving)
                }
                None => (self.engine_spec(), ServingFlags::default()),
            };
            // With --placement, --device-memory and --stage-profile-dir describe the pool.
            let mut checked = spec.clone();
            if self.placement.is_some() {
                checked.parallel.device_memory = None;
                checked.parallel.stage_profile_dir = None;
            }
            checked.validate(spec.kind(), Purpose::Serve).map_err(|e| {
                let whose = if self.model.len() > 1 { format!("model `{name}`: ") } else { String::new() };
                ServerError::Config(format!("{whose}{e}"))
            })?;
            let chat_template = match &serving.chat_template {
                Some(path) => {
                    Some(read_template(path).map_err(|e| ServerError::Config(format!("model `{name}`: {e}")))?)
                }
                None => None,
            };
            let max_waiting = serving.max_waiting;
            specs.push(ServedModelSpec { name, source: model.clone(), spec, chat_template, max_waiting });
        }
        Ok(specs)
    }

    /// The models to serve, checked as [`ServeArgs::model_specs`] does (and placed, with
    /// `--placement`: see [`ServeArgs::placed_entries`]); each builds its engine on its own thread
    /// when the server starts.
    pub fn model_entries(&self) -> Result<Vec<ModelEntry>, ServerError> {
        Ok(self.placed_entries(&mut std::io::sink())?.0)
    }

    /// The models to serve and, with `--placement`, their placement: profiles and the placement
    /// go to `log`; each model's replicas are the groups serving it.
    pub fn placed_entries(
        &self,
        log: &mut dyn std::io::Write,
    ) -> Result<(Vec<ModelEntry>, Option<ServingPlacement>), ServerError> {
        let specs = self.model_specs()?;
        if self.admission == Admission::Slo && (self.placement.is_none() || self.workload.is_none()) {
            return Err(ServerError::Config(
                "--admission slo predicts each request's finish from the placement and each model's slo_s: \
                 add --placement and --workload (or drop --admission)"
                    .into(),
            ));
        }
        let Some(choice) = &self.placement else {
            if self.workload.is_some() {
                return Err(ServerError::Config(
                    "--workload is read by --placement: add --placement auto (or drop --workload)".into(),
                ));
            }
            return Ok((specs.into_iter().map(ServedModelSpec::entry).collect(), None));
        };
        let pool = self.engine.parallel.devices.clone().ok_or_else(|| {
            ServerError::Config(
                "--placement places the models on the --devices pool: list it (e.g. --devices ws://h1:9000,ws://h2:9000)"
                    .into(),
            )
        })?;
        let workload = match &self.workload {
            Some(path) => Some(read_workload(path)?),
            None => None,
        };
        let placement = super::placement::place(choice, &specs, &pool, workload.as_ref(), self.admission, log)?;
        for line in placement.lines() {
            let _ = writeln!(log, "{line}");
        }
        let mut gates = placement.gates();
        let mut entries = Vec::with_capacity(specs.len());
        for model in specs {
            let mut replicas = placement.replica_specs(&model).into_iter();
            let Some(first) = replicas.next() else {
                return Err(ServerError::Config(format!("placement: model `{}` is on no group", model.name)));
            };
            let mut entry = ServedModelSpec { spec: first, ..model.clone() }.entry();
            entry.replicas = replicas.map(|spec| ServedModelSpec { spec, ..model.clone() }.entry().build).collect();
            entry.gates = gates.remove(&model.name).unwrap_or_default();
            entries.push(entry);
        }
        Ok((entries, Some(placement)))
    }

    /// Places (with `--placement`) and loads the models and starts their engines, with `config`
    /// (from [`ServeArgs::server_config`]) showing the placement on `/health`; the placement and
    /// its profiling go to `log`.
    pub fn start_server(&self, mut config: ServerConfig, log: &mut dyn std::io::Write) -> Result<Server, ServerError> {
        let (models, placement) = self.placed_entries(log)?;
        config.placement = placement.as_ref().map(ServingPlacement::to_json);
        Server::start_models(models, config)
    }

    /// The server settings these flags describe (the key from the flag or the environment).
    /// `served_model_name` is the first model's name.
    pub fn server_config(&self) -> Result<ServerConfig, Box<dyn std::error::Error>> {
        let name = model_args::names(&self.model, &self.served_model_name)?.into_iter().next();
        let chat_template = match &self.chat_template {
            Some(path) => Some(read_template(path)?),
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
            placement: None,
            request_timeout,
            allowed_origins: self.allowed_origins.clone(),
        })
    }

    /// The shared engine spec, with the server's default engine (paged).
    pub fn engine_spec(&self) -> EngineSpec {
        self.engine.clone().with_default_engine(EngineKind::Paged)
    }
}

/// A `--chat-template` file's text.
fn read_template(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("--chat-template {}: cannot read it: {e}", path.display()))
}

/// The `--workload` file, parsed (its fields are checked against the served models later).
fn read_workload(path: &std::path::Path) -> Result<ServingWorkload, ServerError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ServerError::Config(format!("--workload {}: cannot read it: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        ServerError::Config(format!(
            "--workload {}: {e}; write {{\"models\": [{{\"model\": NAME, \"rate\": R, \"cv\": C, \"slo_s\": S}}]}}",
            path.display()
        ))
    })
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
    let config = server_config_logged(args)?;
    let server = args.start_server(config, &mut std::io::stderr())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
        for model in server.models() {
            let info = &model.engine.info;
            let placement = info.placement.as_ref().map(|p| format!(" · {p}")).unwrap_or_default();
            let replicas = match model.replicas.len() {
                0 => String::new(),
                n => format!(", {} replicas", n + 1),
            };
            eprintln!(
                "model `{}`: {} ({} engine, context {}{placement}{replicas})",
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
