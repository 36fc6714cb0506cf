//! `cargo xtask bench offload`: FlexGen's workload shape (fixed prompt length, 32 generated
//! tokens, dummy weights as the paper allows for throughput) on a model larger than the device
//! budget, comparing in one run: the searched policy, FlexGen's "DeepSpeed" policy (all weights
//! on the host, one GPU batch, cache on the device), the "Accelerate" policy (some weights on the
//! device, the rest on the host, no overlap), and the searched policy without overlap and
//! without CPU attention (the paper's ablation). Reports throughput, effective batch, latency and
//! predicted vs measured throughput.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::models::weights::RandomWeights;
use burn_llm::models::{DecoderSpec, Prompt, SamplingParams};
use burn_llm::offload::policy::{
    HardwareProfile, OffloadWorkload, Placement, Policy, PolicyShape, SearchSpace, Tier, TierBytes,
    largest_fitting_batch,
};
use burn_llm::offload::{OffloadConfig, OffloadEngine, PolicyChoice, model_shape};
use burn_llm::{DeviceChoice, Engine, EngineDetails};
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// The benchmarked model: OPT family, dummy weights, about 340 MB of `f32` layers (sized for a
/// 2-core CPU; the device budget below is what makes it "not fit").
const MODEL: &str = r#"{"model_type":"opt","vocab_size":8192,"hidden_size":768,"num_hidden_layers":12,"ffn_dim":3072,
    "num_attention_heads":12,"max_position_embeddings":2048,"do_layer_norm_before":true,
    "word_embed_proj_dim":768,"eos_token_id":2}"#;

/// Most sequences per block any policy may use (FlexGen's "unbounded dataset" would make blocks
/// of thousands of sequences, too many for a CPU run).
const MAX_BLOCK: u64 = 128;

/// Flags of `bench offload`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Device memory budget in MiB (enforced).
    #[arg(long, default_value_t = 256)]
    gpu_mem_mib: u64,
    /// Host memory budget in MiB (enforced).
    #[arg(long, default_value_t = 8192)]
    cpu_mem_mib: u64,
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
    searched_vs_deepspeed: f64,
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
        gpu_mem: args.gpu_mem_mib << 20,
        cpu_mem: args.cpu_mem_mib << 20,
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
    let device = args.device.device()?;
    let spec = DecoderSpec::from_json(MODEL, "synthetic:offload-opt".as_ref())?;
    let shape = model_shape(&spec);
    let workload = workload(&args);
    let mut hw = burn_llm::offload::profiler::profile(&device, &Device::flex(), &args.offload_dir.join("profile"), 64)?;
    hw.gpu_memory_bytes = args.gpu_mem_mib << 20;
    hw.cpu_memory_bytes = args.cpu_mem_mib << 20;
    eprintln!("profile: {hw:?}");
    let reserved = TierBytes { gpu: ((spec.vocab_size * spec.hidden_size * 4) * 2) as f64, cpu: 0.0, disk: 0.0 };
    let available = TierBytes::available(&hw, &reserved);
    let fit = |build: &dyn Fn(u32) -> Policy| -> Result<Policy, Box<dyn std::error::Error>> {
        largest_fitting_batch(&hw, &shape, &workload, &available, MAX_BLOCK as u32, build)?
            .map(|(policy, _)| policy)
            .ok_or_else(|| "the baseline policy does not fit the budget even at batch 1".into())
    };
    // The baselines keep their weights in host memory, or on disk when the host budget cannot
    // hold them (ZeRO-Inference's NVMe offload, Accelerate's `offload_folder`).
    let deepspeed = fit(&|gbs| Policy::deepspeed_like(gbs, Tier::Cpu))
        .or_else(|_| fit(&|gbs| Policy::deepspeed_like(gbs, Tier::Disk)))?;
    let weights = shape.layer_weight_bytes() * f64::from(shape.num_layers);
    let on_gpu = (hw.gpu_memory_bytes as f64 * 0.5 / weights).min(1.0);
    let on_cpu = (hw.cpu_memory_bytes as f64 * 0.5 / weights).min(1.0 - on_gpu);
    let accelerate =
        fit(&|gbs| Policy::accelerate_like(gbs, Placement::from_array([on_gpu, on_cpu, 1.0 - on_gpu - on_cpu])))?;
    let searched = run_policy("searched", &spec, PolicyChoice::Auto(space()), &args, &hw, &device)?;
    let mut rows = vec![searched];
    let searched = rows[0].policy;
    let no_overlap = Policy { shape: PolicyShape { overlap: false, ..searched.shape }, ..searched };
    let no_cpu_attention = SearchSpace { cpu_attention: vec![false], ..space() };
    rows.push(run_policy("searched, no overlap", &spec, PolicyChoice::Fixed(no_overlap), &args, &hw, &device)?);
    rows.push(run_policy(
        "searched, no CPU attention",
        &spec,
        PolicyChoice::Auto(no_cpu_attention),
        &args,
        &hw,
        &device,
    )?);
    rows.push(run_policy("DeepSpeed policy", &spec, PolicyChoice::Fixed(deepspeed), &args, &hw, &device)?);
    rows.push(run_policy("Accelerate policy", &spec, PolicyChoice::Fixed(accelerate), &args, &hw, &device)?);
    let ratio = rows[0].tokens_per_s / rows[3].tokens_per_s;

    let command = format!(
        "cargo xtask bench offload --device {} --gpu-mem-mib {} --cpu-mem-mib {} --prompt-len {} --gen-len {} --name {}",
        args.device.name(),
        args.gpu_mem_mib,
        args.cpu_mem_mib,
        args.prompt_len,
        args.gen_len,
        args.name
    );
    let header = Header::new(
        "offload",
        command,
        Some(args.device.name()),
        "synthetic:offload-opt (OPT, 12 layers, hidden 768, vocab 8192)",
    );
    let layers_gib = shape.layer_weight_bytes() * f64::from(shape.num_layers) / (1u64 << 30) as f64;
    let mut md = header.markdown("Offloading throughput (FlexGen policies)");
    md.push_str(&format!(
        "- model: OPT family, 12 layers, hidden 768, dummy weights, {layers_gib:.2} GiB of f32 layers; device budget {} MiB, host budget {} MiB\n\
         - workload: prompt {} tokens, {} generated tokens\n\n",
        args.gpu_mem_mib, args.cpu_mem_mib, args.prompt_len, args.gen_len
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
    md.push_str(&format!("\nSearched policy vs DeepSpeed policy: {ratio:.2}×\n"));
    let report = Report { header, hardware: hw, rows, searched_vs_deepspeed: ratio };
    report::write(&args.out, &args.name, &report, &md)?;
    Ok(())
}
