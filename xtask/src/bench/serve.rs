//! `cargo xtask bench serve`: offline serving throughput of the paged engine (vLLM) against the
//! baselines of the vLLM paper (thesis §5.6.1) under the same KV memory budget, on synthetic
//! ShareGPT-like and Alpaca-like workloads; then the memory block sharing saves for parallel
//! sampling and beam search, and vLLM's throughput with 8-bit KV blocks against float ones in the
//! same KV budget in bytes (more blocks, larger batches).
//!
//! Every system is the paged engine with another [`SchedulingPolicy`], so they share the model,
//! the kernels and the step loop and differ only in how they admit requests and hold KV memory:
//! - **vLLM**: FCFS iteration-level scheduling, KV blocks taken as tokens arrive;
//! - **Orca (Oracle / Pow2 / Max)**: iteration-level scheduling (a finished request's seat is
//!   refilled at the next step), each admitted request reserving contiguous KV for its prompt plus
//!   its exact output, its output rounded up to a power of two, or the model's maximum length;
//! - **static batching**: request-level (FasterTransformer-style): a batch of max-length
//!   reservations runs until its longest request is done before the next batch starts.
//!
//! The workloads are [`SyntheticWorkload::standard`]'s, scaled by `--scale`. Every request generates
//! exactly its drawn output length (EOS ignored), as in vLLM's benchmarks, so Orca (Oracle)'s
//! reservation is exact. All requests arrive at once: this measures throughput, not latency at a
//! request rate (the online benchmark does that).

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Device;
use burn_llm::models::{CausalLm, DecoderSpec, KvLayout, Precision, Prompt, SamplingParams};
use burn_llm::paged::cache::PagedKvCache;
use burn_llm::paged::{EngineStats, KvCacheMemory, KvReservation, PreemptionMode, SchedulingPolicy};
use burn_llm::spec::PagedSpec;
use burn_llm::{BeamSearchParams, DeviceChoice, Engine, EngineDetails, EngineKind, EngineSpec, Purpose, Timing};
use rand::SeedableRng;
use serde::Serialize;

use super::workload::{Request, SyntheticWorkload};
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// The served model: OPT-family, random weights, small enough for many requests on a CPU; its
/// maximum length (what Orca (Max) reserves) is `--max-model-len`.
fn model_json(max_model_len: usize) -> String {
    format!(
        r#"{{"model_type":"opt","vocab_size":8192,"hidden_size":256,"num_hidden_layers":4,"ffn_dim":1024,
        "num_attention_heads":4,"max_position_embeddings":{max_model_len},"do_layer_norm_before":true,
        "word_embed_proj_dim":256,"eos_token_id":2}}"#
    )
}

/// The systems compared, in table order: label and the paged engine's policy.
const SYSTEMS: [(&str, SchedulingPolicy); 5] = [
    ("vLLM (paged)", SchedulingPolicy::Fcfs),
    ("Orca (Oracle)", SchedulingPolicy::Orca(KvReservation::Oracle)),
    ("Orca (Pow2)", SchedulingPolicy::Orca(KvReservation::Pow2)),
    ("Orca (Max)", SchedulingPolicy::Orca(KvReservation::Max)),
    ("static batching", SchedulingPolicy::Static),
];

/// Flags of `bench serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// The served model's shape, random weights: synthetic:serve-opt (OPT, 4 layers, hidden 256,
    /// sized for a CPU) or a built-in shape of `bench generate` (e.g. synthetic:opt-1.3b on a GPU),
    /// its maximum length set to `--max-model-len`.
    #[arg(long, default_value = SERVE_OPT)]
    model: String,
    /// Floating-point type of weights, activations and KV cache; default: f16 on GPU devices, f32
    /// on flex.
    #[arg(long)]
    dtype: Option<Precision>,
    /// Requests per workload.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// KV-cache budget in tokens (every system).
    #[arg(long, default_value_t = 16384)]
    kv_tokens: usize,
    /// The model's maximum sequence length (prompt + output); Orca (Max) and static batching
    /// reserve this much per request.
    #[arg(long, default_value_t = 1024)]
    max_model_len: usize,
    /// Tokens per KV block.
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
    system: String,
    scheduling: String,
    tokens_per_s: f64,
    seconds: f64,
    output_tokens: usize,
    average_batch: f64,
    /// Stored KV tokens ÷ the whole KV budget, averaged over model steps.
    kv_budget_used: f64,
    /// Stored KV tokens ÷ slots of the KV blocks in use (1 − internal fragmentation of the
    /// blocks; reservations not counted).
    kv_block_utilization: f64,
    preemptions: usize,
    /// vLLM's throughput ÷ this system's.
    vllm_speedup: f64,
    /// KV blocks the budget bought.
    kv_blocks: usize,
}

/// vLLM with 8-bit KV blocks against vLLM with float ones, in the same KV budget in bytes.
#[derive(Serialize)]
struct KvQuantResult {
    workload: String,
    /// The budget both runs get: `--kv-tokens` of float (`f32`) KV.
    budget_bytes: u64,
    float_blocks: usize,
    kv8_blocks: usize,
    float_tokens_per_s: f64,
    kv8_tokens_per_s: f64,
    /// kv8's throughput ÷ float's.
    kv8_speedup: f64,
    float_average_batch: f64,
    kv8_average_batch: f64,
    float_preemptions: usize,
    kv8_preemptions: usize,
}

#[derive(Serialize)]
struct WorkloadResult {
    workload: SyntheticWorkload,
    mean_prompt: f64,
    mean_output: f64,
    systems: Vec<SystemResult>,
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
    workloads: Vec<WorkloadResult>,
    kv_quant: Vec<KvQuantResult>,
    sharing: Vec<SharingResult>,
}

/// The default served model's name.
const SERVE_OPT: &str = "synthetic:serve-opt";

/// The benchmark's synthetic model on `device` with room for `max_model_len` positions (shared with the online
/// mode).
pub(super) fn model(device: &Device, max_model_len: usize) -> Result<CausalLm, Box<dyn std::error::Error>> {
    Ok(CausalLm::random(named_spec(SERVE_OPT, Precision::F32, max_model_len)?, device)?)
}

/// The shape of model `name` (`synthetic:serve-opt` or a built-in shape) in `precision`, with
/// room for `max_model_len` positions.
fn named_spec(
    name: &str,
    precision: Precision,
    max_model_len: usize,
) -> Result<DecoderSpec, Box<dyn std::error::Error>> {
    let mut spec = if name == SERVE_OPT {
        DecoderSpec::from_json(&model_json(max_model_len), name.as_ref())?
    } else {
        super::synthetic::spec(name, precision).map_err(|e| format!("{e}, or {SERVE_OPT}"))?
    };
    spec.max_positions = max_model_len;
    spec.dtype = precision;
    Ok(spec)
}

/// Bytes of `--kv-tokens` of float KV of the bench's model (whole blocks): the budget of the kv8
/// comparison.
fn float_budget_bytes(served: &DecoderSpec, args: &Args) -> u64 {
    let layout = KvLayout::of(served);
    (args.kv_tokens / args.block_size * PagedKvCache::block_bytes(&layout, args.block_size, None)) as u64
}

/// One system on all requests at once: the paged engine under `scheduling`, `kv_tokens` of KV,
/// or with `kv_quant` bits the same budget in bytes of quantized blocks.
fn run_system(
    device: &Device,
    served: &DecoderSpec,
    args: &Args,
    reqs: &[Request],
    (label, scheduling): (&str, SchedulingPolicy),
    kv_quant: Option<u32>,
) -> Result<SystemResult, Box<dyn std::error::Error>> {
    let kv_cache_memory = match kv_quant {
        None => KvCacheMemory::Blocks(args.kv_tokens / args.block_size),
        Some(_) => KvCacheMemory::Bytes(float_budget_bytes(served, args)),
    };
    let paged = PagedSpec {
        block_size: Some(args.block_size),
        kv_cache_memory: Some(kv_cache_memory),
        max_num_seqs: Some(256),
        max_num_batched_tokens: Some(args.max_model_len.max(2048)),
        preemption: Some(PreemptionMode::Auto),
        no_enable_prefix_caching: true,
        scheduling: Some(scheduling),
        ..PagedSpec::default()
    };
    let mut engine = paged_engine(device, served, paged, kv_quant)?;
    let kv_blocks = engine.load().map_or(0, |l| l.kv_blocks_total);
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
    let expected: usize = reqs.iter().map(|(_, o)| o).sum();
    if output_tokens != expected {
        return Err(format!("{label}: generated {output_tokens} tokens, the workload asks for {expected}").into());
    }
    let stats = paged_stats(engine.as_ref())?;
    let pool_slots = (kv_blocks * args.block_size) as f64;
    eprintln!(
        "  {label:16} {:8.1} tokens/s, batch {:5.1}, KV budget used {:5.1}%",
        output_tokens as f64 / seconds,
        stats.average_batch(),
        100.0 * stats.kv_tokens as f64 / (pool_slots * stats.model_steps.max(1) as f64)
    );
    Ok(SystemResult {
        system: label.into(),
        scheduling: scheduling.name().into(),
        tokens_per_s: output_tokens as f64 / seconds,
        seconds,
        output_tokens,
        average_batch: stats.average_batch(),
        kv_budget_used: stats.kv_tokens as f64 / (pool_slots * stats.model_steps.max(1) as f64),
        kv_block_utilization: stats.kv_utilization(),
        preemptions: stats.swaps + stats.recomputes,
        vllm_speedup: 0.0,
        kv_blocks,
    })
}

/// Memory saved by sharing for `n = 4` parallel samples or beam width 4 (§5.6.3).
fn sharing(
    device: &Device,
    served: &DecoderSpec,
    args: &Args,
    reqs: &[Request],
    beam: bool,
) -> Result<f64, Box<dyn std::error::Error>> {
    let paged = PagedSpec {
        block_size: Some(args.block_size),
        kv_cache_memory: Some(KvCacheMemory::Blocks(4 * args.kv_tokens / args.block_size)),
        no_enable_prefix_caching: true,
        ..PagedSpec::default()
    };
    let mut engine = paged_engine(device, served, paged, None)?;
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
/// The paged engine with `paged`'s settings (and `--kv-quant kv_quant`) over the bench's random
/// model on `device`, built as every engine is ([`EngineSpec::init_model`]).
fn paged_engine(
    device: &Device,
    served: &DecoderSpec,
    paged: PagedSpec,
    kv_quant: Option<u32>,
) -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
    let spec = EngineSpec { engine: Some(EngineKind::Paged), paged, kv_quant, ..EngineSpec::default() };
    let model = CausalLm::random(served.clone(), device)?;
    spec.init_model(model, None, vec![], Purpose::Serve, &mut std::io::sink())
}

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
    let (dtype, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let served = named_spec(&args.model, dtype, args.max_model_len)?;
    let vocab = served.vocab_size;
    let workloads = SyntheticWorkload::standard(args.scale, args.max_model_len);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut results = Vec::new();
    let mut kv_quant = Vec::new();
    for w in workloads.iter().cloned() {
        let reqs = w.requests(args.requests, vocab, args.max_model_len, &mut rng);
        let mean_prompt = reqs.iter().map(|(p, _)| p.len()).sum::<usize>() as f64 / reqs.len() as f64;
        let mean_output = reqs.iter().map(|(_, o)| *o).sum::<usize>() as f64 / reqs.len() as f64;
        eprintln!("{}: {} requests, mean prompt {mean_prompt:.1}, mean output {mean_output:.1}", w.name, reqs.len());
        let mut systems = SYSTEMS
            .iter()
            .map(|&system| run_system(&device, &served, &args, &reqs, system, None))
            .collect::<Result<Vec<_>, _>>()?;
        let vllm = systems[0].tokens_per_s;
        for s in &mut systems {
            s.vllm_speedup = vllm / s.tokens_per_s;
        }
        let kv8 = run_system(&device, &served, &args, &reqs, ("vLLM, kv8 blocks", SchedulingPolicy::Fcfs), Some(8))?;
        let float = &systems[0];
        kv_quant.push(KvQuantResult {
            workload: w.name.to_string(),
            budget_bytes: float_budget_bytes(&served, &args),
            float_blocks: float.kv_blocks,
            kv8_blocks: kv8.kv_blocks,
            float_tokens_per_s: float.tokens_per_s,
            kv8_tokens_per_s: kv8.tokens_per_s,
            kv8_speedup: kv8.tokens_per_s / float.tokens_per_s,
            float_average_batch: float.average_batch,
            kv8_average_batch: kv8.average_batch,
            float_preemptions: float.preemptions,
            kv8_preemptions: kv8.preemptions,
        });
        results.push(WorkloadResult { workload: w, mean_prompt, mean_output, systems });
    }
    let share_reqs = workloads[1].requests(32, vocab, args.max_model_len, &mut rng);
    let mut shared = Vec::new();
    for (label, beam) in [("parallel sampling n = 4", false), ("beam search, width 4", true)] {
        let saved = sharing(&device, &served, &args, &share_reqs, beam)?;
        eprintln!("{label}: {:.1}% of KV memory saved by sharing", 100.0 * saved);
        shared.push(SharingResult { decoding: label.into(), requests: share_reqs.len(), memory_saved: saved });
    }

    let command = format!(
        "cargo xtask bench serve --device {} --model {} --dtype {} --requests {} --kv-tokens {} --max-model-len {} --block-size {} --scale {} --seed {}",
        args.device.name(),
        args.model,
        dtype.name(),
        args.requests,
        args.kv_tokens,
        args.max_model_len,
        args.block_size,
        args.scale,
        args.seed
    );
    let header = Header::new("serve", command, Some(args.device.name()), &args.model);
    let mut md = header.markdown("Serving throughput: vLLM's paged engine vs Orca and static batching");
    md.push_str(&format!(
        "- model: {} ({} layers, hidden {}, vocab {}) in {}, random weights, maximum length {} tokens\n\
         - KV budget: {} tokens for every system (blocks of {} tokens); Orca (Max) and static batching reserve {} tokens per request, so they run at most {} at once\n\
         - every system is the paged engine with another `--schedule` (`fcfs`, `orca-oracle`, `orca-pow2`, `orca-max`, `static`): same kernels, different admission and KV reservation (thesis §5.6.1; no buddy-allocator fragmentation, which favours Orca). Static batching is request-level (FasterTransformer-style): a batch's finished requests idle until its longest is done.\n\
         - all requests arrive at once (offline throughput; latency at a request rate is the online benchmark's); \"vLLM ×\" is vLLM's throughput over the system's; \"KV budget used\" is stored tokens over the whole budget, averaged over steps\n\n",
        args.model,
        served.num_layers,
        served.hidden_size,
        served.vocab_size,
        dtype.name(),
        args.max_model_len,
        args.kv_tokens,
        args.block_size,
        args.max_model_len,
        args.kv_tokens / args.max_model_len.max(1)
    ));
    let percent = |x: f64| format!("{:.1}%", 100.0 * x);
    md.push_str(&table(
        &[
            ("workload", Left),
            ("prompt mean (σ)", Right),
            ("output mean (σ)", Right),
            ("system", Left),
            ("tokens/s", Right),
            ("vLLM ×", Right),
            ("batch", Right),
            ("KV budget used", Right),
            ("preemptions", Right),
        ],
        results.iter().flat_map(|r| {
            r.systems.iter().map(move |s| {
                vec![
                    r.workload.name.to_string(),
                    format!("{:.1} ({})", r.mean_prompt, r.workload.prompt.sigma),
                    format!("{:.1} ({})", r.mean_output, r.workload.output.sigma),
                    s.system.clone(),
                    format!("{:.1}", s.tokens_per_s),
                    format!("{:.2}×", s.vllm_speedup),
                    format!("{:.1}", s.average_batch),
                    percent(s.kv_budget_used),
                    s.preemptions.to_string(),
                ]
            })
        }),
    ));
    md.push_str(&format!(
        "\n## 8-bit KV blocks in the same budget\n\nvLLM (FCFS) with `--kv-quant 8` (groups of 64 along the head, codes plus an `f32` scale and minimum per group) against float blocks, both in the bytes of {} float KV tokens.\n\n",
        args.kv_tokens
    ));
    md.push_str(&table(
        &[
            ("workload", Left),
            ("blocks (f32 / kv8)", Right),
            ("tokens/s f32", Right),
            ("tokens/s kv8", Right),
            ("kv8 ×", Right),
            ("batch (f32 / kv8)", Right),
            ("preemptions (f32 / kv8)", Right),
        ],
        kv_quant.iter().map(|k| {
            vec![
                k.workload.clone(),
                format!("{} / {}", k.float_blocks, k.kv8_blocks),
                format!("{:.1}", k.float_tokens_per_s),
                format!("{:.1}", k.kv8_tokens_per_s),
                format!("{:.2}×", k.kv8_speedup),
                format!("{:.1} / {:.1}", k.float_average_batch, k.kv8_average_batch),
                format!("{} / {}", k.float_preemptions, k.kv8_preemptions),
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
        workloads: results,
        kv_quant,
        sharing: shared,
    };
    report::write(&args.out, "serve", &report, &md)?;
    Ok(())
}
