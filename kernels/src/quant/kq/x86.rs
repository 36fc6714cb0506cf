//! The x86 kernel of [`super::row_dot`]: AVX2, one block of 32 at a time.
//!
//! It reads a block's codes in the activation's order (see the module doc of [`super`]): 8-bit
//! codes as they lie; 4-bit codes split into low and high nibbles and interleaved per 8 bytes
//! (`unpacklo/hi_epi64`), which puts each group's low nibbles (its even elements) before its high
//! ones (its odd elements).

use std::arch::x86_64::*;

use super::{BLOCK, GROUP};

/// The 32 codes of block `b` as two 16-byte groups in activation order.
///
/// # Safety
/// The CPU has AVX2; `codes` holds block `b`.
#[target_feature(enable = "avx2")]
fn block_groups(bits: u32, codes: &[u32], b: usize) -> (__m128i, __m128i) {
    if bits == 8 {
        let w = &codes[b * 8..(b + 1) * 8];
        // SAFETY: `w` is 32 bytes long.
        unsafe { (_mm_loadu_si128(w.as_ptr().cast()), _mm_loadu_si128(w.as_ptr().add(4).cast())) }
    } else {
        let w = &codes[b * 4..(b + 1) * 4];
        // SAFETY: `w` is 16 bytes long.
        let v = unsafe { _mm_loadu_si128(w.as_ptr().cast()) };
        let mask = _mm_set1_epi8(0x0F);
        let (lo, hi) = (_mm_and_si128(v, mask), _mm_and_si128(_mm_srli_epi16(v, 4), mask));
        (_mm_unpacklo_epi64(lo, hi), _mm_unpackhi_epi64(lo, hi))
    }
}

/// Horizontal sum of eight `f32` lanes.
#[target_feature(enable = "avx2")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// One group of 16: unsigned codes × signed activations, widened to 16 bits, pairwise summed to
/// eight `i32` lanes, converted and accumulated into `acc` times `factor`.
#[target_feature(enable = "avx2,fma")]
fn group_fma(acc: __m256, codes: __m128i, q: &[i8], factor: f32) -> __m256 {
    // SAFETY: `q` is one group of 16 codes.
    let x = unsafe { _mm_loadu_si128(q.as_ptr().cast()) };
    let dot = _mm256_madd_epi16(_mm256_cvtepu8_epi16(codes), _mm256_cvtepi8_epi16(x));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(factor), acc)
}

/// [`super::row_dot`] with AVX2: per block, both groups' eight-lane integer dots scaled by
/// `d_b · scale[g]` into one `f32` accumulator.
///
/// # Safety
/// The CPU has AVX2 and FMA; the slices hold whole blocks as [`super::row_dot`] documents.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn row_dot_avx2(bits: u32, codes: &[u32], scale: &[f32], q: &[i8], d: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, &db) in d.iter().enumerate() {
        let (g0, g1) = block_groups(bits, codes, b);
        let qb = &q[b * BLOCK..(b + 1) * BLOCK];
        acc = group_fma(acc, g0, &qb[..GROUP], db * scale[2 * b]);
        acc = group_fma(acc, g1, &qb[GROUP..], db * scale[2 * b + 1]);
    }
    hsum256(acc)
}
