//! `cargo xtask bench schedule`: ExeGPT's constraint-aware schedule against FCFS on the paged
//! engine, at three latency bounds, on seeded ShareGPT-like and Alpaca-like workloads.
//!
//! The model has SmolLM2-135M's shape (from its GGUF when cached, else the same shape written
//! out) with random weights and `--layers` decoder layers. Its costs are profiled once at
//! start-up with the Burn profiler (or read from `--profile`). For each workload and bound:
//! - (a) FCFS with the default configuration (`max_num_seqs` 256);
//! - (b) FCFS with `max_num_seqs` tuned (over two `--devices`, as a PP=2 pipeline) on a grid (1, 2, 4, … `--max-batch`, and each plan's `B_D`):
//!   the best throughput among the points whose measured latency meets the bound;
//! - (c) the ExeGPT plan for the bound (`plan_for`): on one device RRA, run as `phased_policy`;
//!   over two `--devices` the planner's choice, WAA disaggregated or RRA pipelined ([`devices`]);
//! - (d) static batching with `max_num_seqs` tuned on the same grid ([`static_config`]):
//!   FasterTransformer-style, the baseline ExeGPT reports its 2× against (§7.3).
//!
//! Latency is measured as the planner defines it (`burn_llm::plan::schedule`, ExeGPT's
//! SLA-(b): the time to generate the percentile-length output): in a closed (offline) run, from
//! the start of the step that prefills a request to the end of the step that finishes it, at the
//! planner's percentile (p99) over requests. Queueing before the prefill is outside the planner's
//! model; it is reported separately (`latency_from_arrival_s`). The planner reads the paged
//! engine's measured step times by batch (`engine_step_ms`, timed at start-up with the profile)
//! and counts the prompt tail of the percentile query's prefills. Prompt and output lengths follow
//! the workload's distributions, and every request generates exactly its drawn output length (EOS
//! ignored), as in ExeGPT's evaluation (§7.1); the planner gets both lengths' distributions
//! (`plan_for`), and its latency is that of the 99th-percentile output. `--output-len` gives
//! every request the same output length instead.
//!
//! Throughput is the planner's steady state: the rate at which requests are admitted (prefilled)
//! between the first completion (the decode batch has filled up) and the last prefill (the
//! queue has run dry and the batch drains), measured the same way for every system
//! ([`steady_rate`]); the whole run's requests/s is reported next to it.

mod devices;
mod markdown;
mod measure;

use std::path::PathBuf;
use std::time::Instant;

use burn_llm::DeviceChoice;
use burn_llm::models::gguf::GgufModel;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm::models::{CausalLm, DecoderSpec};
use burn_llm::paged::{EngineConfig, KvCacheMemory};
use burn_llm::parallel::profiler::{EngineStepGrid, Interference, ProfileGrid, SideBySide};
use burn_llm::plan::profile::Profile;
use burn_llm::plan::schedule::{ScheduleOutput, Strategy};
use burn_llm::schedule::{
    DeviceInterference, EngineInterference, ScheduleWorkload, check_layers, measure_profile, read_profile,
    rra_stage_layers,
};
use burn_llm::spec::parse_device;
use rand::SeedableRng;
use serde::Serialize;

use super::pipeline::workers::Workers;
use super::plot;
use super::process_cpu::Process;
use super::workload::SyntheticWorkload;
use crate::report::{self, Header, percentile};
use devices::Devices;
use markdown::{markdown, plan_shape, plot_series, throughput_ratio};
use measure::{Run, Verdict, best_meeting, judge, load_average, measure, one_seat_seconds, run_engine, static_config};

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
    /// Two devices (`flex,flex`, or workers `ws://HOST:PORT,ws://HOST:PORT` started with the
    /// `worker` example): FCFS and static batching run the model as a PP=2 pipeline over both,
    /// ExeGPT what its planner chooses for two devices (WAA: prefill on the first, decode on the
    /// second; or RRA over the pipeline). Default: every system on `--device`.
    #[arg(long, value_delimiter = ',', num_args = 2, conflicts_with = "loopback_workers")]
    devices: Option<Vec<String>>,
    /// Start two `worker` processes on loopback, each `--threads 1`, and run over them as the two
    /// devices (ended when the benchmark ends, also on error).
    #[arg(long)]
    loopback_workers: bool,
    /// The `worker` executable for `--loopback-workers` (default: build the example).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
    /// Over two devices, the layers of each of the pipeline's two stages, for every system:
    /// `auto` (Alpa's stage planner over the profile's decode step at `--max-batch`, the LM head
    /// on the second stage), or ranges (`0-2,3-3`). Default: an even split.
    #[arg(long)]
    stage_layers: Option<String>,
    /// Over two devices, the strategies ExeGPT's planner chooses (c) from: `rra`, `waa-c`,
    /// `waa-m` (default: all three). `waa-c,waa-m` measures the disaggregated schedule, prefill on
    /// the first device and decode on the second with the KV moved between them, where the
    /// planner would choose RRA.
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy)]
    strategies: Option<Vec<Strategy>>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
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
    /// WAA's prefill device beside its decode device on this workload's steps (two devices, WAA
    /// among the strategies): the `κ` WAA's plans are priced at.
    #[serde(skip_serializing_if = "Option::is_none")]
    waa_interference: Option<SideBySide>,
    bounds: Vec<BoundResult>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    /// Where the systems ran.
    devices: String,
    layers: usize,
    kv_tokens: usize,
    block_size: usize,
    latency_percentile: f64,
    profile: Profile,
    profile_source: String,
    /// The devices' interference over the layers alone (two devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    layer_interference: Option<Interference>,
    /// The devices' interference over the engines (two devices): the `κ` the planner got.
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_interference: Option<EngineInterference>,
    /// The machine's 1-minute load average before the first run and after the last (`None`
    /// where the system does not report it): other work on the cores makes the numbers noisy.
    load_average: [Option<f64>; 2],
    workloads: Vec<WorkloadResult>,
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

/// A strategy as the planner's JSON names it.
fn parse_strategy(text: &str) -> Result<Strategy, String> {
    serde_json::from_value(serde_json::Value::String(text.trim().to_string()))
        .map_err(|_| format!("unknown strategy `{text}`: give rra, waa-c or waa-m"))
}

/// The three default bounds for a workload (see `--latency-bounds`).
fn default_bounds(
    devices: &Devices,
    profile: &Profile,
    workload: &ScheduleWorkload,
    interference: DeviceInterference,
    strategies: Option<&[Strategy]>,
) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let loose = devices.plan(profile, workload, 1e6, interference, strategies)?.latency_s;
    let (mut infeasible, mut feasible) = (0.0, loose);
    for _ in 0..20 {
        let mid = (infeasible + feasible) / 2.0;
        if devices.plan(profile, workload, mid, interference, strategies).is_ok() {
            feasible = mid;
        } else {
            infeasible = mid;
        }
    }
    let (tight, loose) = (1.1 * feasible, 1.5 * loose);
    Ok(vec![tight, (tight * loose).sqrt(), loose])
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
    if args.strategies.is_some() && args.devices.is_none() && !args.loopback_workers {
        return Err(
            "--strategies chooses among ExeGPT's strategies over two devices: add --devices or --loopback-workers"
                .into(),
        );
    }
    let strategies = args.strategies.as_deref();
    // Dropped when `run` returns, on error too: the workers end either way.
    let workers = match args.loopback_workers {
        true => Some(Workers::start(&[1, 1], args.worker_bin.as_deref(), &std::env::temp_dir())?),
        false => None,
    };
    // The bench (client and engines) and the workers it started, metered over every run.
    let mut processes = vec![Process::this("bench")];
    processes.extend(workers.iter().flat_map(Workers::processes));
    let entries: Option<Vec<String>> = match &workers {
        Some(w) => Some(w.all().iter().map(|w| w.url.clone()).collect()),
        None => args.devices.clone(),
    };
    let token = workers.as_ref().map(|w| w.token.as_str());
    let (first, second) = match &entries {
        Some(entries) => {
            let parse = |e: &String| parse_device(e, token).map(|d| (e.trim().to_string(), d));
            (parse(&entries[0])?, Some(parse(&entries[1])?))
        }
        None => ((args.device.name().to_string(), args.device.device()?), None),
    };
    let (spec, source) = model_spec(args.layers)?;
    let model_name = format!("SmolLM2-135M shape ({source}), {} layers, random weights", spec.num_layers);
    eprintln!("model: {model_name}");
    let model = CausalLm::random(spec.clone(), &first.1)?;
    let (profile, mut profile_source) = profile(&args, &model)?;
    // Over two devices, the pipeline's split: `--stage-layers`, or even.
    let second = match (second, &args.stage_layers) {
        (None, Some(_)) => {
            return Err(
                "--stage-layers splits the pipeline over two devices: add --devices or --loopback-workers".into()
            );
        }
        (None, None) => None,
        (Some((name, device)), text) => {
            // The split's decode context: the first workload's mean prompt plus half its mean output.
            let [first, _] = SyntheticWorkload::standard(args.scale, MAX_LEN);
            let context = first.prompt.mean + first.output.mean / 2.0;
            let layers = rra_stage_layers(&profile, 2, text.as_deref(), args.max_batch, context)?;
            eprintln!("pipeline stages of {layers:?} layers (--stage-layers {})", text.as_deref().unwrap_or("even"));
            Some((name, device, layers))
        }
    };
    let devices = Devices::new(model, first, second);
    let interference = devices.interference()?;
    // Two engines, one per stage, each with up to half the seats.
    let engines = devices.engine_interference(&profile, args.max_batch.div_ceil(2))?;
    // The planner prices the two devices working at once with the engines' κ (see
    // `Devices::engine_interference`); the layers' is reported beside it.
    if let Some(e) = &engines {
        profile_source.push_str(&format!(
            "; the devices' interference, measured at start-up: {}; κ = {:.2} over the layers alone (each \
             device's decode step through half the layers: alone {:.2?} ms, a pass of {} micro-batches {:.2} ms)",
            e.summary(),
            interference.kappa,
            interference.alone_ms,
            interference.step.micro_batches,
            interference.pass_ms
        ));
    }
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
        let waa_interference = devices.waa_interference(&plan_workload, strategies)?;
        if let Some(waa) = &waa_interference {
            eprintln!("{}: {}", w.name, waa.summary(["prefill device", "decode device"]));
        }
        let waa = waa_interference.as_ref().map(|w| w.kappa);
        let priced = match &engines {
            Some(e) => e.priced(waa),
            None => DeviceInterference { stages: interference.kappa, stages_at_batch: None, waa },
        };
        let (bounds, from_profile) = match &args.latency_bounds {
            Some(b) => (b.clone(), false),
            None => (default_bounds(&devices, &profile, &plan_workload, priced, strategies)?, true),
        };
        eprintln!(
            "{}: {} requests, mean prompt {mean_prompt:.1}, output mean {mean_output:.1} (p99 {p99_output}); bounds {bounds:.3?} s",
            w.name,
            reqs.len()
        );
        let plans: Vec<Result<ScheduleOutput, String>> = bounds
            .iter()
            .map(|&b| devices.plan(&profile, &plan_workload, b, priced, strategies).map_err(|e| e.to_string()))
            .collect();
        if let Some(plan) = plans.iter().flatten().next() {
            pct = plan.latency_percentile;
        }

        let default = measure(&devices, base.clone(), &reqs, pct, &processes)?;
        eprintln!("  (a) FCFS default: {:.2} req/s, p{pct} {:.3} s", default.requests_per_s, default.latency_s);
        // FCFS also runs at each plan's seat count, so that (c) is compared with FCFS at the
        // same batch too, not only at the grid's powers of two.
        let mut fcfs_seats = grid.clone();
        fcfs_seats.extend(plans.iter().flatten().map(|p| p.decode_batch));
        fcfs_seats.sort_unstable();
        fcfs_seats.dedup();
        let mut fcfs_grid = Vec::new();
        for &seqs in &fcfs_seats {
            let r = measure(&devices, EngineConfig { max_num_seqs: seqs, ..base.clone() }, &reqs, pct, &processes)?;
            eprintln!("  (b) FCFS max_num_seqs {seqs}: {:.2} req/s, p{pct} {:.3} s", r.requests_per_s, r.latency_s);
            fcfs_grid.push(r);
        }
        let mut static_grid = Vec::new();
        for &seqs in &grid {
            let one_seat = fcfs_grid.iter().find(|r| r.max_num_seqs == 1).filter(|_| seqs == 1);
            let r = match one_seat {
                Some(one_seat) => one_seat.clone(),
                None => measure(&devices, static_config(&base, seqs, &spec), &reqs, pct, &processes)?,
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
                    let (engine, seqs) = devices.exegpt(&plan, &base)?;
                    let r = run_engine(engine, seqs, &reqs, pct, &processes)?;
                    eprintln!(
                        "  (c) ExeGPT {} at {bound:.3} s: {:.2} req/s (predicted {:.2}), p{pct} {:.3} s (predicted {:.3}){}",
                        plan_shape(&plan),
                        r.requests_per_s,
                        plan.throughput_qps,
                        r.latency_s,
                        plan.latency_s,
                        r.devices.map_or(String::new(), |d| format!(
                            "; prefill device busy {:.0}%, decode device {:.0}%, {} KV hand-offs, {} bytes in {:.3} s",
                            100.0 * d.prefill_busy,
                            100.0 * d.decode_busy,
                            d.kv_transfers,
                            d.kv_transfer_bytes,
                            d.kv_transfer_s
                        ))
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
            waa_interference,
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
    if let Some(d) = &args.devices {
        command.push_str(&format!(" --devices {}", d.join(",")));
    }
    if args.loopback_workers {
        command.push_str(" --loopback-workers");
    }
    if let Some(layers) = &args.stage_layers {
        command.push_str(&format!(" --stage-layers {layers}"));
    }
    if let Some(strategies) = strategies {
        let names: Vec<String> = strategies.iter().map(|s| s.to_string()).collect();
        command.push_str(&format!(" --strategies {}", names.join(",")));
    }
    let load = [load_before, load_average()];
    // One current report per set-up: one device; two, the planner choosing (c); two, (c) WAA only.
    let waa_only = strategies.is_some_and(|s| !s.contains(&Strategy::Rra));
    let name = match (args.devices.is_some() || args.loopback_workers, waa_only) {
        (false, _) => "schedule",
        (true, false) => "schedule-devices",
        (true, true) => "schedule-devices-waa",
    };
    let header = Header::new(name, command, Some(args.device.name()), model_name.clone());
    let md = markdown(&header, &model_name, &args, &devices, &profile_source, &profile, load, pct, &results);
    let png = plot::schedule_png(&args.out.join(format!("{name}.png")), &plot_series(&results));
    let report = Report {
        header,
        devices: devices.describe(),
        layers: spec.num_layers,
        kv_tokens: args.kv_tokens,
        block_size: args.block_size,
        latency_percentile: pct,
        profile,
        profile_source,
        layer_interference: engines.is_some().then_some(interference),
        engine_interference: engines,
        load_average: load,
        workloads: results,
    };
    report::write(&args.out, name, &report, &md)?;
    match png {
        Ok(path) => eprintln!("wrote {}", path.display()),
        Err(e) => eprintln!("no plot: {e}"),
    }
    Ok(())
}
