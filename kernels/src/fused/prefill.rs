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
    for_rows(&mut out, heads * d, 2 * heads * len * d, |row, out| {
        let (bi, si) = (row / s, row % s);
        let visible = visible_keys(a.bias(bi, si));
        let bias = &a.bias(bi, si)[visible.clone()];
        SCORES.with_borrow_mut(|scores| {
            scores.resize(visible.len(), 0.0);
            for (head, out) in out.chunks_exact_mut(d).enumerate() {
                let kv = a.kv_head(bi, head);
                // `keys_t[c · len + start + j]`: element `c` of visible key `j`.
                scores_of(a.query(bi, si, head), &keys_t[kv * d * len + visible.start..], len, bias, scale, scores);
                weighted_softmax(scores, &a.slots(kv, false)[visible.start * d..visible.end * d], out);
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
