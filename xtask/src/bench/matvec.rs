//! `cargo xtask bench matvec`: the decode matrix-vector kernels (`kernels::matvec`) against the
//! paths they replace, at decode shapes on a GPU device.
//!
//! For each weight shape `[k, n]` (default LLaMA-7B's `[4096, 4096]` attention and
//! `[4096, 11008]` MLP projections) and each input row count `m` (default 1, 8, 32), four
//! products, each timed on the old path and on the new one:
//!
//! - dense `[k, n]` (a `Linear`'s `[in, out]`): Burn's `matmul` vs `kernels::matmul`;
//! - dense `[n, k]` read transposed (HF's `[out, in]`, a tied LM head): the same two;
//! - 4-bit groups of 64 in FlexGen's `[k, n]` layout, and 4-bit groups of 32 in GGUF's `[n, k]`
//!   layout: the per-output quantized kernel vs the quantized matrix-vector kernel
//!   (`kernels::set_matvec_kernels` switches between them).
//!
//! A figure is weight bytes read ÷ time per call, time per call being a sample of `--iters`
//! calls, the last one's result read back before the clock stops (median of 5 samples after a
//! warm-up call, which also compiles the kernels). Each row also states the largest difference
//! between the two paths' results, so a fast path that computes something else shows up.
//! On a software Vulkan driver (lavapipe) the figures say nothing about GPUs: there, run it with
//! tiny `--shapes` to check that it works.

use std::path::PathBuf;

use burn::tensor::{DType, Device, Distribution, Tensor};
use burn_llm::DeviceChoice;
use burn_llm::kernels::{QuantSpec, qmatmul, qmatmul_transposed, quantize, set_matvec_kernels};
use burn_llm::models::Precision;
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `bench matvec`.
#[derive(clap::Args)]
pub struct Args {
    /// Device backend (a GPU runtime: the kernels do not run on flex).
    #[arg(long, value_enum, default_value = "wgpu")]
    device: DeviceChoice,
    /// Element type of inputs, dense weights and quantization scales (default: f16 on GPUs).
    #[arg(long)]
    dtype: Option<Precision>,
    /// Weight shapes `KxN` (input features × output features).
    #[arg(long, value_delimiter = ',', default_value = "4096x4096,4096x11008")]
    shapes: Vec<String>,
    /// Input rows.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    rows: Vec<usize>,
    /// Calls per timed sample.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    product: String,
    m: usize,
    k: usize,
    n: usize,
    weight_bytes: usize,
    old_ms: f64,
    new_ms: f64,
    old_gb_s: f64,
    new_gb_s: f64,
    /// Largest `|new − old|` over the outputs, relative to the largest `|old|`.
    max_rel_diff: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    dtype: Precision,
    results: Vec<Row>,
}

/// Seconds per call of `f` with the matrix-vector kernels on or off (see the module docs), and
/// the last result.
fn per_call(device: &Device, iters: usize, matvec: bool, f: &dyn Fn() -> Tensor<2>) -> (f64, Tensor<2>) {
    set_matvec_kernels(matvec);
    let timed = super::calls::per_call(device, iters, f);
    set_matvec_kernels(true);
    timed
}

/// `max |a − b| / max |a|`.
fn relative_diff(a: Tensor<2>, b: Tensor<2>) -> f64 {
    let values = |t: Tensor<2>| t.cast(DType::F32).into_data().try_into_vec_as::<f32>().unwrap_or_default();
    let (a, b) = (values(a), values(b));
    let scale = a.iter().fold(1e-12f32, |m, v| m.max(v.abs()));
    a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) as f64 / scale as f64
}

/// Parses `KxN`.
fn parse_shape(s: &str) -> Result<[usize; 2], String> {
    let bad = || format!("--shapes: `{s}` is not KxN (e.g. 4096x11008)");
    let (k, n) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (k, n) = (k.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if k == 0 || n == 0 {
        return Err(bad());
    }
    Ok([k, n])
}

/// The four products at one shape and row count.
fn shape_rows(args: &Args, device: &Device, dtype: DType, [k, n]: [usize; 2], m: usize) -> Result<Vec<Row>, String> {
    let random = |shape: [usize; 2]| Tensor::<2>::random(shape, Distribution::Uniform(-1.0, 1.0), (device, dtype));
    let x = random([m, k]);
    let mut rows = Vec::new();
    let mut record = |product: &str, weight_bytes: usize, old: &dyn Fn() -> Tensor<2>, new: &dyn Fn() -> Tensor<2>| {
        let (old_s, old_out) = per_call(device, args.iters, false, old);
        let (new_s, new_out) = per_call(device, args.iters, true, new);
        let row = Row {
            product: product.to_string(),
            m,
            k,
            n,
            weight_bytes,
            old_ms: old_s * 1e3,
            new_ms: new_s * 1e3,
            old_gb_s: weight_bytes as f64 / old_s / 1e9,
            new_gb_s: weight_bytes as f64 / new_s / 1e9,
            max_rel_diff: relative_diff(old_out, new_out),
        };
        eprintln!(
            "{product} m = {m} [{k}, {n}]: old {:.3} ms ({:.1} GB/s), new {:.3} ms ({:.1} GB/s), diff {:.1e}",
            row.old_ms, row.old_gb_s, row.new_ms, row.new_gb_s, row.max_rel_diff
        );
        rows.push(row);
    };

    let dense_bytes = k * n * dtype.size();
    let w = random([k, n]);
    record("dense [in, out]", dense_bytes, &|| x.clone().matmul(w.clone()), &|| {
        burn_llm::kernels::matmul(x.clone(), w.clone())
    });
    drop(w);
    let table = random([n, k]);
    record("dense [out, in]ᵀ", dense_bytes, &|| x.clone().matmul(table.clone().transpose()), &|| {
        burn_llm::kernels::matmul(x.clone(), table.clone().transpose())
    });
    drop(table);

    for (transposed, group) in [(false, 64), (true, 32)] {
        let spec = QuantSpec::new(4, group, 1).map_err(|e| e.to_string())?;
        let shape = if transposed { [n, k] } else { [k, n] };
        let quantized_axis = shape[1];
        if !quantized_axis.is_multiple_of(group) {
            eprintln!("skipping 4-bit groups of {group} at [{k}, {n}]: {quantized_axis} is not a multiple of {group}");
            continue;
        }
        let mut q = quantize(random(shape).cast(DType::F32), spec).map_err(|e| e.to_string())?;
        q.scale = q.scale.cast(dtype);
        q.min = q.min.cast(dtype);
        let bytes = k * n / 2 + 2 * (k * n / group) * dtype.size();
        let product = |x: Tensor<2>| {
            let out = if transposed { qmatmul_transposed(x, &q) } else { qmatmul(x, &q) };
            out.expect("the weight is quantized along axis 1 with k shared")
        };
        let name = if transposed { "Q4/32 [out, in] (GGUF)" } else { "Q4/64 [in, out] (FlexGen)" };
        record(name, bytes, &|| product(x.clone()), &|| product(x.clone()));
    }
    Ok(rows)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.device == DeviceChoice::Flex {
        return Err("bench matvec times GPU kernels: give --device wgpu, vulkan, cuda or metal".into());
    }
    let device = args.device.device()?;
    let (precision, note) = args.device.precision(args.dtype, &device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let dtype = precision.dtype();
    let shapes = args.shapes.iter().map(|s| parse_shape(s)).collect::<Result<Vec<_>, _>>()?;
    if let Some(m) = args.rows.iter().find(|&&m| m == 0 || m > burn_llm::kernels::MATVEC_MAX_ROWS) {
        return Err(format!("--rows: {m} is outside 1..={}", burn_llm::kernels::MATVEC_MAX_ROWS).into());
    }
    let mut results = Vec::new();
    for &shape in &shapes {
        for &m in &args.rows {
            results.extend(shape_rows(&args, &device, dtype, shape, m)?);
        }
    }
    let list = |v: &[String]| v.join(",");
    let rows = args.rows.iter().map(usize::to_string).collect::<Vec<_>>();
    let command = format!(
        "cargo xtask bench matvec --device {} --dtype {} --shapes {} --rows {} --iters {}",
        args.device.name(),
        precision.name(),
        list(&args.shapes),
        list(&rows),
        args.iters
    );
    let header = Header::new("matvec", command, Some(args.device.name()), "none (kernels only)");
    let mut md = header.markdown("Decode matrix-vector kernels vs the paths they replace");
    md.push_str(&format!(
        "- {}; GB/s = weight bytes (codes, scales and minimums for Q4) ÷ time per call\n\
         - old: Burn's matmul (dense), the per-output kernel (Q4); new: `kernels::matvec`\n\
         - diff: largest |new − old| ÷ largest |old|\n\n",
        precision.name()
    ));
    md.push_str(&table(
        &[
            ("product", Left),
            ("m", Right),
            ("k × n", Right),
            ("old ms", Right),
            ("new ms", Right),
            ("old GB/s", Right),
            ("new GB/s", Right),
            ("speed-up", Right),
            ("diff", Right),
        ],
        results.iter().map(|r| {
            vec![
                r.product.clone(),
                r.m.to_string(),
                format!("{} × {}", r.k, r.n),
                format!("{:.3}", r.old_ms),
                format!("{:.3}", r.new_ms),
                format!("{:.1}", r.old_gb_s),
                format!("{:.1}", r.new_gb_s),
                format!("{:.2}×", r.old_ms / r.new_ms),
                format!("{:.1e}", r.max_rel_diff),
            ]
        }),
    ));
    report::write(&args.out, "matvec", &Report { header, dtype: precision, results }, &md)?;
    Ok(())
}
