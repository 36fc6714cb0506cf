//! `cargo xtask bench placement`: AlpaServe's placement against replication (issue 30 §2), on
//! the real server over HTTP, each next to the simulator's prediction for the same trace.
//!
//! Two one-thread `worker` processes on loopback are the device pool. Two copies of SmolLM2-135M
//! Q4_1 (`cargo xtask fetch-model smollm2`) are served as `a` and `b`, with each device's memory
//! (`--device-memory`) set to `--memory-scale` × one model's weights, so that a device holds one
//! whole model, as in AlpaServe's experiments where replication is memory-bound. For each mode
//! (`--placement auto`, planned for the workload at CV 3 and the highest rate; `--placement
//! replicate`; and `pipeline`, `--placement manual:a=0,1;b=0,1`, both models pipelined over both
//! devices: the model-parallel placement of AlpaServe's claim, whichever the planner picks) one
//! server runs in this process; seeded gamma arrival traces per model (CV 1, 3,
//! 6; rates swept as fractions of one device's capacity for one model) are replayed against it,
//! and each trace is also run through the simulator on the server's placement
//! (`placement::evaluate`). SLO = `--slo-scale` × one request's predicted latency on one device.
//! As in AlpaServe's experiments and its simulator, nothing is batched: each stage serves one
//! request at a time (`--max-num-seqs 1`, and a pipelined model runs one virtual engine per stage,
//! so that a stage takes the next request once it has passed on the last). And as there (§4.6),
//! each group rejects at arrival a request it predicts would miss its SLO (`--admission slo`,
//! the default; a rejection is a miss), in the server and in the prediction alike.
//! Writes `bench-results/placement.{json,md,png}` ([`report`]).

mod replay;
mod report;

use std::path::{Path, PathBuf};

use burn_llm::models::PretrainedFiles;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm::plan::placement::{self, ModelRef, PlacementInput, PlacementWorkload};
use burn_llm::plan::sim::Admission;
use burn_llm_server::Server;
use burn_llm_server::launch::ServeArgs;
use burn_llm_server::placement::ServingPlacement;

use super::online::loopback_client::client;
use super::pipeline::workers::Workers;
use super::process_cpu::{CpuMeter, Process};
use report::{Point, Results};

/// The served names of the two copies.
const NAMES: [&str; 2] = ["a", "b"];

/// Flags of `bench placement`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Coefficients of variation of the arrival gaps.
    #[arg(long, value_delimiter = ',', default_value = "1,3,6")]
    cvs: Vec<f64>,
    /// Each model's rate as a fraction of one device's capacity for it (1 ÷ one request's
    /// predicted latency on one device).
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.4")]
    loads: Vec<f64>,
    /// Seconds of arrivals per trace.
    #[arg(long, default_value_t = 60.0)]
    duration_s: f64,
    /// SLO as a multiple of one request's predicted latency on one device.
    #[arg(long, default_value_t = 5.0)]
    slo_scale: f64,
    /// Each device's memory as a multiple of one model's weight bytes.
    #[arg(long, default_value_t = 1.5)]
    memory_scale: f64,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 16)]
    prompt_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 8)]
    max_tokens: usize,
    /// The worker executable (default: the `worker` example, built in xtask's profile).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
    /// Seed of the traces.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `slo`: the server rejects at arrival a request predicted to miss its SLO, as AlpaServe's
    /// controller does in the paper's experiments (a rejection is a miss); `all`: every request
    /// is served, however late.
    #[arg(long, value_enum, default_value_t = Admission::Slo)]
    admission: Admission,
    /// Placements to serve with: `auto`, `replicate`, `pipeline` (both models over both devices).
    #[arg(long, value_delimiter = ',', default_value = "auto,replicate,pipeline")]
    modes: Vec<String>,
    /// `pipeline` mode's engines compute at most this many tokens a step
    /// (`--max-num-batched-tokens`), so that a prompt is prefilled in chunks that follow each
    /// other through the two stages, the second stage computing one chunk while the first
    /// computes the next; 0 prefills whole prompts (`--no-chunked-prefill`). Without it, the
    /// server chooses the chunks at start-up, as for any model on a two-stage group. Replicas
    /// prefill whole prompts: on one device, chunks only add steps.
    #[arg(long)]
    pipeline_chunk_tokens: Option<usize>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

impl Args {
    fn check(&self) -> Result<(), String> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if self.cvs.is_empty() || !self.cvs.iter().all(|&c| c.is_finite() && c >= 0.0) {
            return Err("--cvs: give one or more non-negative numbers".into());
        }
        if self.loads.is_empty() || !self.loads.iter().all(|&l| positive(l)) {
            return Err("--loads: give one or more positive fractions".into());
        }
        for (flag, v) in
            [("--duration-s", self.duration_s), ("--slo-scale", self.slo_scale), ("--memory-scale", self.memory_scale)]
        {
            if !positive(v) {
                return Err(format!("{flag} must be a positive number"));
            }
        }
        if self.prompt_tokens == 0 || self.max_tokens == 0 {
            return Err("--prompt-tokens and --max-tokens must be at least 1".into());
        }
        if self.modes.is_empty() {
            return Err("--modes: give one or more of auto, replicate, pipeline".into());
        }
        for mode in &self.modes {
            placement_flag(mode)?;
        }
        Ok(())
    }

    fn command(&self) -> String {
        let list = |v: &[f64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        format!(
            "cargo xtask bench placement --cvs {} --loads {} --duration-s {} --slo-scale {} --memory-scale {} --prompt-tokens {} --max-tokens {} --seed {} --admission {} --modes {}{}",
            list(&self.cvs),
            list(&self.loads),
            self.duration_s,
            self.slo_scale,
            self.memory_scale,
            self.prompt_tokens,
            self.max_tokens,
            self.seed,
            self.admission.name(),
            self.modes.join(","),
            self.pipeline_chunk_tokens.map(|c| format!(" --pipeline-chunk-tokens {c}")).unwrap_or_default()
        )
    }
}

/// The shared `serve` flags: both copies over the workers' pool.
fn serve_argv(model: &Path, workers: &Workers, extra: &[String]) -> Vec<String> {
    let model = model.display().to_string();
    let pool: Vec<&str> = workers.all().iter().map(|w| w.url.as_str()).collect();
    let model = model.as_str();
    let mut argv: Vec<String> = ["serve", "--model", model, "--served-model-name", NAMES[0]]
        .into_iter()
        .chain(["--model", model, "--served-model-name", NAMES[1]])
        .map(String::from)
        .collect();
    argv.extend(["--devices".into(), pool.join(","), "--worker-token".into(), workers.token.clone()]);
    argv.extend(
        ["--kv-cache-memory", "blocks:64", "--max-num-seqs", "1", "--worker-timeout-s", "300"].map(String::from),
    );
    argv.extend(extra.iter().cloned());
    argv
}

/// The `--placement` value of a mode of [`Args::modes`].
fn placement_flag(mode: &str) -> Result<String, String> {
    match mode {
        "auto" | "replicate" => Ok(mode.to_string()),
        "pipeline" => Ok(format!("manual:{}=0,1;{}=0,1", NAMES[0], NAMES[1])),
        other => Err(format!("--modes: unknown mode `{other}`: give auto, replicate or pipeline")),
    }
}

/// Writes a workload file for both models at `rate` each and coefficient of variation `cv`.
fn workload_file(dir: &Path, args: &Args, rate: f64, cv: f64, slo_s: f64) -> std::io::Result<PathBuf> {
    let models: Vec<_> = NAMES
        .iter()
        .map(|n| {
            serde_json::json!({"model": n, "rate": rate, "cv": cv, "slo_s": slo_s,
                "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens})
        })
        .collect();
    let path = dir.join(format!("burn-llm-placement-workload-{}.json", std::process::id()));
    let body = serde_json::json!({"duration_s": args.duration_s, "seed": args.seed, "models": models});
    std::fs::write(&path, body.to_string())?;
    Ok(path)
}

/// The placement `argv` asks for, profiled and planned (nothing loaded).
fn planned(argv: &[String]) -> Result<ServingPlacement, Box<dyn std::error::Error>> {
    let args = ServeArgs::try_parse_from(argv)?;
    let mut log = Vec::new();
    let placed = args.placed_entries(&mut log);
    eprint!("{}", String::from_utf8_lossy(&log));
    placed?.1.ok_or_else(|| "no placement".into())
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    args.check()?;
    let model = SMOLLM2_GGUF.cached_path();
    if !model.is_file() {
        return Err(format!("{} is not cached: run `cargo xtask fetch-model smollm2` first", model.display()).into());
    }
    let vocab = PretrainedFiles::open(&model)?.spec.vocab_size;
    let tmp = std::env::temp_dir();
    let workers = Workers::start(&[1, 1], args.worker_bin.as_deref(), &tmp)?;
    // The bench process (the server and the replaying client) and the workers, metered per replay.
    let mut processes = vec![Process::this("server")];
    processes.extend(workers.processes());
    // One request's cost and one model's bytes, from the profile (measured once, then cached).
    let probe = workload_file(&tmp, &args, 1.0, 1.0, 1e6)?;
    let base = planned(&serve_argv(
        &model,
        &workers,
        &["--placement".into(), "replicate".into(), "--workload".into(), probe.display().to_string()],
    ))?;
    let input = base.input.clone().ok_or("the placement profiled nothing")?;
    let one_device_s: f64 = input.models[0].layer_latency_ms.iter().sum::<f64>() / 1000.0;
    let model_bytes: u64 = input.models[0].layer_memory_bytes.iter().sum();
    let cap = (model_bytes as f64 * args.memory_scale) as u64;
    let slo_s = args.slo_scale * one_device_s;
    let top_rate = args.loads.iter().copied().fold(0.0, f64::max) / one_device_s;
    eprintln!(
        "one request on one device: {one_device_s:.3} s predicted; SLO {slo_s:.3} s; model {model_bytes} bytes, device memory {cap}"
    );
    let plan_workload = workload_file(&tmp, &args, top_rate, 3.0, slo_s)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let http = client();
    let mut results = Results { one_device_s, slo_s, model_bytes, device_memory_bytes: cap, modes: Vec::new() };
    for mode in &args.modes {
        let extra = [
            "--placement".to_string(),
            placement_flag(mode)?,
            "--workload".into(),
            plan_workload.display().to_string(),
            "--device-memory".into(),
            format!("{cap},{cap}"),
            "--admission".into(),
            args.admission.name().into(),
        ];
        let chunks = match (mode.as_str(), args.pipeline_chunk_tokens) {
            ("pipeline", Some(0)) => vec!["--no-chunked-prefill".to_string()],
            ("pipeline", Some(c)) => vec!["--max-num-batched-tokens".to_string(), c.to_string()],
            _ => Vec::new(),
        };
        let extra: Vec<String> = extra.into_iter().chain(chunks).collect();
        let argv = serve_argv(&model, &workers, &extra);
        let serve = ServeArgs::try_parse_from(argv)?;
        let mut log = Vec::new();
        let (entries, placement) = serve.placed_entries(&mut log)?;
        eprint!("{}", String::from_utf8_lossy(&log));
        let placement = placement.ok_or("no placement")?;
        let input = placement.input.clone().ok_or("the placement profiled nothing")?;
        let server = Server::start_models(entries, serve.server_config()?)?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let url = format!("http://{}/v1/completions", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        let names: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
        // Warm-up: one request per model.
        let warm = replay::trace(&[1.0, 1.0], 0.0, 1.5, args.seed, args.prompt_tokens, vocab);
        runtime.block_on(replay::replay(&http, &url, &names, &warm, args.max_tokens))?;
        let mut points = Vec::new();
        for &cv in &args.cvs {
            for &load in &args.loads {
                let rate = load / one_device_s;
                let trace = replay::trace(&[rate, rate], cv, args.duration_s, args.seed, args.prompt_tokens, vocab);
                if trace.is_empty() {
                    continue;
                }
                let meter = CpuMeter::start(&processes);
                let measured = runtime.block_on(replay::replay(&http, &url, &names, &trace, args.max_tokens))?;
                let cpu = meter.read();
                let predicted = predict(&input, &placement, &trace)?;
                let point = Point { cpu, ..Point::new(cv, load, rate, slo_s, &measured, &predicted) };
                eprintln!(
                    "{mode} cv {cv} load {load}: {} requests, attainment {:.1}% (predicted {:.1}%), rejected {:.1}% (predicted {:.1}%), p99 {:.2} s (predicted {:.2} s)",
                    point.requests,
                    100.0 * point.attainment,
                    100.0 * point.predicted_attainment,
                    100.0 * point.rejected,
                    100.0 * point.predicted_rejected,
                    point.p99_s,
                    point.predicted_p99_s
                );
                if let Some(cpu) = &point.cpu {
                    eprintln!("  cores busy: {}", cpu.describe());
                }
                points.push(point);
            }
        }
        let _ = stop.send(());
        runtime.block_on(task)??;
        results.modes.push(report::Mode { mode: mode.clone(), placement: placement.lines(), points });
    }
    let _ = std::fs::remove_file(&probe);
    let _ = std::fs::remove_file(&plan_workload);
    drop(workers);
    report::write(&args.out, &args.command(), &file_name(&model), results)
}

/// The simulator's latency of every request of `trace` on `placement`, in trace order (`None`:
/// rejected at arrival).
fn predict(
    input: &PlacementInput,
    placement: &ServingPlacement,
    trace: &[replay::Arrival],
) -> Result<Vec<Option<f64>>, Box<dyn std::error::Error>> {
    let mut input = input.clone();
    input.workload = PlacementWorkload {
        trace: Some(trace.iter().map(|a| (a.at_s, ModelRef::Index(a.model))).collect()),
        arrivals: None,
        duration_s: None,
        seed: None,
    };
    let out = placement::evaluate(&input, placement.groups.clone())?;
    Ok(out.latencies_s)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}
