//! Integer dot products on packed codes, the way llama.cpp's CPU backend multiplies `Q4_1`/`Q4_0`/
//! `Q8_0` weights (`ggml_vec_dot_q4_1_q8_1` in `ggml/src/ggml-cpu/arch/x86/quants.c`): each input
//! row is quantized once per matmul to signed 8-bit codes in blocks of 32 with one scale
//! `d = max|x| / 127` (at `f16` precision, as llama.cpp stores it) per block ([`QuantizedRows`], `quantize_row_q8_1`), then every block of 32
//! unsigned weight codes is multiplied with the 32 activation codes in 8-bit × 8-bit integer
//! multiply-adds (AVX-512 VNNI `vpdpbusd` on 512-bit registers, two blocks at a time; AVX2
//! `vpmaddubsw` + `vpmaddwd`; or scalar), converted to `f32` once per pair of blocks and scaled
//! lane by lane by `scale[g] · d`.
//!
//! For the asymmetric form `w = q·scale + min` of one group `g` of weight row `j`:
//! `Σ_{k∈g} x_k w_k ≈ scale[g] · Σ_{b∈g} d_b · Σ_{k∈b} q_k·qx_k + min[g] · Σ_{b∈g} d_b · Σ_{k∈b} qx_k`,
//! the second sum being the row's per-group sum ([`QuantizedRows::group_sum`]), as `q8_1` stores it.
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

/// Values per activation block (llama.cpp's `QK8_1`).
pub const BLOCK: usize = 32;

/// Input rows of a tile sharing one decode of each weight block (a prefill's rows are taken four
/// at a time; decode has one).
pub const TILE: usize = 4;

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
    /// Per pair of blocks, lane by lane as `d`: `d_b · Σ_{k∈b} q_k / 8` of the block `b` the lane
    /// belongs to (eight lanes per block, so the lanes add up to the block sum that `min`
    /// multiplies), `[m, pairs · 16]`.
    sx: Vec<f32>,
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
            sx: vec![0.0; m * pairs * LANES],
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
            sx: Vec::new(),
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
            all.sx.extend_from_slice(&part.sx);
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

    /// Records block `b` of row `i`'s scale `d` and code sum `sum`: in its lanes of `d` and `sx`
    /// (see [`lane_block`]) and in its group's sum.
    #[inline(always)]
    fn set_block_scale(&mut self, i: usize, b: usize, per_group: usize, d: f32, sum: i32) {
        let at = (i * self.pairs() + b / 2) * LANES;
        let lanes = self.d[at..at + LANES].iter_mut().zip(&mut self.sx[at..at + LANES]);
        for (l, (lane_d, lane_sx)) in lanes.enumerate() {
            if lane_block(l, self.bits) == b % 2 {
                *lane_d = d;
                *lane_sx = d * sum as f32 / 8.0;
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
}

impl Weights<'_> {
    fn words_per_row(&self, a: &QuantizedRows) -> usize {
        a.blocks * BLOCK * self.bits as usize / 32
    }
}

/// `(x · Wᵀ)[i, j]` for the weight rows `rows` and every input row `i`, handed to `out(i, j, value)`.
/// Input rows are taken a tile at a time, each weight block decoded once per tile.
pub fn weight_rows(
    w: &Weights,
    a: &QuantizedRows,
    rows: Range<usize>,
    isa: Isa,
    mut out: impl FnMut(usize, usize, f32),
) {
    assert!(w.bits == a.bits && w.group.is_multiple_of(BLOCK) && w.group / BLOCK * a.groups == a.blocks);
    assert!(rows.end * w.words_per_row(a) <= w.codes.len() && rows.end * a.groups <= w.scale.len().min(w.min.len()));
    let m = a.m;
    let mut sums = [0f32; CHUNK * TILE];
    // A chunk of weight rows at a time, every tile of input rows over it while its codes are in
    // cache: the weight is read from memory once whatever `m`.
    for j0 in rows.clone().step_by(CHUNK) {
        let chunk = j0..(j0 + CHUNK).min(rows.end);
        for i0 in (0..m).step_by(TILE) {
            let t = TILE.min(m - i0);
            let sums = &mut sums[..chunk.len() * t];
            block_sums(w, a, chunk.clone(), i0, isa, sums);
            for (j, row) in chunk.clone().zip(sums.chunks_exact(t)) {
                for (r, v) in row.iter().enumerate() {
                    out(i0 + r, j, *v);
                }
            }
        }
    }
}

/// Weight rows per chunk of [`weight_rows`]: a few KB of codes, kept in cache across tiles.
const CHUNK: usize = 16;

/// `Σ_g min[j, g] · group_sum[i, g]` (the SIMD kernels add it lane by lane instead).
fn min_term(w: &Weights, a: &QuantizedRows, j: usize, i: usize) -> f32 {
    dot(&w.min[j * a.groups..(j + 1) * a.groups], &a.group_sum[i * a.groups..(i + 1) * a.groups])
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

/// `Σ_g scale[j, g] · Σ_{b∈g} d[i, b] · (q_j · qx_i)_b + min[j, g] · group_sum[i, g]` for the weight
/// rows `rows` and the input rows `i0..i0 + t`, into `out[(j − rows.start) · t + (i − i0)]`.
fn block_sums(w: &Weights, a: &QuantizedRows, rows: Range<usize>, i0: usize, isa: Isa, out: &mut [f32]) {
    match isa {
        Isa::Scalar => {
            let t = out.len() / rows.len().max(1);
            for (j, row) in rows.zip(out.chunks_exact_mut(t.max(1))) {
                row.iter_mut()
                    .enumerate()
                    .for_each(|(r, o)| *o = scalar_row(w, a, j, i0 + r) + min_term(w, a, j, i0 + r));
            }
        }
        #[cfg(target_arch = "x86_64")]
        simd => x86::block_sums(w, a, rows, i0, simd, out),
    }
}

/// The scalar reference of [`block_sums`] for one input row.
fn scalar_row(w: &Weights, a: &QuantizedRows, j: usize, i: usize) -> f32 {
    let words = w.words_per_row(a);
    let codes = &w.codes[j * words..(j + 1) * words];
    let per_group = w.group / BLOCK;
    let block_words = BLOCK * w.bits as usize / 32;
    let mut acc = 0f32;
    for b in 0..a.blocks {
        let (q, d) = a.block(i, b);
        let dot = block_dot_scalar(&codes[b * block_words..(b + 1) * block_words], &q, w.bits);
        acc += w.scale[j * a.groups + b / per_group] * d * dot as f32;
    }
    acc
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The SIMD kernels, a pair of blocks (64 codes) per step: AVX-512 VNNI in one 512-bit
    //! `vpdpbusd`, AVX2 in two 256-bit `vpmaddubsw` + `vpmaddwd`. The integer lanes are converted
    //! to `f32` once per pair and multiplied by the lanes' `scale · d` into one accumulator per
    //! input row (two, alternating pairs, so that consecutive FMAs do not wait on each other).

    use std::arch::x86_64::*;

    use super::{BLOCK, Isa, LANES, PAIR, QuantizedRows, TILE, Weights};

    #[cfg(test)]
    pub(super) use quantize_into as quantize_into_simd;

    /// Dispatches to the kernel for `isa`, `w.bits` and the tile height `out.len()`; the caller
    /// ([`super::weight_rows`]) checked the bounds.
    pub(super) fn block_sums(
        w: &Weights,
        a: &QuantizedRows,
        rows: std::ops::Range<usize>,
        i0: usize,
        isa: Isa,
        out: &mut [f32],
    ) {
        let t = out.len() / rows.len().max(1);
        assert!(i0 + t <= a.m && (1..=TILE).contains(&t) && out.len() == rows.len() * t);
        macro_rules! tiles {
            ($kernel:ident) => {
                // SAFETY: `isa` comes from `Isa::best`/`Isa::available`, which detected the
                // features the kernel is compiled for; `weight_rows` checked that the weight rows
                // `rows` and the activation rows `i0..i0 + t` are in bounds.
                unsafe {
                    match t {
                        1 => $kernel::<1>(w, a, rows, i0, out),
                        2 => $kernel::<2>(w, a, rows, i0, out),
                        3 => $kernel::<3>(w, a, rows, i0, out),
                        _ => $kernel::<TILE>(w, a, rows, i0, out),
                    }
                }
            };
        }
        match (isa, w.bits) {
            (Isa::Vnni, 4) => tiles!(vnni4),
            (Isa::Vnni, _) => tiles!(vnni8),
            (Isa::Avx2, 4) => tiles!(avx2_4),
            (_, _) => tiles!(avx2_8),
        }
    }

    /// [`super::quantize_into`] with AVX2 (the plain loops compiled for AVX2 stay scalar: a
    /// multiply, a rounding and a byte store per value).
    /// Each block: `|x|`'s maximum over four registers, the codes `round(x / d)` converted with
    /// the default rounding (half to even, as the portable path's magic-number rounding), packed
    /// to bytes, and for 4-bit weights split into even and odd elements by one byte shuffle.
    pub(super) fn quantize_into(rows: &mut QuantizedRows, x: &[f32], k: usize, per_group: usize) {
        // SAFETY: the callers checked that the CPU has AVX2 (`Isa::best`).
        unsafe { quantize_into_avx2(rows, x, k, per_group) }
    }

    #[target_feature(enable = "avx2")]
    fn quantize_into_avx2(rows: &mut QuantizedRows, x: &[f32], k: usize, per_group: usize) {
        let pairs = rows.pairs();
        // Bytes `[0, 2, …, 14, 1, 3, …, 15]` of each 128-bit lane: its even elements, then its odd.
        let parity = _mm256_setr_epi8(
            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
        );
        for (i, row) in x.chunks_exact(k).enumerate() {
            for (b, values) in row.chunks_exact(BLOCK).enumerate() {
                let (codes, d, sum) = quantize_block(values.try_into().expect("whole blocks"));
                let q = &mut rows.q[(i * pairs + b / 2) * PAIR..][..PAIR];
                if rows.bits == 4 {
                    // Even elements of the block in the low 16 bytes, odd ones in the high 16.
                    let split = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(codes, parity));
                    let half = (b % 2) * (BLOCK / 2);
                    let (even, odd) = q.split_at_mut(BLOCK);
                    // SAFETY: `half + 16 ≤ BLOCK` bytes of each half of the pair's 64 codes.
                    unsafe {
                        _mm_storeu_si128(
                            even[half..][..16].as_mut_ptr() as *mut __m128i,
                            _mm256_castsi256_si128(split),
                        );
                        _mm_storeu_si128(
                            odd[half..][..16].as_mut_ptr() as *mut __m128i,
                            _mm256_extracti128_si256(split, 1),
                        );
                    }
                } else {
                    // SAFETY: 32 bytes of the pair's 64 codes.
                    unsafe { _mm256_storeu_si256(q[(b % 2) * BLOCK..][..BLOCK].as_mut_ptr() as *mut __m256i, codes) };
                }
                rows.set_block_scale(i, b, per_group, d, sum);
            }
        }
    }

    /// One block as [`super::quantize_block`]: its codes in element order, its scale at `f16`
    /// precision and the sum of its codes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quantize_block(values: &[f32; BLOCK]) -> (__m256i, f32, i32) {
        // SAFETY: four loads of eight values from a block of 32.
        let v: [__m256; 4] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(values.as_ptr().add(8 * c)) });
        let sign = _mm256_set1_ps(-0.0);
        let abs = |x: __m256| _mm256_andnot_ps(sign, x);
        let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let c: [__m256i; 4] = std::array::from_fn(|j| _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv)));
        let total = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
        let total = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b01_00_11_10>(total));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(total, _mm_shuffle_epi32::<0b10_11_00_01>(total)));
        // Packing works per 128-bit lane: dwords of four codes come out as elements
        // [0–3, 8–11, 16–19, 24–27, 4–7, 12–15, 20–23, 28–31], put back in order.
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        let codes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        (codes, super::f16_precision(d), sum)
    }

    /// Lanes of block 1 of a pair in a 512-bit dot (see `lane_block`): 4-bit, lanes 4–7 and 12–15.
    const HIGH_LANES_4: __mmask16 = 0xF0F0;
    /// 8-bit: lanes 8–15.
    const HIGH_LANES_8: __mmask16 = 0xFF00;

    /// A pair of 4-bit blocks (32 code bytes, or 16 when `full` is false) as 64 bytes: the low
    /// nibbles of both blocks, then the high ones.
    #[inline]
    #[target_feature(enable = "avx2,avx512f")]
    unsafe fn nibbles512(p: *const u8, full: bool) -> __m512i {
        let (lo, hi) = unsafe { nibbles256(p, full) };
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
    }

    /// The low and the high nibbles of a pair of 4-bit blocks, 32 bytes each.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn nibbles256(p: *const u8, full: bool) -> (__m256i, __m256i) {
        let c = unsafe {
            if full {
                _mm256_loadu_si256(p as *const __m256i)
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(p as *const __m128i))
            }
        };
        let mask = _mm256_set1_epi8(15);
        (_mm256_and_si256(c, mask), _mm256_and_si256(_mm256_srli_epi16(c, 4), mask))
    }

    /// A pair of 8-bit blocks (64 code bytes, or 32 when `full` is false).
    #[inline]
    #[target_feature(enable = "avx2,avx512f")]
    unsafe fn bytes512(p: *const u8, full: bool) -> __m512i {
        unsafe {
            if full {
                _mm512_loadu_si512(p as *const __m512i)
            } else {
                _mm512_zextsi256_si512(_mm256_loadu_si256(p as *const __m256i))
            }
        }
    }

    /// A pair of 8-bit blocks as signed `code − 128`, one 256-bit register per block (the second
    /// zero when `full` is false; its activations are zeros too).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bytes_signed(p: *const u8, full: bool) -> (__m256i, __m256i) {
        let shift = _mm256_set1_epi8(-128);
        let first = unsafe { _mm256_xor_si256(_mm256_loadu_si256(p as *const __m256i), shift) };
        let second = if full {
            unsafe { _mm256_xor_si256(_mm256_loadu_si256(p.add(BLOCK) as *const __m256i), shift) }
        } else {
            _mm256_setzero_si256()
        };
        (first, second)
    }

    /// `Σ u·s` in eight lanes (u8 × i8 pairs to saturating i16: exact for 4-bit codes).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_avx2(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    /// `Σ c·s` for signed `c` (|c| ≤ 128, |s| ≤ 127: pairs stay within i16), as `|c| · sign(s, c)`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot_avx2_signed(c: __m256i, s: __m256i) -> __m256i {
        unsafe { dot_avx2(_mm256_sign_epi8(c, c), _mm256_sign_epi8(s, c)) }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The shared skeleton: for each pair of blocks, `$load` the weight codes once, then for each
    /// input row of the tile `$step` them into that row's accumulators; `$sum` reduces them.
    /// `$scales` builds the pair's per-lane weight scales and minimums from those of the groups of
    /// its two blocks (for a lone last block, its own twice: the missing block's lanes are zeros).
    macro_rules! kernel {
        ($(#[$doc:meta])* $name:ident, $features:literal, $zero:expr, $load:ident, $scales:ident, $step:ident, $sum:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            unsafe fn $name<const T: usize>(
                w: &Weights,
                a: &QuantizedRows,
                rows: std::ops::Range<usize>,
                i0: usize,
                out: &mut [f32],
            ) {
                let pairs = a.pairs();
                let pair_bytes = 2 * BLOCK * w.bits as usize / 8;
                let per_group = w.group / BLOCK;
                for (j, out) in rows.zip(out.chunks_exact_mut(T)) {
                let scale = &w.scale[j * a.groups..(j + 1) * a.groups];
                let min = &w.min[j * a.groups..(j + 1) * a.groups];
                // SAFETY (every pointer below): `weight_rows` checked that row `j` holds
                // `blocks` blocks of codes and rows `i0..i0 + T` hold `pairs` pairs of codes and
                // scales; a pair is read in full only when both its blocks exist.
                let codes = unsafe { (w.codes.as_ptr() as *const u8).add(j * w.words_per_row(a) * 4) };
                let (mut even, mut odd) = ([$zero; T], [$zero; T]);
                let group_of = |b: usize| if per_group == 1 { b } else { b / per_group };
                macro_rules! pair {
                    ($p:expr, $acc:ident) => {{
                        let p = $p;
                        let full = 2 * p + 1 < a.blocks;
                        let (g0, g1) = (group_of(2 * p), if full { group_of(2 * p + 1) } else { group_of(2 * p) });
                        let (sv, mv) = unsafe {
                            let (s0, m0) = (*scale.get_unchecked(g0), *min.get_unchecked(g0));
                            let (s1, m1) = (*scale.get_unchecked(g1), *min.get_unchecked(g1));
                            $scales([s0, s1], [m0, m1])
                        };
                        let u = unsafe { $load(codes.add(p * pair_bytes), full) };
                        for t in 0..T {
                            let at = ((i0 + t) * pairs + p) * LANES;
                            let (q, d, sx) = unsafe {
                                (a.q.as_ptr().add(at / LANES * PAIR), a.d.as_ptr().add(at), a.sx.as_ptr().add(at))
                            };
                            $acc[t] = unsafe { $step($acc[t], u, sv, mv, q, d, sx) };
                        }
                    }};
                }
                let mut p = 0;
                while p + 1 < pairs {
                    pair!(p, even);
                    pair!(p + 1, odd);
                    p += 2;
                }
                if p < pairs {
                    pair!(p, even);
                }
                for t in 0..T {
                    out[t] = unsafe { $sum(even[t], odd[t]) };
                }
                }
            }
        };
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes512(mask: __mmask16, v: [f32; 2]) -> __m512 {
        _mm512_mask_blend_ps(mask, _mm512_set1_ps(v[0]), _mm512_set1_ps(v[1]))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scales4_512(s: [f32; 2], m: [f32; 2]) -> (__m512, __m512) {
        unsafe { (lanes512(HIGH_LANES_4, s), lanes512(HIGH_LANES_4, m)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scales8_512(s: [f32; 2], m: [f32; 2]) -> (__m512, __m512) {
        unsafe { (lanes512(HIGH_LANES_8, s), lanes512(HIGH_LANES_8, m)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vnni")]
    unsafe fn step_vnni(
        acc: __m512,
        u: __m512i,
        sv: __m512,
        mv: __m512,
        q: *const i8,
        d: *const f32,
        sx: *const f32,
    ) -> __m512 {
        unsafe {
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(q as *const __m512i));
            let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv, _mm512_loadu_ps(d)), acc);
            _mm512_fmadd_ps(mv, _mm512_loadu_ps(sx), acc)
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sum512(a: __m512, b: __m512) -> f32 {
        _mm512_reduce_add_ps(_mm512_add_ps(a, b))
    }

    kernel!(
        /// 4-bit codes, AVX-512 VNNI.
        vnni4, "avx2,fma,avx512f,avx512vnni", _mm512_setzero_ps(), nibbles512, scales4_512, step_vnni, sum512
    );
    kernel!(
        /// 8-bit codes, AVX-512 VNNI.
        vnni8, "avx2,fma,avx512f,avx512vnni", _mm512_setzero_ps(), bytes512, scales8_512, step_vnni, sum512
    );

    /// 4-bit lanes of a 256-bit dot: `[b0 × 4, b1 × 4]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales4_256(s: [f32; 2], m: [f32; 2]) -> (__m256, __m256) {
        let lanes = |v: [f32; 2]| _mm256_blend_ps::<0b1111_0000>(_mm256_set1_ps(v[0]), _mm256_set1_ps(v[1]));
        (lanes(s), lanes(m))
    }

    /// The first eight of a pair's 16 lanes (`[b0 × 4, b1 × 4]` for 4-bit codes); `sx` adds the
    /// second eight, which repeat the pattern, so that each block's lanes still sum to its sum.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn step_avx2_4(
        acc: __m256,
        u: (__m256i, __m256i),
        sv: __m256,
        mv: __m256,
        q: *const i8,
        d: *const f32,
        sx: *const f32,
    ) -> __m256 {
        unsafe {
            let lo = dot_avx2(u.0, _mm256_loadu_si256(q as *const __m256i));
            let hi = dot_avx2(u.1, _mm256_loadu_si256(q.add(BLOCK) as *const __m256i));
            let p = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
            let acc = _mm256_fmadd_ps(p, _mm256_mul_ps(sv, _mm256_loadu_ps(d)), acc);
            _mm256_fmadd_ps(mv, _mm256_add_ps(_mm256_loadu_ps(sx), _mm256_loadu_ps(sx.add(8))), acc)
        }
    }

    /// 8-bit: the two blocks' scales, each for a whole 256-bit dot, and their minimums plus
    /// `128 · scale`, which puts back the shift of the codes to `code − 128`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales8_256(s: [f32; 2], m: [f32; 2]) -> ([__m256; 2], [__m256; 2]) {
        let shifted = |b: usize| _mm256_set1_ps(m[b] + 128.0 * s[b]);
        ([_mm256_set1_ps(s[0]), _mm256_set1_ps(s[1])], [shifted(0), shifted(1)])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn step_avx2_8(
        acc: __m256,
        c: (__m256i, __m256i),
        sv: [__m256; 2],
        mv: [__m256; 2],
        q: *const i8,
        d: *const f32,
        sx: *const f32,
    ) -> __m256 {
        unsafe {
            let first = dot_avx2_signed(c.0, _mm256_loadu_si256(q as *const __m256i));
            let second = dot_avx2_signed(c.1, _mm256_loadu_si256(q.add(BLOCK) as *const __m256i));
            let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_mul_ps(sv[0], _mm256_loadu_ps(d)), acc);
            let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_mul_ps(sv[1], _mm256_loadu_ps(d.add(8))), acc);
            let acc = _mm256_fmadd_ps(mv[0], _mm256_loadu_ps(sx), acc);
            _mm256_fmadd_ps(mv[1], _mm256_loadu_ps(sx.add(8)), acc)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sum256(a: __m256, b: __m256) -> f32 {
        unsafe { hsum256(_mm256_add_ps(a, b)) }
    }

    kernel!(
        /// 4-bit codes, AVX2.
        avx2_4, "avx2,fma", _mm256_setzero_ps(), nibbles256, scales4_256, step_avx2_4, sum256
    );
    kernel!(
        /// 8-bit codes, AVX2, shifted to `code − 128` (`scales8_256` adds `128 · scale · Σ qx` back).
        avx2_8, "avx2,fma", _mm256_setzero_ps(), bytes_signed, scales8_256, step_avx2_8, sum256
    );

    /// The integer dot of `isa` over the first pair of blocks of row 0 of `a`, summed over its
    /// lanes (the AVX2 8-bit kernel's shift added back): equal to the scalar blocks' sum.
    #[cfg(test)]
    pub(super) fn pair_dot(words: &[u32], a: &QuantizedRows, isa: Isa) -> i32 {
        assert!(words.len() * 32 == PAIR * a.bits as usize && a.q.len() >= PAIR);
        let p = words.as_ptr() as *const u8;
        let q = a.q.as_ptr();
        fn lanes<V: Copy>(v: V) -> i32 {
            let n = std::mem::size_of::<V>() / 4;
            let mut out = [0i32; 16];
            // SAFETY: `V` is a SIMD vector of at most 64 bytes, copied into 64 bytes.
            unsafe { std::ptr::copy_nonoverlapping(&v as *const V as *const i32, out.as_mut_ptr(), n) };
            out.iter().sum()
        }
        // SAFETY: the features were detected (`Isa::available`); `words` holds one pair of blocks
        // and `a.q` one pair of activation codes.
        unsafe {
            match (isa, a.bits) {
                (Isa::Vnni, bits) => {
                    let u = if bits == 4 { nibbles512(p, true) } else { bytes512(p, true) };
                    lanes(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(q as *const __m512i)))
                }
                (Isa::Avx2, 4) => {
                    let (lo, hi) = nibbles256(p, true);
                    lanes(dot_avx2(lo, _mm256_loadu_si256(q as *const __m256i)))
                        + lanes(dot_avx2(hi, _mm256_loadu_si256(q.add(BLOCK) as *const __m256i)))
                }
                (Isa::Avx2, _) => {
                    let (c0, c1) = bytes_signed(p, true);
                    let shift: i32 = a.q[..PAIR].iter().map(|&v| 128 * v as i32).sum();
                    lanes(dot_avx2_signed(c0, _mm256_loadu_si256(q as *const __m256i)))
                        + lanes(dot_avx2_signed(c1, _mm256_loadu_si256(q.add(BLOCK) as *const __m256i)))
                        + shift
                }
                (Isa::Scalar, _) => super::pair_dot(words, a, Isa::Scalar),
            }
        }
    }
}

/// The integer dot of `isa` over one pair of blocks of row 0 of `a` and `words` (the pair's
/// codes), summed over its lanes: equal to the two blocks' [`block_dot_scalar`] (for tests).
#[cfg(test)]
pub fn pair_dot(words: &[u32], a: &QuantizedRows, isa: Isa) -> i32 {
    match isa {
        Isa::Scalar => {
            let half = words.len() / 2;
            (0..2).map(|h| block_dot_scalar(&words[h * half..(h + 1) * half], &a.block(0, h).0, a.bits)).sum()
        }
        #[cfg(target_arch = "x86_64")]
        simd => x86::pair_dot(words, a, simd),
    }
}
