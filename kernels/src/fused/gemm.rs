//! `f32` matrix product on Flex with register tiles: `[m, k] · [k, n]`.
//!
//! Written because Burn's Flex matmul (the `gemm` crate, AVX2 kernels) stays far below the FMA peak
//! at SmolLM2's prefill shapes (`cargo xtask bench quant --shapes-only`). Here a tile of `MR` input rows ×
//! `NR` output columns accumulates in registers over the whole `k` (`MR · NR / lanes` vector
//! accumulators: 12 on AVX-512 and on AVX2), reading one `NR`-wide row of the weight and `MR`
//! broadcasts per step. Input rows go in blocks that stay in L2 while the panels pass over them.
//! The weight is read where it is when its rows are contiguous (`[k, n]`, a `Linear` weight);
//! otherwise (the last partial panel; a transposed table without AVX2) each `NR`-column panel is
//! packed into a contiguous `[k, NR]` buffer per row block. A transposed `[n, k]` table (a tied
//! LM head's embedding) with AVX2/FMA runs [`nt::product`] instead: both operands along `k`, 3
//! input rows × 4 table rows per register tile. Panels run in parallel (two threads: the caller
//! and the split helper). Known weak spot: a very wide weight read in place (an f32 LM head,
//! 49,152 columns) maps its rows onto few cache sets and runs at Burn's speed, not faster.

use burn::backend::Flex;
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::flex::{from_vec, into_flex, slice};
// The output, written by the tasks of disjoint column panels: the integer kernels' wrapper.
use crate::quant::flex::SharedOut;

/// Input rows up to which a transposed table is multiplied by dot products instead of tiles
/// where [`nt::product`] cannot run (no AVX2/FMA, or `k` not a multiple of 8): up to this many rows
/// of a wide tied head, dot products beat packing the table into tiles.
const DOT_MAX_ROWS: usize = 8;

/// Products below this many multiply-adds run on the calling thread.
const SERIAL_MACS: usize = 1 << 16;

/// `x · w` for `x` `[m, k]` and `w` `[k, n]` on Flex in `f32` (checked by the caller); `w` may be
/// a strided view (a transposed table).
pub(super) fn flex_matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let [m, k] = x.dims();
    let n = w.dims()[1];
    let x = into_flex(x);
    let xs = slice(&x);
    let mut w = w.try_into_primitive::<Flex>().expect("checked by on_flex");
    if w.layout().strides().iter().any(|&s| s < 0) {
        w = w.to_contiguous();
    }
    let layout = w.layout();
    let (start, strides) = (layout.start_offset(), layout.strides().to_vec());
    let ws = &w.storage::<f32>()[start..];
    // Element (kk, j) of `w` is `ws[kk · row + j · col]`.
    let (row, col) = (strides[0] as usize, strides[1] as usize);
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return from_vec(out, [m, n]);
    }
    let b = Weight { values: ws, row, col, k, n };
    products(xs, m, &b, SharedOut(out.as_mut_ptr()));
    from_vec(out, [m, n])
}

/// The weight operand: element `(kk, j)` at `values[kk · row + j · col]`.
struct Weight<'a> {
    values: &'a [f32],
    row: usize,
    col: usize,
    k: usize,
    n: usize,
}

/// Every column panel of the product, in parallel when it is large enough. Panels are counted
/// in units of [`UNIT`] columns (the widest `NR`), so that every instruction set splits alike.
fn products(xs: &[f32], m: usize, b: &Weight, out: SharedOut) {
    let count = b.n.div_ceil(UNIT);
    let run = |units: std::ops::Range<usize>| {
        panel_range(xs, m, b, units.start * UNIT..(units.end * UNIT).min(b.n), out);
    };
    if m * b.k * b.n < SERIAL_MACS || count == 1 {
        run(0..count);
    } else if rayon::current_num_threads() == 2 {
        // Two halves of the panels, one chunk each (the caller takes the helper's back when the
        // helper has not started it).
        crate::quant::split::split2_chunks(count, count.div_ceil(2), &run);
    } else {
        (0..count).into_par_iter().for_each(|p| run(p..p + 1));
    }
}

/// Columns per unit of work: a multiple of every `NR` below.
const UNIT: usize = 32;

/// Columns `columns` (a whole number of [`UNIT`]s, or the tail) of every output row, with the
/// widest registers the CPU has (AVX-512: 6 × 32 tiles; AVX2: 6 × 16), plain Rust otherwise.
fn panel_range(xs: &[f32], m: usize, b: &Weight, columns: std::ops::Range<usize>, out: SharedOut) {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::cpu::features();
        if b.row == 1 && b.k > 0 && b.k.is_multiple_of(8) && cpu.avx2_fma() {
            // SAFETY: the features `nt::product` is compiled for were just detected; `k` is a
            // positive multiple of 8 and the table's rows are contiguous (`row == 1`).
            return unsafe { nt::product(xs, m, b, columns, out) };
        }
        if cpu.avx512_fma() {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn run(xs: &[f32], m: usize, b: &Weight, columns: std::ops::Range<usize>, out: SharedOut) {
                panels::<6, 32, true>(xs, m, b, columns, out)
            }
            // SAFETY: the features `run` is compiled for were just detected.
            return unsafe { run(xs, m, b, columns, out) };
        }
        if cpu.avx2_fma() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run(xs: &[f32], m: usize, b: &Weight, columns: std::ops::Range<usize>, out: SharedOut) {
                panels::<6, 16, true>(xs, m, b, columns, out)
            }
            // SAFETY: as above.
            return unsafe { run(xs, m, b, columns, out) };
        }
    }
    panels::<4, 16, false>(xs, m, b, columns, out)
}

#[inline(always)]
fn panels<const MR: usize, const NR: usize, const FMA: bool>(
    xs: &[f32],
    m: usize,
    b: &Weight,
    columns: std::ops::Range<usize>,
    out: SharedOut,
) {
    if b.row == 1 && m <= DOT_MAX_ROWS {
        // A transposed table (`[n, k]` rows contiguous) and a few input rows: a dot product per
        // output reads each table row once, in order, with nothing to pack.
        for j in columns {
            let column = &b.values[j * b.col..j * b.col + b.k];
            for i in 0..m {
                let value = crate::quant::q8::dot(&xs[i * b.k..(i + 1) * b.k], column);
                // SAFETY: as in `panel`: this column belongs to this range only.
                unsafe { out.write(i * b.n + j, value) };
            }
        }
        return;
    }
    let mut packed = Vec::new();
    // Blocks of input rows small enough to stay in L2 (about 128 KiB) while every panel of the
    // range passes over them: a wide weight (an LM head's 49,152 columns) would otherwise stream
    // all of `x` from memory once per panel.
    let block = (MR * (32 * 1024 / (b.k.max(1) * MR)).max(1)).max(MR);
    for i0 in (0..m).step_by(block) {
        for j0 in columns.clone().step_by(NR) {
            panel::<MR, NR, FMA>(xs, i0..(i0 + block).min(m), b, j0, &mut packed, out);
        }
    }
}

/// Columns `j0..j0 + NR` (fewer in the last panel) of the output rows `rows`.
#[inline(always)]
fn panel<const MR: usize, const NR: usize, const FMA: bool>(
    xs: &[f32],
    rows: std::ops::Range<usize>,
    b: &Weight,
    j0: usize,
    packed: &mut Vec<f32>,
    out: SharedOut,
) {
    let (k, width) = (b.k, NR.min(b.n - j0));
    // Read in place when the panel's rows are contiguous and whole; otherwise (a transposed
    // table, the last partial panel) pack `[k, NR]`, once per panel and row block.
    let (values, stride): (&[f32], usize) = if b.col == 1 && width == NR {
        (&b.values[j0..], b.row)
    } else {
        packed.clear();
        packed.resize(k * NR, 0.0);
        for (kk, to) in packed.chunks_exact_mut(NR).enumerate() {
            for (c, to) in to[..width].iter_mut().enumerate() {
                *to = b.values[kk * b.row + (j0 + c) * b.col];
            }
        }
        (packed.as_slice(), NR)
    };
    let (mut i0, m) = (rows.start, rows.end);
    while i0 < m {
        let rows = MR.min(m - i0);
        let acc = match rows {
            r if r == MR => tile::<MR, NR, FMA, MR>(xs, i0, k, values, stride),
            _ => tail::<MR, NR, FMA>(xs, i0, rows, k, values, stride),
        };
        for (r, acc) in acc.iter().take(rows).enumerate() {
            // SAFETY: row `i0 + r` is an input row, columns `j0..j0 + width` belong to this panel
            // only, and the `[m, n]` buffer outlives the product.
            unsafe { out.copy((i0 + r) * b.n + j0, &acc[..width]) };
        }
        i0 += rows;
    }
}

/// The last rows (fewer than `MR`), one row tile at a time; rows past `rows` stay zero.
#[inline(always)]
fn tail<const MR: usize, const NR: usize, const FMA: bool>(
    xs: &[f32],
    i0: usize,
    rows: usize,
    k: usize,
    values: &[f32],
    stride: usize,
) -> [[f32; NR]; MR] {
    let mut acc = [[0f32; NR]; MR];
    for (r, acc) in acc.iter_mut().take(rows).enumerate() {
        *acc = tile::<MR, NR, FMA, 1>(xs, i0 + r, k, values, stride)[0];
    }
    acc
}

/// `acc[r][c] = Σ_kk x[i0 + r, kk] · w[kk, c]` for `R` rows (`R ≤ MR`) and `NR` columns, with
/// `w[kk, c]` at `values[kk · stride + c]`.
#[inline(always)]
fn tile<const MR: usize, const NR: usize, const FMA: bool, const R: usize>(
    xs: &[f32],
    i0: usize,
    k: usize,
    values: &[f32],
    stride: usize,
) -> [[f32; NR]; MR] {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &xs[(i0 + r) * k..(i0 + r + 1) * k]);
    let mut acc = [[0f32; NR]; MR];
    for kk in 0..k {
        let w: &[f32; NR] = values[kk * stride..kk * stride + NR].try_into().expect("NR columns");
        for r in 0..R {
            let a = rows[r][kk];
            for c in 0..NR {
                acc[r][c] = if FMA { a.mul_add(w[c], acc[r][c]) } else { acc[r][c] + a * w[c] };
            }
        }
    }
    acc
}

/// A transposed table (`[n, k]`, its rows contiguous) times a few input rows with AVX2/FMA: both
/// operands run along `k`, so a register tile of [`nt::ROWS`] input rows × [`nt::COLUMNS`] table
/// rows accumulates 8 lanes of `k` at a time and reduces horizontally once at the end, where the
/// packed tiles would first transpose every 16-column panel (scalar, strided) and the dot
/// products run one input row and one column at a time.
#[cfg(target_arch = "x86_64")]
pub(super) mod nt {
    use std::arch::x86_64::*;

    use super::{SharedOut, Weight};

    /// Input rows per register tile.
    pub(super) const ROWS: usize = 3;
    /// Table rows (output columns) per register tile.
    pub(super) const COLUMNS: usize = 4;
    /// Bytes of input rows per block (about half of L2).
    const BLOCK_BYTES: usize = 192 * 1024;

    /// Output columns `columns` of every input row.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `b.row == 1` and `b.k` is a positive multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn product(xs: &[f32], m: usize, b: &Weight, columns: std::ops::Range<usize>, out: SharedOut) {
        let k = b.k;
        assert!(b.row == 1 && k.is_multiple_of(8) && xs.len() >= m * k && columns.end <= b.n);
        assert!(columns.is_empty() || (columns.end - 1) * b.col + k <= b.values.len());
        let whole = columns.start + (columns.end - columns.start) / COLUMNS * COLUMNS;
        // Blocks of input rows that stay in L2 while the columns pass over them, whole tiles.
        let block = (BLOCK_BYTES / (4 * k).max(1)).max(ROWS) / ROWS * ROWS;
        for i0 in (0..m).step_by(block) {
            for j in (columns.start..whole).step_by(COLUMNS) {
                let mut i = i0;
                while i < m.min(i0 + block) {
                    let rows = ROWS.min(m.min(i0 + block) - i);
                    // SAFETY: rows `i..i + rows` and table rows `j..j + 4` are in bounds
                    // (asserted).
                    unsafe {
                        match rows {
                            3 => tile::<3>(xs, i, b, j, out),
                            2 => tile::<2>(xs, i, b, j, out),
                            _ => tile::<1>(xs, i, b, j, out),
                        }
                    }
                    i += rows;
                }
            }
        }
        for j in whole..columns.end {
            let column = &b.values[j * b.col..j * b.col + k];
            for i in 0..m {
                let value = crate::quant::q8::dot(&xs[i * k..(i + 1) * k], column);
                // SAFETY: column `j` belongs to this range only.
                unsafe { out.write(i * b.n + j, value) };
            }
        }
    }

    /// Input rows `i..i + R` × table rows `j..j + 4`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize>(xs: &[f32], i: usize, b: &Weight, j: usize, out: SharedOut) {
        let k = b.k;
        let mut acc = [[_mm256_setzero_ps(); COLUMNS]; R];
        // SAFETY (every access): `product` checked the bounds of rows `i..i + R` of `xs` and of
        // table rows `j..j + 4`; the output row segments belong to this range only.
        unsafe {
            let table: [*const f32; COLUMNS] = std::array::from_fn(|c| b.values.as_ptr().add((j + c) * b.col));
            let x: [*const f32; R] = std::array::from_fn(|r| xs.as_ptr().add((i + r) * k));
            for kk in (0..k).step_by(8) {
                let w: [__m256; COLUMNS] = std::array::from_fn(|c| _mm256_loadu_ps(table[c].add(kk)));
                for r in 0..R {
                    let x = _mm256_loadu_ps(x[r].add(kk));
                    for c in 0..COLUMNS {
                        acc[r][c] = _mm256_fmadd_ps(x, w[c], acc[r][c]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let mut sums = [0f32; COLUMNS];
                _mm_storeu_ps(sums.as_mut_ptr(), sum4(acc));
                out.copy((i + r) * b.n + j, &sums);
            }
        }
    }

    /// `[Σ a[0], Σ a[1], Σ a[2], Σ a[3]]`, each the sum of a register's 8 lanes (lanes 0–3 and
    /// 4–7 summed in the two halves, then the halves added).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::fused) fn sum4(a: &[__m256; 4]) -> __m128 {
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
    }
}
