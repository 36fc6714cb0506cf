//! `cargo xtask bench quant`: cost of group quantization on a device.
//!
//! - dequantize throughput (GB/s of f32 produced) of a 4-bit, group-64 `[4096, 4096]` weight;
//! - fused dequantize-matmul vs an f32 matmul of the same shape at m = 1, 8, 32 (ratio > 1: fused
//!   is faster);
//! - decode tokens/s of a real model (default: SmolLM2-135M from `cargo xtask fetch-model
//!   smollm2`) at batch 1 and 16, f32 weights vs re-quantized w8/w4, next to the memory-bandwidth
//!   roofline: weight bytes read per token ÷ measured read bandwidth;
//! - the GGUF-layout product at SmolLM2-135M's shapes (`[m, 576] × [576, 1536]`,
//!   `[m, 1536] × [1536, 576]` in Q4_1, the `[m, 576] × [576, 49152]` LM head in Q8_0) for
//!   m = 1 … 512: the integer path, the exact `f32` path and Burn's dense `f32` matmul, as a
//!   fraction of the host's int8 and `f32` peak (a tight `vpdpbusd` / FMA loop on every thread).

use std::path::PathBuf;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm::kernels::{
    MatmulPrecision, QuantSpec, dequantize, qmatmul, qmatmul_transposed, quantize, with_matmul_precision,
};
use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm::models::{Pretrained, Prompt, SamplingParams, hub};
use burn_llm::offload::profiler::time;
use burn_llm::{DeviceChoice, EngineKind, EngineSpec, Purpose};
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
    /// Input rows of the SmolLM2-shape products.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,32,512")]
    rows: Vec<usize>,
    /// Only the SmolLM2-shape products (no [4096, 4096] table, no decode figures).
    #[arg(long)]
    shapes_only: bool,
}

#[derive(Serialize)]
struct ShapeRow {
    shape: String,
    m: usize,
    k: usize,
    n: usize,
    /// Integer path (8-bit input rows), the default.
    int8_ms: f64,
    int8_gmac_s: f64,
    /// `--exact-matmul` fused path (`None`: skipped, too slow at this size).
    exact_ms: Option<f64>,
    /// Burn's `f32` matmul on the dequantized weight (what `--exact-matmul` prefill ran before
    /// `kernels::matmul`).
    dense_ms: f64,
    dense_gflop_s: f64,
    /// `kernels::matmul`, the `f32` product dense projections run now.
    tiled_ms: f64,
    tiled_gflop_s: f64,
}

/// Tight-loop peaks of this host on all threads (`None` without AVX-512 VNNI).
#[derive(Serialize, Clone, Copy)]
struct Peaks {
    int8_gmac_s: f64,
    f32_gflop_s: f64,
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
    peaks: Option<Peaks>,
    shapes: Vec<ShapeRow>,
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

/// Multiply-adds per second of `kernel(iterations)` run on every thread, each iteration doing
/// `per_iteration` of them.
fn per_second(per_iteration: usize, kernel: fn(usize) -> u64) -> f64 {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let iterations = 20_000_000;
    let seconds = time(3, || {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(move || std::hint::black_box(kernel(std::hint::black_box(iterations))));
            }
        });
    });
    (threads * iterations * per_iteration) as f64 / seconds / 1e9
}

/// The host's int8 (`vpdpbusd` on 512-bit registers) and `f32` (FMA, the better of 256- and
/// 512-bit registers) peaks: twelve independent accumulators, no memory traffic.
#[cfg(target_arch = "x86_64")]
fn peaks() -> Option<Peaks> {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    let cpu = burn_llm::kernels::cpu::features();
    if !(cpu.avx512_vnni() && cpu.fma) {
        return None;
    }
    #[target_feature(enable = "avx512f,avx512vnni")]
    fn int8(iterations: usize) -> u64 {
        let (a, b) = (black_box(_mm512_set1_epi8(1)), black_box(_mm512_set1_epi8(2)));
        let mut acc = [_mm512_setzero_si512(); 12];
        for _ in 0..iterations {
            acc.iter_mut().for_each(|r| *r = _mm512_dpbusd_epi32(*r, a, b));
        }
        acc.iter().fold(0u64, |sum, r| sum.wrapping_add(_mm512_reduce_add_epi32(*r) as u64))
    }
    #[target_feature(enable = "avx512f,fma")]
    fn f32_512(iterations: usize) -> u64 {
        let (a, b) = (black_box(_mm512_set1_ps(1.0)), black_box(_mm512_set1_ps(0.0)));
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..iterations {
            acc.iter_mut().for_each(|r| *r = _mm512_fmadd_ps(*r, a, b));
        }
        acc.iter().map(|r| _mm512_reduce_add_ps(*r) as u64).sum()
    }
    #[target_feature(enable = "avx2,fma")]
    fn f32_256(iterations: usize) -> u64 {
        let (a, b) = (black_box(_mm256_set1_ps(1.0)), black_box(_mm256_set1_ps(0.0)));
        let mut acc = [_mm256_setzero_ps(); 12];
        for _ in 0..iterations {
            acc.iter_mut().for_each(|r| *r = _mm256_fmadd_ps(*r, a, b));
        }
        acc.iter().map(|r| _mm256_cvtss_f32(*r) as u64).sum()
    }
    // SAFETY (each call): the features the kernels are compiled for were detected above.
    let int8_gmac_s = per_second(12 * 64, |n| unsafe { int8(n) });
    let f32_512 = per_second(12 * 16 * 2, |n| unsafe { f32_512(n) });
    let f32_256 = per_second(12 * 8 * 2, |n| unsafe { f32_256(n) });
    Some(Peaks { int8_gmac_s, f32_gflop_s: f32_512.max(f32_256) })
}

#[cfg(not(target_arch = "x86_64"))]
fn peaks() -> Option<Peaks> {
    None
}

/// The GGUF-layout product at SmolLM2-135M's shapes for each `m` in `rows`.
fn shapes(device: &Device, rows: &[usize]) -> Result<Vec<ShapeRow>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    for (label, k, n, bits) in [("q/o-proj…up", 576, 1536, 4), ("down", 1536, 576, 4), ("LM head", 576, 49152, 8)] {
        let w = Tensor::<2>::random([k, n], Distribution::Uniform(-1.0, 1.0), device);
        let wq = quantize(w.clone().transpose(), QuantSpec::new(bits, 32, 1)?)?;
        let w = Tensor::<2>::from_data(w.into_data(), device);
        for &m in rows {
            let x = Tensor::<2>::random([m, k], Distribution::Uniform(-1.0, 1.0), device);
            let macs = (m * k * n) as f64;
            let int8_s = time(5, || {
                let _ = qmatmul_transposed(x.clone(), &wq).map(|t| t.into_data());
            });
            // The exact fused path is the decode-sized one; prefill dequantizes and runs `dense`.
            let exact_s = (m <= 32).then(|| {
                time(3, || {
                    let _ = with_matmul_precision(MatmulPrecision::Exact, || {
                        qmatmul_transposed(x.clone(), &wq).map(|t| t.into_data())
                    });
                })
            });
            let dense_s = time(3, || {
                let _ = x.clone().matmul(w.clone()).into_data();
            });
            let tiled_s = time(3, || {
                let _ = burn_llm::kernels::matmul(x.clone(), w.clone()).into_data();
            });
            let row = ShapeRow {
                shape: format!("{label} [{m}, {k}] × [{k}, {n}] Q{bits}"),
                m,
                k,
                n,
                int8_ms: int8_s * 1e3,
                int8_gmac_s: macs / int8_s / 1e9,
                exact_ms: exact_s.map(|s| s * 1e3),
                dense_ms: dense_s * 1e3,
                dense_gflop_s: 2.0 * macs / dense_s / 1e9,
                tiled_ms: tiled_s * 1e3,
                tiled_gflop_s: 2.0 * macs / tiled_s / 1e9,
            };
            eprintln!(
                "{}: int8 {:.3} ms ({:.1} GMAC/s), exact {}, dense f32 {:.3} ms ({:.1} GFLOP/s), tiled f32 {:.3} ms ({:.1} GFLOP/s)",
                row.shape,
                row.int8_ms,
                row.int8_gmac_s,
                row.exact_ms.map_or("–".into(), |v| format!("{v:.3} ms")),
                row.dense_ms,
                row.dense_gflop_s,
                row.tiled_ms,
                row.tiled_gflop_s
            );
            out.push(row);
        }
    }
    Ok(out)
}

fn shapes_markdown(peaks: Option<Peaks>, rows: &[ShapeRow]) -> String {
    let mut md = String::from("\n## GGUF-layout product at SmolLM2-135M's shapes\n\n");
    match peaks {
        Some(p) => md.push_str(&format!(
            "Peaks (tight loop, all threads): int8 {:.1} G multiply-adds/s (`vpdpbusd`), f32 {:.1} GFLOP/s (FMA).\n\n",
            p.int8_gmac_s, p.f32_gflop_s
        )),
        None => md.push_str("Peaks: not measured (no AVX-512 VNNI).\n\n"),
    }
    let fraction = |v: f64, peak: Option<f64>| peak.map_or("–".into(), |p| format!("{:.0}%", 100.0 * v / p));
    md.push_str(&table(
        &[
            ("product", Left),
            ("int8 ms", Right),
            ("int8 GMAC/s", Right),
            ("of int8 peak", Right),
            ("exact fused ms", Right),
            ("Burn f32 ms", Right),
            ("Burn GFLOP/s", Right),
            ("of f32 peak", Right),
            ("`kernels::matmul` ms", Right),
            ("GFLOP/s", Right),
            ("of f32 peak", Right),
        ],
        rows.iter().map(|r| {
            vec![
                r.shape.clone(),
                format!("{:.3}", r.int8_ms),
                format!("{:.1}", r.int8_gmac_s),
                fraction(r.int8_gmac_s, peaks.map(|p| p.int8_gmac_s)),
                r.exact_ms.map_or("–".into(), |v| format!("{v:.3}")),
                format!("{:.3}", r.dense_ms),
                format!("{:.1}", r.dense_gflop_s),
                fraction(r.dense_gflop_s, peaks.map(|p| p.f32_gflop_s)),
                format!("{:.3}", r.tiled_ms),
                format!("{:.1}", r.tiled_gflop_s),
                fraction(r.tiled_gflop_s, peaks.map(|p| p.f32_gflop_s)),
            ]
        }),
    ));
    md
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let peaks = peaks();
    if let Some(p) = peaks {
        eprintln!("peaks: int8 {:.1} GMAC/s, f32 {:.1} GFLOP/s", p.int8_gmac_s, p.f32_gflop_s);
    }
    let shape_rows = shapes(&device, &args.rows)?;
    if args.shapes_only {
        let command = format!("cargo xtask bench quant --device {} --shapes-only", args.device.name());
        let header = Header::new("quant-shapes", command, Some(args.device.name()), "SmolLM2-135M shapes");
        let md = header.markdown("Quantized matmul at SmolLM2 shapes") + &shapes_markdown(peaks, &shape_rows);
        #[derive(Serialize)]
        struct ShapesReport {
            #[serde(flatten)]
            header: Header,
            peaks: Option<Peaks>,
            shapes: Vec<ShapeRow>,
        }
        report::write(&args.out, "quant-shapes", &ShapesReport { header, peaks, shapes: shape_rows }, &md)?;
        return Ok(());
    }
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
        let spec = EngineSpec { engine: Some(EngineKind::Plain), ..EngineSpec::default() };
        let purpose = Purpose::Generate { prompts: &[], params: &SamplingParams::default() };
        let Pretrained { model, tokenizer, eos_token_ids, .. } = pretrained;
        let mut engine = spec.init_model(model, Some(tokenizer), eos_token_ids, purpose, &mut std::io::sink())?;
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
    md.push_str(&shapes_markdown(peaks, &shape_rows));
    let report =
        Report { header, read_bandwidth_gb_s: bandwidth, dequantize_gb_s, matmul, decode, peaks, shapes: shape_rows };
    report::write(&args.out, "quant", &report, &md)?;
    Ok(())
}
