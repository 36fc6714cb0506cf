//! [`EngineSpec`]: what engine to build and how, in one place for every front end. The CLI and the
//! server parse it from their flags (it is a `clap::Args` group), the benches and library users fill
//! it in as a struct, and all of them build through [`EngineSpec::init`]:
//!
//! ```no_run
//! use burn_llm::spec::{EngineKind, EngineSpec, PagedSpec, Purpose};
//!
//! let spec = EngineSpec {
//!     engine: Some(EngineKind::Paged),
//!     exact_matmul: true,
//!     paged: PagedSpec { block_size: Some(32), ..PagedSpec::default() },
//!     ..EngineSpec::default()
//! };
//! let mut engine = spec.init("path/to/model".as_ref(), Purpose::Serve, &mut std::io::sink())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Burn's `Config` → `init` pattern: the spec is plain data (every field a flag, `None` where the
//! flag was not given), [`EngineSpec::validate`] checks every combination before any work, and a
//! combination the engine cannot honour is a [`SpecError`] naming the flag and what to use
//! instead, never a silently different run. The precision (`dtype`, `exact_matmul`) belongs to the
//! engine built ([`precision::Precise`]), not to the process.

mod auto_stages;
mod build;
mod disagg;
mod loaded;
mod parallel;
pub mod precision;
mod quant;
mod slicing;
mod validate;

use std::path::PathBuf;

use burn_llm_models::{Precision, Prompt, SamplingParams};
use burn_paged::{EngineConfig, KvCacheMemory, KvReservation, PreemptionMode, SchedulingPolicy};

use crate::device::DeviceChoice;

pub use auto_stages::default_memory;
pub use auto_stages::{AutoStagesError, SendProgress, interference_of, profile_stage_device, split_interference};
pub use parallel::{ParallelSpec, PrefillSlices, TensorParallelSize, parse_device};
pub use slicing::planned_slices;
pub use validate::SpecError;

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

impl EngineKind {
    /// The name `--engine` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Paged => "paged",
            Self::Offload => "offload",
        }
    }
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

/// What the engine is built for: the checks and the start-up planning differ.
#[derive(Debug, Clone, Copy)]
pub enum Purpose<'a> {
    /// Offline generation of these prompts with these parameters: the workload of the offload
    /// policy search and of an ExeGPT plan made at start-up.
    Generate {
        /// The prompts of the run.
        prompts: &'a [Prompt],
        /// Their sampling parameters.
        params: &'a SamplingParams,
    },
    /// An OpenAI-compatible server: requests arrive later, so the engine must run them step by
    /// step (the paged engine) and nothing can be planned from a workload at start-up.
    Serve,
}

/// Everything that decides which engine runs and how: device, precision, quantization, and the
/// settings of each engine and of parallelism. Every field is a flag of the examples and of the
/// server; `None` (or `false`) means the flag was not given and its default applies.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineSpec {
    /// Engine: `plain` (static batch, contiguous KV cache), `paged` (vLLM: paged KV cache,
    /// continuous batching, parallel sampling, beam search) or `offload` (FlexGen). Default: the
    /// example's own (the server's is `paged`).
    #[arg(long, value_enum)]
    pub engine: Option<EngineKind>,
    /// Device backend (default: the best one compiled in).
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// Floating-point type of weights, activations and KV cache: `f32`, `f16` or `bf16` (norms,
    /// attention softmax and logits compute in f32 whatever it is). Default: f16 on GPU devices
    /// (wgpu, vulkan, cuda, metal) that support it, f32 on flex and on GPUs without f16.
    #[arg(long)]
    pub dtype: Option<Precision>,
    /// Multiply GGUF-layout quantized weights by `f32` input rows on the CPU instead of rows
    /// quantized to 8 bits (llama.cpp's way, the default): slower, equal to the dequantized model.
    /// It holds for the engine built, whatever else runs in the process.
    #[arg(long)]
    pub exact_matmul: bool,
    /// Quantize attention and MLP weights at load (group-wise asymmetric, FlexGen style).
    #[arg(long, value_enum)]
    pub quantize: Option<WeightQuant>,
    /// `--quantize`: values per quantization group, along each weight's output channel (default 64).
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Store the KV cache as 4- or 8-bit group-quantized codes, in groups along the head
    /// dimension (`--kv-group-size`; the whole head when the group does not tile it). The paged
    /// engine's 4-bit keys are quantized per channel over each block's tokens instead (KIVI;
    /// `--block-size` a multiple of 8); the plain and offload engines group keys along the head.
    #[arg(long, value_parser = parse_kv_bits)]
    pub kv_quant: Option<u32>,
    /// `--kv-quant`: values per group along the head dimension (default 32 for 4 bits, 64 for 8):
    /// every engine's values and 8-bit keys; 4-bit keys in the plain and offload engines (the
    /// paged engine's 4-bit keys are grouped per channel over a block's tokens).
    #[arg(long)]
    pub kv_group_size: Option<usize>,
    /// FlexGen's name for `--quantize w4 --group-size 64` (4-bit group-wise weights, §5).
    #[arg(long)]
    pub compress_weight: bool,
    /// FlexGen's name for `--kv-quant 4 --kv-group-size 64` (4-bit group-wise KV cache; the paged
    /// engine keeps its 4-bit keys per channel).
    #[arg(long)]
    pub compress_cache: bool,
    /// Token for remote workers (`ws://HOST:PORT[#INDEX]` entries of `--devices`, served by the
    /// `worker` example); default: $BURN_LLM_WORKER_TOKEN.
    #[arg(long)]
    pub worker_token: Option<String>,
    /// The paged engine's settings.
    #[command(flatten)]
    pub paged: PagedSpec,
    /// The offloading engine's settings.
    #[command(flatten)]
    pub offload: OffloadSpec,
    /// Pipeline (and tensor) parallelism over several devices.
    #[command(flatten)]
    pub parallel: ParallelSpec,
}

/// Settings of the paged engine (`--engine paged`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PagedSpec {
    /// Paged engine: device memory for the KV-cache pool (`2GiB`, `512MiB`, a fraction of RAM on
    /// the CPU such as `0.4`, or `blocks:N`; default 1GiB).
    #[arg(long, value_parser = parse_kv_memory)]
    pub kv_cache_memory: Option<KvCacheMemory>,
    /// Paged engine: tokens per KV block (default 16; with `--kv-quant 4` a multiple of 8, the
    /// group of the per-channel keys).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Paged engine: sequences batched at once, at most (default 256).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Paged engine: tokens computed in one step, at most (default: the model's context length,
    /// at least 2048); a longer prompt is computed in chunks over several steps (refused with
    /// `--no-chunked-prefill`).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Paged engine: how to preempt when KV blocks run out: `auto` (default), `swap` or
    /// `recompute`.
    #[arg(long, value_parser = parse_preemption)]
    pub preemption: Option<PreemptionMode>,
    /// Paged engine: do not reuse the KV blocks of prompt prefixes seen before (vLLM's flag).
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Paged engine: compute every prompt in one step (vLLM's chunked prefill off): a prompt
    /// longer than `--max-num-batched-tokens` is then refused, and a long prompt's step delays
    /// the running sequences' next tokens. By default a prompt that does not fit a step's token
    /// budget is computed in chunks beside the decodes (under `--schedule fcfs` and the Orca
    /// baselines; ExeGPT's and static batching's prefills are whole prompts either way).
    #[arg(long)]
    pub no_chunked_prefill: bool,
    /// Paged engine: `fcfs` (vLLM, the default) or `exegpt` (ExeGPT's RRA schedule: prefill a
    /// batch, then a fixed number of decode iterations without prefills, repeated), from `--plan`
    /// or planned at start-up with `--latency-bound-s` (`--profile-json` reuses a saved profile);
    /// or a baseline of the vLLM paper: `orca-max`, `orca-pow2`, `orca-oracle` (Orca's
    /// iteration-level scheduling with contiguous per-request KV reservations of the model's
    /// length, prompt + output rounded to a power of two, or prompt + output) and `static`
    /// (request-level static batching).
    #[arg(long, value_enum)]
    pub schedule: Option<ScheduleKind>,
    /// `--schedule exegpt`: a saved ExeGPT plan (the output of `cargo run --example plan --
    /// schedule`), RRA on one device.
    #[arg(long, conflicts_with = "latency_bound_s")]
    pub plan: Option<PathBuf>,
    /// `--schedule exegpt`: plan at start-up for this bound on the latency of a request, in
    /// seconds (the prompts and `--max-new-tokens` are the workload, the KV-cache pool the memory),
    /// from the model's cost profile: `--profile-json`, or measured now on the device.
    #[arg(long)]
    pub latency_bound_s: Option<f64>,
    /// `--schedule exegpt` with `--latency-bound-s`: the planner's cost profile of the model on
    /// this device (format: `burn_plan::profile`); measured and written there when
    /// the file does not exist yet.
    #[arg(long, requires = "latency_bound_s")]
    pub profile_json: Option<PathBuf>,
    /// Library use: the scheduling policy itself (an ExeGPT plan made in memory, a baseline), in
    /// place of `--schedule`.
    #[arg(skip)]
    pub scheduling: Option<SchedulingPolicy>,
}

/// Settings of the offloading engine (`--engine offload`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OffloadSpec {
    /// Offload engine: device memory budget (`2GiB`, `512MiB`; default 2GiB), enforced.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_mem: Option<u64>,
    /// Offload engine: host memory budget (default 8GiB), enforced.
    #[arg(long, value_parser = parse_bytes)]
    pub cpu_mem: Option<u64>,
    /// Offload engine: directory of the disk tier (default: `~/.cache/burn-llm/offload/tensors`).
    #[arg(long)]
    pub offload_dir: Option<PathBuf>,
    /// Offload engine: `auto` (the default) searches FlexGen's cost model; `--percent` gives the
    /// policy instead.
    #[arg(long)]
    pub policy: Option<String>,
    /// Offload engine: FlexGen's placement percentages `wg wc cg cc hg hc` (the rest of each goes
    /// to disk).
    #[arg(long, num_args = 6, value_names = ["WG", "WC", "CG", "CC", "HG", "HC"])]
    pub percent: Option<Vec<f64>>,
    /// Offload engine, with `--percent`: GPU batch size (default 4).
    #[arg(long)]
    pub gbs: Option<u32>,
    /// Offload engine, with `--percent`: GPU batches per block (default 1).
    #[arg(long)]
    pub num_gb: Option<u32>,
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
    pub profile: Option<PathBuf>,
}

/// The CLI's default KV-cache pool of the paged engine.
pub const DEFAULT_KV_CACHE_MEMORY: KvCacheMemory = KvCacheMemory::Bytes(1 << 30);
/// The offloading engine's default device memory budget.
pub const DEFAULT_GPU_MEM: u64 = 2 << 30;
/// The offloading engine's default host memory budget.
pub const DEFAULT_CPU_MEM: u64 = 8 << 30;
/// `--quantize`'s default group size.
pub const DEFAULT_GROUP_SIZE: usize = 64;

impl EngineSpec {
    /// This spec with `default` as its engine where `--engine` was not given (each front end's
    /// own default: the example's, or the server's paged engine).
    pub fn with_default_engine(mut self, default: EngineKind) -> Self {
        self.engine.get_or_insert(default);
        self
    }

    /// The engine to build: `--engine`, else plain.
    pub fn kind(&self) -> EngineKind {
        self.engine.unwrap_or(EngineKind::Plain)
    }

    /// The device kind: `--device`, else the best one compiled in.
    pub fn device_choice(&self) -> DeviceChoice {
        self.device.unwrap_or_else(DeviceChoice::best_available)
    }

    /// The paged engine's configuration these settings describe (FCFS scheduling; the policy of
    /// `--schedule` is made at build, since an ExeGPT plan needs the model).
    pub fn engine_config(&self) -> EngineConfig {
        let p = &self.paged;
        let defaults = EngineConfig::default();
        EngineConfig {
            block_size: p.block_size.unwrap_or(defaults.block_size),
            kv_cache_memory: p.kv_cache_memory.unwrap_or(DEFAULT_KV_CACHE_MEMORY),
            // `validate` refuses --kv-quant with --compress-cache, the one error here.
            kv_quant: self.kv_quant_spec().ok().flatten(),
            max_num_seqs: p.max_num_seqs.unwrap_or(defaults.max_num_seqs),
            max_num_batched_tokens: p.max_num_batched_tokens,
            preemption: p.preemption.unwrap_or(defaults.preemption),
            enable_prefix_caching: !p.no_enable_prefix_caching,
            chunked_prefill: !p.no_chunked_prefill,
            micro_batches: self.parallel.micro_batches,
            ..defaults
        }
    }

    /// The scheduling policy given in memory, or the one `--schedule` names when it needs no plan
    /// (FCFS, Orca, static); `None` for ExeGPT, whose plan the build reads or makes.
    pub fn planless_policy(&self) -> Option<SchedulingPolicy> {
        if let Some(policy) = self.paged.scheduling {
            return Some(policy);
        }
        Some(match self.paged.schedule {
            Some(ScheduleKind::Exegpt) => return None,
            Some(ScheduleKind::OrcaMax) => SchedulingPolicy::Orca(KvReservation::Max),
            Some(ScheduleKind::OrcaPow2) => SchedulingPolicy::Orca(KvReservation::Pow2),
            Some(ScheduleKind::OrcaOracle) => SchedulingPolicy::Orca(KvReservation::Oracle),
            Some(ScheduleKind::Static) => SchedulingPolicy::Static,
            Some(ScheduleKind::Fcfs) | None => SchedulingPolicy::Fcfs,
        })
    }
}

impl From<&EngineConfig> for PagedSpec {
    /// The settings of a paged engine's configuration, so that code holding an [`EngineConfig`]
    /// builds through the spec too. The host swap space is not a setting of the spec: it stays
    /// at its default.
    fn from(config: &EngineConfig) -> Self {
        Self {
            kv_cache_memory: Some(config.kv_cache_memory),
            block_size: Some(config.block_size),
            max_num_seqs: Some(config.max_num_seqs),
            max_num_batched_tokens: config.max_num_batched_tokens,
            preemption: Some(config.preemption),
            no_enable_prefix_caching: !config.enable_prefix_caching,
            no_chunked_prefill: !config.chunked_prefill,
            scheduling: Some(config.scheduling),
            ..Self::default()
        }
    }
}

fn parse_kv_memory(text: &str) -> Result<KvCacheMemory, String> {
    text.parse()
}

fn parse_preemption(text: &str) -> Result<PreemptionMode, String> {
    text.parse()
}

/// `2GiB`, `512MiB`, `1.5GB`, or plain bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    match text.parse::<KvCacheMemory>()? {
        KvCacheMemory::Bytes(b) => Ok(b),
        _ => Err(format!("`{text}`: give a size such as 2GiB or 512MiB")),
    }
}

fn parse_kv_bits(text: &str) -> Result<u32, String> {
    match text {
        "4" => Ok(4),
        "8" => Ok(8),
        other => Err(format!("`{other}`: the KV cache can be quantized to 4 or 8 bits")),
    }
}
