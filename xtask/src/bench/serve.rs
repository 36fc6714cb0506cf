//! `cargo xtask bench serve`: offline serving throughput of the paged engine (vLLM) against a
//! static-batching baseline that reserves max-length contiguous KV per request (vLLM's
//! "Orca (Max)"), under the same KV memory budget, on synthetic ShareGPT-like and Alpaca-like
//! workloads; then the memory block sharing saves for parallel sampling and beam search.
//!
//! The workloads are [`Workload::standard`]'s, scaled by `--scale`. Every request generates
//! exactly its drawn output length (EOS ignored), as in vLLM's benchmarks.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Device;
use burn_llm::models::{CausalLm, DecoderSpec, Generator, Prompt, SamplingParams};
use burn_llm::paged::{EngineConfig, EngineStats, KvCacheMemory, LlmEngine, PreemptionMode};
use burn_llm::{BeamSearchParams, DeviceChoice, Engine, EngineDetails, Timing};
use rand::SeedableRng;
use serde::Serialize;

use super::workload::{Request, Workload};
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// The served model: OPT-family, random weights, small enough for many requests on a CPU.
const MODEL: &str = r#"{"model_type":"opt","vocab_size":8192,"hidden_size":256,"num_hidden_layers":4,"ffn_dim":1024,
    "num_attention_heads":4,"max_position_embeddings":2048,"do_layer_norm_before":true,
    "word_embed_proj_dim":256,"eos_token_id":2}"#;

/// Flags of `bench serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Requests per workload.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// KV-cache budget in tokens (both systems).
    #[arg(long, default_value_t = 16384)]
    kv_tokens: usize,
    /// Longest sequence (prompt + output) a request may reach; the baseline reserves this much.
    #[arg(long, default_value_t = 1024)]
    max_model_len: usize,
    /// Tokens per KV block of the paged engine.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Multiplies the paper's mean lengths (ShareGPT 161 in / 338 out, Alpaca 19.3 / 58.5).
    #[arg(long, default_value_t = 0.5)]
    scale: f64,
    /// Random seed of the workloads.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Online serving instead (vLLM §5.6): HTTP requests with Poisson arrivals to servers
    /// started on loopback, a sweep of rates (`serve-online.{json,md,png}`).
    #[arg(long)]
    online: bool,
    /// The online mode's flags.
    #[command(flatten)]
    online_args: super::online::OnlineArgs,
}

#[derive(Serialize)]
struct SystemResult {
    tokens_per_s: f64,
    seconds: f64,
    output_tokens: usize,
    average_batch: f64,
    kv_utilization: f64,
}

#[derive(Serialize)]
struct WorkloadResult {
    workload: Workload,
    mean_prompt: f64,
    mean_output: f64,
    paged: SystemResult,
    baseline: SystemResult,
    throughput_ratio: f64,
    preemptions: usize,
}

#[derive(Serialize)]
struct SharingResult {
    decoding: String,
    requests: usize,
    memory_saved: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    kv_tokens: usize,
    max_model_len: usize,
    block_size: usize,
    baseline_batch: usize,
    workloads: Vec<WorkloadResult>,
    sharing: Vec<SharingResult>,
}

/// The benchmark's synthetic model on `device` (shared with the online mode).
pub(super) fn model(device: &Device) -> Result<CausalLm, Box<dyn std::error::Error>> {
    let spec = DecoderSpec::from_json(MODEL, "synthetic:serve-opt".as_ref())?;
    Ok(CausalLm::random(spec, device)?)
}

/// The paged engine on all requests at once.
fn run_paged(
    device: &Device,
    args: &Args,
    reqs: &[Request],
) -> Result<(SystemResult, usize), Box<dyn std::error::Error>> {
    let config = EngineConfig {
        block_size: args.block_size,
        kv_cache_memory: KvCacheMemory::Blocks(args.kv_tokens / args.block_size),
        max_num_seqs: 256,
        max_num_batched_tokens: Some(args.max_model_len.max(2048)),
        preemption: PreemptionMode::Auto,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut engine: Box<dyn Engine> = Box::new(LlmEngine::from_parts(model(device)?, None, vec![], config)?);
    let started = Instant::now();
    for (i, (prompt, out)) in reqs.iter().enumerate() {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(*out) };
        engine.add_request(&i.to_string(), Prompt::Ids(prompt.clone()), params)?;
    }
    let mut output_tokens = 0;
    while engine.has_unfinished_requests() {
        for out in engine.step()? {
            output_tokens += out.sequences.iter().map(|d| d.token_ids.len()).sum::<usize>();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = paged_stats(engine.as_ref())?;
    Ok((
        SystemResult {
            tokens_per_s: output_tokens as f64 / seconds,
            seconds,
            output_tokens,
            average_batch: stats.average_batch(),
            kv_utilization: stats.kv_utilization(),
        },
        stats.swaps + stats.recomputes,
    ))
}

/// Static batching: batches of `kv_tokens / max_model_len` requests in arrival order, each run
/// until its longest request is done (finished requests idle in their reserved slots).
fn run_baseline(
    device: &Device,
    args: &Args,
    reqs: &[Request],
) -> Result<(SystemResult, usize), Box<dyn std::error::Error>> {
    let batch = (args.kv_tokens / args.max_model_len).max(1);
    let mut engine: Box<dyn Engine> = Box::new(Generator::new(model(device)?, None, vec![]));
    let started = Instant::now();
    let (mut steps, mut batched, mut stored, mut reserved) = (0usize, 0usize, 0f64, 0f64);
    for chunk in reqs.chunks(batch) {
        let longest = chunk.iter().map(|(_, o)| *o).max().unwrap_or(1);
        let prompts: Vec<Prompt> = chunk.iter().map(|(p, _)| Prompt::Ids(p.clone())).collect();
        engine.generate(&prompts, &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(longest) })?;
        for t in 0..longest {
            let live: Vec<&Request> = chunk.iter().filter(|(_, o)| t < *o).collect();
            batched += live.len();
            stored += live.iter().map(|(p, _)| (p.len() + t + 1) as f64).sum::<f64>();
            reserved += (batch * args.max_model_len) as f64;
        }
        steps += longest;
    }
    let seconds = started.elapsed().as_secs_f64();
    let output_tokens: usize = reqs.iter().map(|(_, o)| o).sum();
    Ok((
        SystemResult {
            tokens_per_s: output_tokens as f64 / seconds,
            seconds,
            output_tokens,
            average_batch: batched as f64 / steps.max(1) as f64,
            kv_utilization: stored / reserved.max(1.0),
        },
        batch,
    ))
}

/// Memory saved by sharing for `n = 4` parallel samples or beam width 4 (§5.6.3).
fn sharing(device: &Device, args: &Args, reqs: &[Request], beam: bool) -> Result<f64, Box<dyn std::error::Error>> {
    let config = EngineConfig {
        block_size: args.block_size,
        kv_cache_memory: KvCacheMemory::Blocks(4 * args.kv_tokens / args.block_size),
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut engine: Box<dyn Engine> = Box::new(LlmEngine::from_parts(model(device)?, None, vec![], config)?);
    for (i, (prompt, out)) in reqs.iter().enumerate() {
        let params = if beam {
            SamplingParams { beam: Some(BeamSearchParams::new(4)), ignore_eos: true, ..SamplingParams::greedy(*out) }
        } else {
            SamplingParams {
                n: 4,
                temperature: 1.0,
                seed: Some(i as u64),
                ignore_eos: true,
                ..SamplingParams::greedy(*out)
            }
        };
        engine.add_request(&i.to_string(), Prompt::Ids(prompt.clone()), params)?;
    }
    while engine.has_unfinished_requests() {
        engine.step()?;
    }
    Ok(paged_stats(engine.as_ref())?.sharing_saving())
}

/// The paged engine's scheduler and KV-cache counters, from its report.
fn paged_stats(engine: &dyn Engine) -> Result<EngineStats, Box<dyn std::error::Error>> {
    match engine.report(Timing::default()).details {
        EngineDetails::Paged(stats) => Ok(stats),
        _ => Err(format!("the {} engine reports no paged KV-cache counters", engine.name()).into()),
    }
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.online {
        return super::online::run(&args.online_args, args.device, args.seed, &args.out);
    }
    let device = args.device.device()?;
    let vocab = 8192;
    let workloads = Workload::standard(args.scale, args.max_model_len);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut results = Vec::new();
    let mut baseline_batch = 0;
    for w in workloads.iter().cloned() {
        let reqs = w.requests(args.requests, vocab, args.max_model_len, &mut rng);
        let mean_prompt = reqs.iter().map(|(p, _)| p.len()).sum::<usize>() as f64 / reqs.len() as f64;
        let mean_output = reqs.iter().map(|(_, o)| *o).sum::<usize>() as f64 / reqs.len() as f64;
        eprintln!("{}: {} requests, mean prompt {mean_prompt:.1}, mean output {mean_output:.1}", w.name, reqs.len());
        let (paged, preemptions) = run_paged(&device, &args, &reqs)?;
        eprintln!(
            "  paged:    {:.1} tokens/s, batch {:.1}, KV utilization {:.1}%",
            paged.tokens_per_s,
            paged.average_batch,
            100.0 * paged.kv_utilization
        );
        let (baseline, batch) = run_baseline(&device, &args, &reqs)?;
        baseline_batch = batch;
        eprintln!(
            "  baseline: {:.1} tokens/s, batch {:.1}, KV utilization {:.1}%",
            baseline.tokens_per_s,
            baseline.average_batch,
            100.0 * baseline.kv_utilization
        );
        results.push(WorkloadResult {
            throughput_ratio: paged.tokens_per_s / baseline.tokens_per_s,
            workload: w,
            mean_prompt,
            mean_output,
            paged,
            baseline,
            preemptions,
        });
    }
    let share_reqs = workloads[1].requests(32, vocab, args.max_model_len, &mut rng);
    let mut shared = Vec::new();
    for (label, beam) in [("parallel sampling n = 4", false), ("beam search, width 4", true)] {
        let saved = sharing(&device, &args, &share_reqs, beam)?;
        eprintln!("{label}: {:.1}% of KV memory saved by sharing", 100.0 * saved);
        shared.push(SharingResult { decoding: label.into(), requests: share_reqs.len(), memory_saved: saved });
    }

    let command = format!(
        "cargo xtask bench serve --device {} --requests {} --kv-tokens {} --max-model-len {} --block-size {} --scale {} --seed {}",
        args.device.name(),
        args.requests,
        args.kv_tokens,
        args.max_model_len,
        args.block_size,
        args.scale,
        args.seed
    );
    let header = Header::new(
        "serve",
        command,
        Some(args.device.name()),
        "synthetic:serve-opt (OPT, 4 layers, hidden 256, vocab 8192)",
    );
    let mut md = header.markdown("Serving throughput: paged engine vs static batching");
    md.push_str(&format!(
        "- model: OPT-family, 4 layers, hidden 256, vocab 8192, random weights\n\
         - KV budget: {} tokens for both systems; paged blocks of {} tokens; the baseline reserves {} tokens per request, so it batches {baseline_batch} requests\n\n",
        args.kv_tokens, args.block_size, args.max_model_len
    ));
    let percent = |x: f64| format!("{:.1}%", 100.0 * x);
    md.push_str(&table(
        &[
            ("workload", Left),
            ("prompt mean (σ)", Right),
            ("output mean (σ)", Right),
            ("paged tokens/s", Right),
            ("baseline tokens/s", Right),
            ("ratio", Right),
            ("paged batch", Right),
            ("baseline batch", Right),
            ("paged KV use", Right),
            ("baseline KV use", Right),
            ("preemptions", Right),
        ],
        results.iter().map(|r| {
            vec![
                r.workload.name.to_string(),
                format!("{:.1} ({})", r.mean_prompt, r.workload.prompt.sigma),
                format!("{:.1} ({})", r.mean_output, r.workload.output.sigma),
                format!("{:.1}", r.paged.tokens_per_s),
                format!("{:.1}", r.baseline.tokens_per_s),
                format!("{:.2}×", r.throughput_ratio),
                format!("{:.1}", r.paged.average_batch),
                format!("{:.1}", r.baseline.average_batch),
                percent(r.paged.kv_utilization),
                percent(r.baseline.kv_utilization),
                r.preemptions.to_string(),
            ]
        }),
    ));
    md.push_str("\n## Memory saved by block sharing\n\n");
    md.push_str(&table(
        &[("decoding", Left), ("requests", Right), ("KV memory saved", Right)],
        shared.iter().map(|s| vec![s.decoding.clone(), s.requests.to_string(), percent(s.memory_saved)]),
    ));
    let report = Report {
        header,
        kv_tokens: args.kv_tokens,
        max_model_len: args.max_model_len,
        block_size: args.block_size,
        baseline_batch,
        workloads: results,
        sharing: shared,
    };
    report::write(&args.out, "serve", &report, &md)?;
    Ok(())
}
