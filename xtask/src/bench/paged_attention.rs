//! `cargo xtask bench paged-attention`: the PagedAttention kernel's achieved memory bandwidth.
//!
//! A decode step reads, for every sequence, the keys and values of its whole context from a
//! paged cache (vLLM, thesis ch. 5): the kernel is bound by those reads, so its figure of merit is
//! KV bytes read ÷ kernel time. Each case is one decode launch of `seqs` queries (one per
//! sequence) over `context` tokens each, in a cache whose blocks are handed out in a random
//! order (as a block manager's free list ends up after a while), LLaMA-7B's layer shape by
//! default (32 heads of 128). Next to it, the same device's streaming bandwidth: an elementwise
//! pass over a buffer half as large as the KV read, at most 256 MiB (bytes read + written ÷
//! time), and the nominal peak when `--peak-gb-s` names it. The default set runs LLaMA-7B's 32 KV
//! heads and a grouped-query layer of 8 KV heads under the same 32 query heads.
//!
//! A figure is reported only when it can be trusted:
//!
//! - after timing, the outputs of a sample of sequences (first, middle, last) are checked against
//!   the Flex twin on the same queries and blocks (copied to the host); a case whose output
//!   differs beyond the dtype's tolerance fails, and the command fails after writing the report;
//! - a figure above the streaming bandwidth measured on the same device is refused (the row is
//!   marked invalid, its figures not reported): no kernel that reads its bytes can beat it, so
//!   such a figure means that work was skipped (as a launch over a buffer that failed to
//!   allocate is).
//! - cases whose caches exceed the device's largest buffer ([`GpuTensorLimit`]) are refused up
//!   front.

use std::path::PathBuf;

use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData};
use burn_llm::DeviceChoice;
use burn_llm::kernels::{
    GpuTensorLimit, PagedBatch, PagedKernelError, paged_attention, paged_attention_with, read_blocks,
};
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
    /// Key/value heads, one set of cases per value (grouped-query attention when fewer than
    /// `--heads`).
    #[arg(long, value_delimiter = ',', default_value = "32,8")]
    kv_heads: Vec<usize>,
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
    kv_heads: usize,
    seqs: usize,
    context: usize,
    kv_bytes: u64,
    /// Largest difference from the Flex twin over the sampled outputs (`None` on Flex itself).
    max_abs_error: Option<f32>,
    /// Why the figures are not reported (`None`: they are).
    #[serde(skip_serializing_if = "Option::is_none")]
    invalid: Option<String>,
    /// The measured figures; absent when invalid.
    #[serde(skip_serializing_if = "Option::is_none")]
    figures: Option<Figures>,
}

#[derive(Serialize)]
struct Figures {
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

/// Largest difference from the Flex twin a correct kernel shows in `dtype`, relative to the
/// largest reference value (at least 1): both accumulate in f32, and differ by the order of the
/// sums and the final rounding to the storage dtype.
fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 1e-4,
    }
}

/// A case whose GPU output differs from the Flex twin.
#[derive(Debug)]
struct Mismatch(String);

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Mismatch {}

/// Checks the outputs `out` of the sequences `sample` against the Flex twin on the same queries,
/// blocks and context: returns the largest difference, or an error naming the first output that
/// differs beyond [`tolerance`].
#[allow(clippy::too_many_arguments)]
fn check_against_flex(
    q: &Tensor<3>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    out: &Tensor<3>,
    tables: &[u32],
    blocks_per_seq: usize,
    context: usize,
    scale: f32,
    sample: &[usize],
) -> Result<f32, Box<dyn std::error::Error>> {
    let flex = Device::flex();
    let ids: Vec<u32> =
        sample.iter().flat_map(|&s| tables[s * blocks_per_seq..(s + 1) * blocks_per_seq].to_vec()).collect();
    let to_flex4 = |t: &Tensor<4>| -> Result<Tensor<4>, PagedKernelError> {
        Ok(Tensor::from_data(read_blocks(t, &ids)?.into_data(), (&flex, t.dtype())))
    };
    let (k_flex, v_flex) = (to_flex4(k)?, to_flex4(v)?);
    let rows = Tensor::<1, Int>::from_data(
        TensorData::new(sample.iter().map(|&s| s as i64).collect::<Vec<_>>(), [sample.len()]),
        &q.device(),
    );
    let q_flex = Tensor::<3>::from_data(q.clone().select(0, rows.clone()).into_data(), (&flex, q.dtype()));
    let flex_tables: Vec<u32> = (0..ids.len() as u32).collect();
    let query_seq: Vec<u32> = (0..sample.len() as u32).collect();
    let context_lens = vec![context as u32; sample.len()];
    let reference =
        paged_attention(q_flex, &k_flex, &v_flex, &flex_tables, blocks_per_seq, &query_seq, &context_lens, scale)?;
    let reference = reference.cast(DType::F32).into_data().try_to_vec::<f32>()?;
    let found = out.clone().select(0, rows).cast(DType::F32).into_data().try_to_vec::<f32>()?;
    let largest = reference.iter().fold(1f32, |m, x| m.max(x.abs()));
    let bound = tolerance(q.dtype()) * largest;
    let mut worst = 0f32;
    for (i, (a, b)) in found.iter().zip(&reference).enumerate() {
        let diff = (a - b).abs();
        if !diff.is_finite() || diff > bound {
            let row_len = reference.len() / sample.len();
            return Err(Mismatch(format!(
                "the GPU output differs from the Flex twin: sequence {}, value {} is {a} where Flex gives {b} (allowed \
                 difference {bound:.2e}); the kernel did not compute this case correctly, so its time is not reported",
                sample[i / row_len],
                i % row_len
            ))
            .into());
        }
        worst = worst.max(diff);
    }
    Ok(worst)
}

/// One case: `seqs` decode queries over `context` tokens each, `kv_heads` KV heads.
fn case(
    args: &Args,
    dtype: DType,
    kv_heads: usize,
    seqs: usize,
    context: usize,
    device: &Device,
) -> Result<Row, Box<dyn std::error::Error>> {
    let blocks_per_seq = context.div_ceil(args.block_size);
    let num_blocks = seqs * blocks_per_seq;
    let mut tables: Vec<u32> = (0..num_blocks as u32).collect();
    tables.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(0));
    let shape = [num_blocks, kv_heads, args.block_size, args.head_dim];
    let cache_elements: usize = shape.iter().product();
    if let Some(limit) = GpuTensorLimit::of(device).filter(|l| !l.fits(cache_elements as u64, dtype)) {
        return Err(format!(
            "{seqs} sequences × {context} tokens need K and V caches of {cache_elements} {dtype:?} elements each, more \
             than one GPU buffer holds on this device ({limit}): give fewer --seqs or a shorter --context"
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
    let kv_bytes = (2 * seqs * context * kv_heads * args.head_dim * dtype.size()) as u64;
    let kernel_gb_s = kv_bytes as f64 / kernel_s / 1e9;
    // The output of the launch just timed, checked on the first, middle and last sequences.
    let max_abs_error = if args.device == DeviceChoice::Flex {
        None
    } else {
        let out = paged_attention_with(q.clone(), &k, &v, &batch, scale)?;
        let mut sample = vec![0, seqs / 2, seqs - 1];
        sample.dedup();
        Some(check_against_flex(&q, &k, &v, &out, &tables, blocks_per_seq, context, scale, &sample)?)
    };
    drop((k, v));
    let stream = stream_gb_s(device, kv_bytes as usize / 2, dtype, args.iters)?;
    let figures = Figures {
        kernel_s,
        kernel_gb_s,
        stream_gb_s: stream,
        of_stream: kernel_gb_s / stream,
        of_peak: args.peak_gb_s.map(|p| kernel_gb_s / p),
    };
    let invalid = refusal(kernel_gb_s, stream);
    eprintln!(
        "{kv_heads:>3} KV heads, {seqs:>4} seqs × {context:>5} tokens: {:.3} ms, {kernel_gb_s:.1} GB/s of KV (stream \
         {stream:.1} GB/s, {:.0}%){}",
        kernel_s * 1e3,
        figures.of_stream * 100.0,
        invalid.as_ref().map(|why| format!(" INVALID: {why}")).unwrap_or_default()
    );
    Ok(Row { kv_heads, seqs, context, kv_bytes, max_abs_error, figures: invalid.is_none().then_some(figures), invalid })
}

/// Why a figure of `kernel_gb_s` is refused on a device that streams `stream_gb_s`, if it is: a
/// launch that reads its bytes cannot beat the device's streaming bandwidth.
fn refusal(kernel_gb_s: f64, stream_gb_s: f64) -> Option<String> {
    (kernel_gb_s > stream_gb_s).then(|| {
        format!(
            "{kernel_gb_s:.1} GB/s of KV is above the {stream_gb_s:.1} GB/s this device streams: the launch cannot have \
             read its bytes, so its time is not reported"
        )
    })
}

/// A failed case as a report row: no figures, and the reason.
fn failed(kv_heads: usize, seqs: usize, context: usize, reason: String) -> Row {
    Row { kv_heads, seqs, context, kv_bytes: 0, max_abs_error: None, invalid: Some(reason), figures: None }
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let (precision, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let dtype = precision.dtype();
    let mut results = Vec::new();
    let mut failures = 0;
    if args.seqs.contains(&0) || args.context.contains(&0) {
        return Err("--seqs and --context must be positive".into());
    }
    for &kv_heads in &args.kv_heads {
        if kv_heads == 0 || !args.heads.is_multiple_of(kv_heads) {
            return Err(format!("--kv-heads {kv_heads} does not divide --heads {}", args.heads).into());
        }
        for &context in &args.context {
            for &seqs in &args.seqs {
                // A case whose output is wrong is reported as failed; argument errors stop the run.
                match case(&args, dtype, kv_heads, seqs, context, &device) {
                    Ok(row) => results.push(row),
                    Err(e) if e.is::<Mismatch>() => {
                        eprintln!("{kv_heads:>3} KV heads, {seqs:>4} seqs × {context:>5} tokens: FAILED: {e}");
                        failures += 1;
                        results.push(failed(kv_heads, seqs, context, e.to_string()));
                    }
                    Err(e) => return Err(e),
                }
            }
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
        list(&args.kv_heads),
        args.head_dim,
        args.block_size,
        args.peak_gb_s.map(|p| format!(" --peak-gb-s {p}")).unwrap_or_default()
    );
    let header = Header::new("paged-attention", command, Some(args.device.name()), "none (kernel only)");
    let mut md = header.markdown("PagedAttention kernel: achieved memory bandwidth");
    md.push_str(&format!(
        "- one decode launch: {} query heads, heads of {}, blocks of {} tokens in random order, {}\n\
         - KV GB/s = K and V bytes read ÷ kernel time; stream = `x + 1` over half as many random bytes (at most 256 MiB), read + written ÷ time\n\
         - check: largest difference of the first, middle and last sequences' outputs from the Flex twin; a figure above the streaming bandwidth is refused\n\n",
        args.heads,
        args.head_dim,
        args.block_size,
        precision.name()
    ));
    md.push_str(&table(
        &[
            ("KV heads", Right),
            ("seqs", Right),
            ("context", Right),
            ("KV MiB", Right),
            ("kernel ms", Right),
            ("KV GB/s", Right),
            ("stream GB/s", Right),
            ("of stream", Right),
            ("of peak", Right),
            ("check", Right),
        ],
        results.iter().map(|r| {
            let mut row = vec![
                r.kv_heads.to_string(),
                r.seqs.to_string(),
                r.context.to_string(),
                format!("{:.1}", r.kv_bytes as f64 / (1 << 20) as f64),
            ];
            let dash = || "–".to_string();
            match &r.figures {
                Some(f) => row.extend([
                    format!("{:.3}", f.kernel_s * 1e3),
                    format!("{:.1}", f.kernel_gb_s),
                    format!("{:.1}", f.stream_gb_s),
                    format!("{:.0}%", f.of_stream * 100.0),
                    f.of_peak.map(|p| format!("{:.0}%", p * 100.0)).unwrap_or_else(dash),
                ]),
                None => row.extend([dash(), dash(), dash(), dash(), dash()]),
            }
            row.push(match (&r.invalid, r.max_abs_error) {
                (Some(_), _) => "invalid (below)".into(),
                (None, Some(e)) => format!("{e:.1e}"),
                (None, None) => "–".into(),
            });
            row
        }),
    ));
    for r in results.iter().filter(|r| r.invalid.is_some()) {
        let why = r.invalid.as_deref().unwrap_or_default();
        md.push_str(&format!("\n- invalid: {} KV heads, {} × {}: {why}", r.kv_heads, r.seqs, r.context));
    }
    let report = Report {
        header,
        dtype: precision,
        heads: args.heads,
        head_dim: args.head_dim,
        block_size: args.block_size,
        peak_gb_s: args.peak_gb_s,
        results,
    };
    report::write(&args.out, "paged-attention", &report, &md)?;
    if failures > 0 {
        return Err(format!("{failures} case(s) gave outputs that differ from the Flex twin (see the report)").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figures above the streaming bandwidth are refused, others kept; tolerances widen with
    /// coarser storage.
    #[test]
    fn refusals_and_tolerances() {
        assert_eq!(refusal(900.0, 1000.0), None);
        assert!(refusal(63039.9, 5321.1).is_some_and(|why| why.contains("above the 5321.1 GB/s")));
        assert!(tolerance(DType::F32) < tolerance(DType::F16) && tolerance(DType::F16) < tolerance(DType::BF16));
    }

    /// The check passes the kernel's own output and fails one that is off, naming the sequence.
    #[test]
    fn the_flex_check_catches_a_wrong_output() {
        let device = Device::flex();
        let (seqs, context, block_size, blocks_per_seq) = (4, 40, 16, 3);
        let mut tables: Vec<u32> = (0..(seqs * blocks_per_seq) as u32).collect();
        tables.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(1));
        let shape = [seqs * blocks_per_seq, 2, block_size, 8];
        let random = |shape| Tensor::<4>::random(shape, Distribution::Uniform(-1.0, 1.0), &device);
        let (k, v) = (random(shape), random(shape));
        let q = Tensor::<3>::random([seqs, 4, 8], Distribution::Uniform(-1.0, 1.0), &device);
        let query_seq: Vec<u32> = (0..seqs as u32).collect();
        let out =
            paged_attention(q.clone(), &k, &v, &tables, blocks_per_seq, &query_seq, &[context as u32; 4], 0.3).unwrap();
        let check =
            |out: &Tensor<3>| check_against_flex(&q, &k, &v, out, &tables, blocks_per_seq, context, 0.3, &[0, 2, 3]);
        assert!(check(&out).unwrap() < 1e-6);
        let mut wrong = out.into_data().try_to_vec::<f32>().unwrap();
        wrong[2 * 4 * 8 + 5] += 0.01;
        let wrong = Tensor::<3>::from_data(TensorData::new(wrong, [seqs, 4, 8]), &device);
        let err = check(&wrong).unwrap_err();
        assert!(err.is::<Mismatch>() && err.to_string().contains("sequence 2, value 5"), "{err}");
    }
}
