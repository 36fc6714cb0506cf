//! The x86 microkernels of the strip product (see the parent module): AVX-512 VNNI and AVX2.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{AVX2_ROWS, BLOCK, Panel, ROWS, STRIP, Strip};

/// `acc += vpdpbusd(codes, the four activation codes at p broadcast)`, the broadcast folded
/// into the instruction's memory operand (written out because the compiler hoists the
/// broadcasts of a whole block into registers and spills them).
macro_rules! dot_broadcast {
    ($acc:expr, $codes:expr, $p:expr) => {
        // SAFETY: `$p` points at four readable bytes (the caller's bounds).
        unsafe {
            asm!(
                "vpdpbusd {acc}, {codes}, dword ptr [{p}]{{1to16}}",
                acc = inout(zmm_reg) $acc,
                codes = in(zmm_reg) $codes,
                p = in(reg) $p,
                options(pure, readonly, nostack, preserves_flags),
            )
        }
    };
}

/// Reads one byte of each cache line of `data` in order, bringing it into the cache the way
/// the hardware prefetchers follow best.
pub(super) fn stream<T>(data: &[T]) {
    let p = data.as_ptr() as *const u8;
    let mut sum = 0u8;
    for line in (0..std::mem::size_of_val(data)).step_by(64) {
        // SAFETY: the address is inside `data`.
        sum = sum.wrapping_add(unsafe { p.add(line).read_volatile() });
    }
    std::hint::black_box(sum);
}

/// Asks for every cache line of `data` to be brought into the cache, without waiting.
pub(super) fn prefetch<T>(data: &[T]) {
    let p = data.as_ptr() as *const i8;
    for line in (0..std::mem::size_of_val(data)).step_by(64) {
        // SAFETY: the address is inside `data` (and a prefetch never faults).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(line)) };
    }
}

/// The 16 × 16 blocks of [`super::transpose`] for a full strip: `from` is 16 rows of `len`
/// words, `to` receives the first `len / 16 · 16` columns, each as 16 consecutive words.
pub(super) fn transpose16(to: &mut [u32], from: &[u32], len: usize) {
    let blocks = len / STRIP;
    assert!(from.len() >= STRIP * len && to.len() >= blocks * STRIP * STRIP);
    // SAFETY: `transpose16` is reached only through `weight_rows` with `Isa::Vnni`, detected
    // only where the CPU has AVX-512; the bounds were checked above.
    unsafe { transpose16_avx512(to.as_mut_ptr(), from.as_ptr(), len, blocks) }
}

/// The 8 × 8 blocks of [`super::transpose`] for a full strip on AVX2: `from` is 16 rows of
/// `len` words, `to` receives the first `len / 8 · 8` columns, each as 16 consecutive words
/// (the first 8 rows' block, then the last 8 rows').
pub(super) fn transpose8(to: &mut [u32], from: &[u32], len: usize) {
    let blocks = len / 8;
    assert!(from.len() >= STRIP * len && to.len() >= blocks * 8 * STRIP);
    // SAFETY: `transpose8` is reached only through `weight_rows` with `Isa::Avx2`, detected
    // only where the CPU has AVX2; the bounds were checked above.
    unsafe { transpose8_avx2(to.as_mut_ptr(), from.as_ptr(), len, blocks) }
}

/// Three rounds of 8 shuffles per 8 × 8 block: pairs of rows interleaved by 32 then 64 bits
/// (a 4 × 4 transpose inside each 128-bit lane of each group of four rows), then the 128-bit
/// lanes of the two groups exchanged.
#[target_feature(enable = "avx2")]
unsafe fn transpose8_avx2(to: *mut u32, from: *const u32, len: usize, blocks: usize) {
    for half in 0..2 {
        for block in 0..blocks {
            let at = |i: usize| half * 8 * len + i * len + block * 8;
            let r: [__m256i; 8] = std::array::from_fn(|i| unsafe { _mm256_loadu_si256(from.add(at(i)) as *const _) });
            let t: [__m256i; 8] = std::array::from_fn(|i| {
                let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
                if i % 2 == 0 { _mm256_unpacklo_epi32(a, b) } else { _mm256_unpackhi_epi32(a, b) }
            });
            // u[4g + j], 128-bit lane L: rows 4g..4g + 4 of column 4L + j.
            let u: [__m256i; 8] = std::array::from_fn(|i| {
                let (g, j) = (i / 4, i % 4);
                let (a, b) = (t[4 * g + j / 2], t[4 * g + 2 + j / 2]);
                if j % 2 == 0 { _mm256_unpacklo_epi64(a, b) } else { _mm256_unpackhi_epi64(a, b) }
            });
            for j in 0..4 {
                let columns = [
                    _mm256_permute2x128_si256::<0x20>(u[j], u[4 + j]),
                    _mm256_permute2x128_si256::<0x31>(u[j], u[4 + j]),
                ];
                for (l, column) in columns.into_iter().enumerate() {
                    let c = block * 8 + 4 * l + j;
                    unsafe { _mm256_storeu_si256(to.add(c * STRIP + half * 8) as *mut _, column) };
                }
            }
        }
    }
}

/// Four rounds of 16 shuffles per 16 × 16 block: pairs of rows interleaved by 32 then 64
/// bits (a 4 × 4 transpose inside every 128-bit lane of each group of four rows), then the
/// 4 × 4 transpose of the 128-bit lanes across the groups.
#[target_feature(enable = "avx512f")]
unsafe fn transpose16_avx512(to: *mut u32, from: *const u32, len: usize, blocks: usize) {
    for block in 0..blocks {
        let r: [__m512i; 16] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_si512(from.add(i * len + block * STRIP) as *const _) });
        let t: [__m512i; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 { _mm512_unpacklo_epi32(a, b) } else { _mm512_unpackhi_epi32(a, b) }
        });
        // u[4g + j], lane L: rows 4g..4g + 4 of column 4L + j.
        let u: [__m512i; 16] = std::array::from_fn(|i| {
            let (g, j) = (i / 4, i % 4);
            let (a, b) = (t[4 * g + j / 2], t[4 * g + 2 + j / 2]);
            if j % 2 == 0 { _mm512_unpacklo_epi64(a, b) } else { _mm512_unpackhi_epi64(a, b) }
        });
        for j in 0..4 {
            let p0 = _mm512_shuffle_i32x4::<0x44>(u[j], u[4 + j]);
            let p1 = _mm512_shuffle_i32x4::<0xEE>(u[j], u[4 + j]);
            let p2 = _mm512_shuffle_i32x4::<0x44>(u[8 + j], u[12 + j]);
            let p3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + j], u[12 + j]);
            let columns = [
                _mm512_shuffle_i32x4::<0x88>(p0, p2),
                _mm512_shuffle_i32x4::<0xDD>(p0, p2),
                _mm512_shuffle_i32x4::<0x88>(p1, p3),
                _mm512_shuffle_i32x4::<0xDD>(p1, p3),
            ];
            for (l, column) in columns.into_iter().enumerate() {
                let c = block * STRIP + 4 * l + j;
                unsafe { _mm512_storeu_si512(to.add(c * STRIP) as *mut _, column) };
            }
        }
    }
}

/// Where a microkernel reads, block by block: its first input row's activation codes and
/// block scales in the panel's tile, and the strip's code words and weight scales from its
/// first column (the scales move on once per group). Pointers only move here
/// (`wrapping_add`); the kernels' callers checked the bounds of every read through them.
struct Cursor {
    x: *const i8,
    d: *const f32,
    words: *const u32,
    scales: *const f32,
    block_words: usize,
    per_group: usize,
    in_group: usize,
    /// 2 for a split panel (groups of half a block), else 1.
    groups_per_block: usize,
}

impl Cursor {
    /// At block 0 of input row `row` of `tile` and strip column `column`, for `bits`-bit codes.
    #[inline(always)]
    fn new(strip: &Strip, a: &Panel, tile: usize, row: usize, column: usize, bits: u32) -> Self {
        Self {
            x: a.q.as_ptr().wrapping_add((tile * a.blocks * ROWS + row) * BLOCK),
            d: a.d.as_ptr().wrapping_add(tile * a.blocks * ROWS + row),
            words: strip.codes.as_ptr().wrapping_add(column),
            scales: strip.scale.as_ptr().wrapping_add(column),
            block_words: BLOCK * bits as usize / 32,
            // A split panel's groups are half blocks: the scales move on by two groups a block.
            per_group: if a.split { 1 } else { a.blocks / a.groups.max(1) },
            in_group: 0,
            groups_per_block: if a.split { 2 } else { 1 },
        }
    }

    /// On to the next block.
    #[inline(always)]
    fn next_block(&mut self) {
        self.x = self.x.wrapping_add(ROWS * BLOCK);
        self.d = self.d.wrapping_add(ROWS);
        self.words = self.words.wrapping_add(self.block_words * STRIP);
        self.in_group += 1;
        if self.in_group == self.per_group {
            self.in_group = 0;
            self.scales = self.scales.wrapping_add(self.groups_per_block * STRIP);
        }
    }
}

/// Runs the microkernel for `bits`-bit codes on the input rows `i0..i0 + t` (`i0` a multiple
/// of [`ROWS`], `t ≤ ROWS`), `values[r · 16 + c]` receiving row `i0 + r`, strip column `c`.
pub(super) fn tile(bits: u32, t: usize, strip: &Strip, a: &Panel, i0: usize, values: &mut [f32; ROWS * STRIP]) {
    assert!(i0.is_multiple_of(ROWS) && i0 + t <= a.m && (1..=ROWS).contains(&t));
    assert!(strip.codes.len() >= a.blocks * BLOCK * bits as usize / 32 * STRIP);
    assert!(strip.scale.len() >= a.groups * STRIP && strip.min.len() >= a.groups * STRIP);
    let tile = i0 / ROWS;
    macro_rules! dispatch {
        ($bits:literal, $split:literal) => {
            // SAFETY: `supports` admitted only `Isa::Vnni`, which `Isa::best`/`available`
            // return only where AVX-512 VNNI (and with it AVX-512 BW, on every CPU that has
            // VNNI) was detected; the bounds were checked above.
            unsafe {
                match t {
                    1 => kernel::<$bits, $split, 1>(strip, a, tile, values),
                    2 => kernel::<$bits, $split, 2>(strip, a, tile, values),
                    3 => kernel::<$bits, $split, 3>(strip, a, tile, values),
                    4 => kernel::<$bits, $split, 4>(strip, a, tile, values),
                    5 => kernel::<$bits, $split, 5>(strip, a, tile, values),
                    6 => kernel::<$bits, $split, 6>(strip, a, tile, values),
                    7 => kernel::<$bits, $split, 7>(strip, a, tile, values),
                    _ => kernel::<$bits, $split, ROWS>(strip, a, tile, values),
                }
            }
        };
    }
    match (bits == 4, a.split) {
        (true, false) => dispatch!(4, false),
        (false, false) => dispatch!(8, false),
        (true, true) => dispatch!(4, true),
        (false, true) => dispatch!(8, true),
    }
}

/// The microkernel: 16 weight rows × the first `T` input rows of `tile`, the block's `i32`
/// dots in `iacc` (`SPLIT`, groups of half a block: the first half's in `iacc`, the second's in
/// `iacc2`, each scaled by its own group's scale), the scaled sums in `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn kernel<const BITS: u32, const SPLIT: bool, const T: usize>(
    strip: &Strip,
    a: &Panel,
    tile: usize,
    values: &mut [f32; ROWS * STRIP],
) {
    // SAFETY (every read below): `tile` checked that the strip holds `blocks` blocks and
    // `groups` groups and that the panel holds tile `tile`.
    let mut at = Cursor::new(strip, a, tile, 0, 0, BITS);
    let nibble = _mm512_set1_epi8(15);
    let mut acc = [_mm512_setzero_ps(); T];
    for _ in 0..a.blocks {
        let (mut iacc, mut iacc2) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
        if BITS == 4 {
            for w in 0..4 {
                let c = unsafe { _mm512_loadu_si512(at.words.add(w * STRIP) as *const __m512i) };
                let (lo, hi) = (_mm512_and_si512(c, nibble), _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble));
                // Words 0 and 1 hold elements 0..16 of the block, the first half's group.
                let sums = if SPLIT && w >= 2 { &mut iacc2 } else { &mut iacc };
                for (t, iacc) in sums.iter_mut().enumerate() {
                    let p = at.x.wrapping_add(t * BLOCK + 4 * w);
                    dot_broadcast!(*iacc, lo, p);
                    dot_broadcast!(*iacc, hi, p.wrapping_add(BLOCK / 2));
                }
            }
        } else {
            for w in 0..8 {
                let c = unsafe { _mm512_loadu_si512(at.words.add(w * STRIP) as *const __m512i) };
                let sums = if SPLIT && w >= 4 { &mut iacc2 } else { &mut iacc };
                for (t, iacc) in sums.iter_mut().enumerate() {
                    dot_broadcast!(*iacc, c, at.x.wrapping_add(t * BLOCK + 4 * w));
                }
            }
        }
        let scale = unsafe { _mm512_loadu_ps(at.scales) };
        for (t, (acc, iacc)) in acc.iter_mut().zip(iacc).enumerate() {
            let sd = _mm512_mul_ps(scale, _mm512_set1_ps(unsafe { *at.d.add(t) }));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), sd, *acc);
        }
        if SPLIT {
            let scale2 = unsafe { _mm512_loadu_ps(at.scales.add(STRIP)) };
            for (t, (acc, iacc)) in acc.iter_mut().zip(iacc2).enumerate() {
                let sd = _mm512_mul_ps(scale2, _mm512_set1_ps(unsafe { *at.d.add(t) }));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), sd, *acc);
            }
        }
        at.next_block();
    }
    let sums = unsafe { a.group_sum.as_ptr().add(tile * a.groups * ROWS) };
    for g in 0..a.groups {
        let min = unsafe { _mm512_loadu_ps(strip.min.as_ptr().add(g * STRIP)) };
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = _mm512_fmadd_ps(min, _mm512_set1_ps(unsafe { *sums.add(g * ROWS + t) }), *acc);
        }
    }
    for (row, acc) in values.chunks_exact_mut(STRIP).zip(acc) {
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), acc) };
    }
}

/// [`tile`] on AVX2: each half of the strip (8 weight rows), the tile's input rows
/// [`AVX2_ROWS`] at a time.
pub(super) fn tile_avx2(bits: u32, t: usize, strip: &Strip, a: &Panel, i0: usize, values: &mut [f32; ROWS * STRIP]) {
    assert!(i0.is_multiple_of(ROWS) && i0 + t <= a.m && (1..=ROWS).contains(&t) && a.bits == bits);
    assert!(strip.codes.len() >= a.blocks * BLOCK * bits as usize / 32 * STRIP);
    assert!(strip.scale.len() >= a.groups * STRIP && strip.min.len() >= a.groups * STRIP);
    let tile = i0 / ROWS;
    macro_rules! dispatch {
        ($bits:literal, $r0:expr, $half:expr) => {
            // SAFETY: `supports` admitted `Isa::Avx2`, which `Isa::best`/`available` return
            // only where AVX2 and FMA were detected; the bounds were checked above.
            unsafe {
                match t - $r0 {
                    1 => kernel_avx2::<$bits, 1>(strip, a, tile, $r0, $half, values),
                    2 => kernel_avx2::<$bits, 2>(strip, a, tile, $r0, $half, values),
                    3 => kernel_avx2::<$bits, 3>(strip, a, tile, $r0, $half, values),
                    _ => kernel_avx2::<$bits, AVX2_ROWS>(strip, a, tile, $r0, $half, values),
                }
            }
        };
    }
    for half in 0..2 {
        for r0 in (0..t).step_by(AVX2_ROWS) {
            if bits == 4 { dispatch!(4, r0, half) } else { dispatch!(8, r0, half) }
        }
    }
}

/// The AVX2 microkernel: weight rows `8·half..8·half + 8` of the strip × input rows
/// `r0..r0 + T` of `tile`, a block's products summed as `i16` (see the module docs).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2<const BITS: u32, const T: usize>(
    strip: &Strip,
    a: &Panel,
    tile: usize,
    r0: usize,
    half: usize,
    values: &mut [f32; ROWS * STRIP],
) {
    const HALF: usize = STRIP / 2;
    let block_words = BLOCK * BITS as usize / 32;
    // SAFETY (every read below): `tile_avx2` checked that the strip holds `blocks` blocks
    // and `groups` groups and that the panel holds rows `r0..r0 + T` of tile `tile`; each
    // half strip is 8 of the 16 words of a strip row.
    let mut at = Cursor::new(strip, a, tile, r0, half * HALF, BITS);
    let nibble = _mm256_set1_epi8(15);
    let (ones, sixteens) = (_mm256_set1_epi16(1), _mm256_set1_epi16(16));
    let mut acc = [_mm256_setzero_ps(); T];
    for _ in 0..a.blocks {
        // 4-bit: the block's products; 8-bit: those of the low nibbles, and of the high ones.
        let (mut sums, mut high) = ([_mm256_setzero_si256(); T], [_mm256_setzero_si256(); T]);
        for w in 0..block_words {
            let c = unsafe { _mm256_loadu_si256(at.words.add(w * STRIP) as *const __m256i) };
            let (lo, hi) = (_mm256_and_si256(c, nibble), _mm256_and_si256(_mm256_srli_epi16(c, 4), nibble));
            for t in 0..T {
                let p = at.x.wrapping_add(t * BLOCK + 4 * w);
                let broadcast = |p: *const i8| unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) };
                if BITS == 4 {
                    // Low nibbles are the even elements, high nibbles the odd ones.
                    let (even, odd) = (broadcast(p), broadcast(p.wrapping_add(BLOCK / 2)));
                    let products = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd));
                    sums[t] = _mm256_add_epi16(sums[t], products);
                } else {
                    let x = broadcast(p);
                    sums[t] = _mm256_add_epi16(sums[t], _mm256_maddubs_epi16(lo, x));
                    high[t] = _mm256_add_epi16(high[t], _mm256_maddubs_epi16(hi, x));
                }
            }
        }
        let scale = unsafe { _mm256_loadu_ps(at.scales) };
        for t in 0..T {
            let sd = _mm256_mul_ps(scale, _mm256_set1_ps(unsafe { *at.d.add(t) }));
            let mut dot = _mm256_madd_epi16(sums[t], ones);
            if BITS == 8 {
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(high[t], sixteens));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[t]);
        }
        at.next_block();
    }
    let group_sums = unsafe { a.group_sum.as_ptr().add(tile * a.groups * ROWS + r0) };
    for g in 0..a.groups {
        let min = unsafe { _mm256_loadu_ps(strip.min.as_ptr().add(g * STRIP + half * HALF)) };
        for (t, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(min, _mm256_set1_ps(unsafe { *group_sums.add(g * ROWS + t) }), *acc);
        }
    }
    for (t, acc) in acc.into_iter().enumerate() {
        unsafe { _mm256_storeu_ps(values.as_mut_ptr().add((r0 + t) * STRIP + half * HALF), acc) };
    }
}
