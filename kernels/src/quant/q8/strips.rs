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
        transpose(f32_bits_mut(&mut self.min), f32_bits(w.min), groups, rows, isa);
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
/// [`QuantizedRows`] (a copy of `m · k` bytes).
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
}

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

/// `(x · Wᵀ)[i, j]` for the weight rows `rows` and every input row `i`, handed a strip at a time
/// to `out(i, j0, values)` (`values[c]` is column `j0 + c`); equal to [`super::weight_rows`]
/// within `f32` rounding. Panics unless [`supports`]`(isa, w.bits)`.
pub fn weight_rows(w: &Weights, a: &Panel, rows: Range<usize>, isa: Isa, mut out: impl FnMut(usize, usize, &[f32])) {
    assert!(supports(isa, w.bits), "the strip kernel needs AVX-512 VNNI or AVX2, and 4- or 8-bit codes");
    assert!(w.bits == a.bits && w.group.is_multiple_of(BLOCK) && w.group / BLOCK * a.groups == a.blocks);
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
            x86::stream(&w.codes[strip_rows.start * words..strip_rows.end * words]);
            x86::stream(&w.scale[strip_rows.start * a.groups..strip_rows.end * a.groups]);
            x86::stream(&w.min[strip_rows.start * a.groups..strip_rows.end * a.groups]);
            // And ask for the next strip, which arrives while this one is multiplied: past the
            // end of `rows` too (up to the weight's last row), as a split product's thread next
            // takes the chunk that follows its own in memory.
            let next = strip_rows.end..(strip_rows.end + STRIP).min(total_rows);
            x86::prefetch(&w.codes[next.start * words..next.end * words]);
            x86::prefetch(&w.scale[next.start * a.groups..next.end * a.groups]);
            x86::prefetch(&w.min[next.start * a.groups..next.end * a.groups]);
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
mod x86 {
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
                let r: [__m256i; 8] =
                    std::array::from_fn(|i| unsafe { _mm256_loadu_si256(from.add(at(i)) as *const _) });
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
                per_group: a.blocks / a.groups.max(1),
                in_group: 0,
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
                self.scales = self.scales.wrapping_add(STRIP);
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
            ($bits:literal) => {
                // SAFETY: `supports` admitted only `Isa::Vnni`, which `Isa::best`/`available`
                // return only where AVX-512 VNNI (and with it AVX-512 BW, on every CPU that has
                // VNNI) was detected; the bounds were checked above.
                unsafe {
                    match t {
                        1 => kernel::<$bits, 1>(strip, a, tile, values),
                        2 => kernel::<$bits, 2>(strip, a, tile, values),
                        3 => kernel::<$bits, 3>(strip, a, tile, values),
                        4 => kernel::<$bits, 4>(strip, a, tile, values),
                        5 => kernel::<$bits, 5>(strip, a, tile, values),
                        6 => kernel::<$bits, 6>(strip, a, tile, values),
                        7 => kernel::<$bits, 7>(strip, a, tile, values),
                        _ => kernel::<$bits, ROWS>(strip, a, tile, values),
                    }
                }
            };
        }
        if bits == 4 { dispatch!(4) } else { dispatch!(8) }
    }

    /// The microkernel: 16 weight rows × the first `T` input rows of `tile`, the block's `i32`
    /// dots in `iacc`, the scaled sums in `acc`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    unsafe fn kernel<const BITS: u32, const T: usize>(
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
            let mut iacc = [_mm512_setzero_si512(); T];
            if BITS == 4 {
                for w in 0..4 {
                    let c = unsafe { _mm512_loadu_si512(at.words.add(w * STRIP) as *const __m512i) };
                    let (lo, hi) = (_mm512_and_si512(c, nibble), _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble));
                    for (t, iacc) in iacc.iter_mut().enumerate() {
                        let p = at.x.wrapping_add(t * BLOCK + 4 * w);
                        dot_broadcast!(*iacc, lo, p);
                        dot_broadcast!(*iacc, hi, p.wrapping_add(BLOCK / 2));
                    }
                }
            } else {
                for w in 0..8 {
                    let c = unsafe { _mm512_loadu_si512(at.words.add(w * STRIP) as *const __m512i) };
                    for (t, iacc) in iacc.iter_mut().enumerate() {
                        dot_broadcast!(*iacc, c, at.x.wrapping_add(t * BLOCK + 4 * w));
                    }
                }
            }
            let scale = unsafe { _mm512_loadu_ps(at.scales) };
            for (t, (acc, iacc)) in acc.iter_mut().zip(iacc).enumerate() {
                let sd = _mm512_mul_ps(scale, _mm512_set1_ps(unsafe { *at.d.add(t) }));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), sd, *acc);
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
    pub(super) fn tile_avx2(
        bits: u32,
        t: usize,
        strip: &Strip,
        a: &Panel,
        i0: usize,
        values: &mut [f32; ROWS * STRIP],
    ) {
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
}
