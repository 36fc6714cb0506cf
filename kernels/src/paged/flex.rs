//! Pure-Rust twins of [`PagedKvOps`] for Burn's Flex CPU backend. Cache writes go straight into
//! the cache's buffer (`FlexTensor::storage_mut`: copy-on-write, so a uniquely owned cache is
//! never copied); attention is parallel over (query, head) with `f32` arithmetic.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::{DType, Element, TensorData, bf16, f16};
use rayon::prelude::*;

use super::ops::PagedKvOps;
use crate::quant::flex::{decode_words, f32s, widened};

/// Float storage types of a cache, converted to `f32` for arithmetic.
trait Real: Element + Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Real for f64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
}

impl Real for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Real for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Runs `$body` with `$E` bound to the Rust type of float dtype `$dtype`. The public wrappers
/// only let the dtypes listed here through.
macro_rules! with_float {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $E = f32;
                $body
            }
            DType::F64 => {
                type $E = f64;
                $body
            }
            DType::F16 => {
                type $E = f16;
                $body
            }
            DType::BF16 => {
                type $E = bf16;
                $body
            }
            other => panic!("paged ops handle F32, F64, F16 and BF16 tensors, not {other:?}"),
        }
    };
}

/// Inputs are borrowed in place when already contiguous.
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() { t } else { t.to_contiguous() }
}

/// Index tensor values (`U32` from the wrappers; other integer dtypes are converted).
fn indices(t: FlexTensor) -> Vec<u32> {
    let t = contiguous(t);
    match t.dtype() {
        DType::U32 => t.as_slice::<u32>().map(<[u32]>::to_vec),
        DType::I32 => t.as_slice::<i32>().map(|s| s.iter().map(|&v| v as u32).collect()),
        DType::I64 => t.as_slice::<i64>().map(|s| s.iter().map(|&v| v as u32).collect()),
        DType::U64 => t.as_slice::<u64>().map(|s| s.iter().map(|&v| v as u32).collect()),
        _ => None,
    }
    .expect("paged index tensors are contiguous U32 (or I32/I64/U64) tensors")
}

/// Element range of a contiguous tensor inside its storage buffer.
fn range(t: &FlexTensor) -> std::ops::Range<usize> {
    let (start, end) = t.layout().contiguous_offsets().expect("made contiguous above");
    start..end
}

/// `cache[slot][h] = new[t][h]` for every non-skipped token.
fn scatter_tokens<E: Copy>(
    cache: &mut [E],
    new: &[E],
    slots: &[u32],
    kv_heads: usize,
    block_size: usize,
    head_dim: usize,
) {
    for (token, &slot) in slots.iter().enumerate() {
        if slot == u32::MAX {
            continue;
        }
        let (block, offset) = (slot as usize / block_size, slot as usize % block_size);
        for head in 0..kv_heads {
            let src = (token * kv_heads + head) * head_dim;
            let dst = ((block * kv_heads + head) * block_size + offset) * head_dim;
            cache[dst..dst + head_dim].copy_from_slice(&new[src..src + head_dim]);
        }
    }
}

/// Sizes of one attention call.
struct Geometry {
    heads: usize,
    kv_heads: usize,
    block_size: usize,
    head_dim: usize,
    max_blocks: usize,
    scale: f32,
}

/// Host index arrays of one attention call.
struct Tables<'a> {
    block_tables: &'a [u32],
    query_seq: &'a [u32],
    context_lens: &'a [u32],
}

/// One layer's keys (or values) read a slot row at a time: row `r` is slot
/// `(block · kv_heads + kv_head) · block_size + offset`, `head_dim` values wide.
trait KvRows: Sync {
    /// `query · row`, with `buf` (`head_dim` values) as scratch.
    fn dot(&self, query: &[f32], row: usize, buf: &mut [f32]) -> f32;
    /// `acc += p · row`, with `buf` as scratch.
    fn axpy(&self, p: f32, row: usize, acc: &mut [f32], buf: &mut [f32]);
}

/// Rows of a float cache, read in place.
struct DenseRows<'a, E> {
    data: &'a [E],
    head_dim: usize,
}

impl<E: Real> KvRows for DenseRows<'_, E> {
    #[inline(always)]
    fn dot(&self, query: &[f32], row: usize, _: &mut [f32]) -> f32 {
        dot(query, &self.data[row * self.head_dim..(row + 1) * self.head_dim])
    }

    #[inline(always)]
    fn axpy(&self, p: f32, row: usize, acc: &mut [f32], _: &mut [f32]) {
        for (a, x) in acc.iter_mut().zip(&self.data[row * self.head_dim..(row + 1) * self.head_dim]) {
            *a += p * x.to_f32();
        }
    }
}

/// Rows of a group-quantized cache, each decoded into the scratch row as the group
/// dequantization does it (`code · scale + min`, in `f32`) and then used as a float row.
struct QuantRows<'a> {
    codes: &'a [u32],
    scale: &'a [f32],
    min: &'a [f32],
    /// Code words per stored row: a slot's (grouped along the head) or a channel's.
    words: usize,
    groups: usize,
    group: usize,
    bits: u32,
    /// `Some(block_size)`: keys per channel over each block's tokens (a stored row is one
    /// channel, and slot row `r` is token `r % block_size` of channels `r / block_size · D ..`).
    channels: Option<usize>,
}

impl<'a> QuantRows<'a> {
    /// Rows of contiguous codes and `f32` scales and minimums, `(words, groups, group, bits)`
    /// per stored row, per channel over blocks of `channels` tokens if given.
    fn new(
        codes: &'a FlexTensor,
        scale: &'a FlexTensor,
        min: &'a FlexTensor,
        shape: (usize, usize, usize, u32),
        channels: Option<usize>,
    ) -> Self {
        let (words, groups, group, bits) = shape;
        let codes = codes.as_slice::<u32>().expect("codes are contiguous u32 tensors");
        Self { codes, scale: f32s(scale), min: f32s(min), words, groups, group, bits, channels }
    }

    #[inline(always)]
    fn decode(&self, row: usize, buf: &mut [f32]) {
        if let Some(block_size) = self.channels {
            // Channel `c` of this slot's block and head is stored row `first + c`.
            let (first, token) = (row / block_size * buf.len(), row % block_size);
            let per = 32 / self.bits as usize;
            let (shift, mask) = ((token % per) as u32 * self.bits, (1u32 << self.bits) - 1);
            let words = self.codes[first * self.words + token / per..].iter().step_by(self.words);
            let params = self.scale[first..first + buf.len()].iter().zip(&self.min[first..]);
            for ((value, &word), (&s, &m)) in buf.iter_mut().zip(words).zip(params) {
                *value = ((word >> shift) & mask) as f32 * s + m;
            }
            return;
        }
        decode_words(&self.codes[row * self.words..(row + 1) * self.words], self.bits, buf);
        let params = row * self.groups..(row + 1) * self.groups;
        for ((values, &s), &m) in
            buf.chunks_exact_mut(self.group).zip(&self.scale[params.clone()]).zip(&self.min[params])
        {
            values.iter_mut().for_each(|v| *v = *v * s + m);
        }
    }
}

impl KvRows for QuantRows<'_> {
    #[inline(always)]
    fn dot(&self, query: &[f32], row: usize, buf: &mut [f32]) -> f32 {
        self.decode(row, buf);
        dot(query, buf)
    }

    #[inline(always)]
    fn axpy(&self, p: f32, row: usize, acc: &mut [f32], buf: &mut [f32]) {
        self.decode(row, buf);
        for (a, x) in acc.iter_mut().zip(buf.iter()) {
            *a += p * x;
        }
    }
}

avx2_dispatch! {
    /// Output row `out` (in `f32`) of query `idx / heads`, head `idx % heads`, whose scaled query
    /// is `query`, using AVX2/FMA when the CPU has them.
    fn attend<R: KvRows>(g: &Geometry, t: &Tables, idx: usize, query: &[f32], k: &R, v: &R, out: &mut [f32]) => attend_portable
}

/// Online softmax over the context, one block at a time: the block's scores (eight-lane dot
/// products against the keys of one head), the block maximum, a rescale of the running sum and
/// accumulator by `exp(m_old − m_new)`, then `acc += p · v` for each key.
#[inline(always)]
fn attend_portable<R: KvRows>(g: &Geometry, t: &Tables, idx: usize, query: &[f32], k: &R, v: &R, out: &mut [f32]) {
    let d = g.head_dim;
    let token = idx / g.heads;
    let kv_head = idx % g.heads / (g.heads / g.kv_heads);
    let context = t.context_lens[token] as usize;
    let row = &t.block_tables[t.query_seq[token] as usize * g.max_blocks..];
    let mut acc = vec![0f32; d];
    let mut buf = vec![0f32; d];
    let mut scores = vec![0f32; g.block_size];
    let (mut running_max, mut running_sum) = (f32::NEG_INFINITY, 0f32);
    for (logical, &block) in row[..context.div_ceil(g.block_size)].iter().enumerate() {
        let n = g.block_size.min(context - logical * g.block_size);
        let first = (block as usize * g.kv_heads + kv_head) * g.block_size;
        let mut block_max = running_max;
        for (i, s) in scores[..n].iter_mut().enumerate() {
            *s = k.dot(query, first + i, &mut buf);
            block_max = block_max.max(*s);
        }
        let correction = if running_max == f32::NEG_INFINITY { 0.0 } else { (running_max - block_max).exp() };
        running_sum *= correction;
        acc.iter_mut().for_each(|a| *a *= correction);
        for (i, s) in scores[..n].iter().enumerate() {
            let p = (s - block_max).exp();
            running_sum += p;
            v.axpy(p, first + i, &mut acc, &mut buf);
        }
        running_max = block_max;
    }
    let inv = if running_sum > 0.0 { 1.0 / running_sum } else { 0.0 };
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// Attention of every (query, head) row of `q` over the rows `k` and `v`, parallel over rows,
/// as a `[tokens, heads, head_dim]` tensor of `q`'s dtype.
fn attend_all<E: Real, R: KvRows>(g: &Geometry, t: &Tables, q: &[E], k: &R, v: &R, tokens: usize) -> FlexTensor {
    let d = g.head_dim;
    let mut rows = vec![0f32; tokens * g.heads * d];
    if d > 0 && g.heads > 0 {
        // A row reads its sequence's context twice (scores, then values); a decode step's rows
        // are too little work to hand to the thread pool, a prompt's are not.
        let context: usize = t.context_lens.iter().map(|&c| c as usize).sum();
        let work_per_row = 2 * d * context / tokens.max(1);
        crate::fused::flex::for_rows(&mut rows, d, work_per_row, |idx, row| {
            let query: Vec<f32> = q[idx * d..(idx + 1) * d].iter().map(|x| x.to_f32() * g.scale).collect();
            attend(g, t, idx, &query, k, v, row);
        });
    }
    let out: Vec<E> = rows.into_iter().map(E::from_f32).collect();
    FlexTensor::from_data(TensorData::new(out, [tokens, g.heads, d]))
}

/// Dot product in eight independent lanes (one AVX register), then the tail.
#[inline(always)]
fn dot<E: Real>(a: &[f32], b: &[E]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y.to_f32()).sum();
    for (ca, cb) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += ca[l] * cb[l].to_f32();
        }
    }
    lanes.iter().sum::<f32>() + tail
}

impl PagedKvOps for Flex {
    fn reshape_and_cache(
        cache: FloatTensor<Self>,
        new: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.layout().shape().dims::<4>();
        let mut cache = contiguous(cache);
        let new = contiguous(new);
        let slots = indices(slots);
        let range = range(&cache);
        with_float!(cache.dtype(), E => {
            let new = new.as_slice::<E>().expect("new K/V has the cache's dtype");
            let data = &mut cache.storage_mut::<E>()[range];
            scatter_tokens(data, new, &slots, kv_heads, block_size, head_dim);
        });
        cache
    }

    fn copy_blocks(cache: FloatTensor<Self>, pairs: IntTensor<Self>) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.layout().shape().dims::<4>();
        let len = kv_heads * block_size * head_dim;
        let mut cache = contiguous(cache);
        let pairs = indices(pairs);
        let range = range(&cache);
        with_float!(cache.dtype(), E => {
            let data = &mut cache.storage_mut::<E>()[range];
            for pair in pairs.chunks_exact(2) {
                let (src, dst) = (pair[0] as usize, pair[1] as usize);
                data.copy_within(src * len..(src + 1) * len, dst * len);
            }
        });
        cache
    }

    fn write_blocks(cache: FloatTensor<Self>, ids: IntTensor<Self>, blocks: FloatTensor<Self>) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.layout().shape().dims::<4>();
        let len = kv_heads * block_size * head_dim;
        let mut cache = contiguous(cache);
        let blocks = contiguous(blocks);
        let ids = indices(ids);
        let range = range(&cache);
        with_float!(cache.dtype(), E => {
            let blocks = blocks.as_slice::<E>().expect("blocks have the cache's dtype");
            let data = &mut cache.storage_mut::<E>()[range];
            for (&id, block) in ids.iter().zip(blocks.chunks_exact(len.max(1))) {
                data[id as usize * len..(id as usize + 1) * len].copy_from_slice(block);
            }
        });
        cache
    }

    fn paged_attention(
        q: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        block_tables: IntTensor<Self>,
        query_seq: IntTensor<Self>,
        context_lens: IntTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let [tokens, heads, head_dim] = q.layout().shape().dims::<3>();
        let [_, kv_heads, block_size, _] = k_cache.layout().shape().dims::<4>();
        let max_blocks = block_tables.layout().shape().dims::<2>()[1];
        let (q, k_cache, v_cache) = (contiguous(q), contiguous(k_cache), contiguous(v_cache));
        let (block_tables, query_seq, context_lens) =
            (indices(block_tables), indices(query_seq), indices(context_lens));
        let geometry = Geometry { heads, kv_heads, block_size, head_dim, max_blocks, scale };
        let tables = Tables { block_tables: &block_tables, query_seq: &query_seq, context_lens: &context_lens };
        with_float!(q.dtype(), E => {
            let same = "q, K and V share one dtype";
            let (qs, ks, vs) = (q.as_slice::<E>().expect(same), k_cache.as_slice::<E>().expect(same), v_cache.as_slice::<E>().expect(same));
            let (k, v) = (DenseRows { data: ks, head_dim }, DenseRows { data: vs, head_dim });
            attend_all(&geometry, &tables, qs, &k, &v, tokens)
        })
    }

    fn paged_attention_quantized(
        q: FloatTensor<Self>,
        k_codes: IntTensor<Self>,
        k_scale: FloatTensor<Self>,
        k_min: FloatTensor<Self>,
        v_codes: IntTensor<Self>,
        v_scale: FloatTensor<Self>,
        v_min: FloatTensor<Self>,
        block_tables: IntTensor<Self>,
        query_seq: IntTensor<Self>,
        context_lens: IntTensor<Self>,
        scale: f32,
        bits: u32,
        group: usize,
        key_channels: u32,
    ) -> FloatTensor<Self> {
        let [tokens, heads, head_dim] = q.layout().shape().dims::<3>();
        let [_, kv_heads, block_size, words] = v_codes.layout().shape().dims::<4>();
        let groups = v_scale.layout().shape().dims::<4>()[3];
        let k_words = k_codes.layout().shape().dims::<4>()[3];
        let max_blocks = block_tables.layout().shape().dims::<2>()[1];
        let q = contiguous(q);
        let (k_codes, v_codes) = (contiguous(k_codes), contiguous(v_codes));
        let [k_scale, k_min, v_scale, v_min] = [k_scale, k_min, v_scale, v_min].map(widened);
        let (block_tables, query_seq, context_lens) =
            (indices(block_tables), indices(query_seq), indices(context_lens));
        let geometry = Geometry { heads, kv_heads, block_size, head_dim, max_blocks, scale };
        let tables = Tables { block_tables: &block_tables, query_seq: &query_seq, context_lens: &context_lens };
        let k = if key_channels != 0 {
            QuantRows::new(&k_codes, &k_scale, &k_min, (k_words, 1, 1, bits), Some(block_size))
        } else {
            QuantRows::new(&k_codes, &k_scale, &k_min, (words, groups, group, bits), None)
        };
        let v = QuantRows::new(&v_codes, &v_scale, &v_min, (words, groups, group, bits), None);
        let sequences = query_seq.iter().collect::<std::collections::BTreeSet<_>>().len();
        with_float!(q.dtype(), E => {
            let q = q.as_slice::<E>().expect("q is contiguous");
            if tokens > sequences {
                // A prompt or chunk: its rows would decode every key and value once per query row
                // and head, so the blocks the step reads are decoded once and attended as floats
                // (the same values, the same arithmetic, so the same bits).
                let step = DecodedBlocks::new(&geometry, &tables, &k, &v);
                let tables = Tables { block_tables: &step.tables, ..tables };
                let (k, v) = (DenseRows { data: &step.keys, head_dim }, DenseRows { data: &step.values, head_dim });
                attend_all(&geometry, &tables, q, &k, &v, tokens)
            } else {
                attend_all(&geometry, &tables, q, &k, &v, tokens)
            }
        })
    }
}

/// The blocks one step reads from a quantized cache, decoded once into float rows, and the step's
/// block tables renumbered into them (block `i` of `keys` and `values` is the `i`-th distinct
/// block the tables name within the sequences' contexts).
struct DecodedBlocks {
    tables: Vec<u32>,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl DecodedBlocks {
    fn new(g: &Geometry, t: &Tables, k: &QuantRows, v: &QuantRows) -> Self {
        let mut tables = vec![0u32; t.block_tables.len()];
        let mut order: Vec<u32> = Vec::new();
        let mut index = std::collections::HashMap::new();
        for (&seq, &context) in t.query_seq.iter().zip(t.context_lens) {
            let at = seq as usize * g.max_blocks;
            for logical in 0..(context as usize).div_ceil(g.block_size.max(1)) {
                let block = t.block_tables[at + logical];
                let next = order.len() as u32;
                tables[at + logical] = *index.entry(block).or_insert_with(|| {
                    order.push(block);
                    next
                });
            }
        }
        let block_len = g.kv_heads * g.block_size * g.head_dim;
        let decode = |rows: &QuantRows| -> Vec<f32> {
            let mut out = vec![0f32; order.len() * block_len];
            if block_len > 0 {
                out.par_chunks_mut(block_len).zip(&order).for_each(|(dense, &block)| {
                    let first = block as usize * g.kv_heads * g.block_size;
                    for (i, row) in dense.chunks_exact_mut(g.head_dim).enumerate() {
                        rows.decode(first + i, row);
                    }
                });
            }
            out
        };
        Self { keys: decode(k), values: decode(v), tables }
    }
}
