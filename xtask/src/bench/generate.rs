//! `cargo xtask bench generate`: prefill and decode throughput of the plain engine.
//!
//! Each batch size runs one `generate` call on `batch` random prompts of `prompt_len` tokens and
//! generates `new_tokens` tokens per prompt with EOS ignored. Prefill tokens/s is prompt tokens ÷
//! time to the first sampled token; decode tokens/s is the later tokens ÷ the time of the later
//! steps. Without `--model`, a model of OPT-125m's shape with random weights is used (FlexGen's
//! "dummy weights"), so the benchmark needs no download.

use std::path::PathBuf;

use burn_llm::models::{hub, CausalLm, DecoderSpec, Generator, Pretrained, Prompt, SamplingParams};
use burn_llm::DeviceChoice;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::machine::Machine;
use crate::report;

/// Built-in model shapes for dummy-weight runs, as HF `config.json` text.
const SYNTHETIC: [(&str, &str); 3] = [
    (
        "synthetic:opt-125m",
        r#"{"model_type":"opt","vocab_size":50272,"hidden_size":768,"num_hidden_layers":12,"ffn_dim":3072,
            "num_attention_heads":12,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":768,"eos_token_id":2}"#,
    ),
    (
        "synthetic:gpt2",
        r#"{"model_type":"gpt2","vocab_size":50257,"n_embd":768,"n_layer":12,"n_head":12,"n_positions":1024,
            "eos_token_id":50256}"#,
    ),
    (
        "synthetic:smollm2-135m",
        r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
            "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"max_position_embeddings":8192,
            "rms_norm_eps":1e-5,"rope_theta":100000.0,"tie_word_embeddings":true,"eos_token_id":2}"#,
    ),
];

/// Flags of `bench generate`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// A model directory or hub id, or one of synthetic:opt-125m, synthetic:gpt2,
    /// synthetic:smollm2-135m (random weights).
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
struct Report<'a> {
    benchmark: &'static str,
    command: String,
    machine: Machine,
    device: &'static str,
    model: &'a str,
    prompt_len: usize,
    new_tokens: usize,
    unix_time: u64,
    results: Vec<Row>,
}

fn load(model: &str, device: &burn::tensor::Device) -> Result<Generator, Box<dyn std::error::Error>> {
    if let Some((_, config)) = SYNTHETIC.iter().find(|(name, _)| *name == model) {
        let spec = DecoderSpec::from_json(config, model.as_ref())?;
        return Ok(Generator::new(CausalLm::random(spec, device)?, None, vec![]));
    }
    Ok(Generator::from(Pretrained::load(&hub::resolve_model(model)?, device)?))
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let generator = load(&args.model, &device)?;
    let vocab = generator.model().spec().vocab_size as u32;
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(args.new_tokens.max(2))
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut prompts = |n: usize| -> Vec<Prompt> {
        (0..n)
            .map(|_| Prompt::Ids((0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect()))
            .collect()
    };
    // Warm-up: first-use allocations and kernel compilation stay out of the figures.
    generator.generate(&prompts(1), &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(2) })?;

    let mut results = Vec::new();
    for &batch in &args.batch_sizes {
        let out = generator.generate(&prompts(batch), &params)?;
        let t = out.timing;
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

    let machine = Machine::current();
    let command = format!(
        "cargo xtask bench generate --device {} --model {} --batch-sizes {} --prompt-len {} --new-tokens {}",
        args.device.name(),
        args.model,
        args.batch_sizes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
        args.prompt_len,
        args.new_tokens
    );
    let mut md = format!(
        "# Plain-engine generation throughput\n\n- command: `{command}`\n- machine: {}\n- device: {}\n- model: {} \
         (prompt {} tokens, {} new tokens per prompt, greedy, EOS ignored)\n\n\
         | batch | prefill tokens/s | decode tokens/s | prefill s | decode s |\n|---:|---:|---:|---:|---:|\n",
        machine.describe(),
        args.device.name(),
        args.model,
        args.prompt_len,
        args.new_tokens
    );
    for r in &results {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.3} | {:.3} |\n",
            r.batch, r.prefill_tokens_per_s, r.decode_tokens_per_s, r.prefill_s, r.decode_s
        ));
    }
    let report = Report {
        benchmark: "generate",
        command,
        machine,
        device: args.device.name(),
        model: &args.model,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        unix_time: report::unix_time(),
        results,
    };
    report::write(&args.out, "generate", &report, &md)?;
    Ok(())
}
