//! What a CLI run prints at the end: the `--json` object ([`JsonReport`]) and the closing line of a
//! text run ([`summary`]).

use serde::Serialize;

use burn_llm_models::{GenerationOutput, RequestOutput};

use crate::engine::RunReport;

/// The `--json` output.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// The `--model` argument.
    pub model: &'a str,
    /// The device backend.
    pub device: &'a str,
    /// One entry per prompt.
    pub requests: &'a [RequestOutput],
    /// Timings.
    pub timing: JsonTiming,
    /// The offloading policy that ran (`--engine offload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<serde_json::Value>,
    /// Peak memory per tier (`--engine offload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<serde_json::Value>,
    /// Which devices ran which stages and the bytes handed between them (parallel runs), and with
    /// `--stage-layers auto` the planner's prediction (per-stage decode step and request time,
    /// the bottleneck stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// The same split, structured (parallel runs): `stages` (each with `first_layer`,
    /// `last_layer` and `devices`), `tensor_parallel`, and with `--stage-layers auto`
    /// `predicted` (per stage: predicted prefill, decode step and request ms, bytes, link; the
    /// bottleneck stage and its time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
}

impl<'a> JsonReport<'a> {
    /// The report of a run that took `load_s` seconds to load.
    pub fn new(model: &'a str, device: &'a str, output: &'a GenerationOutput, load_s: f64) -> Self {
        Self {
            model,
            device,
            requests: &output.requests,
            timing: JsonTiming {
                load_s,
                prefill_s: output.timing.prefill_s,
                decode_s: output.timing.decode_s,
                generated_tokens: output.timing.generated_tokens,
                tokens_per_s: output.timing.tokens_per_s(),
            },
            policy: None,
            memory: None,
            placement: None,
            plan: None,
        }
    }

    /// Adds what the engine reported beyond timing: the offloading policy and its per-tier peak
    /// memory (absent for the other engines).
    pub fn with_report(mut self, report: &RunReport) -> Self {
        self.policy = report.policy_json();
        self.memory = report.memory.and_then(|m| serde_json::to_value(m).ok());
        self
    }
}

/// Timings of a CLI run.
#[derive(Debug, Serialize)]
pub struct JsonTiming {
    /// Loading model and tokenizer.
    pub load_s: f64,
    /// Prompt processing to the first token.
    pub prefill_s: f64,
    /// The remaining steps.
    pub decode_s: f64,
    /// Tokens generated over all prompts.
    pub generated_tokens: usize,
    /// `generated_tokens / (prefill_s + decode_s)`.
    pub tokens_per_s: f64,
}

/// The closing line of a text run: load time, timing and throughput, plus what the engine
/// predicted and measured where it reports more (the offloading engine's prediction and per-tier
/// peak memory).
pub fn summary(report: &RunReport, load_s: f64) -> String {
    let t = &report.timing;
    let mut line = format!(
        "[load {load_s:.2} s · prefill {:.3} s · decode {:.3} s · {} tokens · {:.1} tokens/s",
        t.prefill_s,
        t.decode_s,
        t.generated_tokens,
        t.tokens_per_s()
    );
    if let Some(predicted) = report.predicted_tokens_per_s() {
        line.push_str(&format!(" · predicted {predicted:.2} tokens/s"));
    }
    if let Some(m) = &report.memory {
        let fmt = burn_offload::store::fmt_bytes;
        line.push_str(&format!(
            " · peak memory: device {}, host {}, disk {}",
            fmt(m.gpu_peak_bytes),
            fmt(m.cpu_peak_bytes),
            fmt(m.disk_bytes)
        ));
    }
    line.push(']');
    line
}
