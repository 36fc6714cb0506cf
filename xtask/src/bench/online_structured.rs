//! `cargo xtask bench serve --online --online-structured`: what structured outputs cost a
//! loaded server. One `serve` (paged engine, FCFS) on a real model (default: the cached SmolLM2
//! GGUF) takes the online benchmark's Poisson workload twice per rate: every request plain, then
//! every second request with `guided_json` (a fixed-length array of bounded integers, so that a
//! structured request runs to its `max_tokens` like a plain one and both carry the same tokens).
//! Reports throughput, TTFT and TPOT p50/p99 of both.

use std::path::Path;
use std::time::Instant;

use burn_llm::DeviceChoice;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm_server::Server;
use burn_llm_server::launch::ServeArgs;
use rand::SeedableRng;
use serde::Serialize;
use serde_json::{Value, json};

use super::online::{OnlineArgs, RatePoint, send, summarize};
use super::workload::SyntheticWorkload;
use crate::report::{self, Align::Left, Align::Right, Header, table};

#[derive(Serialize)]
struct MixResult {
    name: &'static str,
    points: Vec<RatePoint>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    workload: SyntheticWorkload,
    kv_tokens: usize,
    schema: Value,
    mixes: Vec<MixResult>,
}

/// Runs both mixes at every rate and writes `serve-online-structured.{json,md}`.
pub fn run(args: &OnlineArgs, device: DeviceChoice, seed: u64, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let model = args.online_model.clone().unwrap_or_else(|| SMOLLM2_GGUF.cached_path().display().to_string());
    let max_len = 2048;
    let workload = SyntheticWorkload::standard(args.online_scale, max_len)[0].clone();
    let blocks = format!("blocks:{}", args.online_kv_tokens / 16);
    let argv = [
        "serve",
        "--model",
        model.as_str(),
        "--device",
        device.name(),
        "--kv-cache-memory",
        blocks.as_str(),
        "--block-size",
        "16",
        "--max-num-seqs",
        "64",
        "--schedule",
        "fcfs",
        "--served-model-name",
        "bench",
    ];
    let serve = ServeArgs::try_parse_from(argv)?;
    let server = Server::start_models(serve.model_entries()?, serve.server_config()?)
        .map_err(|e| format!("{e} (run `cargo xtask fetch-model smollm2`, or give --online-model)"))?;
    let vocab = server.info().spec.vocab_size;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Prompts avoid the first ids (special tokens) so that they read as ordinary text.
    let requests: Vec<_> = workload
        .requests(args.online_requests, vocab - 100, max_len, &mut rng)
        .into_iter()
        .map(|(prompt, output)| (prompt.into_iter().map(|t| t + 100).collect(), output))
        .collect();
    let longest = requests.iter().map(|r| r.1).max().unwrap_or(1);
    let schema = json!({
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9999},
        "minItems": longest,
        "maxItems": longest,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}/v1/completions", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = runtime.spawn(server.serve(listener, async {
        let _ = stopped.await;
    }));
    let client = super::online::client();
    runtime.block_on(send(&client, &url, &requests[..2], 1.0, &mut rng, Some(&schema)))?; // warm-up
    let mut mixes = vec![
        MixResult { name: "all plain", points: Vec::new() },
        MixResult { name: "half structured", points: Vec::new() },
    ];
    // Structured outputs checked against the schema (each a prefix of a valid array, since it
    // stops at `max_tokens`).
    let mut checked = 0;
    for (k, &rate) in args.rates.iter().enumerate() {
        for mix in mixes.iter_mut() {
            let structured = (mix.name == "half structured").then_some(&schema);
            // Both mixes see the same arrival times at a rate, so they differ only in the guides.
            let mut arrivals = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_add(1 + k as u64));
            let started = Instant::now();
            let (samples, texts) = runtime.block_on(send(&client, &url, &requests, rate, &mut arrivals, structured))?;
            for text in &texts {
                check_output(text, &schema)?;
            }
            checked += texts.len();
            let point = summarize(rate, &samples, started.elapsed().as_secs_f64());
            eprintln!(
                "{} @ {rate} req/s: {:.0} tokens/s, TPOT p99 {:.4} s",
                mix.name, point.output_tokens_per_s, point.tpot_p99_s
            );
            mix.points.push(point);
        }
    }
    let _ = stop.send(());
    runtime.block_on(task)??;

    let rates: Vec<String> = args.rates.iter().map(f64::to_string).collect();
    let command = format!(
        "cargo xtask bench serve --online --online-structured --device {} --rates {} --online-requests {} --online-scale {} --online-kv-tokens {} --seed {seed}",
        device.name(),
        rates.join(","),
        args.online_requests,
        args.online_scale,
        args.online_kv_tokens
    );
    let header =
        Header::new("serve-online-structured", command, Some(device.name()), crate::report::home_relative(&model));
    let mut md = header.markdown("Online serving with structured outputs: all plain vs half guided_json");
    md.push_str(&format!(
        "- workload: {} (prompt mean {:.0}, output mean {:.0} tokens), {} requests per rate, greedy, `ignore_eos`\n\
         - structured requests: every second one, `guided_json` = an array of exactly {longest} integers in [0, 9999] (runs to `max_tokens`); all {checked} outputs are prefixes of such an array\n\
         - KV budget: {} tokens; paged engine, FCFS\n\n",
        workload.name, workload.prompt.mean, workload.output.mean, args.online_requests, args.online_kv_tokens
    ));
    let cols = [
        ("requests", Left),
        ("rate (req/s)", Right),
        ("tokens/s", Right),
        ("TTFT p50 / p99 (s)", Right),
        ("TPOT p50 / p99 (s)", Right),
        ("e2e / token (s)", Right),
    ];
    let rows = (0..args.rates.len()).flat_map(|k| {
        mixes.iter().map(move |m| {
            let p = &m.points[k];
            vec![
                m.name.to_string(),
                format!("{}", p.rate),
                format!("{:.1}", p.output_tokens_per_s),
                format!("{:.3} / {:.3}", p.ttft_p50_s, p.ttft_p99_s),
                format!("{:.4} / {:.4}", p.tpot_p50_s, p.tpot_p99_s),
                format!("{:.4}", p.normalized_latency_s_per_token),
            ]
        })
    });
    md.push_str(&table(&cols, rows));
    let report = Report { header, workload, kv_tokens: args.online_kv_tokens, schema, mixes };
    report::write(out, "serve-online-structured", &report, &md)?;
    println!("{md}");
    Ok(())
}

/// Checks that `text`, a structured output cut at `max_tokens`, begins an array that `schema`
/// (integers within its `minimum`..`maximum`) allows: closed after its last complete item, it
/// parses, and every item is in range.
fn check_output(text: &str, schema: &Value) -> Result<(), String> {
    let bad = |why: &str| format!("structured output {text:?} is not the start of the schema's array: {why}");
    // Unless it is complete, drop a number the cut may have left unfinished and close the array.
    let closed = match text.strip_suffix(']') {
        Some(_) => text.to_string(),
        None => {
            let cut = text.trim_end_matches(|c: char| c.is_ascii_digit());
            format!("{}]", cut.strip_suffix(',').unwrap_or(cut))
        }
    };
    let items: Vec<i64> = serde_json::from_str(&closed).map_err(|e| bad(&e.to_string()))?;
    let (low, high) = (schema["items"]["minimum"].as_i64(), schema["items"]["maximum"].as_i64());
    match items.iter().find(|&&v| low.is_some_and(|l| v < l) || high.is_some_and(|h| v > h)) {
        Some(v) => Err(bad(&format!("{v} is out of range"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_checked_as_array_prefixes() {
        let schema = json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9999}});
        for good in ["[", "[12", "[12,", "[12,3456,7", "[0,9999]"] {
            assert!(check_output(good, &schema).is_ok(), "{good}");
        }
        for bad in ["", "12", "[12,,3", "[\"a\"", "[12,10000,", "[-1"] {
            assert!(check_output(bad, &schema).is_err(), "{bad}");
        }
    }
}
