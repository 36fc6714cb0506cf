//! The arrival traces and their replay: seeded gamma processes per model (the planner's own
//! generator), sent over HTTP at their arrival times, each request's end-to-end latency measured.

use std::time::{Duration, Instant};

use burn_llm::plan::sim;
use rand::{Rng, SeedableRng};
use reqwest::Client;
use serde_json::json;

/// One request of a trace: when it is sent, to which model (index), and its prompt.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub at_s: f64,
    pub model: usize,
    pub prompt: Vec<u32>,
}

/// The requests of `rates.len()` models over `duration_s`: model `m` a gamma process of rate
/// `rates[m]` and coefficient of variation `cv` (stream `m` of `seed`), with random prompts of
/// `prompt_tokens` ids below `vocab`; sorted by arrival.
pub fn trace(rates: &[f64], cv: f64, duration_s: f64, seed: u64, prompt_tokens: usize, vocab: usize) -> Vec<Arrival> {
    let mut prompts = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9);
    let mut out = Vec::new();
    for (m, &rate) in rates.iter().enumerate() {
        let mut rng = sim::rng(seed, m as u64);
        for at_s in sim::gamma_arrivals(rate, cv, duration_s, usize::MAX, &mut rng) {
            let prompt = (0..prompt_tokens).map(|_| prompts.random_range(0..vocab as u32)).collect();
            out.push(Arrival { at_s, model: m, prompt });
        }
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// Sends every arrival to `url` at its time (model `names[model]`, greedy, exactly `max_tokens`
/// tokens); returns each request's end-to-end latency in seconds, in trace order, `None` for a
/// request the server rejected at arrival as predicted to miss its SLO (`--admission slo`); an
/// error where a request came back with fewer tokens.
pub async fn replay(
    client: &Client,
    url: &str,
    names: &[String],
    arrivals: &[Arrival],
    max_tokens: usize,
) -> Result<Vec<Option<f64>>, Box<dyn std::error::Error>> {
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        let body = json!({
            "model": names[a.model], "prompt": a.prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": true,
        });
        let (client, url) = (client.clone(), url.to_string());
        let send_at = start + Duration::from_secs_f64(a.at_s);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(send_at).await;
            let sent = Instant::now();
            let response = client.post(&url).json(&body).send().await.map_err(std::io::Error::other)?;
            let status = response.status().as_u16();
            let text = response.text().await.map_err(std::io::Error::other)?;
            if status == 503 && text.contains("\"slo_unattainable\"") {
                return Ok(None);
            }
            if status != 200 {
                return Err(std::io::Error::other(format!("HTTP {status}: {text}")));
            }
            // A reply with fewer tokens than asked did less work than the trace asks: timed as
            // served, it would flatter the mode.
            let reply: serde_json::Value = serde_json::from_str(&text).map_err(std::io::Error::other)?;
            let generated = reply["usage"]["completion_tokens"].as_u64();
            if generated != Some(max_tokens as u64) {
                let reason = &reply["choices"][0]["finish_reason"];
                return Err(std::io::Error::other(format!(
                    "a request returned {generated:?} of its {max_tokens} tokens (finish_reason {reason}): the \
                     replay would time less work than the trace asks; check the model's context and KV memory"
                )));
            }
            Ok::<_, std::io::Error>(Some(sent.elapsed().as_secs_f64()))
        }));
    }
    let mut latencies = Vec::with_capacity(tasks.len());
    for task in tasks {
        latencies.push(task.await??);
    }
    Ok(latencies)
}
