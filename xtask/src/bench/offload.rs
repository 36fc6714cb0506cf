//! `cargo xtask bench offload`: FlexGen's workload shape (fixed prompt length, 32 generated
//! tokens, dummy weights as the paper allows for throughput) on a model larger than the device
//! budget, comparing in one run: the searched policy, FlexGen's "DeepSpeed" policy (all weights
//! on the host, one GPU batch, cache on the device), the "Accelerate" policy (some weights on the
//! device, the rest on the host, no overlap), and the searched policy without overlap and
//! without CPU attention (the paper's ablation). Reports throughput, effective batch, latency and
//! predicted vs measured throughput. `--model synthetic:opt-30b --gpu-mem 16GiB --dtype f16` is
//! FlexGen's own setting (OPT-30B on a 16 GB GPU); the default is a model sized for a CPU.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::models::units::fmt_bytes;
use burn_llm::models::weights::RandomWeights;
use burn_llm::models::{DecoderSpec, Precision, Prompt, SamplingParams};
use burn_llm::offload::policy::{
    HardwareProfile, OffloadWorkload, Placement, Policy, PolicyShape, SearchSpace, Tier, TierBytes,
    largest_fitting_batch,
};
use burn_llm::offload::{OffloadConfig, OffloadEngine, PolicyChoice, model_shape};
use burn_llm::spec::parse_bytes;
use burn_llm::{DeviceChoice, Engine, EngineDetails};
use serde::Serialize;

use super::synthetic;
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Most sequences per block any policy may use (FlexGen's "unbounded dataset" would make blocks
/// of thousands of sequences, too many for a CPU run).
const MAX_BLOCK: u64 = 128;

/// Flags of `bench offload`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// A built-in shape with dummy weights (synthetic:offload-opt, about 340 MB of `f32` layers
    /// sized for a 2-core CPU; synthetic:opt-30b is FlexGen's setting; see `bench generate` for the others).
    #[arg(long, default_value = "synthetic:offload-opt")]
    model: String,
    /// Floating-point type of weights, activations and KV cache; default: f16 on GPU devices, f32
    /// on flex.
    #[arg(long)]
    dtype: Option<Precision>,
    /// Device memory budget (enforced), e.g. 256MiB or 16GiB.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    gpu_mem: u64,
    /// Host memory budget (enforced).
    #[arg(long, default_value = "8GiB", value_parser = parse_bytes)]
    cpu_mem: u64,
    /// Policies to run, in order: searched, no-overlap, no-cpu-attention, deepspeed, accelerate
    /// (the searched policy always runs first: the ablations derive from it).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "searched,no-overlap,no-cpu-attention,deepspeed,accelerate"
    )]
    policies: Vec<Which>,
    /// Prompt length.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// Generated tokens per prompt.
    #[arg(long, default_value_t = 32)]
    gen_len: usize,
    /// Directory of the disk tier.
    #[arg(long, default_value = "target/offload-bench")]
    offload_dir: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Name of the result files (`<name>.json`, `<name>.md`), to keep runs with different
    /// budgets side by side.
    #[arg(long, default_value = "offload")]
    name: String,
}

/// One policy of the comparison.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Which {
    Searched,
    NoOverlap,
    NoCpuAttention,
    Deepspeed,
    Accelerate,
}

impl Which {
    fn label(self) -> &'static str {
        match self {
            Which::Searched => "searched",
            Which::NoOverlap => "searched, no overlap",
            Which::NoCpuAttention => "searched, no CPU attention",
            Which::Deepspeed => "DeepSpeed policy",
            Which::Accelerate => "Accelerate policy",
        }
    }
}

#[derive(Serialize)]
struct Row {
    name: &'static str,
    policy: Policy,
    effective_batch: usize,
    tokens_per_s: f64,
    predicted_tokens_per_s: f64,
    prediction_error: f64,
    latency_s: f64,
    gpu_peak_bytes: u64,
    cpu_peak_bytes: u64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    hardware: HardwareProfile,
    rows: Vec<Row>,
    /// Searched ÷ DeepSpeed-like throughput, when both ran.
    searched_vs_deepspeed: Option<f64>,
    /// Searched ÷ Accelerate-like throughput, when both ran.
    searched_vs_accelerate: Option<f64>,
}

fn run_policy(
    name: &'static str,
    spec: &DecoderSpec,
    choice: PolicyChoice,
    args: &Args,
    hw: &HardwareProfile,
    device: &Device,
) -> Result<Row, Box<dyn std::error::Error>> {
    let config = OffloadConfig {
        gpu_mem: args.gpu_mem,
        cpu_mem: args.cpu_mem,
        offload_dir: args.offload_dir.join(name.replace(' ', "-")),
        policy: choice,
        hardware: hw.clone(),
        workload: workload(args),
        host: Device::flex(),
        attention_sparsity: None,
        threads: None,
    };
    let offload = OffloadEngine::new(spec.clone(), &RandomWeights::default(), None, vec![], config, device)?;
    // One block of prompts: the policy's gpu batch size × number of gpu batches.
    let block = (offload.policy().shape.gpu_batch_size * offload.policy().shape.num_gpu_batches) as usize;
    let mut engine: Box<dyn Engine> = Box::new(offload);
    let prompts: Vec<Prompt> = (0..block)
        .map(|i| Prompt::Ids((0..args.prompt_len).map(|t| 3 + ((t * 31 + i * 7) % 8000) as u32).collect()))
        .collect();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(args.gen_len) };
    let report = engine.generate(&prompts, &params)?.report;
    let (EngineDetails::Offload(run), Some(memory)) = (&report.details, report.memory) else {
        return Err(format!("the {} engine reported no offloading policy or peak memory", report.engine).into());
    };
    let row = Row {
        name,
        policy: run.policy,
        effective_batch: run.effective_batch,
        tokens_per_s: run.measured_tokens_per_s,
        predicted_tokens_per_s: run.predicted_tokens_per_s,
        prediction_error: run.predicted_tokens_per_s / run.measured_tokens_per_s - 1.0,
        latency_s: report.timing.prefill_s + report.timing.decode_s,
        gpu_peak_bytes: memory.gpu_peak_bytes,
        cpu_peak_bytes: memory.cpu_peak_bytes,
    };
    eprintln!(
        "{name}: batch {} → {:.2} tokens/s (predicted {:.2}), latency {:.1} s",
        row.effective_batch, row.tokens_per_s, row.predicted_tokens_per_s, row.latency_s
    );
    Ok(row)
}

/// A byte count as `--gpu-mem` / `--cpu-mem` take it back.
fn mib_flag(bytes: u64) -> String {
    format!("{}MiB", bytes >> 20)
}

fn workload(args: &Args) -> OffloadWorkload {
    OffloadWorkload {
        num_prompts: Some(MAX_BLOCK),
        ..OffloadWorkload::new(args.prompt_len as u64, args.gen_len as u64)
    }
}

/// FlexGen's search space with blocks of at most [`MAX_BLOCK`] sequences.
fn space() -> SearchSpace {
    SearchSpace {
        gpu_batch_sizes: (1..=MAX_BLOCK as u32).collect(),
        num_gpu_batches: (1..=4).collect(),
        ..SearchSpace::default()
    }
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.policies.first() != Some(&Which::Searched) {
        return Err("--policies must start with `searched`: the ablations derive from the searched policy".into());
    }
    let device = args.device.device()?;
    let (dtype, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let spec = synthetic::spec(&args.model, dtype)?;
    let shape = model_shape(&spec);
    let workload = workload(&args);
    let mut hw = burn_llm::offload::profiler::profile(&device, &Device::flex(), &args.offload_dir.join("profile"), 64)?;
    hw.gpu_memory_bytes = args.gpu_mem;
    hw.cpu_memory_bytes = args.cpu_mem;
    eprintln!("profile: {hw:?}");
    // Embeddings and LM head stay on the device.
    let reserved =
        TierBytes { gpu: (spec.vocab_size * spec.hidden_size * dtype.size_bytes() * 2) as f64, cpu: 0.0, disk: 0.0 };
    let available = TierBytes::available(&hw, &reserved);
    let fit = |build: &dyn Fn(u32) -> Policy| -> Result<Policy, Box<dyn std::error::Error>> {
        largest_fitting_batch(&hw, &shape, &workload, &available, MAX_BLOCK as u32, build)?
            .map(|(policy, _)| policy)
            .ok_or_else(|| "the baseline policy does not fit the budget even at batch 1".into())
    };
    // Every fixed policy is sized before anything runs, so a budget a baseline cannot fit fails
    // at once rather than after the searched policy's run.
    let mut choices = Vec::with_capacity(args.policies.len());
    for &which in &args.policies {
        choices.push(match which {
            Which::Searched => Some(PolicyChoice::Auto(space())),
            // Derived from the searched policy once it has run.
            Which::NoOverlap => None,
            Which::NoCpuAttention => Some(PolicyChoice::Auto(SearchSpace { cpu_attention: vec![false], ..space() })),
            // The baselines keep their weights in host memory, or on disk when the host budget
            // cannot hold them (ZeRO-Inference's NVMe offload, Accelerate's `offload_folder`).
            Which::Deepspeed => Some(PolicyChoice::Fixed(
                fit(&|gbs| Policy::deepspeed_like(gbs, Tier::Cpu))
                    .or_else(|_| fit(&|gbs| Policy::deepspeed_like(gbs, Tier::Disk)))
                    .map_err(|e| format!("DeepSpeed policy: {e}"))?,
            )),
            Which::Accelerate => {
                let weights = shape.layer_weight_bytes() * f64::from(shape.num_layers);
                let on_gpu = (hw.gpu_memory_bytes as f64 * 0.5 / weights).min(1.0);
                let on_cpu = (hw.cpu_memory_bytes as f64 * 0.5 / weights).min(1.0 - on_gpu);
                let split = Placement::from_array([on_gpu, on_cpu, 1.0 - on_gpu - on_cpu]);
                Some(PolicyChoice::Fixed(
                    fit(&|gbs| Policy::accelerate_like(gbs, split)).map_err(|e| format!("Accelerate policy: {e}"))?,
                ))
            }
        });
    }
    let mut rows: Vec<Row> = Vec::new();
    for (&which, choice) in args.policies.iter().zip(choices) {
        let choice = choice.unwrap_or_else(|| {
            let searched = rows[0].policy;
            PolicyChoice::Fixed(Policy { shape: PolicyShape { overlap: false, ..searched.shape }, ..searched })
        });
        rows.push(run_policy(which.label(), &spec, choice, &args, &hw, &device)?);
    }
    let ratio = |other: Which| {
        let row = args.policies.iter().position(|w| *w == other)?;
        Some(rows[0].tokens_per_s / rows[row].tokens_per_s)
    };
    let (vs_deepspeed, vs_accelerate) = (ratio(Which::Deepspeed), ratio(Which::Accelerate));

    let command = format!(
        "cargo xtask bench offload --device {} --model {} --dtype {} --gpu-mem {} --cpu-mem {} --prompt-len {} --gen-len {} --policies {} --name {}",
        args.device.name(),
        args.model,
        dtype.name(),
        mib_flag(args.gpu_mem),
        mib_flag(args.cpu_mem),
        args.prompt_len,
        args.gen_len,
        args.policies
            .iter()
            .filter_map(|w| clap::ValueEnum::to_possible_value(w).map(|v| v.get_name().to_string()))
            .collect::<Vec<_>>()
            .join(","),
        args.name
    );
    let header = Header::new("offload", command, Some(args.device.name()), &args.model);
    let layers_gib = shape.layer_weight_bytes() * f64::from(shape.num_layers) / (1u64 << 30) as f64;
    let mut md = header.markdown("Offloading throughput (FlexGen policies)");
    md.push_str(&format!(
        "- model: {} ({} layers, hidden {}), dummy weights, {layers_gib:.2} GiB of {} layers; device budget {}, host budget {}\n\
         - workload: prompt {} tokens, {} generated tokens\n\n",
        args.model,
        spec.num_layers,
        spec.hidden_size,
        dtype.name(),
        fmt_bytes(args.gpu_mem),
        fmt_bytes(args.cpu_mem),
        args.prompt_len,
        args.gen_len
    ));
    let split = |p: Placement| format!("{:.0}/{:.0}/{:.0}%", 100.0 * p.gpu, 100.0 * p.cpu, 100.0 * p.disk);
    let mib = |bytes: u64| format!("{:.0}", bytes as f64 / (1u64 << 20) as f64);
    md.push_str(&table(
        &[
            ("policy", Left),
            ("gbs × batches", Right),
            ("weights gpu/cpu/disk", Left),
            ("cache gpu/cpu/disk", Left),
            ("activations gpu/cpu/disk", Left),
            ("CPU attn", Left),
            ("overlap", Left),
            ("tokens/s", Right),
            ("predicted", Right),
            ("error", Right),
            ("latency s", Right),
            ("device peak MiB", Right),
            ("host peak MiB", Right),
        ],
        rows.iter().map(|r| {
            let p = &r.policy;
            vec![
                r.name.to_string(),
                format!("{} × {}", p.shape.gpu_batch_size, p.shape.num_gpu_batches),
                split(p.weights),
                split(p.cache),
                split(p.activations),
                p.shape.cpu_attention.to_string(),
                p.shape.overlap.to_string(),
                format!("{:.2}", r.tokens_per_s),
                format!("{:.2}", r.predicted_tokens_per_s),
                format!("{:+.0}%", 100.0 * r.prediction_error),
                format!("{:.1}", r.latency_s),
                mib(r.gpu_peak_bytes),
                mib(r.cpu_peak_bytes),
            ]
        }),
    ));
    for (name, ratio) in [("DeepSpeed", vs_deepspeed), ("Accelerate", vs_accelerate)] {
        if let Some(ratio) = ratio {
            md.push_str(&format!("\nSearched policy vs {name} policy: {ratio:.2}×\n"));
        }
    }
    let report = Report {
        header,
        hardware: hw,
        rows,
        searched_vs_deepspeed: vs_deepspeed,
        searched_vs_accelerate: vs_accelerate,
    };
    report::write(&args.out, &args.name, &report, &md)?;
    Ok(())
}
