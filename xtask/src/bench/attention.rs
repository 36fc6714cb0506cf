//! `cargo xtask bench attention`: prefill attention on a GPU device, the flash-attention kernel
//! (`kernels/src/fused/cube_flash.rs`) against the path it replaces (Burn's matmul → cast → bias
//! → softmax → cast → matmul), both through `kernels::prefix_attention` as a model calls it.
//!
//! For each prompt length `s` (default 512 and 2048) and KV head count (default 32 and 8 under 32
//! query heads of 128: LLaMA-7B's shape and a grouped-query one), a causal prefill of one
//! sequence: queries as the `[b, heads, s, d]` view of a projection's `[b, s, heads, d]` output,
//! keys and values `[b, kv_heads, s, d]`, the `[1, 1, s, s]` causal bias of `-1e30`. Three
//! paths are timed ([`GpuPrefill`]): the matmul path, the flash kernel over every key tile, and
//! the flash kernel skipping the tiles the causal mask hides (the default). A figure is time per
//! call (median of 5 samples of `--iters` calls after a warm-up call, the last result read back
//! before the clock stops) and effective FLOP/s: `4 · b · heads · d · s(s + 1)/2`, the products
//! of the visible (causal) scores only, whatever a path computes.
//!
//! Every path's last `--check-rows` query rows (those with the most keys) are compared with the
//! Flex twin on the same values; a difference above the dtype's tolerance fails the bench after
//! the report is written, so a fast path that computes something else cannot pass.
//! On a software Vulkan driver (lavapipe) the figures say nothing about GPUs: there, run it with
//! small `--prompts` and `--heads` to check that it works.

use std::path::PathBuf;

use burn::tensor::{DType, Device, Distribution, Tensor};
use burn_llm::DeviceChoice;
use burn_llm::kernels::{GpuPrefill, prefix_attention, set_gpu_prefill};
use burn_llm::models::Precision;
use burn_llm::models::cache::causal_bias;
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `bench attention`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend (a GPU runtime: the kernels do not run on flex).
    #[arg(long, value_enum, default_value = "wgpu")]
    device: DeviceChoice,
    /// Element type of queries, keys and values (default: f16 on GPUs).
    #[arg(long)]
    dtype: Option<Precision>,
    /// Prompt lengths (query rows = keys: a prefill from an empty cache).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    prompts: Vec<usize>,
    /// Query heads.
    #[arg(long, default_value_t = 32)]
    heads: usize,
    /// Key/value heads, one case each (each must divide --heads).
    #[arg(long, value_delimiter = ',', default_value = "32,8")]
    kv_heads: Vec<usize>,
    /// Head dimension.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Sequences per call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Calls per timed sample.
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Query rows (the last ones) checked against the Flex twin.
    #[arg(long, default_value_t = 16)]
    check_rows: usize,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// One path at one shape.
#[derive(Serialize)]
struct PathResult {
    ms: f64,
    tflop_s: f64,
    /// Largest `|path − Flex|` over the checked rows, relative to the largest `|Flex|`.
    max_rel_diff: f64,
}

#[derive(Serialize)]
struct Row {
    prompt: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    batch: usize,
    /// Effective (causal) FLOPs per call.
    flops: f64,
    matmul: PathResult,
    flash_every_tile: PathResult,
    flash: PathResult,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    dtype: Precision,
    results: Vec<Row>,
}

/// The paths, in table order, with their report names.
const PATHS: [(GpuPrefill, &str); 3] =
    [(GpuPrefill::Matmul, "matmul"), (GpuPrefill::FlashEveryTile, "flash, every tile"), (GpuPrefill::Flash, "flash")];

/// Seconds per call of `f` under `mode`, and the last result.
fn per_call(device: &Device, iters: usize, mode: GpuPrefill, f: &dyn Fn() -> Tensor<4>) -> (f64, Tensor<4>) {
    set_gpu_prefill(mode);
    let timed = super::calls::per_call(device, iters, f);
    set_gpu_prefill(GpuPrefill::Flash);
    timed
}

/// The values of `t` in `f32`.
fn values(t: Tensor<4>) -> Vec<f32> {
    t.cast(DType::F32).into_data().try_into_vec_as::<f32>().unwrap_or_default()
}

/// `max |a − b| / max |b|`.
fn relative_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) as f64 / scale as f64
}

/// The three paths at one prompt length and KV head count.
fn case(args: &Args, device: &Device, dtype: DType, s: usize, kv_heads: usize) -> Row {
    let (b, h, d) = (args.batch, args.heads, args.head_dim);
    let random = |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Uniform(-1.0, 1.0), (device, dtype));
    // Queries as a model passes them: the `[b, heads, s, d]` view of a `[b, s, heads, d]` output.
    let q = random([b, s, h, d]).swap_dims(1, 2);
    let (k, v) = (random([b, kv_heads, s, d]), random([b, kv_heads, s, d]));
    let bias = causal_bias(0, s, s, device);
    let scale = 1.0 / (d as f32).sqrt();

    // The Flex twin on the last rows, over every key.
    let m = args.check_rows.clamp(1, s);
    let flex = Device::flex();
    let on_flex = |t: &Tensor<4>| Tensor::<4>::from_data(t.to_data(), &flex).cast(DType::F32);
    let rows = |t: Tensor<4>| t.slice([0..b, 0..h, s - m..s, 0..d]);
    let bias_rows = causal_bias(s - m, m, s, &flex);
    let expected = values(prefix_attention(rows(on_flex(&q)), on_flex(&k), on_flex(&v), bias_rows, s, scale));

    let flops = 4.0 * (b * h * d) as f64 * (s * (s + 1) / 2) as f64;
    let call = || prefix_attention(q.clone(), k.clone(), v.clone(), bias.clone(), s, scale);
    let [matmul, flash_every_tile, flash] = PATHS.map(|(mode, name)| {
        let (seconds, out) = per_call(device, args.iters, mode, &call);
        let max_rel_diff = relative_diff(&values(rows(out)), &expected);
        let result = PathResult { ms: seconds * 1e3, tflop_s: flops / seconds / 1e12, max_rel_diff };
        eprintln!(
            "s = {s}, {h}/{kv_heads} heads of {d}, {name}: {:.3} ms, {:.2} TFLOP/s, diff vs Flex {:.1e}",
            result.ms, result.tflop_s, result.max_rel_diff
        );
        result
    });
    Row { prompt: s, heads: h, kv_heads, head_dim: d, batch: b, flops, matmul, flash_every_tile, flash }
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.device == DeviceChoice::Flex {
        return Err("bench attention times GPU kernels: give --device wgpu, vulkan, cuda or metal".into());
    }
    if args.heads == 0 || args.head_dim == 0 || args.batch == 0 {
        return Err("--heads, --head-dim and --batch must be at least 1".into());
    }
    if let Some(kv) = args.kv_heads.iter().find(|&&kv| kv == 0 || !args.heads.is_multiple_of(kv)) {
        return Err(format!("--kv-heads: {kv} does not divide --heads {}", args.heads).into());
    }
    if let Some(s) = args.prompts.iter().find(|&&s| s <= 16) {
        return Err(format!("--prompts: {s} is a decode-sized step (prefill attention starts above 16 rows)").into());
    }
    let device = args.device.device()?;
    let (precision, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let dtype = precision.dtype();
    let mut results = Vec::new();
    for &s in &args.prompts {
        for &kv in &args.kv_heads {
            results.push(case(&args, &device, dtype, s, kv));
        }
    }
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let command = format!(
        "cargo xtask bench attention --device {} --dtype {} --prompts {} --heads {} --kv-heads {} --head-dim {} --batch {} \
         --iters {} --check-rows {}",
        args.device.name(),
        precision.name(),
        list(&args.prompts),
        args.heads,
        list(&args.kv_heads),
        args.head_dim,
        args.batch,
        args.iters,
        args.check_rows
    );
    let header = Header::new("attention", command, Some(args.device.name()), "none (kernels only)");
    let mut md = header.markdown("Prefill attention: flash kernel vs matmul path");
    md.push_str(&format!(
        "- {}; causal prefill from an empty cache; TFLOP/s = 4 · b · heads · d · s(s + 1)/2 (visible scores only) ÷ \
         time per call\n\
         - matmul: Burn's matmul → softmax → matmul; flash: `kernels/src/fused/cube_flash.rs`, over every key tile or \
         skipping those the mask hides\n\
         - diff: largest |path − Flex| ÷ largest |Flex| over the last {} query rows\n\n",
        precision.name(),
        args.check_rows
    ));
    md.push_str(&table(
        &[
            ("s", Right),
            ("heads / kv", Left),
            ("d", Right),
            ("matmul ms", Right),
            ("every tile ms", Right),
            ("flash ms", Right),
            ("matmul TFLOP/s", Right),
            ("flash TFLOP/s", Right),
            ("speed-up", Right),
            ("diff", Right),
        ],
        results.iter().map(|r| {
            let diff = r.matmul.max_rel_diff.max(r.flash_every_tile.max_rel_diff).max(r.flash.max_rel_diff);
            vec![
                r.prompt.to_string(),
                format!("{} / {}", r.heads, r.kv_heads),
                r.head_dim.to_string(),
                format!("{:.3}", r.matmul.ms),
                format!("{:.3}", r.flash_every_tile.ms),
                format!("{:.3}", r.flash.ms),
                format!("{:.2}", r.matmul.tflop_s),
                format!("{:.2}", r.flash.tflop_s),
                format!("{:.2}×", r.matmul.ms / r.flash.ms),
                format!("{diff:.1e}"),
            ]
        }),
    ));
    // f16 rounds each output to 2^-11 of its magnitude, and the paths sum in different orders.
    let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
    let failed: Vec<String> = results
        .iter()
        .flat_map(|r| {
            [("matmul", &r.matmul), ("flash, every tile", &r.flash_every_tile), ("flash", &r.flash)]
                .into_iter()
                .filter(|(_, p)| p.max_rel_diff.is_nan() || p.max_rel_diff > tolerance)
                .map(move |(name, p)| format!("s = {} kv {} {name}: {:.1e}", r.prompt, r.kv_heads, p.max_rel_diff))
        })
        .collect();
    if !failed.is_empty() {
        md.push_str(&format!("\n**Differs from the Flex twin beyond {tolerance:.0e}:** {}\n", failed.join("; ")));
    }
    report::write(&args.out, "attention", &Report { header, dtype: precision, results }, &md)?;
    if !failed.is_empty() {
        return Err(format!("outputs differ from the Flex twin beyond {tolerance:.0e}: {}", failed.join("; ")).into());
    }
    Ok(())
}
