//! `cargo xtask bench paged-attention`: the PagedAttention kernel's achieved memory bandwidth.
//!
//! A decode step reads, for every sequence, the keys and values of its whole context from a
//! paged cache (vLLM, thesis ch. 5): the kernel is bound by those reads, so its figure of merit is
//! KV bytes read ÷ kernel time. Each case is one decode launch of `seqs` queries (one per
//! sequence) over `context` tokens each, in a cache whose blocks are handed out in a random
//! order (as a block manager's free list ends up after a while), LLaMA-7B's layer shape by
//! default (32 heads of 128). Next to it, the same device's streaming bandwidth: an elementwise
//! pass over a buffer half as large as the KV read, at most 256 MiB (bytes read + written ÷
//! time), and the nominal peak when `--peak-gb-s` names it.

use std::path::PathBuf;

use burn::tensor::{DType, Device, Distribution, Tensor};
use burn_llm::DeviceChoice;
use burn_llm::kernels::{MAX_GPU_TENSOR_ELEMENTS, PagedBatch, PagedKernelError, paged_attention_with};
use burn_llm::models::Precision;
use burn_llm::offload::profiler::time;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::Serialize;

use crate::report::{self, Align::Right, Header, table};

/// Flags of `bench paged-attention`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Element type of queries and caches (default: f16 on GPU devices, f32 on flex).
    #[arg(long)]
    dtype: Option<Precision>,
    /// Sequences per decode step (one query each).
    #[arg(long, value_delimiter = ',', default_value = "8,32,64")]
    seqs: Vec<usize>,
    /// Context length of every sequence, in tokens.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    context: Vec<usize>,
    /// Query heads.
    #[arg(long, default_value_t = 32)]
    heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `--heads`).
    #[arg(long, default_value_t = 32)]
    kv_heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Tokens per cache block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Kernel launches per timed sample (one read-back at the end of each sample).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// The device's nominal memory bandwidth in GB/s, for the fraction-of-peak column (e.g. 3350
    /// for an H100 SXM, 4800 for an H200).
    #[arg(long)]
    peak_gb_s: Option<f64>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    seqs: usize,
    context: usize,
    kv_bytes: u64,
    kernel_s: f64,
    kernel_gb_s: f64,
    stream_gb_s: f64,
    of_stream: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    of_peak: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    dtype: Precision,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    peak_gb_s: Option<f64>,
    results: Vec<Row>,
}

/// Largest buffer of the streaming measurement: past a few hundred MiB a GPU's bandwidth is
/// flat, and `iters` results are alive at once.
const MAX_STREAM_BYTES: usize = 256 << 20;

/// Seconds per call of `f`: the median of 5 samples of `iters` calls each, after a warm-up.
/// Every result stays alive until the device has finished (a device sync): on a GPU Burn fuses
/// operations lazily, and a result dropped before it ran is never computed.
fn per_call<const D: usize>(
    device: &Device,
    iters: usize,
    mut f: impl FnMut() -> Result<Tensor<D>, PagedKernelError>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let iters = iters.max(1);
    let mut failed: Option<String> = None;
    let seconds = time(5, || {
        let results: Result<Vec<Tensor<D>>, _> = (0..iters).map(|_| f()).collect();
        if let Err(e) = device.sync() {
            failed = Some(format!("the device failed while timing: {e:?}"));
        }
        match results {
            Ok(results) => drop(results),
            Err(e) => failed = Some(e.to_string()),
        }
    });
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(seconds / iters as f64),
    }
}

/// Streaming bandwidth on `device`: `x + 1` over `bytes` of random `dtype` values (at most
/// [`MAX_STREAM_BYTES`]; random, since an H200 reads a buffer of zeros faster than its HBM
/// peak: Hopper compresses them), bytes read and written ÷ time.
fn stream_gb_s(device: &Device, bytes: usize, dtype: DType, iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let elems = (bytes.min(MAX_STREAM_BYTES) / dtype.size()).max(1);
    let x = Tensor::<1>::random([elems], Distribution::Uniform(-1.0, 1.0), (device, dtype));
    let seconds = per_call(device, iters, || Ok(x.clone() + 1.0))?;
    Ok((2 * elems * dtype.size()) as f64 / seconds / 1e9)
}

/// One case: `seqs` decode queries over `context` tokens each.
fn case(
    args: &Args,
    dtype: DType,
    seqs: usize,
    context: usize,
    device: &Device,
) -> Result<Row, Box<dyn std::error::Error>> {
    let blocks_per_seq = context.div_ceil(args.block_size);
    let num_blocks = seqs * blocks_per_seq;
    let mut tables: Vec<u32> = (0..num_blocks as u32).collect();
    tables.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(0));
    let shape = [num_blocks, args.kv_heads, args.block_size, args.head_dim];
    let cache_elements: usize = shape.iter().product();
    if args.device != DeviceChoice::Flex && cache_elements > MAX_GPU_TENSOR_ELEMENTS {
        return Err(format!(
            "{seqs} sequences × {context} tokens need K and V caches of {cache_elements} elements each, more than the \
             {MAX_GPU_TENSOR_ELEMENTS} a GPU kernel handles: give fewer --seqs or a shorter --context"
        )
        .into());
    }
    let random = |shape| Tensor::<4>::random(shape, Distribution::Uniform(-1.0, 1.0), (device, dtype));
    let (k, v) = (random(shape), random(shape));
    let q = Tensor::<3>::random([seqs, args.heads, args.head_dim], Distribution::Uniform(-1.0, 1.0), (device, dtype));
    let query_seq: Vec<u32> = (0..seqs as u32).collect();
    let context_lens = vec![context as u32; seqs];
    let batch = PagedBatch::new(&tables, blocks_per_seq, args.block_size, &query_seq, &context_lens, device)?;
    let scale = (args.head_dim as f32).powf(-0.5);
    let kernel_s = per_call(device, args.iters, || paged_attention_with(q.clone(), &k, &v, &batch, scale))?;
    let kv_bytes = (2 * seqs * context * args.kv_heads * args.head_dim * dtype.size()) as u64;
    let kernel_gb_s = kv_bytes as f64 / kernel_s / 1e9;
    drop((k, v));
    let stream = stream_gb_s(device, kv_bytes as usize / 2, dtype, args.iters)?;
    let row = Row {
        seqs,
        context,
        kv_bytes,
        kernel_s,
        kernel_gb_s,
        stream_gb_s: stream,
        of_stream: kernel_gb_s / stream,
        of_peak: args.peak_gb_s.map(|p| kernel_gb_s / p),
    };
    eprintln!(
        "{seqs:>4} seqs × {context:>5} tokens: {:.3} ms, {kernel_gb_s:.1} GB/s of KV (stream {stream:.1} GB/s, {:.0}%)",
        kernel_s * 1e3,
        row.of_stream * 100.0
    );
    Ok(row)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let (precision, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let dtype = precision.dtype();
    let mut results = Vec::new();
    for &context in &args.context {
        for &seqs in &args.seqs {
            results.push(case(&args, dtype, seqs, context, &device)?);
        }
    }
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let command = format!(
        "cargo xtask bench paged-attention --device {} --dtype {} --seqs {} --context {} --heads {} --kv-heads {} \
         --head-dim {} --block-size {}{}",
        args.device.name(),
        precision.name(),
        list(&args.seqs),
        list(&args.context),
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.block_size,
        args.peak_gb_s.map(|p| format!(" --peak-gb-s {p}")).unwrap_or_default()
    );
    let header = Header::new("paged-attention", command, Some(args.device.name()), "none (kernel only)");
    let mut md = header.markdown("PagedAttention kernel: achieved memory bandwidth");
    md.push_str(&format!(
        "- one decode launch: {} query heads, {} KV heads of {}, blocks of {} tokens in random order, {}\n\
         - KV GB/s = K and V bytes read ÷ kernel time; stream = `x + 1` over half as many random bytes (at most 256 MiB), read + written ÷ time\n\n",
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.block_size,
        precision.name()
    ));
    md.push_str(&table(
        &[
            ("seqs", Right),
            ("context", Right),
            ("KV MiB", Right),
            ("kernel ms", Right),
            ("KV GB/s", Right),
            ("stream GB/s", Right),
            ("of stream", Right),
            ("of peak", Right),
        ],
        results.iter().map(|r| {
            vec![
                r.seqs.to_string(),
                r.context.to_string(),
                format!("{:.1}", r.kv_bytes as f64 / (1 << 20) as f64),
                format!("{:.3}", r.kernel_s * 1e3),
                format!("{:.1}", r.kernel_gb_s),
                format!("{:.1}", r.stream_gb_s),
                format!("{:.0}%", r.of_stream * 100.0),
                r.of_peak.map(|p| format!("{:.0}%", p * 100.0)).unwrap_or_else(|| "–".into()),
            ]
        }),
    ));
    let report = Report {
        header,
        dtype: precision,
        heads: args.heads,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
        block_size: args.block_size,
        peak_gb_s: args.peak_gb_s,
        results,
    };
    report::write(&args.out, "paged-attention", &report, &md)?;
    Ok(())
}
