//! Attention of prefill-sized steps on Flex: many query rows against the same keys.
//!
//! Burn's ops materialize `[b, heads, s, len]` scores three times (product, biased, softmax),
//! each a fresh multi-megabyte buffer whose pages are faulted in, and evaluate `eˣ` through libm,
//! whose slow path handles every masked score. Here each query row of each head runs scores,
//! softmax and the weighted sum of values in one pass over a thread-local row of scores, with the
//! keys of each (sequence, key/value head) transposed once per call so that SIMD lanes run over
//! keys: a block of keys accumulates in registers across the head dimension. Keys before the first
//! and after the last unmasked one of a row (left padding, a sliding window's past, the causal
//! mask's upper triangle) are skipped: their weight is exactly 0 ([`visible_keys`]).

use std::cell::RefCell;

use burn::tensor::Tensor;
use rayon::prelude::*;

use super::attention::{FlexAttention, lane_sum, score, visible_keys, weighted_softmax};
use super::flex::for_rows;

/// Keys per register block of the score loop: eight lane accumulators (one per element index
/// mod 8, the order of [`score`]) of 16 keys each, two AVX registers per lane.
const KEY_BLOCK: usize = 16;

thread_local! {
    /// One row of scores per thread, reused across rows and calls.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`super::prefix_attention`] on Flex for steps of many query rows; shapes were checked by the
/// caller.
pub(super) fn tiled_prefix_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    len: usize,
    scale: f32,
) -> Tensor<4> {
    let a = FlexAttention::new(q, k, v, bias, len);
    let (s, heads, d) = (a.s, a.heads, a.d);
    let mut keys_t = vec![0f32; a.b * a.kv_heads * d * len];
    if len > 0 {
        keys_t.par_chunks_mut(d * len).enumerate().for_each(|(kv, keys_t)| {
            for (j, key) in a.slots(kv, true).chunks_exact(d).enumerate() {
                for (c, &x) in key.iter().enumerate() {
                    keys_t[c * len + j] = x;
                }
            }
        });
    }
    let mut out = vec![0f32; a.b * s * heads * d];
    let pairs = pairs_apply(d);
    for_rows(&mut out, heads * d, 2 * heads * len * d, |row, out| {
        let (bi, si) = (row / s, row % s);
        let visible = visible_keys(a.bias(bi, si));
        let bias = &a.bias(bi, si)[visible.clone()];
        SCORES.with_borrow_mut(|scores| {
            scores.resize(2 * visible.len(), 0.0);
            let (scores, second) = scores.split_at_mut(visible.len());
            let mut outs = out.chunks_exact_mut(d);
            let mut head = 0;
            while let Some(out) = outs.next() {
                let kv = a.kv_head(bi, head);
                // `keys_t[c · len + start + j]`: element `c` of visible key `j`.
                let keys = &keys_t[kv * d * len + visible.start..];
                let values = &a.slots(kv, false)[visible.start * d..visible.end * d];
                // Two query heads that share a key head: each key element loaded once for both.
                if pairs && head + 1 < heads && a.kv_head(bi, head + 1) == kv {
                    let queries = [a.query(bi, si, head), a.query(bi, si, head + 1)];
                    scores_of_pair(queries, keys, len, bias, scale, [&mut *scores, &mut *second]);
                    let next = outs.next().expect("head + 1 < heads");
                    weighted_softmax(scores, values, out);
                    weighted_softmax(second, values, next);
                    head += 2;
                } else {
                    scores_of(a.query(bi, si, head), keys, len, bias, scale, scores);
                    weighted_softmax(scores, values, out);
                    head += 1;
                }
            }
        });
    });
    a.output(out)
}

avx2_dispatch! {
    /// `scores[j] = query · key_j · scale + bias[j]` for `j < scores.len()`, where `keys_t` holds
    /// the keys transposed (`keys_t[c · len + j]` is element `c` of key `j`), with SIMD lanes over
    /// keys but each key's operations exactly those of [`score`] (the decode path's), so prefill
    /// and decode give a row the same bits; with AVX2/FMA when the CPU has them.
    fn scores_of(query: &[f32], keys_t: &[f32], len: usize, bias: &[f32], scale: f32, scores: &mut [f32]) => scores_of_portable
}

#[inline(always)]
fn scores_of_portable(query: &[f32], keys_t: &[f32], len: usize, bias: &[f32], scale: f32, scores: &mut [f32]) {
    let end = scores.len();
    let blocks = end / KEY_BLOCK * KEY_BLOCK;
    for (start, block) in scores[..blocks].chunks_exact_mut(KEY_BLOCK).enumerate() {
        let start = start * KEY_BLOCK;
        let mut acc = [[0f32; KEY_BLOCK]; 8];
        for (c, chunk) in query.chunks(8).enumerate() {
            for (l, &x) in chunk.iter().enumerate() {
                let row = (8 * c + l) * len + start;
                let keys: &[f32; KEY_BLOCK] = keys_t[row..row + KEY_BLOCK].try_into().expect("a whole block");
                for (a, k) in acc[l].iter_mut().zip(keys) {
                    *a = x.mul_add(*k, *a);
                }
            }
        }
        for (i, s) in block.iter_mut().enumerate() {
            let lanes = std::array::from_fn(|l| acc[l][i]);
            *s = lane_sum(&lanes).mul_add(scale, bias[start + i]);
        }
    }
    for (j, s) in scores.iter_mut().enumerate().skip(blocks) {
        *s = score(query, |c| keys_t[c * len + j], scale, bias[j]);
    }
}

/// Whether [`scores_of_pair`] runs its AVX-512 kernel for a head dimension of `d`.
fn pairs_apply(d: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        d.is_multiple_of(8) && crate::cpu::features().avx512_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = d;
        false
    }
}

/// [`scores_of`] for two query heads over the same keys (grouped-query attention): with
/// AVX-512, 16 keys a register and both heads' lane accumulators (16 registers) fed by one load
/// of each key element, so the keys stream from the cache once for the pair; the last keys of a
/// row (fewer than 16) through [`score`]. Each score's operations are exactly [`score`]'s.
/// Callers check [`pairs_apply`].
fn scores_of_pair(queries: [&[f32]; 2], keys_t: &[f32], len: usize, bias: &[f32], scale: f32, scores: [&mut [f32]; 2]) {
    let [first, second] = scores;
    let end = first.len().min(second.len());
    let d = queries[0].len();
    assert!(queries[1].len() == d && d.is_multiple_of(8) && bias.len() >= end);
    assert!(end == 0 || keys_t.len() >= (d - 1) * len + end);
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if pairs_apply(d) {
        done = end / KEY_BLOCK * KEY_BLOCK;
        // SAFETY: the CPU has AVX-512F and FMA (checked above); the bounds were checked above.
        unsafe { x86::scores_pair(queries, keys_t, len, bias, scale, [&mut first[..done], &mut second[..done]]) };
    }
    for j in done..end {
        first[j] = score(queries[0], |c| keys_t[c * len + j], scale, bias[j]);
        second[j] = score(queries[1], |c| keys_t[c * len + j], scale, bias[j]);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KEY_BLOCK;

    /// The scores of whole blocks of [`KEY_BLOCK`] keys (`scores[h].len()` of them) for both
    /// heads: per block, lane `l` of head `h` a register of 16 keys' chains of FMAs over elements
    /// `l, l + 8, …`, summed as [`super::lane_sum`] orders them, then `sum · scale + bias` fused.
    ///
    /// # Safety
    /// The CPU has AVX-512F and FMA; both queries have `d` (a multiple of 8) elements, `keys_t`
    /// holds element `c` of key `j` at `c · len + j` for every `j < scores[h].len()`, and `bias`
    /// that many values.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn scores_pair(
        queries: [&[f32]; 2],
        keys_t: &[f32],
        len: usize,
        bias: &[f32],
        scale: f32,
        scores: [&mut [f32]; 2],
    ) {
        let d = queries[0].len();
        let [first, second] = scores;
        let n = first.len().min(second.len());
        let scale = _mm512_set1_ps(scale);
        for start in (0..n).step_by(KEY_BLOCK) {
            let mut acc = [[_mm512_setzero_ps(); 8]; 2];
            for c8 in (0..d).step_by(8) {
                let [first_acc, second_acc] = &mut acc;
                for (l, (a, b)) in first_acc.iter_mut().zip(second_acc.iter_mut()).enumerate() {
                    let c = c8 + l;
                    // SAFETY: key elements `c · len + start..+16` and query element `c` are in
                    // bounds (the caller's contract).
                    unsafe {
                        let keys = _mm512_loadu_ps(keys_t.as_ptr().add(c * len + start));
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*queries[0].get_unchecked(c)), keys, *a);
                        *b = _mm512_fmadd_ps(_mm512_set1_ps(*queries[1].get_unchecked(c)), keys, *b);
                    }
                }
            }
            for (acc, out) in acc.iter().zip([&mut *first, &mut *second]) {
                let sum = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
                    _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])),
                );
                // SAFETY: `start + 16 ≤ n`, within `bias` and `out`.
                unsafe {
                    let bias = _mm512_loadu_ps(bias.as_ptr().add(start));
                    _mm512_storeu_ps(out.as_mut_ptr().add(start), _mm512_fmadd_ps(sum, scale, bias));
                }
            }
        }
    }
}
