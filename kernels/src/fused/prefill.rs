//! Attention of prefill-sized steps on Flex: many query rows against the same keys.
//!
//! Burn's ops materialize `[b, heads, s, len]` scores three times (product, biased, softmax),
//! each a fresh multi-megabyte buffer whose pages are faulted in, and evaluate `eˣ` through libm,
//! whose slow path handles every masked score. Here each query row of each head runs scores,
//! softmax and the weighted sum of values in one pass over a thread-local row of scores, with the
//! keys of each (sequence, key/value head) transposed once per call so that SIMD lanes run over
//! keys: a block of keys accumulates in registers across the head dimension. Keys after the last
//! unmasked one of a row (the causal mask's upper triangle) are skipped: their weight is exactly 0.

use std::cell::RefCell;

use burn::tensor::Tensor;
use rayon::prelude::*;

use super::attention::{FlexAttention, weighted_softmax};
use super::flex::for_rows;

/// A bias at or below this masks its key (models add `-1e30`, some `-∞`). Such keys at the end of
/// a row get weight exactly 0 in `f32` whenever the row has an unmasked key, so they are skipped.
const MASK_LIMIT: f32 = -1.0e29;

/// Keys per register block of the score loop: 8 vectors of 8 lanes, enough independent
/// accumulators to keep both FMA units busy.
const KEY_BLOCK: usize = 64;

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
        let bias = a.bias(bi, si);
        // A row with every key masked weighs them all alike, as the plain softmax does.
        let end = bias.iter().rposition(|&x| x > MASK_LIMIT).map_or(len, |last| last + 1);
        SCORES.with_borrow_mut(|scores| {
            scores.resize(end, 0.0);
            for (head, out) in out.chunks_exact_mut(d).enumerate() {
                let kv = a.kv_head(bi, head);
                scores_of(a.query(bi, si, head), &keys_t[kv * d * len..][..d * len], len, scores);
                for (score, b) in scores.iter_mut().zip(bias) {
                    *score = *score * scale + b;
                }
                weighted_softmax(scores, &a.slots(kv, false)[..end * d], out);
            }
        });
    });
    a.output(out)
}

avx2_dispatch! {
    /// `scores[j] = query · key_j` for `j < scores.len()`, where `keys_t` holds the keys
    /// transposed (`keys_t[c · len + j]` is element `c` of key `j`); with AVX2/FMA when the CPU
    /// has them.
    fn scores_of(query: &[f32], keys_t: &[f32], len: usize, scores: &mut [f32]) => scores_of_portable
}

#[inline(always)]
fn scores_of_portable(query: &[f32], keys_t: &[f32], len: usize, scores: &mut [f32]) {
    let end = scores.len();
    let blocks = end / KEY_BLOCK * KEY_BLOCK;
    for (start, block) in scores[..blocks].chunks_exact_mut(KEY_BLOCK).enumerate() {
        let start = start * KEY_BLOCK;
        let mut acc = [0f32; KEY_BLOCK];
        for (c, &x) in query.iter().enumerate() {
            let keys: &[f32; KEY_BLOCK] = keys_t[c * len + start..][..KEY_BLOCK].try_into().expect("a whole block");
            for (a, k) in acc.iter_mut().zip(keys) {
                *a += x * k;
            }
        }
        block.copy_from_slice(&acc);
    }
    let tail = &mut scores[blocks..];
    tail.fill(0.0);
    for (c, &x) in query.iter().enumerate() {
        for (a, k) in tail.iter_mut().zip(&keys_t[c * len + blocks..c * len + end]) {
            *a += x * k;
        }
    }
}
