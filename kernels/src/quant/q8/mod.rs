//! Integer dot products on packed codes, the way llama.cpp's CPU backend multiplies `Q4_1`/`Q4_0`/
//! `Q8_0` weights (`ggml_vec_dot_q4_1_q8_1` in `ggml/src/ggml-cpu/arch/x86/quants.c`): each input
//! row is quantized once per matmul to signed 8-bit codes in blocks of 32 with one scale
//! `d = max|x| / 127` (at `f16` precision, as llama.cpp stores it) per block ([`QuantizedRows`],
//! `quantize_row_q8_1`), then every block of 32 unsigned weight codes is multiplied with the 32
//! activation codes in integer arithmetic: the strip kernel ([`strips`]: AVX-512 VNNI or AVX2)
//! where the CPU has it, [`weight_rows`] (plain Rust, the same float operations) elsewhere.
//!
//! For the asymmetric form `w = q·scale + min` of one group `g` of weight row `j`:
//! `Σ_{k∈g} x_k w_k ≈ scale[g] · Σ_{b∈g} d_b · Σ_{k∈b} q_k·qx_k + min[g] · Σ_{b∈g} d_b · Σ_{k∈b} qx_k`,
//! the second sum being the row's per-group sum ([`QuantizedRows`]' `group_sum`), as `q8_1` stores it.
//! Every kernel sums an output the same way whatever the number of input rows (batch invariance):
//! `fma(dot_b, scale[g] · d_b, acc)` block by block, then `fma(min[g], group_sum[g], acc)` group by
//! group, the integer dots `dot_b` being exact.
//!
//! Code order: 4-bit codes are packed eight to a little-endian `u32`, element `t` of a block in
//! nibble `t % 2` of byte `t / 2`, so a block's low nibbles are its even elements and its high
//! nibbles its odd ones. Rather than shuffle weight nibbles on every call, the activation codes
//! are stored in that order once per matmul, a pair of blocks (64 codes) at a time: the even
//! elements of both blocks, then their odd elements, matching the low then the high nibbles of
//! the pair's 32 code bytes (see `position`). 8-bit codes are in element order.
//!
//! Pure functions on slices; the Flex twin ([`super::flex`]) splits weight rows across threads.

use std::ops::Range;

pub mod strips;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Values per activation block (llama.cpp's `QK8_1`).
pub const BLOCK: usize = 32;

/// The instruction set an integer kernel runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU: the reference the SIMD kernels are tested against.
    Scalar,
    /// AVX2 + FMA: `vpmaddubsw` (u8 × i8 pairs to i16) then `vpmaddwd` (to i32).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 VNNI: `vpdpbusd` on 512-bit registers, u8 × i8 quads summed to i32.
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

impl Isa {
    /// How benchmarks name it: `"scalar"`, `"AVX2"` or `"AVX-512 VNNI"`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "AVX2",
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => "AVX-512 VNNI",
        }
    }

    /// The fastest the CPU running this has.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let cpu = crate::cpu::features();
            if cpu.avx2_fma() {
                if cpu.avx512_vnni() {
                    return Isa::Vnni;
                }
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every instruction set this CPU can run, scalar first (for tests and the strip bench).
    pub fn available() -> Vec<Self> {
        let mut all = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let best = Isa::best();
            if best != Isa::Scalar {
                all.push(Isa::Avx2);
            }
            if best == Isa::Vnni {
                all.push(Isa::Vnni);
            }
        }
        all
    }
}

/// Input rows quantized to signed 8-bit codes in blocks of [`BLOCK`] (llama.cpp's `block_q8_1`),
/// laid out a pair of blocks at a time for the kernels (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedRows {
    /// Codes, `[m, pairs · 64]`, each pair of blocks in the order of the weight codes it meets;
    /// a row with an odd number of blocks ends in a pair whose second block is zeros.
    q: Vec<i8>,
    /// Per pair of blocks, the scale `d = max|x| / 127` of the block each of the 16 `i32` lanes of
    /// a 512-bit integer dot belongs to, `[m, pairs · 16]`.
    d: Vec<f32>,
    /// Per weight group, `Σ_{b∈g} d_b · Σ_{k∈b} q_k` (what `min` multiplies), `[m, k / group]`.
    group_sum: Vec<f32>,
    m: usize,
    blocks: usize,
    groups: usize,
    bits: u32,
}

/// Activation bytes of one pair of blocks.
const PAIR: usize = 2 * BLOCK;
/// Lanes of one pair's scales ([`QuantizedRows::d`]).
const LANES: usize = 16;

impl QuantizedRows {
    /// Quantizes `x` `[m, k]` for weights of `bits`-bit codes in groups of `group` along `k`
    /// (`group` and `k` multiples of [`BLOCK`]).
    pub fn new(x: &[f32], m: usize, k: usize, group: usize, bits: u32) -> Self {
        debug_assert!(group.is_multiple_of(BLOCK) && k.is_multiple_of(group) && x.len() == m * k);
        let mut rows = Self::zeros(m, k, group, bits);
        quantize_into(&mut rows, x, k, group / BLOCK);
        rows
    }

    /// Rows of zero codes and scales, to be filled by a quantizer.
    fn zeros(m: usize, k: usize, group: usize, bits: u32) -> Self {
        let (blocks, groups) = (k / BLOCK, k / group);
        let pairs = blocks.div_ceil(2);
        Self {
            q: vec![0; m * pairs * PAIR],
            d: vec![0.0; m * pairs * LANES],
            group_sum: vec![0.0; m * groups],
            m,
            blocks,
            groups,
            bits,
        }
    }

    /// [`QuantizedRows::new`] through the portable quantizer, or (`simd`, x86-64 with AVX2) the
    /// AVX2 one, for tests that compare them.
    #[cfg(test)]
    pub fn new_with(x: &[f32], m: usize, k: usize, group: usize, bits: u32, simd: bool) -> Self {
        let mut rows = Self::zeros(m, k, group, bits);
        match simd {
            #[cfg(target_arch = "x86_64")]
            true => x86::quantize_into_simd(&mut rows, x, k, group / BLOCK),
            _ => quantize_into_portable(&mut rows, x, k, group / BLOCK),
        }
        rows
    }

    /// Input rows `[m]`, the rows of `parts` one after the other (parts quantized in parallel).
    pub fn concat(parts: Vec<QuantizedRows>) -> Self {
        let first = parts.first().map_or((0, 0, 4), |p| (p.blocks, p.groups, p.bits));
        let mut all = Self {
            q: Vec::new(),
            d: Vec::new(),
            group_sum: Vec::new(),
            m: 0,
            blocks: first.0,
            groups: first.1,
            bits: first.2,
        };
        for part in parts {
            debug_assert_eq!((part.blocks, part.groups, part.bits), first);
            all.q.extend_from_slice(&part.q);
            all.d.extend_from_slice(&part.d);
            all.group_sum.extend_from_slice(&part.group_sum);
            all.m += part.m;
        }
        all
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    fn pairs(&self) -> usize {
        self.blocks.div_ceil(2)
    }

    /// Records block `b` of row `i`'s scale `d` and code sum `sum`: in its lanes of `d` (see
    /// [`lane_block`]) and in its group's sum.
    #[inline(always)]
    fn set_block_scale(&mut self, i: usize, b: usize, per_group: usize, d: f32, sum: i32) {
        let at = (i * self.pairs() + b / 2) * LANES;
        for (l, lane_d) in self.d[at..at + LANES].iter_mut().enumerate() {
            if lane_block(l, self.bits) == b % 2 {
                *lane_d = d;
            }
        }
        self.group_sum[i * self.groups + b / per_group] += d * sum as f32;
    }

    /// Activation codes of row `i`, block `b`, in element order, and the block's scale.
    pub fn block(&self, i: usize, b: usize) -> ([i8; BLOCK], f32) {
        let q = &self.q[(i * self.pairs() + b / 2) * PAIR..][..PAIR];
        let lane = (0..LANES).find(|&l| lane_block(l, self.bits) == b % 2).unwrap_or(0);
        (std::array::from_fn(|t| q[position(b % 2, t, self.bits)]), self.d[(i * self.pairs() + b / 2) * LANES + lane])
    }
}

/// Fills `rows` (fresh from [`QuantizedRows::new`]) from `x`, block by block as
/// `quantize_row_q8_1`: with AVX2 where the CPU has it, in plain Rust otherwise (same codes and
/// scales, bit for bit).
fn quantize_into(rows: &mut QuantizedRows, x: &[f32], k: usize, per_group: usize) {
    #[cfg(target_arch = "x86_64")]
    if Isa::best() != Isa::Scalar {
        return x86::quantize_into(rows, x, k, per_group);
    }
    quantize_into_portable(rows, x, k, per_group)
}

/// [`quantize_into`] in plain Rust.
fn quantize_into_portable(rows: &mut QuantizedRows, x: &[f32], k: usize, per_group: usize) {
    let pairs = rows.pairs();
    let mut codes = [0i8; BLOCK];
    for (i, row) in x.chunks_exact(k).enumerate() {
        for (b, values) in row.chunks_exact(BLOCK).enumerate() {
            let values: &[f32; BLOCK] = values.try_into().expect("whole blocks");
            let (d, sum) = quantize_block(values, &mut codes);
            let q = &mut rows.q[(i * pairs + b / 2) * PAIR..][..PAIR];
            if rows.bits == 4 {
                // `position`: even elements meet the low nibbles, odd ones the high nibbles.
                let half = (b % 2) * (BLOCK / 2);
                for u in 0..BLOCK / 2 {
                    q[half + u] = codes[2 * u];
                    q[BLOCK + half + u] = codes[2 * u + 1];
                }
            } else {
                q[(b % 2) * BLOCK..][..BLOCK].copy_from_slice(&codes);
            }
            rows.set_block_scale(i, b, per_group, d, sum);
        }
    }
}

/// One block as `quantize_row_q8_1`: codes from the `f32` scale, rounded half to even, in
/// element order; returns the scale kept at `f16` precision (so that the codes and scales are
/// llama.cpp's) and the sum of the codes. Written lane-wise so that it vectorizes.
#[inline(always)]
pub(crate) fn quantize_block(values: &[f32; BLOCK], codes: &mut [i8; BLOCK]) -> (f32, i32) {
    let mut lanes = [0f32; 8];
    for chunk in values.chunks_exact(8) {
        for (lane, v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (c, v) in codes.iter_mut().zip(values) {
        *c = round_ties_even(v * inv) as i8;
    }
    (f16_precision(d), codes.iter().map(|&c| c as i32).sum())
}

/// `x` rounded to the nearest integer, half to even, for `|x| ≤ 2^22`: adding and subtracting
/// 1.5 · 2^23 leaves no fraction bits (`f32::round_ties_even` is a libm call without SSE4.1).
#[inline(always)]
fn round_ties_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// `x` rounded to the nearest `f16` value (half to even), for `0 ≤ x < 65504`: llama.cpp stores
/// activation scales as `f16`.
fn f16_precision(x: f32) -> f32 {
    const MIN_NORMAL: f32 = f32::from_bits(0x3880_0000); // 2^-14
    if x < MIN_NORMAL {
        // Subnormal `f16`: a fixed step of 2^-24.
        const STEP: f32 = f32::from_bits(0x3380_0000);
        return (x / STEP).round_ties_even() * STEP;
    }
    // Keep 10 of the 23 mantissa bits, rounding the 13 dropped ones half to even.
    let bits = x.to_bits();
    let rounded = bits + 0x0FFF + ((bits >> 13) & 1);
    f32::from_bits(rounded & !0x1FFF)
}

/// Where element `t` of the `half`-th block (0 or 1) of a pair sits among the pair's 64
/// activation codes for `bits`-bit weights: 8-bit, in order; 4-bit, the even elements of both
/// blocks, then their odd elements (the low nibbles of the pair's 32 code bytes, then the high).
#[inline(always)]
fn position(half: usize, t: usize, bits: u32) -> usize {
    if bits == 4 { (t % 2) * BLOCK + half * (BLOCK / 2) + t / 2 } else { half * BLOCK + t }
}

/// Which block of a pair (0 or 1) lane `l` of a 512-bit `i32` dot sums: 4-bit, lanes of four
/// alternate `[0, 1, 0, 1]` (low nibbles of both blocks, then high); 8-bit, the first eight
/// lanes are block 0.
#[inline(always)]
fn lane_block(l: usize, bits: u32) -> usize {
    if bits == 4 { (l / 4) % 2 } else { l / 8 }
}

/// A weight `[n, k]` of `bits`-bit codes grouped along `k` (the GGUF layout), borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Weights<'a> {
    /// Packed codes, `[n, k · bits / 32]` little-endian words.
    pub codes: &'a [u32],
    /// Per-group scale, `[n, k / group]`.
    pub scale: &'a [f32],
    /// Per-group minimum, `[n, k / group]`.
    pub min: &'a [f32],
    /// 4 or 8.
    pub bits: u32,
    /// Values per group, a multiple of [`BLOCK`].
    pub group: usize,
    /// When not 0, every `min[j, g]` is exactly `−symmetric_offset · scale[j, g]` (a symmetric
    /// GGUF type, `burn_llm_kernels::QuantSpec::symmetric_offset`): the strip kernel computes it
    /// from the scale it reads anyway instead of reading `min` (the same value, bit for bit).
    pub symmetric_offset: u32,
}

impl Weights<'_> {
    fn words_per_row(&self, a: &QuantizedRows) -> usize {
        a.blocks * BLOCK * self.bits as usize / 32
    }
}

/// `(x · Wᵀ)[i, j]` for the weight rows `rows` and every input row `i`, handed to `out(i, j, value)`,
/// in plain Rust: the product on CPUs without the strip kernel, and its reference in tests (bit
/// for bit: the same float operations in the same order, see the module docs).
pub fn weight_rows(w: &Weights, a: &QuantizedRows, rows: Range<usize>, mut out: impl FnMut(usize, usize, f32)) {
    assert!(w.bits == a.bits && w.group.is_multiple_of(BLOCK) && w.group / BLOCK * a.groups == a.blocks);
    assert!(rows.end * w.words_per_row(a) <= w.codes.len() && rows.end * a.groups <= w.scale.len().min(w.min.len()));
    for j in rows {
        for i in 0..a.m {
            out(i, j, output(w, a, j, i));
        }
    }
}

/// Output `[i, j]` of [`weight_rows`].
fn output(w: &Weights, a: &QuantizedRows, j: usize, i: usize) -> f32 {
    let words = w.words_per_row(a);
    let codes = &w.codes[j * words..(j + 1) * words];
    let per_group = w.group / BLOCK;
    let block_words = BLOCK * w.bits as usize / 32;
    let (scale, min) = (&w.scale[j * a.groups..(j + 1) * a.groups], &w.min[j * a.groups..(j + 1) * a.groups]);
    let mut acc = 0f32;
    for b in 0..a.blocks {
        let (q, d) = a.block(i, b);
        let dot = block_dot_scalar(&codes[b * block_words..(b + 1) * block_words], &q, w.bits);
        acc = (dot as f32).mul_add(scale[b / per_group] * d, acc);
    }
    for (m, sum) in min.iter().zip(&a.group_sum[i * a.groups..(i + 1) * a.groups]) {
        acc = m.mul_add(*sum, acc);
    }
    acc
}

/// Dot product in eight independent lanes (one AVX register), then the tail.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (ca, cb) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += ca[l] * cb[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `Σ_t code_t · q_t` over one block (`q` in element order), exactly, codes read from their words.
pub fn block_dot_scalar(words: &[u32], q: &[i8], bits: u32) -> i32 {
    let per = 32 / bits as usize;
    let mask = (1u32 << bits) - 1;
    (0..BLOCK)
        .map(|t| {
            let code = (words[t / per] >> (bits as usize * (t % per))) & mask;
            code as i32 * q[t] as i32
        })
        .sum()
}
