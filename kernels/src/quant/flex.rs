//! Pure-Rust twins of [`GroupQuantOps`] for Burn's Flex CPU backend, parallel over rows.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use super::ops::GroupQuantOps;
use super::{kq, q8, split};

/// Sizes of one fused-matmul call.
struct BlockShape {
    m: usize,
    k_len: usize,
    groups: usize,
    group: usize,
    words: usize,
    per: usize,
    bits: u32,
}

avx2_dispatch! {
    /// Output columns of group `g` for every row, using AVX2/FMA when the CPU has them.
    fn group_block(shape: &BlockShape, g: usize, x: &[f32], codes: &[u32], scale: &[f32], min: &[f32]) -> Vec<f32> => group_block_portable
}

/// `Σ_k (x[i,k]·scale[k,g])·q[k, cols of g] + Σ_k x[i,k]·min[k,g]`: the codes of each `k` are
/// decoded once (fixed-width shift-and-mask, which vectorizes) and reused for every row.
#[inline(always)]
fn group_block_portable(
    shape: &BlockShape,
    g: usize,
    x: &[f32],
    codes: &[u32],
    scale: &[f32],
    min: &[f32],
) -> Vec<f32> {
    let BlockShape { m, k_len, groups, group, words, per, bits } = *shape;
    let words_per_group = group / per;
    let mut acc = vec![0f32; m * group];
    let mut offset = vec![0f32; m];
    let mut decoded = vec![0f32; group];
    for k in 0..k_len {
        let (s, mn) = (scale[k * groups + g], min[k * groups + g]);
        let start = k * words + g * words_per_group;
        let packed = &codes[start..start + words_per_group];
        decode_words(packed, bits, &mut decoded);
        for ((row, x_row), off) in acc.chunks_exact_mut(group).zip(x.chunks_exact(k_len)).zip(offset.iter_mut()) {
            let xk = x_row[k];
            let a = xk * s;
            *off += xk * mn;
            for (o, d) in row.iter_mut().zip(&decoded) {
                *o += a * d;
            }
        }
    }
    for i in 0..m {
        acc[i * group..(i + 1) * group].iter_mut().for_each(|o| *o += offset[i]);
    }
    acc
}

/// Sizes of one transposed fused-matmul call (`W` `[n, k]` grouped along `k`).
struct RowsShape {
    m: usize,
    k_len: usize,
    groups: usize,
    group: usize,
    words: usize,
    bits: u32,
}

/// Output rows (weight rows) per parallel task of the transposed product.
const ROWS_PER_TASK: usize = 16;

avx2_dispatch! {
    /// `out[j, i]` for the weight rows `rows` and every input row `i`, using AVX2/FMA when the CPU
    /// has them.
    fn weight_rows(shape: &RowsShape, rows: std::ops::Range<usize>, x: &[f32], xsum: &[f32], codes: &[u32], scale: &[f32], min: &[f32]) -> Vec<f32> => weight_rows_portable
}

/// Per weight row and group: the codes are decoded once (fixed-width shift-and-mask) and dotted
/// with every input row's slice in eight lanes; `min` needs only the slice sums `xsum`.
#[inline(always)]
fn weight_rows_portable(
    shape: &RowsShape,
    rows: std::ops::Range<usize>,
    x: &[f32],
    xsum: &[f32],
    codes: &[u32],
    scale: &[f32],
    min: &[f32],
) -> Vec<f32> {
    let RowsShape { m, k_len, groups, group, words, bits } = *shape;
    let per = 32 / bits as usize;
    let words_per_group = group / per;
    let mut out = vec![0f32; rows.len() * m];
    let mut decoded = vec![0f32; group];
    for (local, j) in rows.enumerate() {
        for g in 0..groups {
            let start = j * words + g * words_per_group;
            decode_words(&codes[start..start + words_per_group], bits, &mut decoded);
            let (s, mn) = (scale[j * groups + g], min[j * groups + g]);
            for i in 0..m {
                let xs = &x[i * k_len + g * group..i * k_len + (g + 1) * group];
                out[local * m + i] += s * q8::dot(xs, &decoded) + mn * xsum[i * groups + g];
            }
        }
    }
    out
}

/// Unpacks `packed` codes (`32 / bits` per word, lowest bits first) into `out` as `f32`.
#[inline(always)]
pub(crate) fn decode_words(packed: &[u32], bits: u32, out: &mut [f32]) {
    if bits == 4 {
        for (o, &word) in out.chunks_exact_mut(8).zip(packed) {
            for (t, v) in o.iter_mut().enumerate() {
                *v = ((word >> (4 * t as u32)) & 15) as f32;
            }
        }
    } else {
        for (o, &word) in out.chunks_exact_mut(4).zip(packed) {
            for (t, v) in o.iter_mut().enumerate() {
                *v = ((word >> (8 * t as u32)) & 255) as f32;
            }
        }
    }
}

/// Inputs are borrowed in place, never copied: copying the codes on every call would cost as much
/// memory traffic as the product itself.
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() { t } else { t.to_contiguous() }
}

/// `t` contiguous in `f32`: half-precision inputs are widened (the twin computes in `f32`, the
/// precision a GPU kernel accumulates half inputs in).
pub(crate) fn widened(t: FlexTensor) -> FlexTensor {
    if t.dtype() == DType::F32 { contiguous(t) } else { FlexTensor::from_data(t.into_data().convert_dtype(DType::F32)) }
}

/// `f32` results as a tensor of `dtype` (the dtype of the op's float inputs).
fn narrowed(values: Vec<f32>, shape: [usize; 2], dtype: DType) -> FlexTensor {
    let data = TensorData::new(values, shape);
    FlexTensor::from_data(if dtype == DType::F32 { data } else { data.convert_dtype(dtype) })
}

pub(crate) fn f32s(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("group quantization runs on contiguous f32 tensors")
}

pub(crate) fn u32s(t: &FlexTensor) -> &[u32] {
    t.as_slice::<u32>().expect("codes are contiguous u32 tensors")
}

/// Input rows quantized per parallel task when a product has many (prefill).
const QUANTIZE_ROWS_PER_TASK: usize = 32;
/// Weight rows per parallel task of a product on the plain-Rust kernel (CPUs without AVX2): their
/// codes (tens of KB) stay in cache while every input row passes over them.
const INT8_ROWS_PER_TASK: usize = 64;
/// Products with fewer multiply-adds run on the calling thread: waking another costs more.
const INT8_SERIAL_MACS: usize = 1 << 18;
/// Products with at most this many input rows are split in two on two cores ([`split`]), more
/// go to rayon in several parts per thread (which balances when another process holds a core).
const SPLIT2_MAX_ROWS: usize = 32;
/// Weight rows per chunk of a [`split`] product: two strips ([`q8::strips::STRIP`]), the
/// granularity at which one thread takes over the other's rows.
const SPLIT2_CHUNK_ROWS: usize = 2 * q8::strips::STRIP;
/// Parallel parts per thread for products with more than [`SPLIT2_MAX_ROWS`] input rows.
const PARTS_PER_THREAD: usize = 4;

/// Whether the strip kernel ([`q8::strips`]) runs the product: wherever it can (AVX-512 VNNI or
/// AVX2, 4- or 8-bit codes), whatever the number of input rows, so that a row's result does not
/// depend on how many rows share the product (batch invariance: a request's greedy tokens do not
/// change with what else runs in its steps). Each output is `Σ_b scale · d_b · dot_b` in block
/// order, then `Σ_g min · sum_g`, the same float operations for every row count and on both
/// instruction sets; the row-by-row kernel summed lanes in another order, so a lone decode row
/// and the same row in a batch of five differed in the last bits.
fn use_strips(isa: q8::Isa, bits: u32) -> bool {
    q8::strips::supports(isa, bits)
}

/// `x · Wᵀ` in integer arithmetic ([`q8`]): the input rows quantized once, then the weight rows
/// split across threads in whole strips of [`q8::strips::STRIP`] rows: for decode-sized `m`, in
/// as many parts as threads (on two cores, this thread and the [`split`] helper, without a round
/// trip through rayon's sleep and wake-up, each taking over the other's last chunks when done
/// first); for prefill-sized `m`, in a few parts per thread. Weights in groups of 16 (the
/// K-quants with sub-blocks of 16) take the same strip kernel on a split panel where the CPU has
/// AVX-512 VNNI, [`kq`]'s row kernels elsewhere.
fn int8_nt(w: &q8::Weights, x: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    if m == 0 || k == 0 || n == 0 {
        return vec![0.0; m * n];
    }
    let isa = *ISA.get_or_init(q8::Isa::best);
    let activations = if w.group == kq::GROUP {
        if !q8::strips::supports_halves(isa, w.bits) {
            return kq::int8_nt(w, x, m, k, n);
        }
        Activations::Strips(q8::strips::Panel::halves(x, m, k, w.bits))
    } else {
        let a = if m > QUANTIZE_ROWS_PER_TASK {
            q8::QuantizedRows::concat(
                x.par_chunks(QUANTIZE_ROWS_PER_TASK * k)
                    .map(|rows| q8::QuantizedRows::new(rows, rows.len() / k, k, w.group, w.bits))
                    .collect(),
            )
        } else {
            q8::QuantizedRows::new(x, m, k, w.group, w.bits)
        };
        debug_assert_eq!(a.rows(), m);
        match use_strips(isa, w.bits) {
            true => Activations::Strips(q8::strips::Panel::new(&a)),
            false => Activations::Rows(a),
        }
    };
    let mut out = vec![0f32; m * n];
    let shared = SharedOut(out.as_mut_ptr());
    // SAFETY (both writes): every caller of `part` hands it a range of weight rows (output
    // columns) that no other part covers; the `[m, n]` output outlives the parallel calls, and
    // the kernels hand out only `i < m`, columns inside `rows`.
    let part = |rows: std::ops::Range<usize>| match &activations {
        Activations::Strips(panel) => {
            q8::strips::weight_rows(w, panel, rows, isa, |i, j0, v| unsafe { shared.copy(i * n + j0, v) })
        }
        Activations::Rows(a) => q8::weight_rows(w, a, rows, |i, j, v| unsafe { shared.write(i * n + j, v) }),
    };
    let strip = q8::strips::STRIP;
    if m * n * k <= INT8_SERIAL_MACS {
        part(0..n);
        return out;
    }
    let threads = rayon::current_num_threads();
    if m <= SPLIT2_MAX_ROWS && threads == 2 {
        // Two cores: this thread and the split helper, each its half in chunks, taking the
        // other's last chunks when done first.
        split::split2_chunks(n, SPLIT2_CHUNK_ROWS, &|rows| part(rows));
        return out;
    }
    let per_task = match &activations {
        Activations::Rows(_) => INT8_ROWS_PER_TASK,
        Activations::Strips(_) => {
            let parts = if m <= SPLIT2_MAX_ROWS { threads } else { threads * PARTS_PER_THREAD };
            n.div_ceil(strip).div_ceil(parts) * strip
        }
    };
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|t| part(t * per_task..((t + 1) * per_task).min(n)));
    out
}

/// The input rows of an integer product, quantized for the kernel that runs it.
enum Activations {
    /// For the strip kernel ([`q8::strips`]).
    Strips(q8::strips::Panel),
    /// For the plain-Rust kernel ([`q8::weight_rows`]).
    Rows(q8::QuantizedRows),
}

/// The instruction set the integer kernels use, detected once.
static ISA: std::sync::OnceLock<q8::Isa> = std::sync::OnceLock::new();

/// The output buffer, written by parallel tasks at disjoint indices.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);

// SAFETY: only used for writes at disjoint indices from tasks that finish before the buffer is read.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `index` is in bounds and no other task writes it.
    pub(crate) unsafe fn write(self, index: usize, value: f32) {
        unsafe { *self.0.add(index) = value };
    }

    /// # Safety
    /// `index..index + values.len()` is in bounds and no other task writes it.
    pub(crate) unsafe fn copy(self, index: usize, values: &[f32]) {
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.0.add(index), values.len()) };
    }
}

impl GroupQuantOps for Flex {
    /// Parallel over output column groups (decode has a single row). Per group, the `min` term
    /// `Σ_k x[i, k] · min[k, g]` is one sum shared by all its columns, and each packed word is
    /// decoded once for all rows, so the weight is never expanded to `f32` in memory.
    fn fused_qmatmul(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let [m, k_len] = x.layout().shape().dims::<2>();
        let words = codes.layout().shape().dims::<2>()[1];
        let dtype = x.dtype();
        let (x, codes, scale, min) = (widened(x), contiguous(codes), widened(scale), widened(min));
        let (x, codes) = (f32s(&x), u32s(&codes));
        let (scale, min) = (f32s(&scale), f32s(&min));
        let per = 32 / bits as usize;
        let n = words * per;
        let groups = n / group;
        let shape = BlockShape { m, k_len, groups, group, words, per, bits };
        let blocks: Vec<Vec<f32>> =
            (0..groups).into_par_iter().map(|g| group_block(&shape, g, x, codes, scale, min)).collect();
        let mut out = vec![0f32; m * n];
        for (g, block) in blocks.iter().enumerate() {
            for i in 0..m {
                out[i * n + g * group..i * n + (g + 1) * group].copy_from_slice(&block[i * group..(i + 1) * group]);
            }
        }
        narrowed(out, [m, n], dtype)
    }

    /// Integer arithmetic on 8-bit input rows ([`int8_nt`]) when the caller asked for them
    /// (`int8_rows == 1`, its [`MatmulPrecision::Int8Activations`](super::MatmulPrecision)) and the
    /// groups are whole blocks of 32 ([`q8`]) or groups of 16 ([`kq`], the K-quants with
    /// sub-blocks of 16); otherwise `f32`, parallel over blocks of
    /// weight rows (output columns), each packed word read once per call and decoded once for all
    /// input rows. The integer kernels derive a symmetric weight's minimums from its scales
    /// (`symmetric_offset`, see [`GroupQuantOps::fused_qmatmul_nt`]) rather than read them.
    fn fused_qmatmul_nt(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
        int8_rows: u32,
        symmetric_offset: u32,
    ) -> FloatTensor<Self> {
        let [m, k_len] = x.layout().shape().dims::<2>();
        let [n, words] = codes.layout().shape().dims::<2>();
        let dtype = x.dtype();
        // Minimums derived from half-precision scales could differ from the stored ones where
        // those round to subnormals: derive them only from `f32` scales.
        let symmetric_offset = if scale.dtype() == DType::F32 { symmetric_offset } else { 0 };
        let (x, codes, scale, min) = (widened(x), contiguous(codes), widened(scale), widened(min));
        let (x, codes) = (f32s(&x), u32s(&codes));
        let (scale, min) = (f32s(&scale), f32s(&min));
        if int8_rows == 1 && (group.is_multiple_of(q8::BLOCK) || kq::supports(bits, group)) {
            let w = q8::Weights { codes, scale, min, bits, group, symmetric_offset };
            return narrowed(int8_nt(&w, x, m, k_len, n), [m, n], dtype);
        }
        let groups = k_len / group;
        let xsum: Vec<f32> = x.chunks_exact(group).map(|c| c.iter().sum()).collect();
        let shape = RowsShape { m, k_len, groups, group, words, bits };
        let blocks: Vec<Vec<f32>> = (0..n.div_ceil(ROWS_PER_TASK))
            .into_par_iter()
            .map(|t| {
                let rows = t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n);
                weight_rows(&shape, rows, x, &xsum, codes, scale, min)
            })
            .collect();
        let mut out = vec![0f32; m * n];
        for (t, block) in blocks.iter().enumerate() {
            for (local, column) in block.chunks_exact(m.max(1)).enumerate() {
                let j = t * ROWS_PER_TASK + local;
                for (i, v) in column.iter().enumerate() {
                    out[i * n + j] = *v;
                }
            }
        }
        narrowed(out, [m, n], dtype)
    }

    fn pack_groups(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> IntTensor<Self> {
        let [rows, cols] = x.layout().shape().dims::<2>();
        let (x, scale, min) = (widened(x), widened(scale), widened(min));
        let (x, scale, min) = (f32s(&x), f32s(&scale), f32s(&min));
        let per = 32 / bits as usize;
        let top = ((1u32 << bits) - 1) as f32;
        let groups = cols / group;
        let mut codes = vec![0u32; rows * cols / per];
        codes.par_chunks_mut((cols / per).max(1)).zip(x.par_chunks(cols.max(1))).enumerate().for_each(
            |(row, (out, values))| {
                for (w, word) in out.iter_mut().enumerate() {
                    let mut packed = 0u32;
                    for i in 0..per {
                        let col = w * per + i;
                        let g = row * groups + col / group;
                        let (s, m) = (scale[g], min[g]);
                        let q = if s > 0.0 { ((values[col] - m) / s).round().clamp(0.0, top) } else { 0.0 };
                        packed |= (q as u32) << (i as u32 * bits);
                    }
                    *word = packed;
                }
            },
        );
        FlexTensor::from_data(TensorData::new(codes, [rows, cols / per]))
    }

    fn unpack_groups(
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let [rows, words] = codes.layout().shape().dims::<2>();
        let dtype = scale.dtype();
        let (codes, scale, min) = (contiguous(codes), widened(scale), widened(min));
        let (codes, scale, min) = (u32s(&codes), f32s(&scale), f32s(&min));
        let per = 32 / bits as usize;
        let cols = words * per;
        let words_per_group = group / per;
        let groups_per_task = 256;
        let mut out = vec![0f32; rows * cols];
        // Groups are contiguous in both codes and values: decode each group's words (vectorized
        // shift-and-mask), then one multiply-add per value.
        out.par_chunks_mut((group * groups_per_task).max(1)).enumerate().for_each(|(task, values)| {
            for (local, values) in values.chunks_exact_mut(group).enumerate() {
                let g = task * groups_per_task + local;
                decode_words(&codes[g * words_per_group..(g + 1) * words_per_group], bits, values);
                let (s, m) = (scale[g], min[g]);
                values.iter_mut().for_each(|v| *v = *v * s + m);
            }
        });
        narrowed(out, [rows, cols], dtype)
    }
}
