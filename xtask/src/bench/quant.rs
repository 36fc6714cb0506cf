//! `cargo xtask bench quant`: cost of group quantization on a device.
//!
//! - dequantize throughput (GB/s of f32 produced) of a 4-bit, group-64 `[4096, 4096]` weight;
//! - fused dequantize-matmul vs an f32 matmul of the same shape at m = 1, 8, 32 (ratio > 1: fused
//!   is faster);
//! - decode tokens/s of a real model (default: SmolLM2-135M from `cargo xtask fetch-model
//!   smollm2`) at batch 1 and 16, f32 weights vs re-quantized w8/w4, next to the memory-bandwidth
//!   roofline: weight bytes read per token ÷ measured read bandwidth.

use std::path::PathBuf;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm::kernels::{QuantSpec, dequantize, qmatmul, qmatmul_transposed, quantize};
use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm::models::{Generator, Pretrained, Prompt, SamplingParams, hub};
use burn_llm::offload::profiler::time;
use burn_llm::{DeviceChoice, Engine};
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `bench quant`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Model for the decode figures (directory, .gguf or hub id); default: the cached SmolLM2.
    #[arg(long)]
    model: Option<String>,
    /// Tokens generated per decode measurement.
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct MatmulRow {
    m: usize,
    f32_ms: f64,
    fused_ms: f64,
    fused_speedup: f64,
    /// The GGUF layout (`W` `[n, k]` grouped along `k`, group 32 as in Q4_1).
    fused_gguf_ms: f64,
    fused_gguf_speedup: f64,
}

#[derive(Serialize)]
struct DecodeRow {
    weights: &'static str,
    batch: usize,
    tokens_per_s: f64,
    weight_bytes: usize,
    roofline_tokens_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    read_bandwidth_gb_s: f64,
    dequantize_gb_s: f64,
    matmul: Vec<MatmulRow>,
    decode: Vec<DecodeRow>,
}

fn sync(device: &Device) {
    let _ = device.sync();
}

/// Host memory read bandwidth in GB/s: summing a 512 MiB buffer on all threads.
pub(crate) fn read_bandwidth() -> f64 {
    let data: Vec<u64> = (0..64u64 << 20).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let data = std::hint::black_box(data);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let chunk = data.len().div_ceil(threads);
    let seconds = time(5, || {
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(chunk)
                .map(|c| s.spawn(move || std::hint::black_box(c).iter().fold(0u64, |a, &v| a ^ v)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, |a, v| a ^ v)
        });
        std::hint::black_box(total);
    });
    (data.len() * 8) as f64 / seconds / 1e9
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let bandwidth = read_bandwidth();
    eprintln!("host read bandwidth: {bandwidth:.1} GB/s");

    let (k, n) = (4096, 4096);
    let w = Tensor::<2>::random([k, n], Distribution::Uniform(-1.0, 1.0), &device);
    let wq = quantize(w.clone(), QuantSpec::new(4, 64, 1)?)?;
    let wq_gguf = quantize(w.clone().transpose(), QuantSpec::new(4, 32, 1)?)?;
    let dq_s = time(5, || {
        let out = dequantize(&wq);
        sync(&device);
        drop(out);
    });
    let dequantize_gb_s = (k * n * 4) as f64 / dq_s / 1e9;
    eprintln!("dequantize 4-bit [{k}, {n}]: {dequantize_gb_s:.2} GB/s of f32");

    let mut matmul = Vec::new();
    for m in [1, 8, 32] {
        let x = Tensor::<2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &device);
        let f32_s = time(5, || {
            let _ = x.clone().matmul(w.clone()).into_data();
        });
        let fused_s = time(5, || {
            let _ = qmatmul(x.clone(), &wq).map(|t| t.into_data());
        });
        let gguf_s = time(5, || {
            let _ = qmatmul_transposed(x.clone(), &wq_gguf).map(|t| t.into_data());
        });
        eprintln!(
            "m = {m:>2}: f32 {:.2} ms, fused 4-bit {:.2} ms, fused 4-bit GGUF layout {:.2} ms",
            f32_s * 1e3,
            fused_s * 1e3,
            gguf_s * 1e3
        );
        matmul.push(MatmulRow {
            m,
            f32_ms: f32_s * 1e3,
            fused_ms: fused_s * 1e3,
            fused_speedup: f32_s / fused_s,
            fused_gguf_ms: gguf_s * 1e3,
            fused_gguf_speedup: f32_s / gguf_s,
        });
    }

    let model = match &args.model {
        Some(m) => m.clone(),
        None => burn_llm::models::pypi::SMOLLM2_GGUF.cached_path().display().to_string(),
    };
    let path = hub::resolve_model(&model).map_err(|e| format!("{e} (run `cargo xtask fetch-model smollm2`)"))?;
    let mut decode = Vec::new();
    // "as loaded": a GGUF file's blocks as shipped (SmolLM2: Q4_1 projections, Q8_0 tied head).
    let variants: [(&'static str, Option<u32>); 4] =
        [("as loaded", None), ("f32", Some(32)), ("w8 g64", Some(8)), ("w4 g64", Some(4))];
    for (label, bits) in variants {
        let mut pretrained = Pretrained::load(&path, &device)?;
        pretrained.model = match bits {
            None => pretrained.model,
            Some(32) => pretrained.model.dequantize_weights(),
            Some(b) => pretrained.model.quantize_weights(QuantSpec::new(b, 64, WEIGHT_QUANT_AXIS)?)?,
        };
        let bytes = pretrained.model.decode_weight_bytes();
        let mut engine: Box<dyn Engine> = Box::new(Generator::from(pretrained));
        for batch in [1, 16] {
            let prompts: Vec<Prompt> = (0..batch).map(|i| Prompt::Ids(vec![1, 504 + i as u32, 3058, 282])).collect();
            let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(args.new_tokens) };
            let t = engine.generate(&prompts, &params)?.report.timing;
            let row = DecodeRow {
                weights: label,
                batch,
                tokens_per_s: (batch * t.decode_steps) as f64 / t.decode_s,
                weight_bytes: bytes,
                roofline_tokens_per_s: batch as f64 * bandwidth * 1e9 / bytes as f64,
            };
            eprintln!(
                "{label} batch {batch:>2}: {:.1} tokens/s (roofline {:.1})",
                row.tokens_per_s, row.roofline_tokens_per_s
            );
            decode.push(row);
        }
    }

    let command = format!(
        "cargo xtask bench quant --device {} --model {model} --new-tokens {}",
        args.device.name(),
        args.new_tokens
    );
    let header = Header::new("quant", command, Some(args.device.name()), model);
    let mut md = header.markdown("Quantization cost");
    md.push_str(&format!(
        "- host read bandwidth: {bandwidth:.1} GB/s\n\
         - dequantize, 4-bit group 64, [4096, 4096]: {dequantize_gb_s:.2} GB/s of f32 produced\n\n\
         ## Fused dequantize-matmul vs f32 matmul ([m, 4096] × [4096, 4096], 4-bit)\n\n\
         FlexGen layout: `W` `[k, n]` in groups of 64 along `n`; GGUF layout: `W` `[n, k]` in groups of 32 along `k` (Q4_1 as shipped).\n\n"
    ));
    md.push_str(&table(
        &[
            ("m", Right),
            ("f32 ms", Right),
            ("fused FlexGen ms", Right),
            ("speed-up", Right),
            ("fused GGUF ms", Right),
            ("speed-up", Right),
        ],
        matmul.iter().map(|r| {
            vec![
                r.m.to_string(),
                format!("{:.2}", r.f32_ms),
                format!("{:.2}", r.fused_ms),
                format!("{:.2}×", r.fused_speedup),
                format!("{:.2}", r.fused_gguf_ms),
                format!("{:.2}×", r.fused_gguf_speedup),
            ]
        }),
    ));
    md.push_str(&format!(
        "\n## Decode, {} (greedy, {} new tokens)\n\nRoofline = batch × bandwidth ÷ weight bytes read per step.\n\n",
        header.model, args.new_tokens
    ));
    md.push_str(&table(
        &[
            ("weights", Left),
            ("batch", Right),
            ("tokens/s", Right),
            ("weight MB read per step", Right),
            ("roofline tokens/s", Right),
        ],
        decode.iter().map(|r| {
            vec![
                r.weights.to_string(),
                r.batch.to_string(),
                format!("{:.1}", r.tokens_per_s),
                format!("{:.0}", r.weight_bytes as f64 / 1e6),
                format!("{:.1}", r.roofline_tokens_per_s),
            ]
        }),
    ));
    let report = Report { header, read_bandwidth_gb_s: bandwidth, dequantize_gb_s, matmul, decode };
    report::write(&args.out, "quant", &report, &md)?;
    Ok(())
}
