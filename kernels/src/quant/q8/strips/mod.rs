//! The integer product for several input rows at once (batched decode, prefill) on AVX-512 VNNI
//! or AVX2: a register-blocked microkernel over strips of [`STRIP`] weight rows.
//!
//! [`super::weight_rows`] dots one weight row with one input row per 512-bit register, so every
//! 64 multiply-adds pay for an `i32 → f32` conversion, a scale product and two FMAs, and each
//! register's lanes must be summed at the end. Here the 16 `i32` lanes of a register are 16
//! *weight rows*: a strip's codes are transposed once ([`Strip::load`], word `w` of the 16 rows
//! side by side), so that one `vpdpbusd` multiplies four codes of each of 16 rows with the same
//! four activation codes (broadcast from memory). A block of 32 codes is then 8 (4-bit: 4 loads,
//! each split into low and high nibbles) or 8 (8-bit) `vpdpbusd` into one `i32` register per input
//! row, followed by a single conversion and FMA with `scale[row, g] · d[i, b]` for all 16 rows;
//! the strip's codes are decoded once per tile of [`ROWS`] input rows, and the `min` term is one
//! FMA per group and input row. 16 weight rows × 8 input rows take 16 accumulators (8 `i32`, 8
//! `f32`) of the 32 registers.
//!
//! Activation codes come from [`QuantizedRows`], regrouped once per product into a [`Panel`]
//! (each tile's rows block by block, so that all broadcasts of a block are at fixed offsets from
//! one pointer); the pair layout already puts the four codes that meet one code word side by side.
//! The strips are transposed in registers (16 × 16 words) after reading each strip in memory
//! order, which the hardware prefetchers follow (the transposition's order alone they do not).
//!
//! **AVX2** has no `vpdpbusd`: a 256-bit register holds one word of 8 weight rows (half a strip),
//! `vpmaddubsw` multiplies its 4-bit codes (unsigned) with four broadcast activation codes
//! (signed) into pairs summed as `i16`, and a block's eight such products (4 words, low and high
//! nibbles) are added as `i16` — at most `8 · 2 · 15 · 127 = 30480`, so nothing saturates — before
//! one `vpmaddwd` widens them to `i32`. 8-bit codes (`0..=255`: a pair of products would saturate
//! `i16`) are multiplied as their two nibbles, `code = 16 · high + low`: the low and the high
//! nibbles of a block's 8 words meet the same broadcast codes into two `i16` sums (each at most
//! `8 · 2 · 15 · 127`), widened by one `vpmaddwd` with 1 and one with 16. Each half strip runs
//! over tiles of up to [`AVX2_ROWS`] input rows (`i16` and `f32` accumulators for each fit the 16
//! registers). The strip is transposed in 8 × 8 blocks of words there, each half strip at a time.

use std::cell::RefCell;
use std::ops::Range;

use super::{BLOCK, Isa, LANES, PAIR, QuantizedRows, Weights};

/// Weight rows per strip: one per `i32` lane of a 512-bit register.
pub const STRIP: usize = 16;
/// Input rows per microkernel call: each decoded code register feeds this many `vpdpbusd`.
pub const ROWS: usize = 8;
/// Input rows per AVX2 microkernel call (a tile of [`ROWS`] in parts).
pub const AVX2_ROWS: usize = 4;

/// Up to [`STRIP`] weight rows transposed so that word `w` of all of them is one 512-bit register:
/// `codes[w · 16 + r]` is word `w` of row `r` (zeros past the last row), `scale` and `min`
/// likewise `[groups, 16]`. Reused across calls (one per thread), so that the hot loop allocates
/// nothing.
#[derive(Debug, Default)]
struct Strip {
    codes: Vec<u32>,
    scale: Vec<f32>,
    min: Vec<f32>,
}

impl Strip {
    /// Transposes the weight rows `rows` (at most [`STRIP`]) of `w` into the strip; `w` has
    /// `words` code words and `groups` groups per row.
    /// `isa`: the registers full strips are transposed in ([`Isa::Scalar`]: the plain loop).
    /// A symmetric weight's minimums are `−offset · scale`, computed from the strip's scales
    /// (a product by a power of two in the GGUF types, exact: the stored minimums, bit for bit)
    /// rather than read.
    fn load(&mut self, w: &Weights, words: usize, groups: usize, rows: Range<usize>, isa: Isa) {
        debug_assert!(rows.len() <= STRIP);
        self.codes.resize(words * STRIP, 0);
        self.scale.resize(groups * STRIP, 0.0);
        self.min.resize(groups * STRIP, 0.0);
        if rows.len() < STRIP {
            self.codes.fill(0);
            self.scale.fill(0.0);
            self.min.fill(0.0);
        }
        transpose(&mut self.codes, w.codes, words, rows.clone(), isa);
        transpose(f32_bits_mut(&mut self.scale), f32_bits(w.scale), groups, rows.clone(), isa);
        if w.symmetric_offset > 0 {
            let factor = -(w.symmetric_offset as f32);
            self.min.iter_mut().zip(&self.scale).for_each(|(min, &scale)| *min = scale * factor);
        } else {
            transpose(f32_bits_mut(&mut self.min), f32_bits(w.min), groups, rows, isa);
        }
    }
}

/// `to[c · 16 + r] = from[(rows.start + r) · len + c]`: the rows `rows` (at most [`STRIP`]) of
/// a `[·, len]` matrix side by side; where the strip is full, 16 × 16 blocks in AVX-512
/// registers ([`Isa::Vnni`]) or 8 × 8 blocks in AVX2 ones ([`Isa::Avx2`]), the columns past the
/// last whole block by the plain loop.
fn transpose(to: &mut [u32], from: &[u32], len: usize, rows: Range<usize>, isa: Isa) {
    let from = &from[rows.start * len..rows.end * len];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if rows.len() == STRIP {
        match isa {
            Isa::Vnni => {
                done = len / STRIP * STRIP;
                x86::transpose16(to, from, len);
            }
            Isa::Avx2 => {
                done = len / 8 * 8;
                x86::transpose8(to, from, len);
            }
            Isa::Scalar => {}
        }
    }
    for (r, row) in from.chunks_exact(len).enumerate().filter(|_| done < len) {
        to[done * STRIP + r..].iter_mut().step_by(STRIP).zip(&row[done..]).for_each(|(to, from)| *to = *from);
    }
}

fn f32_bits(v: &[f32]) -> &[u32] {
    // SAFETY: `f32` and `u32` have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u32, v.len()) }
}

fn f32_bits_mut(v: &mut [f32]) -> &mut [u32] {
    // SAFETY: as `f32_bits`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u32, v.len()) }
}

thread_local! {
    /// This thread's strip buffer.
    static STRIP_BUFFER: RefCell<Strip> = RefCell::default();
}

/// Input rows regrouped for the microkernel, [`ROWS`] at a time: per tile of rows and block, the
/// rows' 32 activation codes one after the other (4-bit: the even elements, then the odd ones,
/// matching the low and the high nibbles of the code words; 8-bit: in order), so that every
/// broadcast of the tile is at a fixed offset from one pointer. Built once per product from
/// [`QuantizedRows`] (a copy of `m · k` bytes), or for weights in groups of [`HALF`] straight
/// from the input rows ([`Panel::halves`]).
#[derive(Debug, Clone)]
pub struct Panel {
    /// `[tiles, blocks, ROWS, 32]`; rows past `m` are zeros.
    q: Vec<i8>,
    /// Block scales, `[tiles, blocks, ROWS]`.
    d: Vec<f32>,
    /// Per-group sums ([`QuantizedRows`]), `[tiles, groups, ROWS]`.
    group_sum: Vec<f32>,
    m: usize,
    blocks: usize,
    groups: usize,
    bits: u32,
    /// Weight groups of [`HALF`] values, two per block (the K-quants with sub-blocks of 16).
    split: bool,
}

/// Values per weight group of a split panel ([`Panel::halves`]): half a block.
pub const HALF: usize = BLOCK / 2;

/// Input rows per parallel task of [`Panel::halves`] for long inputs (prefill).
const HALVES_ROWS_PER_TASK: usize = 4 * ROWS;

impl Panel {
    /// The rows of `a` regrouped.
    pub fn new(a: &QuantizedRows) -> Self {
        let (tiles, pairs) = (a.m.div_ceil(ROWS), a.pairs());
        let mut panel = Self {
            q: vec![0; tiles * a.blocks * ROWS * BLOCK],
            d: vec![0.0; tiles * a.blocks * ROWS],
            group_sum: vec![0.0; tiles * a.groups * ROWS],
            m: a.m,
            blocks: a.blocks,
            groups: a.groups,
            bits: a.bits,
            split: false,
        };
        // Where block 1 of a pair starts among the pair's codes, and which scale lane is its.
        let (half_offset, half_lane) = if a.bits == 4 { (BLOCK / 2, 4) } else { (BLOCK, 8) };
        for i in 0..a.m {
            let (tile, t) = (i / ROWS, i % ROWS);
            for b in 0..a.blocks {
                let from = (i * pairs + b / 2) * PAIR + (b % 2) * half_offset;
                let to = ((tile * a.blocks + b) * ROWS + t) * BLOCK;
                let to = &mut panel.q[to..to + BLOCK];
                if a.bits == 4 {
                    to[..BLOCK / 2].copy_from_slice(&a.q[from..from + BLOCK / 2]);
                    to[BLOCK / 2..].copy_from_slice(&a.q[from + BLOCK..from + BLOCK + BLOCK / 2]);
                } else {
                    to.copy_from_slice(&a.q[from..from + BLOCK]);
                }
                panel.d[(tile * a.blocks + b) * ROWS + t] = a.d[(i * pairs + b / 2) * LANES + (b % 2) * half_lane];
            }
            for g in 0..a.groups {
                panel.group_sum[(tile * a.groups + g) * ROWS + t] = a.group_sum[i * a.groups + g];
            }
        }
        panel
    }

    /// Input rows `x` `[m, k]` (`k` a multiple of [`BLOCK`]) quantized for `bits`-bit weights in
    /// groups of [`HALF`]: each block of 32 as `q8`'s (`quantize_block`: the codes and scale
    /// llama.cpp's `ggml_vec_dot_q6_K_q8_K` multiplies by), laid out as [`Panel::new`] lays them,
    /// with one sum per half block (`d_b · Σ_{k∈g} q_k`, what a group's minimum multiplies).
    /// Each row is quantized on its own, so its codes do not depend on the rows beside it.
    pub fn halves(x: &[f32], m: usize, k: usize, bits: u32) -> Self {
        debug_assert!(k.is_multiple_of(BLOCK) && x.len() == m * k && matches!(bits, 4 | 8));
        let (tiles, blocks) = (m.div_ceil(ROWS), k / BLOCK);
        let groups = 2 * blocks;
        let mut panel = Self {
            q: vec![0; tiles * blocks * ROWS * BLOCK],
            d: vec![0.0; tiles * blocks * ROWS],
            group_sum: vec![0.0; tiles * groups * ROWS],
            m,
            blocks,
            groups,
            bits,
            split: true,
        };
        let per_tile = |tile: usize, q: &mut [i8], d: &mut [f32], sums: &mut [f32]| {
            let first = tile * ROWS;
            for (t, row) in x.chunks_exact(k.max(1)).skip(first).take(ROWS).enumerate() {
                quantize_halves(row, bits, t, q, d, sums);
            }
        };
        let tile_q = blocks * ROWS * BLOCK;
        let (q, d, sums) = (&mut panel.q, &mut panel.d, &mut panel.group_sum);
        if m > HALVES_ROWS_PER_TASK {
            use rayon::prelude::*;
            q.par_chunks_mut(tile_q.max(1))
                .zip(d.par_chunks_mut((blocks * ROWS).max(1)))
                .zip(sums.par_chunks_mut((groups * ROWS).max(1)))
                .enumerate()
                .for_each(|(tile, ((q, d), sums))| per_tile(tile, q, d, sums));
        } else {
            q.chunks_mut(tile_q.max(1))
                .zip(d.chunks_mut((blocks * ROWS).max(1)))
                .zip(sums.chunks_mut((groups * ROWS).max(1)))
                .enumerate()
                .for_each(|(tile, ((q, d), sums))| per_tile(tile, q, d, sums));
        }
        panel
    }
}

/// Row `t` of a tile of [`Panel::halves`]: `row`'s blocks quantized into the tile's codes `q`
/// (`[blocks, ROWS, 32]`), block scales `d` (`[blocks, ROWS]`) and half-block sums
/// (`[2 · blocks, ROWS]`).
fn quantize_halves(row: &[f32], bits: u32, t: usize, q: &mut [i8], d: &mut [f32], sums: &mut [f32]) {
    let mut codes = [0i8; BLOCK];
    for (b, values) in row.chunks_exact(BLOCK).enumerate() {
        let values: &[f32; BLOCK] = values.try_into().expect("whole blocks");
        let (scale, _) = super::quantize_block(values, &mut codes);
        let to = &mut q[(b * ROWS + t) * BLOCK..][..BLOCK];
        if bits == 4 {
            // Even elements meet the low nibbles, odd ones the high nibbles.
            for u in 0..BLOCK / 2 {
                (to[u], to[BLOCK / 2 + u]) = (codes[2 * u], codes[2 * u + 1]);
            }
        } else {
            to.copy_from_slice(&codes);
        }
        d[b * ROWS + t] = scale;
        for (h, half) in codes.chunks_exact(HALF).enumerate() {
            sums[(2 * b + h) * ROWS + t] = scale * half.iter().map(|&c| i32::from(c)).sum::<i32>() as f32;
        }
    }
}

/// Whether [`weight_rows`] can run with `isa` on `bits`-bit codes (4 or 8): AVX-512 VNNI or
/// AVX2.
pub fn supports(isa: Isa, bits: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(isa, Isa::Vnni | Isa::Avx2) && matches!(bits, 4 | 8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, bits);
        false
    }
}

/// Whether [`weight_rows`] can run with `isa` on `bits`-bit codes in groups of [`HALF`] (a
/// [`Panel::halves`]): AVX-512 VNNI only (elsewhere `kq`'s row kernels multiply them).
pub fn supports_halves(isa: Isa, bits: u32) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Vnni && matches!(bits, 4 | 8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, bits);
        false
    }
}

/// `(x · Wᵀ)[i, j]` for the weight rows `rows` and every input row `i`, handed a strip at a time
/// to `out(i, j0, values)` (`values[c]` is column `j0 + c`); equal to [`super::weight_rows`]
/// within `f32` rounding. Each output is `Σ_b fma(dot_g, scale[g] · d_b)` over the groups of
/// each block in order, then `Σ_g fma(min[g], sum_g)`, whatever the number of input rows.
/// Panics unless [`supports`]`(isa, w.bits)` (groups of whole blocks) or
/// [`supports_halves`]`(isa, w.bits)` (a split panel, groups of [`HALF`]).
pub fn weight_rows(w: &Weights, a: &Panel, rows: Range<usize>, isa: Isa, mut out: impl FnMut(usize, usize, &[f32])) {
    if a.split {
        assert!(supports_halves(isa, w.bits), "groups of 16 need the AVX-512 VNNI strip kernel");
        assert!(w.bits == a.bits && w.group == HALF && a.groups == 2 * a.blocks);
    } else {
        assert!(supports(isa, w.bits), "the strip kernel needs AVX-512 VNNI or AVX2, and 4- or 8-bit codes");
        assert!(w.bits == a.bits && w.group.is_multiple_of(BLOCK) && w.group / BLOCK * a.groups == a.blocks);
    }
    let words = a.blocks * BLOCK * w.bits as usize / 32;
    assert!(rows.end * words <= w.codes.len() && rows.end * a.groups <= w.scale.len().min(w.min.len()));
    let total_rows = (w.codes.len() / words.max(1)).min(w.scale.len().min(w.min.len()) / a.groups.max(1));
    #[cfg(target_arch = "x86_64")]
    STRIP_BUFFER.with_borrow_mut(|strip| {
        let mut values = [0f32; ROWS * STRIP];
        for j0 in rows.clone().step_by(STRIP) {
            let strip_rows = j0..(j0 + STRIP).min(rows.end);
            // The transposition reads 16 rows side by side, an order the hardware prefetchers do
            // not follow from memory: read the strip (contiguous) in order first.
            // A symmetric weight's minimums are not read at all (see `Strip::load`).
            let read_min = w.symmetric_offset == 0;
            x86::stream(&w.codes[strip_rows.start * words..strip_rows.end * words]);
            x86::stream(&w.scale[strip_rows.start * a.groups..strip_rows.end * a.groups]);
            if read_min {
                x86::stream(&w.min[strip_rows.start * a.groups..strip_rows.end * a.groups]);
            }
            // And ask for the next strip, which arrives while this one is multiplied: past the
            // end of `rows` too (up to the weight's last row), as a split product's thread next
            // takes the chunk that follows its own in memory.
            let next = strip_rows.end..(strip_rows.end + STRIP).min(total_rows);
            x86::prefetch(&w.codes[next.start * words..next.end * words]);
            x86::prefetch(&w.scale[next.start * a.groups..next.end * a.groups]);
            if read_min {
                x86::prefetch(&w.min[next.start * a.groups..next.end * a.groups]);
            }
            strip.load(w, words, a.groups, strip_rows.clone(), isa);
            for i0 in (0..a.m).step_by(ROWS) {
                let t = ROWS.min(a.m - i0);
                if isa == Isa::Vnni {
                    x86::tile(w.bits, t, strip, a, i0, &mut values);
                } else {
                    x86::tile_avx2(w.bits, t, strip, a, i0, &mut values);
                }
                for (r, row) in values.chunks_exact(STRIP).take(t).enumerate() {
                    out(i0 + r, j0, &row[..strip_rows.len()]);
                }
            }
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, total_rows, &mut out);
}

#[cfg(target_arch = "x86_64")]
mod x86;
