//! The AVX2 activation quantizer of [`super::QuantizedRows`], bit for bit the portable one.

use std::arch::x86_64::*;

use super::{BLOCK, PAIR, QuantizedRows};

#[cfg(test)]
pub(super) use quantize_into as quantize_into_simd;

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
                    _mm_storeu_si128(even[half..][..16].as_mut_ptr() as *mut __m128i, _mm256_castsi256_si128(split));
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
