//! `cargo xtask bench serve --online`: vLLM's online serving methodology (§5.6 of the thesis).
//! Each server configuration (a list of `serve` flags) is started on loopback with the
//! benchmark's synthetic model; an async HTTP client sends ShareGPT-like requests with Poisson
//! arrivals at a sweep of rates, streaming each response; per rate: throughput, normalized
//! latency (mean end-to-end latency ÷ output length, s/token), TTFT and TPOT p50/p99. The rate a
//! configuration sustains is the highest swept rate whose normalized latency stays within twice
//! its lowest-rate value.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::tensor::Device;
use burn_llm::{DeviceChoice, Engine, Purpose};
use burn_llm_server::Server;
use burn_llm_server::launch::ServeArgs;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;

use super::plot::{self, Panel};
use super::serve::model;
use super::workload::{Request, SyntheticWorkload};
use crate::report::{self, Align::Left, Align::Right, Header, percentile, table};
use loopback_client::SseEvents;
pub(super) use loopback_client::client;
use reqwest::Client;

/// The server tests' `reqwest` client (with the rustls provider installed) and SSE reader (also
/// the placement benchmark's client).
#[allow(dead_code)]
#[path = "../../../tests/all/loopback_client.rs"]
pub(super) mod loopback_client;

/// Flags of the online mode.
#[derive(clap::Args)]
pub struct OnlineArgs {
    /// Online mode: request rates to sweep (requests/s).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub(super) rates: Vec<f64>,
    /// Online mode: requests per rate.
    #[arg(long, default_value_t = 32)]
    pub(super) online_requests: usize,
    /// Online mode: multiplies ShareGPT's mean lengths (161 in / 338 out).
    #[arg(long, default_value_t = 0.1)]
    pub(super) online_scale: f64,
    /// Online mode: KV-cache budget in tokens (every configuration).
    #[arg(long, default_value_t = 4096)]
    pub(super) online_kv_tokens: usize,
    /// Online mode: all-plain requests against half of them structured (`guided_json`) on the
    /// paged engine and a real model, instead of the engine comparison.
    #[arg(long)]
    pub(super) online_structured: bool,
    /// Online mode with `--online-structured`: the model (default: the cached SmolLM2 GGUF).
    #[arg(long)]
    pub(super) online_model: Option<String>,
}

/// The server configurations compared, as `serve` flags added to [`KV_FLAGS`]: the paged engine
/// (vLLM's FCFS), request-level static batching and Orca (Max), all on the same KV budget.
const CONFIGS: [(&str, &[&str]); 3] = [
    ("paged (vLLM)", &["--schedule", "fcfs"]),
    ("Orca (Max)", &["--schedule", "orca-max"]),
    ("static batching", &["--schedule", "static"]),
];

/// The KV budget and batch limit every configuration shares (`{blocks}`: the budget in blocks of
/// 16 tokens).
const KV_FLAGS: [&str; 6] = ["--kv-cache-memory", "blocks:{blocks}", "--block-size", "16", "--max-num-seqs", "64"];

#[derive(Serialize)]
pub(super) struct RatePoint {
    pub(super) rate: f64,
    pub(super) requests: usize,
    pub(super) seconds: f64,
    pub(super) requests_per_s: f64,
    pub(super) output_tokens_per_s: f64,
    pub(super) normalized_latency_s_per_token: f64,
    pub(super) ttft_p50_s: f64,
    pub(super) ttft_p99_s: f64,
    pub(super) tpot_p50_s: f64,
    pub(super) tpot_p99_s: f64,
}

#[derive(Serialize)]
struct ConfigResult {
    name: String,
    flags: Vec<String>,
    points: Vec<RatePoint>,
    /// Highest swept rate with normalized latency ≤ 2 × the lowest rate's.
    sustained_rate: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    workload: SyntheticWorkload,
    kv_tokens: usize,
    configs: Vec<ConfigResult>,
    /// The paged engine's sustained rate ÷ static batching's (vLLM reports 2× and more).
    paged_over_static: Option<f64>,
}

/// One request's measurements: (seconds to first token, end-to-end seconds, output tokens).
pub(super) type Sample = (f64, f64, usize);

/// Runs the sweep for every configuration and writes `serve-online.{json,md,png}`.
pub fn run(args: &OnlineArgs, device: DeviceChoice, seed: u64, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    if args.online_structured {
        return super::online_structured::run(args, device, seed, out);
    }
    let max_len = 1024;
    let workload = SyntheticWorkload::standard(args.online_scale, max_len)[0].clone();
    let spec = model(&device.device()?, max_len)?.spec().clone();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let requests = workload.requests(args.online_requests, spec.vocab_size, max_len, &mut rng);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut configs = Vec::new();
    for (name, template) in CONFIGS {
        let blocks = (args.online_kv_tokens / 16).to_string();
        let flags: Vec<String> = KV_FLAGS.iter().chain(template).map(|f| f.replace("{blocks}", &blocks)).collect();
        let mut argv = vec!["serve".to_string(), "--model".into(), "synthetic".into(), "--device".into()];
        argv.push(device.name().into());
        argv.extend(flags.iter().cloned());
        let serve = ServeArgs::try_parse_from(&argv)?;
        // The `serve` example's engine flags, on the synthetic model (which has no directory).
        let spec = serve.engine_spec();
        let build = Box::new(move || -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
            let device: Device = spec.device_choice().device()?;
            spec.init_model(model(&device, max_len)?, None, vec![], Purpose::Serve, &mut std::io::sink())
        });
        let server = Server::start(build, serve.server_config()?)?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let url = format!("http://{}/v1/completions", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        let client = client();
        runtime.block_on(send(&client, &url, &requests[..1], 1.0, &mut rng, None))?; // warm-up
        let mut points = Vec::new();
        for &rate in &args.rates {
            let started = Instant::now();
            let (samples, _) = runtime.block_on(send(&client, &url, &requests, rate, &mut rng, None))?;
            let point = summarize(rate, &samples, started.elapsed().as_secs_f64());
            eprintln!(
                "{name} @ {rate} req/s: {:.2} req/s, {:.4} s/token, TTFT p50 {:.3} s",
                point.requests_per_s, point.normalized_latency_s_per_token, point.ttft_p50_s
            );
            points.push(point);
        }
        let _ = stop.send(());
        runtime.block_on(task)??;
        let unloaded = points.first().map_or(f64::MAX, |p| p.normalized_latency_s_per_token);
        let sustained_rate = points
            .iter()
            .filter(|p| p.normalized_latency_s_per_token <= 2.0 * unloaded)
            .map(|p| p.rate)
            .fold(None, |best: Option<f64>, r| Some(best.map_or(r, |b| b.max(r))));
        configs.push(ConfigResult { name: name.to_string(), flags, points, sustained_rate });
    }
    write(args, device, seed, out, workload, configs)
}

/// Sends `requests` with Poisson arrivals at `rate`, each streamed (every second one with
/// `guided_json: half_structured` when given); returns what each measured: its first token is the
/// first event carrying a choice, and its output length is what the server's closing usage
/// counts (a request that ended early counts the tokens it did produce). Also returns the text of
/// every structured request, for the caller to check.
pub(super) async fn send(
    client: &Client,
    url: &str,
    requests: &[Request],
    rate: f64,
    rng: &mut impl Rng,
    half_structured: Option<&serde_json::Value>,
) -> Result<(Vec<Sample>, Vec<String>), Box<dyn std::error::Error>> {
    let start = tokio::time::Instant::now();
    let mut at = 0.0;
    let mut tasks = Vec::new();
    for (i, (prompt, output)) in requests.iter().enumerate() {
        at += -(rng.random::<f64>().max(1e-12)).ln() / rate;
        let mut body = json!({
            "prompt": prompt, "max_tokens": output, "temperature": 0, "ignore_eos": true,
            "stream": true, "logprobs": 1, "stream_options": {"include_usage": true},
        });
        let structured = half_structured.filter(|_| i % 2 == 1);
        if let Some(schema) = structured {
            body["guided_json"] = schema.clone();
        }
        let structured = structured.is_some();
        let (client, url) = (client.clone(), url.to_string());
        let send_at = start + Duration::from_secs_f64(at);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(send_at).await;
            let sent = Instant::now();
            let response = client.post(&url).json(&body).send().await.map_err(std::io::Error::other)?;
            if response.status().as_u16() != 200 {
                let status = response.status().as_u16();
                let text = response.text().await.map_err(std::io::Error::other)?;
                return Err(std::io::Error::other(format!("HTTP {status}: {text}")));
            }
            let mut events = SseEvents::new(response.bytes_stream());
            let (mut first, mut produced, mut text) = (None, None, String::new());
            while let Some(event) = events.next().await {
                let data = event.map_err(std::io::Error::other)?;
                if data == "[DONE]" {
                    continue;
                }
                let chunk: serde_json::Value = serde_json::from_str(&data).map_err(std::io::Error::other)?;
                if let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) {
                    first.get_or_insert_with(|| sent.elapsed().as_secs_f64());
                    text.push_str(choice["text"].as_str().unwrap_or_default());
                }
                if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
                    produced = Some(n as usize);
                }
            }
            let e2e = sent.elapsed().as_secs_f64();
            let produced = produced.ok_or_else(|| std::io::Error::other("the stream ended without its usage"))?;
            Ok::<_, std::io::Error>(((first.unwrap_or(e2e), e2e, produced), structured.then_some(text)))
        }));
    }
    let (mut samples, mut texts) = (Vec::new(), Vec::new());
    for task in tasks {
        let (sample, text) = task.await??;
        samples.push(sample);
        texts.extend(text);
    }
    Ok((samples, texts))
}

pub(super) fn summarize(rate: f64, samples: &[Sample], seconds: f64) -> RatePoint {
    let tokens: usize = samples.iter().map(|s| s.2).sum();
    let normalized =
        samples.iter().map(|&(_, e2e, n)| e2e / n.max(1) as f64).sum::<f64>() / samples.len().max(1) as f64;
    let ttft: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let tpot: Vec<f64> =
        samples.iter().filter(|s| s.2 > 1).map(|&(first, e2e, n)| (e2e - first) / (n - 1) as f64).collect();
    RatePoint {
        rate,
        requests: samples.len(),
        seconds,
        requests_per_s: samples.len() as f64 / seconds,
        output_tokens_per_s: tokens as f64 / seconds,
        normalized_latency_s_per_token: normalized,
        ttft_p50_s: percentile(&ttft, 50.0),
        ttft_p99_s: percentile(&ttft, 99.0),
        tpot_p50_s: percentile(&tpot, 50.0),
        tpot_p99_s: percentile(&tpot, 99.0),
    }
}

fn write(
    args: &OnlineArgs,
    device: DeviceChoice,
    seed: u64,
    out: &Path,
    workload: SyntheticWorkload,
    configs: Vec<ConfigResult>,
) -> Result<(), Box<dyn std::error::Error>> {
    let rates: Vec<String> = args.rates.iter().map(f64::to_string).collect();
    let command = format!(
        "cargo xtask bench serve --online --device {} --rates {} --online-requests {} --online-scale {} --online-kv-tokens {} --seed {seed}",
        device.name(),
        rates.join(","),
        args.online_requests,
        args.online_scale,
        args.online_kv_tokens
    );
    let header = Header::new("serve-online", command, Some(device.name()), "synthetic:serve-opt (random weights)");
    let mut md = header.markdown("Online serving: Poisson arrivals over HTTP (vLLM §5.6)");
    md.push_str(&format!(
        "- workload: {} (prompt mean {:.0}, output mean {:.0} tokens), {} requests per rate\n- KV budget: {} tokens\n\n",
        workload.name, workload.prompt.mean, workload.output.mean, args.online_requests, args.online_kv_tokens
    ));
    let cols = [
        ("configuration", Left),
        ("rate (req/s)", Right),
        ("throughput (req/s)", Right),
        ("tokens/s", Right),
        ("normalized latency (s/token)", Right),
        ("TTFT p50 / p99 (s)", Right),
        ("TPOT p50 / p99 (s)", Right),
    ];
    let rows = configs.iter().flat_map(|c| {
        c.points.iter().map(|p| {
            vec![
                c.name.clone(),
                format!("{}", p.rate),
                format!("{:.2}", p.requests_per_s),
                format!("{:.0}", p.output_tokens_per_s),
                format!("{:.4}", p.normalized_latency_s_per_token),
                format!("{:.3} / {:.3}", p.ttft_p50_s, p.ttft_p99_s),
                format!("{:.4} / {:.4}", p.tpot_p50_s, p.tpot_p99_s),
            ]
        })
    });
    md.push_str(&table(&cols, rows));
    md.push('\n');
    for c in &configs {
        let sustained = c.sustained_rate.map_or("none".to_string(), |r| format!("{r} req/s"));
        md.push_str(&format!(
            "- {}: sustains {sustained} at ≤ 2× its lowest-rate normalized latency (flags `{}`)\n",
            c.name,
            c.flags.join(" ")
        ));
    }
    let sustained = |name: &str| configs.iter().find(|c| c.name == name).and_then(|c| c.sustained_rate);
    let paged_over_static = sustained(CONFIGS[0].0).zip(sustained(CONFIGS[2].0)).map(|(p, s)| p / s);
    match paged_over_static {
        Some(ratio) => md.push_str(&format!("- paged ÷ static batching, sustained rate: {ratio:.2}×\n")),
        None => md.push_str("- paged ÷ static batching: undefined (a configuration sustains none of the rates)\n"),
    }
    let series = configs
        .iter()
        .map(|c| (c.name.clone(), c.points.iter().map(|p| (p.rate, Some(p.normalized_latency_s_per_token))).collect()))
        .collect();
    let panel = Panel { title: workload.name.to_string(), series };
    let axes = plot::Axes { x: "request rate (req/s)", y: "normalized latency (s/token)", log_x: false };
    match plot::line_png(&out.join("serve-online.png"), &[panel], &axes) {
        Ok(path) => md.push_str(&format!("\n![normalized latency against request rate]({})\n", file_name(&path))),
        Err(e) => md.push_str(&format!("\n(no chart: {e})\n")),
    }
    let report = Report { header, workload, kv_tokens: args.online_kv_tokens, configs, paged_over_static };
    report::write(out, "serve-online", &report, &md)?;
    println!("{md}");
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}
