//! `cargo xtask bench generate`: prefill and decode throughput of the plain engine.
//!
//! Each batch size runs one `generate` call on `batch` random prompts of `prompt_len` tokens and
//! generates `new_tokens` tokens per prompt with EOS ignored. Prefill tokens/s is prompt tokens ÷
//! time to the first sampled token; decode tokens/s is the later tokens ÷ the time of the later
//! steps. Without `--model`, a model of OPT-125m's shape with random weights is used (FlexGen's
//! "dummy weights"), so the benchmark needs no download.

use std::path::PathBuf;

use burn_llm::models::{CausalLm, Precision, Prompt, SamplingParams, hub};
use burn_llm::{DeviceChoice, Engine, EngineKind, EngineSpec, Purpose};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::synthetic;
use crate::report::{self, Align::Right, Header, table};

/// Flags of `bench generate`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// A model directory or hub id, or a built-in shape with random weights: synthetic:opt-125m,
    /// synthetic:gpt2, synthetic:smollm2-135m, synthetic:opt-1.3b, synthetic:opt-6.7b,
    /// synthetic:opt-30b, synthetic:llama-7b, synthetic:offload-opt.
    #[arg(long, default_value = "synthetic:opt-125m")]
    model: String,
    /// Batch sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batch_sizes: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Floating-point type of weights, activations and KV cache (f32, f16, bf16); default: f16 on
    /// GPU devices, f32 on flex (a GPU without f16 falls back to f32 with a note).
    #[arg(long)]
    dtype: Option<Precision>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    batch: usize,
    prefill_tokens_per_s: f64,
    decode_tokens_per_s: f64,
    prefill_s: f64,
    decode_s: f64,
    decode_steps: usize,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    prompt_len: usize,
    new_tokens: usize,
    batch_sizes: Vec<usize>,
    /// Floating-point type of the run (`scripts/hf_generate_bench.py` runs HF in the same one).
    dtype: Precision,
    /// The HF `config.json` of a synthetic model (absent for checkpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<serde_json::Value>,
    results: Vec<Row>,
}

/// The plain engine on `model` in `precision` on `device` (of kind `choice`): a built-in shape
/// with random weights, or a checkpoint whose weights are cast as they load; built as every engine
/// is ([`EngineSpec`]).
fn load(
    model: &str,
    precision: Precision,
    choice: DeviceChoice,
    device: &burn::tensor::Device,
) -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
    let spec = EngineSpec {
        engine: Some(EngineKind::Plain),
        device: Some(choice),
        dtype: Some(precision),
        ..EngineSpec::default()
    };
    let purpose = Purpose::Generate { prompts: &[], params: &SamplingParams::default() };
    if synthetic::config(model).is_some() {
        let decoder = synthetic::spec(model, precision)?;
        return spec.init_model(CausalLm::random(decoder, device)?, None, vec![], purpose, &mut std::io::sink());
    }
    spec.init(&hub::resolve_model(model)?, purpose, &mut std::io::stderr())
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let (dtype, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let mut engine = load(&args.model, dtype, args.device, &device)?;
    let vocab = engine.spec().vocab_size as u32;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(args.new_tokens.max(2)) };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut prompts = |n: usize| -> Vec<Prompt> {
        (0..n).map(|_| Prompt::Ids((0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect())).collect()
    };
    let warm_up = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(2) };
    let mut results = Vec::new();
    for &batch in &args.batch_sizes {
        // Warm-up at this batch's shapes (its prefill and its first decode steps): first-use
        // allocations, kernel compilation and, with the `autotune` feature, each GEMM shape's
        // tuning stay out of the figures.
        engine.generate(&prompts(batch), &warm_up)?;
        let t = engine.generate(&prompts(batch), &params)?.report.timing;
        let row = Row {
            batch,
            prefill_tokens_per_s: (batch * args.prompt_len) as f64 / t.prefill_s,
            decode_tokens_per_s: (batch * t.decode_steps) as f64 / t.decode_s,
            prefill_s: t.prefill_s,
            decode_s: t.decode_s,
            decode_steps: t.decode_steps,
        };
        eprintln!(
            "batch {batch:>3}: prefill {:>9.1} tokens/s, decode {:>8.1} tokens/s",
            row.prefill_tokens_per_s, row.decode_tokens_per_s
        );
        results.push(row);
    }

    let command = format!(
        "cargo xtask bench generate --device {} --model {} --batch-sizes {} --prompt-len {} --new-tokens {} --dtype {}",
        args.device.name(),
        args.model,
        args.batch_sizes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
        args.prompt_len,
        args.new_tokens,
        dtype.name()
    );
    let header = Header::new("generate", command, Some(args.device.name()), &args.model);
    let mut md = header.markdown("Plain-engine generation throughput");
    md.push_str(&format!(
        "- model: {} in {} (prompt {} tokens, {} new tokens per prompt, greedy, EOS ignored)\n\n",
        args.model,
        dtype.name(),
        args.prompt_len,
        args.new_tokens
    ));
    md.push_str(&table(
        &[
            ("batch", Right),
            ("prefill tokens/s", Right),
            ("decode tokens/s", Right),
            ("prefill s", Right),
            ("decode s", Right),
        ],
        results.iter().map(|r| {
            vec![
                r.batch.to_string(),
                format!("{:.1}", r.prefill_tokens_per_s),
                format!("{:.1}", r.decode_tokens_per_s),
                format!("{:.3}", r.prefill_s),
                format!("{:.3}", r.decode_s),
            ]
        }),
    ));
    let config = synthetic::config(&args.model).map(serde_json::from_str).transpose()?;
    let report = Report {
        header,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        batch_sizes: args.batch_sizes.clone(),
        dtype,
        config,
        results,
    };
    report::write(&args.out, "generate", &report, &md)?;
    Ok(())
}
