//! Masked scaled-dot-product attention with grouped-query heads, over the first `len` slots of
//! preallocated key/value storage.

use std::sync::atomic::{AtomicU8, Ordering};

use burn::backend::Dispatch;
use burn::tensor::activation::softmax;
use burn::tensor::{DType, Tensor};

use super::ops::FusedOps;

/// Query rows per sequence up to which a GPU runs [`prefix_attention`] with the decode kernel
/// (one cube per query row and head): decode steps and short chunks. Longer steps (prefill) take
/// the flash-attention kernel, whose tiles reuse each key and value across many query rows
/// ([`GpuPrefill`]).
pub(super) const GPU_MAX_QUERIES: usize = 16;

/// How a GPU runs [`prefix_attention`] for steps of more than 16 query rows (prefill).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPrefill {
    /// The tiled flash-attention kernel (`fused/cube_flash.rs`), visiting only the key tiles
    /// the bias leaves visible (the default).
    #[default]
    Flash,
    /// The same kernel over every key tile: the same bits, more work (to check and time the
    /// skipping).
    FlashEveryTile,
    /// Burn's ops: matmul, cast, bias, softmax, cast, matmul ([`attention_with`]), the path
    /// before the flash kernel.
    Matmul,
}

/// The process-wide [`GpuPrefill`] as its index in declaration order.
static GPU_PREFILL: AtomicU8 = AtomicU8::new(0);

/// Chooses how every GPU runs prefill attention from now on, for the whole process, so that a
/// benchmark or a test can run the paths the flash kernel replaces on the same shapes. With
/// Burn's fusion on, a kernel reads the mode when its launch runs (at the next read-back).
pub fn set_gpu_prefill(mode: GpuPrefill) {
    GPU_PREFILL.store(mode as u8, Ordering::Relaxed);
}

/// The current [`GpuPrefill`] (see [`set_gpu_prefill`]).
pub fn gpu_prefill() -> GpuPrefill {
    match GPU_PREFILL.load(Ordering::Relaxed) {
        1 => GpuPrefill::FlashEveryTile,
        2 => GpuPrefill::Matmul,
        _ => GpuPrefill::Flash,
    }
}

/// Query rows per sequence up to which Flex runs [`prefix_attention`] as one fused loop per query
/// row and head reading keys as stored (decode steps); longer steps (prefill) first transpose the
/// keys once, which pays off over many query rows (`super::prefill`).
#[cfg(feature = "flex")]
const FUSED_MAX_QUERIES: usize = 8;

/// `softmax(q·kᵀ·scale + bias)·v` over slots `0..len` of `k` and `v`, where `q` is
/// `[b, heads, s, d]`, `k`/`v` are `[b, kv_heads, slots ≥ len, d]` (a cache's whole storage: only
/// the first `len` slots are read) and `bias` broadcasts to `[b, 1, s, len]`. The result has the
/// shape of `q`.
///
/// On Flex (`f32`), each query row of each head is one fused loop (scores, softmax, weighted sum
/// of values) reading keys and values where they are stored, with no copy of the visible slots
/// and no score matrix; steps of many rows (prefill) read the keys transposed and skip the keys a
/// causal mask hides. The result is a view of a `[b, s, heads, d]` buffer, which is the layout the
/// output projection reads. On a GPU, every step is one kernel launch reading queries, keys,
/// values and bias through their strides, with the same output layout: up to 16 query rows the
/// decode kernel, above them (prefill) the flash-attention kernel, or [`attention_with`] when
/// [`set_gpu_prefill`] asks for it. Elsewhere: [`attention_with`] over the sliced slots.
pub fn prefix_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    len: usize,
    scale: f32,
) -> Tensor<4> {
    #[cfg(feature = "flex")]
    if fused_applies(&q, &k, &v, &bias, len) {
        return flex_attention(q, k, v, bias, len, scale);
    }
    #[cfg(feature = "flex")]
    let on_host = q.device() == burn::tensor::Device::flex();
    #[cfg(not(feature = "flex"))]
    let on_host = false;
    if !on_host
        && (q.dims()[2] <= GPU_MAX_QUERIES || gpu_prefill() != GpuPrefill::Matmul)
        && shapes_fit(&q, &k, &v, &bias, len)
        && [k.device(), v.device(), bias.device()].iter().all(|d| *d == q.device())
        && k.dtype() == q.dtype()
        && v.dtype() == q.dtype()
    {
        let out = <Dispatch as FusedOps>::fused_prefix_attention(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            bias.into_dispatch(),
            len,
            scale,
        );
        return Tensor::<4>::from_dispatch(out).swap_dims(1, 2);
    }
    let [b, kv_heads, slots, d] = k.dims();
    let (k, v) = if slots == len {
        (k, v)
    } else {
        let visible = [0..b, 0..kv_heads, 0..len, 0..d];
        (k.slice(visible.clone()), v.slice(visible))
    };
    attention_with(q, k, v, bias, scale, |scores| scores)
}

/// `softmax(adjust(q·kᵀ·scale + bias))·v` where `q` is `[b, heads, s, d]`, `k`/`v` are
/// `[b, kv_heads, t, d]` and `bias` broadcasts to `[b, 1, s, t]`, in ordinary Burn ops; `adjust`
/// sees the biased scores `[b, kv_heads, group · s, t]` (keys on the last axis) before the softmax,
/// for a cache that changes which keys a query weighs (e.g. drops low scores).
///
/// Grouped-query attention folds the query heads that share a key/value head into the sequence
/// axis (`[b, kv_heads, group · s, d]`), so keys and values are never repeated in memory.
pub fn attention_with(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    scale: f32,
    adjust: impl FnOnce(Tensor<4>) -> Tensor<4>,
) -> Tensor<4> {
    let [b, heads, s, d] = q.dims();
    let [_, kv_heads, _, _] = k.dims();
    let group = heads / kv_heads;
    let q = q.reshape([b, kv_heads, group * s, d]);
    // Scores, mask and softmax in `f32` (a no-op for `f32` models): half precision would round
    // the scores and overflow the mask; the products with `q`, `k` and `v` stay in their dtype.
    let dtype = v.dtype();
    let scores = q.matmul(k.swap_dims(2, 3)).cast(DType::F32) * scale;
    let bias = if group > 1 { bias.repeat_dim(2, group) } else { bias };
    let probs = softmax(adjust(scores + bias.cast(DType::F32)), 3).cast(dtype);
    probs.matmul(v).reshape([b, heads, s, d])
}

/// Whether the fused Flex loops serve this call: `f32` on Flex and shapes that agree (anything
/// else takes the Burn-ops path, which reports shape errors as Burn does).
#[cfg(feature = "flex")]
fn fused_applies(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, bias: &Tensor<4>, len: usize) -> bool {
    use super::flex::on_flex;
    on_flex(q) && on_flex(k) && on_flex(v) && on_flex(bias) && shapes_fit(q, k, v, bias, len)
}

/// Whether the shapes are those of a fused attention call: queries `[b, heads, s, d]`, keys and
/// values `[b, kv_heads, slots ≥ len, d]` with `kv_heads` dividing `heads`, the bias
/// `[b or 1, 1, s or 1, len]`.
fn shapes_fit(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, bias: &Tensor<4>, len: usize) -> bool {
    let ([b, heads, s, d], [kb, kv_heads, slots, kd], [bb, bh, bs, bt]) = (q.dims(), k.dims(), bias.dims());
    v.dims() == k.dims()
        && kb == b
        && kd == d
        && kv_heads > 0
        && heads % kv_heads == 0
        && len <= slots
        && (bb == b || bb == 1)
        && bh == 1
        && (bs == s || bs == 1)
        && bt == len
}

/// The inputs of a fused Flex attention call as contiguous `f32` buffers, with their shapes:
/// queries `[b, s, heads, d]` (the layout of the projection they came from, usually a view),
/// keys and values as stored `[b, kv_heads, slots, d]`, the bias `[bias_b, 1, bias_s, len]`.
#[cfg(feature = "flex")]
pub(super) struct FlexAttention {
    q: burn::backend::flex::FlexTensor,
    k: burn::backend::flex::FlexTensor,
    v: burn::backend::flex::FlexTensor,
    bias: burn::backend::flex::FlexTensor,
    pub(super) b: usize,
    pub(super) heads: usize,
    pub(super) s: usize,
    pub(super) d: usize,
    pub(super) kv_heads: usize,
    pub(super) slots: usize,
    pub(super) len: usize,
    group: usize,
    bias_b: usize,
    bias_s: usize,
}

#[cfg(feature = "flex")]
impl FlexAttention {
    /// The buffers of a call [`fused_applies`] accepted.
    pub(super) fn new(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, bias: Tensor<4>, len: usize) -> Self {
        use super::flex::into_flex;
        let [b, heads, s, d] = q.dims();
        let [_, kv_heads, slots, _] = k.dims();
        let [bias_b, _, bias_s, _] = bias.dims();
        Self {
            q: into_flex(q.swap_dims(1, 2)),
            k: into_flex(k),
            v: into_flex(v),
            bias: into_flex(bias),
            b,
            heads,
            s,
            d,
            kv_heads,
            slots,
            len,
            group: heads / kv_heads,
            bias_b,
            bias_s,
        }
    }

    /// Query `head` of position `si` of sequence `bi`.
    pub(super) fn query(&self, bi: usize, si: usize, head: usize) -> &[f32] {
        let row = (bi * self.s + si) * self.heads + head;
        &super::flex::slice(&self.q)[row * self.d..(row + 1) * self.d]
    }

    /// Index of the key/value head that query head `head` of sequence `bi` reads, counted over
    /// all sequences.
    pub(super) fn kv_head(&self, bi: usize, head: usize) -> usize {
        bi * self.kv_heads + head / self.group
    }

    /// The first `len` keys (`keys`) or values of key/value head `kv` ([`Self::kv_head`]).
    pub(super) fn slots(&self, kv: usize, keys: bool) -> &[f32] {
        let all = super::flex::slice(if keys { &self.k } else { &self.v });
        &all[kv * self.slots * self.d..][..self.len * self.d]
    }

    /// The bias of position `si` of sequence `bi` over the `len` keys.
    pub(super) fn bias(&self, bi: usize, si: usize) -> &[f32] {
        let row = (if self.bias_b == 1 { 0 } else { bi }) * self.bias_s + if self.bias_s == 1 { 0 } else { si };
        &super::flex::slice(&self.bias)[row * self.len..(row + 1) * self.len]
    }

    /// `out` (`[b, s, heads, d]`) as the `[b, heads, s, d]` result.
    pub(super) fn output(&self, out: Vec<f32>) -> Tensor<4> {
        super::flex::from_vec(out, [self.b, self.s, self.heads, self.d]).swap_dims(1, 2)
    }
}

/// [`prefix_attention`] on Flex in `f32` (shapes checked by the caller): the fused loop per query
/// row for decode steps, the tiled loop over transposed keys for longer ones. Also what the
/// GPU op's Flex twin runs (a remote worker's Flex device), so both give the same bits.
#[cfg(feature = "flex")]
pub(super) fn flex_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    len: usize,
    scale: f32,
) -> Tensor<4> {
    if q.dims()[2] <= FUSED_MAX_QUERIES {
        flex_prefix_attention(q, k, v, bias, len, scale)
    } else {
        super::prefill::tiled_prefix_attention(q, k, v, bias, len, scale)
    }
}

#[cfg(feature = "flex")]
pub(super) fn flex_prefix_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    len: usize,
    scale: f32,
) -> Tensor<4> {
    let a = FlexAttention::new(q, k, v, bias, len);
    let (s, heads, d) = (a.s, a.heads, a.d);
    let mut out = vec![0f32; a.b * s * heads * d];
    super::flex::for_rows(&mut out, d, 2 * len * d, |row, o| {
        let (bi, si, head) = (row / (s * heads), (row / heads) % s, row % heads);
        let kv = a.kv_head(bi, head);
        attend_row(a.query(bi, si, head), a.slots(kv, true), a.slots(kv, false), a.bias(bi, si), scale, o);
    });
    a.output(out)
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// One query row of one head: scores against every key, softmax, weighted sum of the values
    /// into `out`; with AVX2/FMA when the CPU has them.
    fn attend_row(q: &[f32], keys: &[f32], values: &[f32], bias: &[f32], scale: f32, out: &mut [f32]) => attend_row_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn attend_row_portable(q: &[f32], keys: &[f32], values: &[f32], bias: &[f32], scale: f32, out: &mut [f32]) {
    let d = q.len().max(1);
    let visible = visible_keys(&bias[..bias.len().min(keys.len() / d)]);
    let slots = visible.start * d..visible.end * d;
    let mut scores = vec![0f32; visible.len()];
    key_scores(q, &keys[slots.clone()], &bias[visible], scale, &mut scores);
    weighted_softmax_portable(&mut scores, &values[slots], out);
}

/// A bias at or below this masks its key (models add `-1e30`, some `-∞`). Such a key gets weight
/// exactly 0 in `f32` whenever its row has an unmasked key.
#[cfg(any(feature = "flex", feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
pub(super) const MASK_LIMIT: f32 = -1.0e29;

/// The keys a row's `bias` leaves visible: from its first unmasked key to its last, or every key
/// when all are masked (a padding row, which then weighs them all alike as the plain softmax
/// does). The masked keys outside the range weigh exactly 0, so skipping them changes nothing but
/// the arithmetic's alignment: starting at the first visible key makes a row's sums (which keys
/// share a group of four, a SIMD pass) the same whatever number of masked slots precede it, such
/// as a static batch's left padding, so a sequence gets the same bits in any batch.
#[cfg(feature = "flex")]
pub(super) fn visible_keys(bias: &[f32]) -> std::ops::Range<usize> {
    let unmasked = |x: &f32| *x > MASK_LIMIT;
    match (bias.iter().position(unmasked), bias.iter().rposition(unmasked)) {
        (Some(first), Some(last)) => first..last + 1,
        _ => 0..bias.len(),
    }
}

/// `scores[j] = q · key_j · scale + bias[j]`, in the one order of operations every Flex attention
/// path uses ([`score`]), so that a query row gets the same bits whichever path serves it: a
/// decode step, a prefill ([`super::prefill`]), a prompt chunk, alone or in any batch. With
/// AVX2/FMA and a head dimension that is a multiple of 8, four keys at a time
/// ([`x86::key_scores`]): each 8-wide slice of `q` loaded once for four keys, four independent FMA
/// chains, one horizontal reduction for the four. Plain loops, not `map(…).collect()`: the
/// collecting fold is a function of its own, not inlined into the AVX2 twin, which then ran on
/// baseline SSE.
#[cfg(feature = "flex")]
#[inline(always)]
fn key_scores(q: &[f32], keys: &[f32], bias: &[f32], scale: f32, scores: &mut [f32]) {
    let d = q.len().max(1);
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8) && crate::cpu::features().avx2_fma() {
        // SAFETY: the features were just detected; `d` is a multiple of 8.
        done = unsafe { x86::key_scores(q, keys, bias, scale, scores) };
    }
    let keys = keys.get(done * d..).unwrap_or_default();
    for ((s, key), b) in scores.iter_mut().skip(done).zip(keys.chunks_exact(d)).zip(bias.iter().skip(done)) {
        *s = score(q, |c| key[c], scale, *b);
    }
}

/// One key's score `q · key · scale + bias` in the order of operations all Flex attention paths
/// share: eight lane accumulators, lane `l` a chain of fused multiply-adds over elements
/// `l, l + 8, …` in order, summed by [`lane_sum`], then `sum · scale + bias` fused (what the AVX2
/// kernels do with one register of lanes and `hadd`).
#[cfg(feature = "flex")]
#[inline(always)]
pub(super) fn score(q: &[f32], key: impl Fn(usize) -> f32, scale: f32, bias: f32) -> f32 {
    let mut lanes = [0f32; 8];
    for (c, chunk) in q.chunks(8).enumerate() {
        for (l, &x) in chunk.iter().enumerate() {
            lanes[l] = x.mul_add(key(8 * c + l), lanes[l]);
        }
    }
    lane_sum(&lanes).mul_add(scale, bias)
}

/// `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`: the order in which two `hadd`s and the
/// halves' sum reduce one register of lanes.
#[cfg(feature = "flex")]
#[inline(always)]
pub(super) fn lane_sum(l: &[f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

#[cfg(all(feature = "flex", target_arch = "x86_64"))]
mod x86 {
    use std::arch::x86_64::*;

    use crate::fused::gemm::nt::sum4;

    /// `out[c] += ((p0·v0[c] + p1·v1[c]) + p2·v2[c]) + p3·v3[c]` for each quad of weights `p` and
    /// their value rows, quad after quad in order: the operations of
    /// [`super::weighted_softmax`]'s loop (no fused multiply-add), on 512-bit registers, each
    /// 64-element slice of `out` kept in registers across all the quads.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `out.len()` is a multiple of 16, `p.len()` a multiple of 4 and
    /// `values` holds `p.len()` rows of `out.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weighted_quads(p: &[f32], values: &[f32], out: &mut [f32]) {
        let d = out.len();
        assert!(d.is_multiple_of(16) && p.len().is_multiple_of(4) && values.len() >= p.len() * d);
        let mut c = 0;
        // Four registers of `out` at a time (independent chains of additions), then one.
        while c + 64 <= d {
            // SAFETY: the contract above; `c + 64 ≤ d`.
            unsafe { weighted_slice::<4>(p, values, out, c) };
            c += 64;
        }
        while c < d {
            // SAFETY: as above; `c + 16 ≤ d`.
            unsafe { weighted_slice::<1>(p, values, out, c) };
            c += 16;
        }
    }

    /// [`weighted_quads`] on `out[c..c + 16 · W]`.
    ///
    /// # Safety
    /// As [`weighted_quads`], and `c + 16 · W ≤ out.len()`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_slice<const W: usize>(p: &[f32], values: &[f32], out: &mut [f32], c: usize) {
        let d = out.len();
        // SAFETY (every access): elements `c..c + 16 · W` of `out` and of each value row are in
        // bounds (the contract above).
        unsafe {
            let mut o: [__m512; W] = std::array::from_fn(|r| _mm512_loadu_ps(out.as_ptr().add(c + 16 * r)));
            for (q, w) in p.chunks_exact(4).enumerate() {
                let v = values.as_ptr().add(4 * q * d + c);
                let w = [_mm512_set1_ps(w[0]), _mm512_set1_ps(w[1]), _mm512_set1_ps(w[2]), _mm512_set1_ps(w[3])];
                for (r, o) in o.iter_mut().enumerate() {
                    let at = |k: usize| _mm512_loadu_ps(v.add(k * d + 16 * r));
                    let t = _mm512_add_ps(_mm512_mul_ps(w[0], at(0)), _mm512_mul_ps(w[1], at(1)));
                    let t = _mm512_add_ps(_mm512_add_ps(t, _mm512_mul_ps(w[2], at(2))), _mm512_mul_ps(w[3], at(3)));
                    *o = _mm512_add_ps(*o, t);
                }
            }
            for (r, o) in o.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(c + 16 * r), *o);
            }
        }
    }

    /// The scores of [`super::key_scores`] for every key there is (`n`: the keys, biases and
    /// scores there are), four keys at a time (a last group of fewer repeats its last key);
    /// returns how many it wrote.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and `q.len()` is a multiple of 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn key_scores(q: &[f32], keys: &[f32], bias: &[f32], scale: f32, scores: &mut [f32]) -> usize {
        let d = q.len();
        assert!(d.is_multiple_of(8) && d > 0);
        let n = scores.len().min(bias.len()).min(keys.len() / d);
        for j in (0..n).step_by(4) {
            let mut sums = [0f32; 4];
            // SAFETY (every read and write): keys `j..min(j + 4, n)` of `d` values each and `q`'s
            // `d` values are in bounds; `sums` holds four values.
            unsafe {
                let key = |r: usize| keys.as_ptr().add((j + r).min(n - 1) * d);
                let k = [key(0), key(1), key(2), key(3)];
                let mut acc = [_mm256_setzero_ps(); 4];
                for c in (0..d).step_by(8) {
                    let qc = _mm256_loadu_ps(q.as_ptr().add(c));
                    for (acc, k) in acc.iter_mut().zip(k) {
                        *acc = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k.add(c)), *acc);
                    }
                }
                _mm_storeu_ps(sums.as_mut_ptr(), sum4(&acc));
            }
            for (r, sum) in sums.iter().enumerate().take(n - j) {
                scores[j + r] = sum.mul_add(scale, bias[j + r]);
            }
        }
        n
    }
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// `out = softmax(scores) · values`, where `values` holds one row of `out.len()` per score
    /// (`scores` is overwritten by the weights); with AVX2/FMA when the CPU has them.
    pub(super) fn weighted_softmax(scores: &mut [f32], values: &[f32], out: &mut [f32]) => weighted_softmax_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn weighted_softmax_portable(scores: &mut [f32], values: &[f32], out: &mut [f32]) {
    let d = out.len();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for p in scores.iter_mut() {
        *p = super::exp::exp(*p - max);
        sum += *p;
    }
    out.fill(0.0);
    // Four values per pass over `out`: fewer loads and stores of `out` per multiply-add.
    let quads = scores.len() / 4 * 4;
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(16) && crate::cpu::features().avx512f {
        // SAFETY: the CPU has AVX-512F; `d` is a multiple of 16 and `values` holds a row of `d`
        // per score.
        unsafe { x86::weighted_quads(&scores[..quads], &values[..quads * d], out) };
        done = quads;
    }
    for (p, v) in scores[done..quads].chunks_exact(4).zip(values[done * d..].chunks_exact(4 * d)) {
        let (v0, rest) = v.split_at(d);
        let (v1, rest) = rest.split_at(d);
        let (v2, v3) = rest.split_at(d);
        for ((((o, a), b), c), e) in out.iter_mut().zip(v0).zip(v1).zip(v2).zip(v3) {
            *o += p[0] * a + p[1] * b + p[2] * c + p[3] * e;
        }
    }
    for (p, value) in scores[quads..].iter().zip(values[quads * d..].chunks_exact(d)) {
        for (o, x) in out.iter_mut().zip(value) {
            *o += p * x;
        }
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}
