//! `cargo xtask bench schedule`: ExeGPT's constraint-aware schedule against FCFS on the paged
//! engine, at three latency bounds, on seeded ShareGPT-like and Alpaca-like workloads.
//!
//! The model has SmolLM2-135M's shape (from its GGUF when cached, else the same shape written
//! out) with random weights and `--layers` decoder layers. Its costs are profiled once at
//! start-up with the Burn profiler (or read from `--profile`). For each workload and bound:
//! - (a) FCFS with the default configuration (`max_num_seqs` 256);
//! - (b) FCFS with `max_num_seqs` tuned on a grid (1, 2, 4, … `--max-batch`, and each plan's `B_D`):
//!   the best throughput among the points whose measured latency meets the bound;
//! - (c) the ExeGPT RRA plan for the bound ([`plan_rra`], run as [`phased_policy`]);
//! - (d) static batching with `max_num_seqs` tuned on the same grid ([`static_config`]):
//!   FasterTransformer-style, the baseline ExeGPT reports its 2× against (§7.3).
//!
//! Latency is measured as the planner defines it (`burn_llm::parallel::plan::schedule`, ExeGPT's
//! SLA-(b): the time to generate the percentile-length output): in a closed (offline) run, from
//! the start of the step that prefills a request to the end of the step that finishes it, at the
//! planner's percentile (p99) over requests. Queueing before the prefill is outside the planner's
//! model; it is reported separately (`latency_from_arrival_s`). The planner reads the paged
//! engine's measured step times by batch (`engine_step_ms`, timed at start-up with the profile)
//! and counts the prompt tail of the percentile query's prefills. Prompt and output lengths follow
//! the workload's distributions, and every request generates exactly its drawn output length (EOS
//! ignored), as in ExeGPT's evaluation (§7.1); the planner gets both lengths' distributions
//! ([`plan_rra`]), and its latency is that of the 99th-percentile output. `--output-len` gives
//! every request the same output length instead.
//!
//! Throughput is the planner's steady state: the rate at which requests are admitted (prefilled)
//! between the first completion (the decode batch has filled up) and the last prefill (the
//! queue has run dry and the batch drains), measured the same way for every system
//! ([`steady_rate`]); the whole run's requests/s is reported next to it.

use std::path::PathBuf;
use std::time::Instant;

use burn_llm::models::gguf::GgufModel;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm::models::{CausalLm, DecoderSpec, Prompt, SamplingParams};
use burn_llm::paged::{EngineConfig, KvCacheMemory, SchedulingPolicy};
use burn_llm::parallel::plan::profile::Profile;
use burn_llm::parallel::plan::schedule::ScheduleOutput;
use burn_llm::parallel::profiler::{EngineStepGrid, ProfileGrid};
use burn_llm::schedule::{ScheduleWorkload, check_layers, measure_profile, phased_policy, plan_rra, read_profile};
use burn_llm::spec::PagedSpec;
use burn_llm::{DeviceChoice, EngineKind, EngineSpec, Purpose};
use rand::SeedableRng;
use serde::Serialize;

use super::plot;
use super::workload::{Request, SyntheticWorkload};
use crate::report::{self, Align::Left, Align::Right, Header, percentile, table};

/// SmolLM2-135M's shape, for when its GGUF is not in the model cache.
pub(super) const SMOLLM2_SHAPE: &str = r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
    "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"max_position_embeddings":8192,
    "rms_norm_eps":1e-5,"rope_theta":100000.0,"tie_word_embeddings":true}"#;

/// Longest prompt + output a request may reach.
const MAX_LEN: usize = 2048;

/// Flags of `bench schedule`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Decoder layers of the model (SmolLM2-135M has 30); fewer make a run shorter.
    #[arg(long)]
    layers: Option<usize>,
    /// Requests per workload (enough for several batches: the steady state needs at least three).
    #[arg(long, default_value_t = 128)]
    requests: usize,
    /// Tokens every request generates (default: each request its own length, drawn from the
    /// workload's output distribution).
    #[arg(long)]
    output_len: Option<usize>,
    /// Multiplies the paper's mean lengths (ShareGPT 161 in / 338 out, Alpaca 19.3 / 58.5).
    #[arg(long, default_value_t = 0.25)]
    scale: f64,
    /// KV-cache pool in tokens (every system).
    #[arg(long, default_value_t = 16384)]
    kv_tokens: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Largest batch: the largest `max_num_seqs` of FCFS's grid, and the engine's `max_num_seqs`
    /// the planner plans for (its largest encode and decode batch).
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Three latency bounds in seconds, tightest first (default: per workload, from the profile:
    /// 1.1× the tightest bound the planner can meet, 1.5× the latency of its unconstrained plan,
    /// and their geometric mean).
    #[arg(long, value_delimiter = ',', num_args = 3)]
    latency_bounds: Option<Vec<f64>>,
    /// A planner cost profile of this model and device (`cargo run --example plan -- profile`);
    /// default: profile the model at start-up (layers and paged-engine steps).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Random seed of the workloads.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// One closed run of the paged engine over a workload.
#[derive(Debug, Clone, Serialize)]
struct Run {
    /// `max_num_seqs` of the configuration.
    max_num_seqs: usize,
    /// Wall-clock seconds from the first request queued to the last finished.
    seconds: f64,
    /// Steady-state requests/s ([`steady_rate`]), or the whole run's when the run is too short to
    /// have a steady state (`steady: false`).
    requests_per_s: f64,
    /// Whether `requests_per_s` is the steady-state rate.
    steady: bool,
    /// Requests over the whole run's seconds.
    run_requests_per_s: f64,
    /// Generated tokens per second over the whole run.
    tokens_per_s: f64,
    /// The planner's latency (prefill start to finish) at its percentile over requests.
    latency_s: f64,
    /// Mean of the same latency.
    mean_latency_s: f64,
    /// Finish − arrival at the same percentile: queueing included.
    latency_from_arrival_s: f64,
}

/// A run judged against a bound.
#[derive(Debug, Clone, Serialize)]
struct Verdict {
    #[serde(flatten)]
    run: Run,
    meets_bound: bool,
}

/// The ExeGPT plan for a bound and its run.
#[derive(Serialize)]
struct Planned {
    plan: ScheduleOutput,
    #[serde(flatten)]
    verdict: Verdict,
    /// Measured requests/s ÷ the plan's predicted queries/s.
    throughput_measured_over_predicted: f64,
    /// Measured latency ÷ the plan's predicted latency.
    latency_measured_over_predicted: f64,
}

#[derive(Serialize)]
struct BoundResult {
    latency_bound_s: f64,
    fcfs_default: Verdict,
    /// `None`: no point of the grid meets the bound.
    fcfs_tuned: Option<Verdict>,
    /// `Err`: the planner found no schedule meeting the bound.
    exegpt: Result<Planned, String>,
    /// (c)'s requests/s ÷ (b)'s, where both exist.
    exegpt_over_tuned: Option<f64>,
    /// (d): static batching with `max_num_seqs` tuned on the same grid (`None`: no point meets
    /// the bound).
    static_tuned: Option<Verdict>,
    /// (c)'s requests/s ÷ (d)'s, where both exist: ExeGPT's own comparison (§7.3, against
    /// FasterTransformer).
    exegpt_over_static: Option<f64>,
}

#[derive(Serialize)]
struct WorkloadResult {
    workload: SyntheticWorkload,
    requests: usize,
    mean_prompt: f64,
    /// `--output-len`, when every request generates the same number of tokens.
    output_len: Option<usize>,
    mean_output: f64,
    /// The 99th-percentile output length (nearest rank): the one the latency bound is for.
    p99_output: usize,
    bounds_from_profile: bool,
    fcfs_grid: Vec<Run>,
    /// Static batching (FasterTransformer-style) over the same grid; at one seat it is FCFS's
    /// one-seat run (one request at a time either way).
    static_grid: Vec<Run>,
    /// How fast the machine ran the runs against its speed while profiling: the seconds the
    /// profile predicts for FCFS at one seat ([`one_seat_seconds`]) over the seconds it took
    /// (`None` without a one-seat run). Below 1 the host slowed after the profile, and every
    /// prediction is off by about as much.
    host_speed: Option<f64>,
    bounds: Vec<BoundResult>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    layers: usize,
    kv_tokens: usize,
    block_size: usize,
    latency_percentile: f64,
    profile: Profile,
    profile_source: String,
    /// The machine's 1-minute load average before the first run and after the last (`None`
    /// where the system does not report it): other work on the cores makes the numbers noisy.
    load_average: [Option<f64>; 2],
    workloads: Vec<WorkloadResult>,
}

/// The 1-minute load average (Linux `/proc/loadavg`).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// SmolLM2-135M's shape with `layers` layers, and where the shape came from.
fn model_spec(layers: Option<usize>) -> Result<(DecoderSpec, String), Box<dyn std::error::Error>> {
    let path = SMOLLM2_GGUF.cached_path();
    let (mut spec, source) = if path.is_file() {
        (GgufModel::open(&path)?.spec().clone(), SMOLLM2_GGUF.file.to_string())
    } else {
        let label = "synthetic:smollm2-135m";
        (DecoderSpec::from_json(SMOLLM2_SHAPE, label.as_ref())?, label.to_string())
    };
    if let Some(layers) = layers {
        if layers == 0 {
            return Err("--layers must be at least 1".into());
        }
        spec.num_layers = layers;
    }
    Ok((spec, source))
}

/// The profile to plan with: `--profile`, checked against the model, or measured now (layers and
/// paged-engine steps, [`measure_profile`]).
fn profile(args: &Args, model: &CausalLm) -> Result<(Profile, String), Box<dyn std::error::Error>> {
    if let Some(path) = &args.profile {
        let profile = read_profile(path)?;
        check_layers(&profile, model.spec().num_layers, path)?;
        return Ok((profile, path.display().to_string()));
    }
    let started = Instant::now();
    let mut profile = measure_profile(model, args.max_batch, &mut std::io::stderr())?;
    profile.model = Some(format!("SmolLM2-135M shape, {} layers, random weights", model.spec().num_layers));
    profile.device = Some(args.device.name().to_string());
    let source = format!(
        "measured at start-up in {:.0} s: {:?}; {:?}",
        started.elapsed().as_secs_f64(),
        ProfileGrid::serving(args.max_batch),
        EngineStepGrid::serving(args.max_batch)
    );
    Ok((profile, source))
}

/// Steady-state requests/s of a closed run: requests admitted from the first completion (before
/// it the batch is still filling) up to the last prefill step (after it the batch drains), over
/// that window's length. `None` when the window holds no admission (fewer than three batches).
fn steady_rate(prefilled: &[f64], finished: &[f64]) -> Option<f64> {
    let first_done = finished.iter().copied().fold(f64::INFINITY, f64::min);
    let last_prefill = prefilled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let admitted = prefilled.iter().filter(|&&t| t >= first_done && t < last_prefill).count();
    (admitted > 0 && last_prefill > first_done).then(|| admitted as f64 / (last_prefill - first_done))
}

/// Runs every request of `reqs` (all queued at once) on a paged engine configured by `config`.
fn measure(
    model: &CausalLm,
    config: EngineConfig,
    reqs: &[Request],
    pct: f64,
) -> Result<Run, Box<dyn std::error::Error>> {
    let max_num_seqs = config.max_num_seqs;
    let spec = EngineSpec { engine: Some(EngineKind::Paged), paged: PagedSpec::from(&config), ..EngineSpec::default() };
    let mut engine = spec.init_model(model.clone(), None, vec![], Purpose::Serve, &mut std::io::sink())?;
    let started = Instant::now();
    for (i, (prompt, out)) in reqs.iter().enumerate() {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(*out) };
        engine.add_request(&i.to_string(), Prompt::Ids(prompt.clone()), params)?;
    }
    let (mut prefilled, mut finished) = (vec![None; reqs.len()], vec![None; reqs.len()]);
    let mut tokens = 0;
    while engine.has_unfinished_requests() {
        let step_start = started.elapsed().as_secs_f64();
        let outputs = engine.step()?;
        let step_end = started.elapsed().as_secs_f64();
        for out in outputs {
            let i: usize = out.request_id.parse()?;
            tokens += out.sequences.iter().map(|d| d.token_ids.len()).sum::<usize>();
            prefilled[i].get_or_insert(step_start);
            if out.finished.is_some() {
                finished[i] = Some(step_end);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let (mut starts, mut ends) = (Vec::with_capacity(reqs.len()), Vec::with_capacity(reqs.len()));
    for (i, (start, end)) in prefilled.iter().zip(&finished).enumerate() {
        let (Some(start), Some(end)) = (start, end) else {
            return Err(format!("request {i} never finished").into());
        };
        starts.push(*start);
        ends.push(*end);
    }
    let latency: Vec<f64> = starts.iter().zip(&ends).map(|(s, e)| e - s).collect();
    let from_arrival = &ends;
    let steady = steady_rate(&starts, &ends);
    let run_rate = reqs.len() as f64 / seconds;
    Ok(Run {
        max_num_seqs,
        seconds,
        requests_per_s: steady.unwrap_or(run_rate),
        steady: steady.is_some(),
        run_requests_per_s: run_rate,
        tokens_per_s: tokens as f64 / seconds,
        latency_s: percentile(&latency, pct),
        mean_latency_s: latency.iter().sum::<f64>() / latency.len().max(1) as f64,
        latency_from_arrival_s: percentile(from_arrival, pct),
    })
}

/// Seconds the profile's measured engine steps predict for FCFS at one seat on `reqs`: one request
/// at a time, its prefill step alone, then a decode step per further output token at its context.
/// Nothing is scheduled around, so the run measures the host's speed against the profile's.
fn one_seat_seconds(profile: &Profile, reqs: &[Request]) -> Result<f64, Box<dyn std::error::Error>> {
    let cost = profile.cost_model("profile")?;
    let ms: f64 = reqs
        .iter()
        .map(|(prompt, output)| {
            let p = prompt.len() as f64;
            cost.prefill_step_ms(1.0, p) + (1..*output).map(|t| cost.decode_step_ms(1.0, p + t as f64)).sum::<f64>()
        })
        .sum();
    Ok(ms / 1000.0)
}

/// The three default bounds for a workload (see `--latency-bounds`).
fn default_bounds(profile: &Profile, workload: &ScheduleWorkload) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let loose = plan_rra(profile.clone(), workload, 1e6)?.latency_s;
    let (mut infeasible, mut feasible) = (0.0, loose);
    for _ in 0..20 {
        let mid = (infeasible + feasible) / 2.0;
        if plan_rra(profile.clone(), workload, mid).is_ok() {
            feasible = mid;
        } else {
            infeasible = mid;
        }
    }
    let (tight, loose) = (1.1 * feasible, 1.5 * loose);
    Ok(vec![tight, (tight * loose).sqrt(), loose])
}

fn judge(run: &Run, bound: f64) -> Verdict {
    Verdict { run: run.clone(), meets_bound: run.latency_s <= bound }
}

/// The run of most throughput among those meeting `bound` (a grid tuned by measurement).
fn best_meeting(grid: &[Run], bound: f64) -> Option<Verdict> {
    grid.iter()
        .filter(|r| r.latency_s <= bound)
        .max_by(|x, y| x.requests_per_s.total_cmp(&y.requests_per_s))
        .map(|r| judge(r, bound))
}

/// Static batching (FasterTransformer-style, ExeGPT's baseline) at `seqs` seats: a batch is
/// admitted when the previous one has finished, each request reserving the model's whole context.
/// The KV pool is sized to hold every seat's reservation, so memory never limits the batch (FT
/// is configured for its batch) and only the waiting for the batch's longest request is measured.
fn static_config(base: &EngineConfig, seqs: usize, spec: &DecoderSpec) -> EngineConfig {
    let blocks = seqs * spec.max_positions.div_ceil(base.block_size) + 1;
    EngineConfig {
        max_num_seqs: seqs,
        scheduling: SchedulingPolicy::Static,
        kv_cache_memory: KvCacheMemory::Blocks(blocks),
        ..base.clone()
    }
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.requests == 0 || args.max_batch == 0 || args.block_size == 0 {
        return Err("--requests, --max-batch and --block-size must be at least 1".into());
    }
    if let Some(bounds) = &args.latency_bounds
        && bounds.iter().any(|b| !(b.is_finite() && *b > 0.0))
    {
        return Err(format!("--latency-bounds must be positive seconds, got {bounds:?}").into());
    }
    let device = args.device.device()?;
    let (spec, source) = model_spec(args.layers)?;
    let model_name = format!("SmolLM2-135M shape ({source}), {} layers, random weights", spec.num_layers);
    eprintln!("model: {model_name}");
    let model = CausalLm::random(spec.clone(), &device)?;
    let (profile, profile_source) = profile(&args, &model)?;
    if let Some(table) = &profile.engine_step_ms {
        eprintln!("measured engine steps: {table:?}");
    }
    let load_before = load_average();
    let blocks = args.kv_tokens / args.block_size;
    let base = EngineConfig {
        block_size: args.block_size,
        kv_cache_memory: KvCacheMemory::Blocks(blocks),
        ..EngineConfig::default()
    };
    let mut grid: Vec<usize> = (0..).map(|k| 1usize << k).take_while(|&b| b < args.max_batch).collect();
    grid.push(args.max_batch);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut results = Vec::new();
    let mut pct = 99.0;
    for w in SyntheticWorkload::standard(args.scale, MAX_LEN) {
        let output_len = args.output_len.map(|n| n.clamp(1, MAX_LEN / 2));
        let mut reqs = w.requests(args.requests, spec.vocab_size, MAX_LEN, &mut rng);
        if let Some(n) = output_len {
            reqs.iter_mut().for_each(|r| r.1 = n);
        }
        let mean_prompt = reqs.iter().map(|(p, _)| p.len()).sum::<usize>() as f64 / reqs.len() as f64;
        let output_lens: Vec<usize> = reqs.iter().map(|r| r.1).collect();
        let mean_output = output_lens.iter().sum::<usize>() as f64 / output_lens.len() as f64;
        let p99_output = percentile(&output_lens.iter().map(|&n| n as f64).collect::<Vec<_>>(), 99.0) as usize;
        let plan_workload = ScheduleWorkload {
            prompt_lens: reqs.iter().map(|(p, _)| p.len()).collect(),
            output_lens,
            kv_tokens: blocks * args.block_size,
            max_num_seqs: args.max_batch,
        };
        let (bounds, from_profile) = match &args.latency_bounds {
            Some(b) => (b.clone(), false),
            None => (default_bounds(&profile, &plan_workload)?, true),
        };
        eprintln!(
            "{}: {} requests, mean prompt {mean_prompt:.1}, output mean {mean_output:.1} (p99 {p99_output}); bounds {bounds:.3?} s",
            w.name,
            reqs.len()
        );
        let plans: Vec<Result<ScheduleOutput, String>> =
            bounds.iter().map(|&b| plan_rra(profile.clone(), &plan_workload, b).map_err(|e| e.to_string())).collect();
        if let Some(plan) = plans.iter().flatten().next() {
            pct = plan.latency_percentile;
        }

        let default = measure(&model, base.clone(), &reqs, pct)?;
        eprintln!("  (a) FCFS default: {:.2} req/s, p{pct} {:.3} s", default.requests_per_s, default.latency_s);
        // FCFS also runs at each plan's seat count, so that (c) is compared with FCFS at the
        // same batch too, not only at the grid's powers of two.
        let mut fcfs_seats = grid.clone();
        fcfs_seats.extend(plans.iter().flatten().map(|p| p.decode_batch));
        fcfs_seats.sort_unstable();
        fcfs_seats.dedup();
        let mut fcfs_grid = Vec::new();
        for &seqs in &fcfs_seats {
            let r = measure(&model, EngineConfig { max_num_seqs: seqs, ..base.clone() }, &reqs, pct)?;
            eprintln!("  (b) FCFS max_num_seqs {seqs}: {:.2} req/s, p{pct} {:.3} s", r.requests_per_s, r.latency_s);
            fcfs_grid.push(r);
        }
        let mut static_grid = Vec::new();
        for &seqs in &grid {
            let one_seat = fcfs_grid.iter().find(|r| r.max_num_seqs == 1).filter(|_| seqs == 1);
            let r = match one_seat {
                Some(one_seat) => one_seat.clone(),
                None => measure(&model, static_config(&base, seqs, &spec), &reqs, pct)?,
            };
            eprintln!("  (d) static max_num_seqs {seqs}: {:.2} req/s, p{pct} {:.3} s", r.requests_per_s, r.latency_s);
            static_grid.push(r);
        }
        let mut per_bound = Vec::new();
        for (&bound, plan) in bounds.iter().zip(plans) {
            let tuned = best_meeting(&fcfs_grid, bound);
            let static_tuned = best_meeting(&static_grid, bound);
            let exegpt = match plan {
                Ok(plan) => {
                    let policy = phased_policy(&plan)?;
                    let SchedulingPolicy::Phased { encode_batch, decode_batch, .. } = policy else {
                        return Err("phased_policy returned a non-phased policy".into());
                    };
                    let config = EngineConfig {
                        max_num_seqs: encode_batch.max(decode_batch),
                        scheduling: policy,
                        ..base.clone()
                    };
                    let r = measure(&model, config, &reqs, pct)?;
                    eprintln!(
                        "  (c) ExeGPT B_E {} N_D {} B_D {} at {bound:.3} s: {:.2} req/s (predicted {:.2}), p{pct} {:.3} s (predicted {:.3})",
                        plan.encode_batch,
                        plan.decode_iterations.unwrap_or(0),
                        plan.decode_batch,
                        r.requests_per_s,
                        plan.throughput_qps,
                        r.latency_s,
                        plan.latency_s
                    );
                    Ok(Planned {
                        throughput_measured_over_predicted: r.requests_per_s / plan.throughput_qps,
                        latency_measured_over_predicted: r.latency_s / plan.latency_s,
                        verdict: judge(&r, bound),
                        plan,
                    })
                }
                Err(e) => {
                    eprintln!("  (c) ExeGPT at {bound:.3} s: no plan ({e})");
                    Err(e)
                }
            };
            let exegpt_over_tuned = throughput_ratio(&exegpt, &tuned);
            let exegpt_over_static = throughput_ratio(&exegpt, &static_tuned);
            per_bound.push(BoundResult {
                latency_bound_s: bound,
                fcfs_default: judge(&default, bound),
                fcfs_tuned: tuned,
                exegpt,
                exegpt_over_tuned,
                static_tuned,
                exegpt_over_static,
            });
        }
        results.push(WorkloadResult {
            workload: w,
            requests: reqs.len(),
            mean_prompt,
            output_len,
            mean_output,
            p99_output,
            bounds_from_profile: from_profile,
            host_speed: fcfs_grid
                .iter()
                .find(|r| r.max_num_seqs == 1)
                .map(|r| one_seat_seconds(&profile, &reqs).map(|predicted| predicted / r.seconds))
                .transpose()?,
            fcfs_grid,
            static_grid,
            bounds: per_bound,
        });
    }

    let mut command = format!(
        "cargo xtask bench schedule --device {} --layers {} --requests {} --scale {} --kv-tokens {} --block-size {} --max-batch {} --seed {}",
        args.device.name(),
        spec.num_layers,
        args.requests,
        args.scale,
        args.kv_tokens,
        args.block_size,
        args.max_batch,
        args.seed
    );
    if let Some(n) = args.output_len {
        command.push_str(&format!(" --output-len {n}"));
    }
    if let Some(b) = &args.latency_bounds {
        command.push_str(&format!(" --latency-bounds {}", b.iter().map(f64::to_string).collect::<Vec<_>>().join(",")));
    }
    if let Some(p) = &args.profile {
        command.push_str(&format!(" --profile {}", p.display()));
    }
    let load = [load_before, load_average()];
    let header = Header::new("schedule", command, Some(args.device.name()), model_name.clone());
    let md = markdown(&header, &model_name, &args, &profile_source, &profile, load, pct, &results);
    let png = plot::schedule_png(&args.out.join("schedule.png"), &plot_series(&results));
    let report = Report {
        header,
        layers: spec.num_layers,
        kv_tokens: args.kv_tokens,
        block_size: args.block_size,
        latency_percentile: pct,
        profile,
        profile_source,
        load_average: load,
        workloads: results,
    };
    report::write(&args.out, "schedule", &report, &md)?;
    match png {
        Ok(path) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("no plot: {e}"),
    }
    Ok(())
}

/// Throughput against bound per workload, for the plot: (a), (b) and (c), `None` where the
/// system has no configuration meeting the bound.
/// A measured step table: one row per batch, one column per point of the other axis.
fn step_table(batch_title: &str, other_title: &str, batch: &[f64], other: &[f64], ms: &[Vec<f64>]) -> String {
    let titles: Vec<String> =
        std::iter::once(batch_title.to_string()).chain(other.iter().map(|o| format!("{other_title} {o}"))).collect();
    let columns: Vec<(&str, report::Align)> = titles.iter().map(|t| (t.as_str(), Right)).collect();
    table(
        &columns,
        batch.iter().zip(ms).map(|(b, row)| {
            std::iter::once(b.to_string()).chain(row.iter().map(|v| format!("{v:.1}"))).collect::<Vec<_>>()
        }),
    )
}

fn fmt_load(load: Option<f64>) -> String {
    load.map_or("unknown".into(), |l| format!("{l:.2}"))
}

fn plot_series(results: &[WorkloadResult]) -> Vec<plot::Panel> {
    results
        .iter()
        .map(|w| {
            let series = |pick: &dyn Fn(&BoundResult) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
                w.bounds.iter().map(|b| (b.latency_bound_s, pick(b))).collect()
            };
            let met = |v: &Verdict| v.meets_bound.then_some(v.run.requests_per_s);
            plot::Panel {
                title: w.workload.name.to_string(),
                series: vec![
                    ("(a) FCFS default".into(), series(&|b| met(&b.fcfs_default))),
                    ("(b) FCFS tuned".into(), series(&|b| b.fcfs_tuned.as_ref().map(|v| v.run.requests_per_s))),
                    ("(c) ExeGPT plan".into(), series(&|b| b.exegpt.as_ref().ok().and_then(|p| met(&p.verdict)))),
                    ("(d) static tuned".into(), series(&|b| b.static_tuned.as_ref().map(|v| v.run.requests_per_s))),
                ],
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    header: &Header,
    model: &str,
    args: &Args,
    profile_source: &str,
    profile: &Profile,
    load: [Option<f64>; 2],
    pct: f64,
    results: &[WorkloadResult],
) -> String {
    let mut md = header.markdown("ExeGPT schedule vs FCFS under latency bounds");
    md.push_str(&format!(
        "- model: {model}\n- KV pool: {} tokens in blocks of {}; FCFS grid of `max_num_seqs` 1, 2, 4, … up to {} and each plan's `B_D`\n\
         - profile: {profile_source}\n\
         - latency: p{pct} over requests of (finish − start of the request's prefill step): ExeGPT's SLA-(b), the time \
         to generate the p{pct}-length output, as the planner predicts it; closed run, all requests queued at t = 0. \
         \"met\" compares it with the bound. (a) counts as meeting a bound only if its one run does.\n\
         - throughput (req/s): steady state, as the planner predicts it: requests admitted between the first completion \
         and the last prefill step, over that window (the whole run's rate where a run has no such window, marked *); \
         tok/s and \"run req/s\" are over the whole run\n\
         - {}\n\
         - 1-minute load average before the first run / after the last: {} / {} (the machine's cores are shared: \
         a load above its {} threads means other work slowed these runs)\n",
        args.kv_tokens,
        args.block_size,
        args.max_batch,
        match args.output_len {
            Some(n) => format!(
                "every request generates exactly {n} tokens (`--output-len`); prompts follow the workload's distribution"
            ),
            None => "prompt and output lengths follow the workload's distributions; every request generates exactly its \
                     drawn output length (EOS ignored), as in ExeGPT §7.1; the bound is on the p99 output's latency"
                .into(),
        },
        fmt_load(load[0]),
        fmt_load(load[1]),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    if let Some(steps) = &profile.engine_step_ms {
        md.push_str("\nMeasured paged-engine steps (the profile's `engine_step_ms`, what the planner reads), ms:\n\n");
        let (d, p) = (&steps.decode, &steps.prefill);
        md.push_str(&step_table("decode batch", "context", &d.batch, &d.context, &d.ms));
        md.push('\n');
        md.push_str(&step_table("prefill batch", "prompt tokens", &p.batch, &p.tokens, &p.ms));
    }
    if let Some(v) = &profile.step_variation {
        md.push_str(&format!(
            "\nStep variation (the profile's `step_variation`: the 99th percentile, over every timed run, of the run's \
             prefill and of the mean of its consecutive decode steps, over its point's median): prefill +{:.1}%, decode \
             +{:.1}%.",
            100.0 * v.prefill,
            100.0 * v.decode
        ));
        match &v.runs {
            Some(r) => md.push_str(&format!(
                " Over the same runs (decode runs of {} steps), mean +{:.1}% and standard deviation {:.1}% for prefills, \
                 mean +{:.1}% and standard deviation {:.1}% for decode runs. The planner's latency takes its sum of \
                 steps at its percentile from these (mean plus z standard deviations of the sum, at most every step at \
                 the 99th percentile; ExeGPT §7.9); its throughput takes the medians.\n",
                r.decode_steps,
                100.0 * r.prefill.mean,
                100.0 * r.prefill.std,
                100.0 * r.decode.mean,
                100.0 * r.decode.std
            )),
            None => md.push_str(
                " The planner's latency counts every step at it (ExeGPT §7.9); its throughput takes the medians.\n",
            ),
        }
    }
    let yes = |b: bool| if b { "yes" } else { "**no**" }.to_string();
    for w in results {
        md.push_str(&format!(
            "\n## {}: {} requests, mean prompt {:.1} tokens, {}\n\nBounds {}.\n\n",
            w.workload.name,
            w.requests,
            w.mean_prompt,
            match w.output_len {
                Some(n) => format!("{n} output tokens each"),
                None => format!("output mean {:.1} tokens, p99 {}", w.mean_output, w.p99_output),
            },
            if w.bounds_from_profile { "chosen from the profile" } else { "given by --latency-bounds" }
        ));
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("(a) req/s / tok/s", Right),
                (&format!("(a) p{pct} s"), Right),
                ("(a) met", Left),
                ("(b) max_num_seqs", Right),
                ("(b) req/s / tok/s", Right),
                (&format!("(b) p{pct} s"), Right),
                ("(c) B_E, N_D, B_D", Right),
                ("(c) req/s / tok/s", Right),
                (&format!("(c) p{pct} s"), Right),
                ("(c) met", Left),
                ("(c)/(b)", Right),
            ],
            w.bounds.iter().map(|b| {
                let (seqs, b_rate, b_lat) = tuned_cells(&b.fcfs_tuned);
                let (shape, c_rate, c_lat, c_met) = match &b.exegpt {
                    Ok(p) => (
                        format!(
                            "{}, {}, {}",
                            p.plan.encode_batch,
                            p.plan.decode_iterations.unwrap_or(0),
                            p.plan.decode_batch
                        ),
                        rate(&p.verdict.run),
                        format!("{:.3}", p.verdict.run.latency_s),
                        yes(p.verdict.meets_bound),
                    ),
                    Err(_) => ("no plan".into(), "–".into(), "–".into(), "–".into()),
                };
                vec![
                    format!("{:.3}", b.latency_bound_s),
                    rate(&b.fcfs_default.run),
                    format!("{:.3}", b.fcfs_default.run.latency_s),
                    yes(b.fcfs_default.meets_bound),
                    seqs,
                    b_rate,
                    b_lat,
                    shape,
                    c_rate,
                    c_lat,
                    c_met,
                    b.exegpt_over_tuned.map_or("–".into(), |r| format!("{r:.2}×")),
                ]
            }),
        ));
        md.push_str("\nThe plan's predictions against the run");
        if let Some(speed) = w.host_speed {
            md.push_str(&format!(
                " (host speed {speed:.2}: FCFS at one seat ran at {speed:.2}× the speed the profile's steps predict \
                 for it, so every prediction below is off by about that factor before any modelling error)"
            ));
        }
        md.push_str(":\n\n");
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("predicted req/s", Right),
                ("measured req/s", Right),
                ("measured/predicted", Right),
                (&format!("predicted p{pct} s"), Right),
                (&format!("measured p{pct} s"), Right),
                ("measured/predicted", Right),
            ],
            w.bounds.iter().filter_map(|b| b.exegpt.as_ref().ok().map(|p| (b.latency_bound_s, p))).map(|(bound, p)| {
                vec![
                    format!("{bound:.3}"),
                    format!("{:.2}", p.plan.throughput_qps),
                    format!("{:.2}{}", p.verdict.run.requests_per_s, star(&p.verdict.run)),
                    format!("{:.2}", p.throughput_measured_over_predicted),
                    format!("{:.3}", p.plan.latency_s),
                    format!("{:.3}", p.verdict.run.latency_s),
                    format!("{:.2}", p.latency_measured_over_predicted),
                ]
            }),
        ));
        md.push_str(
            "\nAgainst (d), static batching tuned the same way (FasterTransformer-style, ExeGPT's baseline in §7.3: \
             a batch starts when the previous one has finished; the KV pool holds every seat's reservation):\n\n",
        );
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("(d) max_num_seqs", Right),
                ("(d) req/s / tok/s", Right),
                (&format!("(d) p{pct} s"), Right),
                ("(c) req/s", Right),
                ("(c)/(d)", Right),
            ],
            w.bounds.iter().map(|b| {
                let (seqs, d_rate, d_lat) = tuned_cells(&b.static_tuned);
                let c_rate = match &b.exegpt {
                    Ok(p) if p.verdict.meets_bound => format!("{:.2}", p.verdict.run.requests_per_s),
                    Ok(p) => format!("{:.2} (missed)", p.verdict.run.requests_per_s),
                    Err(_) => "no plan".into(),
                };
                vec![
                    format!("{:.3}", b.latency_bound_s),
                    seqs,
                    d_rate,
                    d_lat,
                    c_rate,
                    b.exegpt_over_static.map_or("–".into(), |r| format!("{r:.2}×")),
                ]
            }),
        ));
        md.push_str("\nFCFS grid (b) picks from:\n\n");
        md.push_str(&grid_table(&w.fcfs_grid, pct));
        md.push_str(
            "\nStatic grid (d) picks from (at one seat, FCFS's one-seat run: one request at a time either way):\n\n",
        );
        md.push_str(&grid_table(&w.static_grid, pct));
    }
    md
}

/// `*` after a rate that is the whole run's, not the steady state's.
fn star(r: &Run) -> &'static str {
    if r.steady { "" } else { "*" }
}

/// `req/s / tok/s` of a run.
fn rate(r: &Run) -> String {
    format!("{:.2}{} / {:.1}", r.requests_per_s, star(r), r.tokens_per_s)
}

/// A tuned baseline's cells: its `max_num_seqs`, rate and latency, or "none meets".
fn tuned_cells(tuned: &Option<Verdict>) -> (String, String, String) {
    match tuned {
        Some(v) => (v.run.max_num_seqs.to_string(), rate(&v.run), format!("{:.3}", v.run.latency_s)),
        None => ("none meets".into(), "–".into(), "–".into()),
    }
}

/// (c)'s requests/s over a tuned baseline's, where both exist.
fn throughput_ratio(exegpt: &Result<Planned, String>, tuned: &Option<Verdict>) -> Option<f64> {
    match (exegpt, tuned) {
        (Ok(c), Some(t)) => Some(c.verdict.run.requests_per_s / t.run.requests_per_s),
        _ => None,
    }
}

/// One grid's runs: throughput and latency by `max_num_seqs`.
fn grid_table(runs: &[Run], pct: f64) -> String {
    table(
        &[
            ("max_num_seqs", Right),
            ("req/s", Right),
            ("run req/s", Right),
            ("tokens/s", Right),
            (&format!("p{pct} latency s"), Right),
            ("mean latency s", Right),
            (&format!("p{pct} from arrival s"), Right),
        ],
        runs.iter().map(|r| {
            vec![
                r.max_num_seqs.to_string(),
                format!("{:.2}{}", r.requests_per_s, star(r)),
                format!("{:.2}", r.run_requests_per_s),
                format!("{:.1}", r.tokens_per_s),
                format!("{:.3}", r.latency_s),
                format!("{:.3}", r.mean_latency_s),
                format!("{:.3}", r.latency_from_arrival_s),
            ]
        }),
    )
}
