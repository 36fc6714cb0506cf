//! Integer dot products for weights in groups of 16: the K-quants whose sub-blocks are 16 values
//! (`Q2_K`, `Q3_K` as 4-bit codes, `Q6_K` as 8-bit codes, repacked losslessly at load), which
//! [`super::q8`]'s kernels (whole groups of 32) do not take. As llama.cpp does for them
//! (`ggml_vec_dot_q6_K_q8_K` in `ggml/src/ggml-cpu/arch/x86/quants.c`), the input row is quantized
//! once to signed 8-bit codes with one scale per block of 32 (`q8`'s `quantize_block`, so the
//! codes are the ones `q8` uses), and each group of 16 weight codes meets its 16 activation codes
//! in an integer multiply-add; only the per-group sums are scaled in `f32`:
//!
//! `Σ_k x_k w_k ≈ Σ_b d_b · Σ_{g∈b} scale[g] · Σ_{k∈g} q_k·qx_k + Σ_g min[g] · d_b · Σ_{k∈g} qx_k`.
//!
//! Activation order: 8-bit codes meet the activation in element order; a 4-bit group's eight
//! code bytes hold its even elements in their low nibbles and its odd ones in their high
//! nibbles, so for 4-bit weights each group of 16 activation codes is stored evens first, then
//! odds (once per matmul), and the kernels never shuffle weight nibbles.
//!
//! Kernels: scalar (the reference) and AVX2 (`vpmaddwd` on codes widened to 16 bits), chosen at
//! run time like `q8`'s ([`Isa::best`]). With AVX-512 VNNI the Flex product does not come here:
//! `q8`'s strip kernel multiplies groups of 16 on a split panel (`q8::strips::Panel::halves`).

use std::ops::Range;

use super::q8::{BLOCK, Isa, Weights, quantize_block};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Values per weight group this module multiplies.
pub const GROUP: usize = 16;

/// Input rows quantized for weights in groups of [`GROUP`].
#[derive(Debug, Clone, PartialEq)]
pub struct Rows16 {
    /// Codes, `[m, k]`, in the order the weight codes meet them (see the module doc).
    q: Vec<i8>,
    /// Scale of each block of 32, `[m, k / 32]`.
    d: Vec<f32>,
    /// `d_b · Σ_{k∈g} qx_k` of each group of 16, `[m, k / 16]` (what `min` multiplies).
    group_sum: Vec<f32>,
    k: usize,
}

impl Rows16 {
    /// Quantizes `x` `[m, k]` (`k` a multiple of 32) for `bits`-bit weights.
    pub fn new(x: &[f32], k: usize, bits: u32) -> Self {
        debug_assert!(k.is_multiple_of(BLOCK) && x.len().is_multiple_of(k.max(1)));
        let blocks = x.len() / BLOCK;
        let mut rows = Self { q: vec![0; x.len()], d: vec![0.0; blocks], group_sum: vec![0.0; 2 * blocks], k };
        let mut codes = [0i8; BLOCK];
        for (b, values) in x.chunks_exact(BLOCK).enumerate() {
            let values: &[f32; BLOCK] = values.try_into().expect("whole blocks");
            let (d, _) = quantize_block(values, &mut codes);
            rows.d[b] = d;
            let q = &mut rows.q[b * BLOCK..(b + 1) * BLOCK];
            for (h, group) in codes.chunks_exact(GROUP).enumerate() {
                rows.group_sum[2 * b + h] = d * group.iter().map(|&c| i32::from(c)).sum::<i32>() as f32;
                let dst = &mut q[h * GROUP..(h + 1) * GROUP];
                if bits == 4 {
                    for u in 0..GROUP / 2 {
                        (dst[u], dst[GROUP / 2 + u]) = (group[2 * u], group[2 * u + 1]);
                    }
                } else {
                    dst.copy_from_slice(group);
                }
            }
        }
        rows
    }

    /// Input rows.
    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.k).unwrap_or(0)
    }

    /// Row `i`'s codes, block scales and group sums.
    fn row(&self, i: usize) -> (&[i8], &[f32], &[f32]) {
        let (blocks, groups) = (self.k / BLOCK, self.k / GROUP);
        (
            &self.q[i * self.k..(i + 1) * self.k],
            &self.d[i * blocks..(i + 1) * blocks],
            &self.group_sum[i * groups..(i + 1) * groups],
        )
    }
}

/// Whether `w` is one this module multiplies: 4- or 8-bit codes in groups of exactly 16.
pub fn supports(bits: u32, group: usize) -> bool {
    group == GROUP && (bits == 4 || bits == 8)
}

/// `x · Wᵀ` for weight rows `rows` of `w` (groups of [`GROUP`]): `write(i, j, value)` for every
/// input row `i` and weight row `j` in `rows`.
pub fn weight_rows(
    w: &Weights<'_>,
    a: &Rows16,
    rows: Range<usize>,
    isa: Isa,
    mut write: impl FnMut(usize, usize, f32),
) {
    let (k, bits) = (a.k, w.bits);
    let (words, groups) = (k * bits as usize / 32, k / GROUP);
    for j in rows {
        let codes = &w.codes[j * words..(j + 1) * words];
        let (scale, min) = (&w.scale[j * groups..(j + 1) * groups], &w.min[j * groups..(j + 1) * groups]);
        for i in 0..a.rows() {
            let (q, d, group_sum) = a.row(i);
            let dot = row_dot(isa, bits, codes, scale, q, d);
            let offset: f32 = min.iter().zip(group_sum).map(|(m, s)| m * s).sum();
            write(i, j, dot + offset);
        }
    }
}

/// `Σ_b d_b · Σ_{g∈b} scale[g] · Σ_{k∈g} q_k·qx_k` of one weight row and one input row.
fn row_dot(isa: Isa, bits: u32, codes: &[u32], scale: &[f32], q: &[i8], d: &[f32]) -> f32 {
    match isa {
        Isa::Scalar => row_dot_scalar(bits, codes, scale, q, d),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::best` returned these only where the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::Vnni => unsafe { x86::row_dot_avx2(bits, codes, scale, q, d) },
    }
}

/// The code bytes of block `b` in the order the activation meets them: 8-bit, the block's 32
/// bytes; 4-bit, per group its low nibbles then its high nibbles.
fn block_codes(bits: u32, codes: &[u32], b: usize) -> [u8; BLOCK] {
    let mut out = [0u8; BLOCK];
    if bits == 8 {
        for (t, word) in codes[b * 8..(b + 1) * 8].iter().enumerate() {
            out[4 * t..4 * t + 4].copy_from_slice(&word.to_le_bytes());
        }
    } else {
        let bytes: Vec<u8> = codes[b * 4..(b + 1) * 4].iter().flat_map(|w| w.to_le_bytes()).collect();
        for (h, group) in bytes.chunks_exact(GROUP / 2).enumerate() {
            for (u, &byte) in group.iter().enumerate() {
                out[h * GROUP + u] = byte & 0x0F;
                out[h * GROUP + GROUP / 2 + u] = byte >> 4;
            }
        }
    }
    out
}

/// [`row_dot`] in plain Rust, the reference the SIMD kernels are tested against.
fn row_dot_scalar(bits: u32, codes: &[u32], scale: &[f32], q: &[i8], d: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, &db) in d.iter().enumerate() {
        let u = block_codes(bits, codes, b);
        let qb = &q[b * BLOCK..(b + 1) * BLOCK];
        for h in 0..2 {
            let range = h * GROUP..(h + 1) * GROUP;
            let dot: i32 = u[range.clone()].iter().zip(&qb[range]).map(|(&c, &x)| i32::from(c) * i32::from(x)).sum();
            acc += db * scale[2 * b + h] * dot as f32;
        }
    }
    acc
}

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 32;

/// `x · Wᵀ` (`x` `[m, k]`, `W` `[n, k]` in groups of [`GROUP`]) in integer arithmetic: the input
/// rows quantized once, the weight rows split across threads in chunks of [`ROWS_PER_TASK`].
pub fn int8_nt(w: &Weights<'_>, x: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = vec![0f32; m * n];
    if m == 0 || k == 0 || n == 0 {
        return out;
    }
    let a = Rows16::new(x, k, w.bits);
    let isa = Isa::best();
    let parts: Vec<Vec<f32>> = (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .map(|t| {
            let rows = t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n);
            let mut part = vec![0f32; rows.len() * m];
            let first = rows.start;
            weight_rows(w, &a, rows, isa, |i, j, v| part[(j - first) * m + i] = v);
            part
        })
        .collect();
    for (t, part) in parts.iter().enumerate() {
        for (local, column) in part.chunks_exact(m).enumerate() {
            let j = t * ROWS_PER_TASK + local;
            for (i, &v) in column.iter().enumerate() {
                out[i * n + j] = v;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
