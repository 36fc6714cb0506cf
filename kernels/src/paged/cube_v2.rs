//! PagedAttention v2 (vLLM's `paged_attention_v2_kernel` and its reduce kernel) in CubeCL: the
//! attention kernel behind [`PagedKvOps::paged_attention`](super::ops::PagedKvOps) and its
//! quantized form on every GPU runtime.
//!
//! - **Work split.** One cube per (query token, KV head, chunk of that KV head's query heads,
//!   partition of [`PARTITION`] context tokens). Under grouped-query attention a cube serves up to
//!   [`MAX_HEADS_PER_CUBE`] query heads of its KV head, so each key and value row is read once
//!   per group instead of once per query head.
//! - **Partitions.** When the context can exceed one partition and the batch alone gives too few
//!   cubes to fill a GPU, each cube writes its partition's normalized output, maximum score and
//!   exp-sum, and [`paged_attention_merge_kernel`] combines the partitions (vLLM's v2 reduce).
//!   Otherwise one partition spans the whole context and the cube writes the output itself (v1).
//! - **Inside a cube.** Keys come in tiles of `threads`: unit `i` scores key `i` of the tile
//!   against every query head of the cube (`Vector` loads of 4 when the head dim allows, else
//!   1); the tile maximum comes from a plane reduction when the device has plane ops, else a
//!   shared-memory tree (a comptime choice made at launch); then the units split the value rows
//!   among themselves, consecutive units on consecutive 4-wide slices of a row (coalesced), and
//!   fold them in with the online-softmax rescale. Accumulation is `f32` whatever the storage.
//! - **Rows.** A comptime flag picks how a key or value row is read: a float row of the cache, or
//!   a group-quantized row dequantized in registers (`code · scale + min`). Quantized keys may be
//!   per channel over each block's tokens (KIVI, a second comptime flag): a slot's element `e`
//!   is then its token's code in channel `e`'s row with that channel's scale and minimum. The
//!   attention loop is the same for all.
//!
//! Launches are unchecked: the public wrappers validate every index the kernels read (block ids,
//! table rows, context lengths, shapes) before the op is called.

use cubecl::prelude::*;

mod launch;

pub(super) use self::launch::{KvOperands, paged_attention};

/// Context tokens per partition (vLLM's `PARTITION_SIZE`).
pub(super) const PARTITION: usize = 512;
/// Most query heads one cube serves (its K/V rows are read once for all of them).
pub(super) const MAX_HEADS_PER_CUBE: usize = 8;
/// Units per cube (a power of two: the shared-memory reductions halve it).
pub(super) const THREADS: usize = 128;
/// At or above this many cubes without partitions the GPU is already full, and splitting the
/// context would only add the merge pass (vLLM's v1/v2 choice, by cubes instead of heads).
const SINGLE_PASS_CUBES: usize = 1024;
/// Largest f32 buffer of per-partition outputs; past it the kernel runs in one pass.
const MAX_PARTIAL_BYTES: usize = 256 << 20;

/// The comptime shape of one attention launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Config {
    /// `head_dim / N`: vectors per row.
    vec_dims: usize,
    /// `N`: values per vector (4 when the head dim allows, else 1).
    width: usize,
    /// Query heads per cube.
    heads_per_cube: usize,
    /// Units per cube.
    threads: usize,
    /// Vector dims the units of one key group cover at once (`min(vec_dims, threads)`).
    span: usize,
    /// Key groups: units `kg · span .. (kg + 1) · span` fold every `key_groups`-th value row.
    key_groups: usize,
    /// Vector dims each unit accumulates (`vec_dims / span`, rounded up).
    dims_per_unit: usize,
    /// Most planes in a cube (shared slots of the plane reduction).
    max_planes: usize,
    /// Plane reductions (`Plane::Ops`) instead of the shared-memory tree.
    plane: bool,
    /// Rows are group-quantized codes, dequantized in registers.
    quantized: bool,
    /// Quantized keys are per channel over each block's tokens (values stay per slot).
    key_channels: bool,
    /// Partitions are merged by a second kernel (else the cube writes the output).
    partitioned: bool,
}

/// Element `e` of slot row `row` of a group-quantized cache: `code · scale + min`, in `f32`
/// (the codes `32 / bits` to a `u32` word, lowest bits first).
#[cube]
fn dequantized<F: Float>(
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    row: usize,
    e: usize,
    words: usize,
    groups: usize,
    group: usize,
    bits: u32,
) -> f32 {
    let per = 32 / bits as usize;
    let word = codes[row * words + e / per];
    let mask = (1u32 << bits) - 1u32;
    let code = (word >> (u32::cast_from(e % per) * bits)) & mask;
    let g = row * groups + e / group;
    f32::cast_from(code) * f32::cast_from(scale[g]) + f32::cast_from(min[g])
}

/// Element `e` of slot row `row` of per-channel quantized keys: channel `e` of the slot's block
/// and head is stored row `row / block_size · head_dim + e`, `words` code words over the block's
/// tokens in one group, so it is element `row % block_size` (the token) of that stored row.
#[cube]
#[allow(clippy::too_many_arguments)]
fn dequantized_channel<F: Float>(
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    row: usize,
    e: usize,
    words: usize,
    block_size: usize,
    head_dim: usize,
    bits: u32,
) -> f32 {
    let channel = row / block_size * head_dim + e;
    dequantized::<F>(codes, scale, min, channel, row % block_size, words, 1usize, block_size, bits)
}

/// Vector `j` of slot row `row` of one cache, in `f32`: read from the float cache, or
/// dequantized from the codes (the row loader; `cfg.quantized` picks it at compile time, and
/// `channels` the per-channel key layout, whose `words` are a channel's).
#[cube]
#[allow(clippy::too_many_arguments)]
fn row_vector<F: Float, N: Size>(
    dense: &Tensor<Vector<F, N>>,
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    row: usize,
    j: usize,
    words: usize,
    groups: usize,
    group: usize,
    bits: u32,
    block_size: usize,
    #[comptime] cfg: Config,
    #[comptime] channels: bool,
) -> Vector<f32, N> {
    let mut v = Vector::<f32, N>::empty();
    if cfg.quantized {
        let head_dim = cfg.vec_dims * N::value();
        #[unroll]
        for i in 0..N::value() {
            let e = j * N::value() + i;
            if channels {
                v.insert(i, dequantized_channel::<F>(codes, scale, min, row, e, words, block_size, head_dim, bits));
            } else {
                v.insert(i, dequantized::<F>(codes, scale, min, row, e, words, groups, group, bits));
            }
        }
    } else {
        v = Vector::<f32, N>::cast_from(dense[row * cfg.vec_dims + j]);
    }
    v
}

/// Replaces each unit's `values[g]` (one per query head of the cube) with its maximum (`max`)
/// or sum over all units of the cube: plane reductions and one shared slot per plane, or a
/// shared-memory tree. Every unit must call it; it ends with a barrier, so `scratch` may be
/// reused right after.
#[cube]
fn reduce_over_cube(
    values: &mut Array<f32>,
    scratch: &mut Shared<[f32]>,
    #[comptime] cfg: Config,
    #[comptime] max: bool,
) {
    let unit = UNIT_POS as usize;
    if cfg.plane {
        #[unroll]
        for g in 0..cfg.heads_per_cube {
            let mut v = values[g];
            if max {
                v = plane_max(v);
            } else {
                v = plane_sum(v);
            }
            if UNIT_POS_PLANE == 0 {
                scratch[g * cfg.max_planes + PLANE_POS as usize] = v;
            }
        }
        sync_cube();
        let planes = cfg.threads / PLANE_DIM as usize;
        #[unroll]
        for g in 0..cfg.heads_per_cube {
            let mut acc = scratch[g * cfg.max_planes];
            for p in 1..planes {
                let v = scratch[g * cfg.max_planes + p];
                if max {
                    acc = f32::max(acc, v);
                } else {
                    acc += v;
                }
            }
            values[g] = acc;
        }
    } else {
        #[unroll]
        for g in 0..cfg.heads_per_cube {
            scratch[g * cfg.threads + unit] = values[g];
        }
        sync_cube();
        #[unroll]
        for step in 0..comptime!(cfg.threads.trailing_zeros() as usize) {
            let stride = comptime!(cfg.threads >> (step + 1));
            if unit < stride {
                #[unroll]
                for g in 0..cfg.heads_per_cube {
                    let a = scratch[g * cfg.threads + unit];
                    let b = scratch[g * cfg.threads + unit + stride];
                    if max {
                        scratch[g * cfg.threads + unit] = f32::max(a, b);
                    } else {
                        scratch[g * cfg.threads + unit] = a + b;
                    }
                }
            }
            sync_cube();
        }
        #[unroll]
        for g in 0..cfg.heads_per_cube {
            values[g] = scratch[g * cfg.threads];
        }
    }
    sync_cube();
}

/// Sum of the lanes of `v` (also the flash-attention kernel's, `crate::fused::cube_flash`).
#[cube]
pub(crate) fn lane_sum<N: Size>(v: Vector<f32, N>) -> f32 {
    let mut s = f32::new(0.0);
    #[unroll]
    for i in 0..N::value() {
        s += v.extract(i);
    }
    s
}

/// One cube per (token, KV head, head chunk, partition); see the [module docs](self).
///
/// Float caches are read from `k_cache`/`v_cache`, quantized ones from the codes, scales and
/// minimums (`cfg.quantized`); the other operands are not read. Unpartitioned launches write
/// `out`; partitioned ones write `partial` (`[T, H, parts, vec_dims]`, each partition's output
/// already divided by its exp-sum) and `stats` (`[T, H, parts, 2]`: maximum score, exp-sum).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn paged_attention_v2_kernel<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    k_codes: &Tensor<u32>,
    k_scale: &Tensor<F>,
    k_min: &Tensor<F>,
    v_codes: &Tensor<u32>,
    v_scale: &Tensor<F>,
    v_min: &Tensor<F>,
    block_tables: &Tensor<u32>,
    query_seq: &Tensor<u32>,
    context_lens: &Tensor<u32>,
    out: &mut Tensor<Vector<F, N>>,
    partial: &mut Tensor<Vector<f32, N>>,
    stats: &mut Tensor<f32>,
    scale: f32,
    heads: usize,
    kv_heads: usize,
    block_size: usize,
    max_blocks: usize,
    parts: usize,
    total: usize,
    words: usize,
    k_words: usize,
    groups: usize,
    group: usize,
    bits: u32,
    #[comptime] cfg: Config,
    #[define(F)] _dtype: ElemType,
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    let hpc = cfg.heads_per_cube;
    let chunks = heads / kv_heads / hpc;
    let part = cube % parts;
    let rest = cube / parts;
    let chunk = rest % chunks;
    let kv_head = (rest / chunks) % kv_heads;
    let token = rest / chunks / kv_heads;
    let head0 = kv_head * (heads / kv_heads) + chunk * hpc;
    let context = context_lens[token] as usize;
    let start = part * PARTITION;
    // A partition past the context has nothing to write: the merge reads only those before it.
    // (Unpartitioned, the single partition writes even an empty context's zeros.)
    if cfg.partitioned && start >= context {
        terminate!();
    }
    let mut end = start + PARTITION;
    if !cfg.partitioned || end > context {
        end = context;
    }
    let unit = UNIT_POS as usize;
    let table = (query_seq[token] as usize) * max_blocks;
    let vec_dims = cfg.vec_dims;
    let lane = unit % cfg.span;
    let key_group = unit / cfg.span;

    let mut q_shared = Shared::<[Vector<f32, N>]>::new_slice(hpc * vec_dims);
    let mut probs = Shared::<[f32]>::new_slice(hpc * cfg.threads);
    let mut scratch = Shared::<[f32]>::new_slice(comptime!(scratch_len(&cfg)));

    let q_base = (token * heads + head0) * vec_dims;
    let mut i = unit;
    while i < hpc * vec_dims {
        q_shared[i] = Vector::<f32, N>::cast_from(q[q_base + i]) * Vector::new(scale);
        i += cfg.threads;
    }
    sync_cube();

    let mut acc = Array::<Vector<f32, N>>::new(hpc * cfg.dims_per_unit);
    let mut running_max = Array::<f32>::new(hpc);
    let mut unit_sum = Array::<f32>::new(hpc);
    let mut scores = Array::<f32>::new(hpc);
    let mut dot = Array::<Vector<f32, N>>::new(hpc);
    #[unroll]
    for g in 0..hpc {
        // Finite "minus infinity": WGSL has no infinite literals, and exp(−3e38 − m) is 0 anyway.
        running_max[g] = f32::new(-3.0e38);
        unit_sum[g] = f32::new(0.0);
        #[unroll]
        for k in 0..cfg.dims_per_unit {
            acc[g * cfg.dims_per_unit + k] = Vector::new(f32::new(0.0));
        }
    }

    let head_stride = block_size * kv_heads;
    let mut tile = start;
    while tile < end {
        let mut valid = end - tile;
        if valid > cfg.threads {
            valid = cfg.threads;
        }
        // Scores of key `tile + unit` against every query head of the cube.
        #[unroll]
        for g in 0..hpc {
            scores[g] = f32::new(-3.0e38);
            dot[g] = Vector::new(f32::new(0.0));
        }
        if unit < valid {
            let pos = tile + unit;
            let block = block_tables[table + pos / block_size] as usize;
            let row = block * head_stride + kv_head * block_size + pos % block_size;
            for j in 0..vec_dims {
                let k = row_vector::<F, N>(
                    k_cache,
                    k_codes,
                    k_scale,
                    k_min,
                    row,
                    j,
                    k_words,
                    groups,
                    group,
                    bits,
                    block_size,
                    cfg,
                    cfg.key_channels,
                );
                #[unroll]
                for g in 0..hpc {
                    dot[g] += q_shared[g * vec_dims + j] * k;
                }
            }
            #[unroll]
            for g in 0..hpc {
                scores[g] = lane_sum::<N>(dot[g]);
            }
        }
        let mut tile_max = Array::<f32>::new(hpc);
        #[unroll]
        for g in 0..hpc {
            tile_max[g] = scores[g];
        }
        reduce_over_cube(&mut tile_max, &mut scratch, cfg, true);

        // Rescale to the new maximum; unit `i` turns its score into a probability.
        let mut correction = Array::<f32>::new(hpc);
        #[unroll]
        for g in 0..hpc {
            let new_max = f32::max(running_max[g], tile_max[g]);
            correction[g] = f32::exp(running_max[g] - new_max);
            running_max[g] = new_max;
            let mut p = f32::new(0.0);
            if unit < valid {
                p = f32::exp(scores[g] - new_max);
            }
            probs[g * cfg.threads + unit] = p;
            unit_sum[g] = unit_sum[g] * correction[g] + p;
            #[unroll]
            for k in 0..cfg.dims_per_unit {
                acc[g * cfg.dims_per_unit + k] *= Vector::new(correction[g]);
            }
        }
        sync_cube();

        // Value rows: key group `kg` folds rows kg, kg + key_groups, …; its units cover the dims.
        if key_group < cfg.key_groups {
            let mut i = key_group;
            while i < valid {
                let pos = tile + i;
                let block = block_tables[table + pos / block_size] as usize;
                let row = block * head_stride + kv_head * block_size + pos % block_size;
                #[unroll]
                for k in 0..cfg.dims_per_unit {
                    let d = lane + k * cfg.span;
                    if d < vec_dims {
                        let v = row_vector::<F, N>(
                            v_cache, v_codes, v_scale, v_min, row, d, words, groups, group, bits, block_size, cfg,
                            false,
                        );
                        #[unroll]
                        for g in 0..hpc {
                            acc[g * cfg.dims_per_unit + k] += Vector::new(probs[g * cfg.threads + i]) * v;
                        }
                    }
                }
                i += cfg.key_groups;
            }
        }
        // `probs` is rewritten only after the next tile's reduction, whose barriers every unit
        // reaches after this loop.
        tile += cfg.threads;
    }

    reduce_over_cube(&mut unit_sum, &mut scratch, cfg, false);

    // Key groups 1.. hand their accumulators to group 0 one at a time through `scratch`.
    let width = cfg.width;
    let mut r = 1usize;
    while r < cfg.key_groups {
        if key_group == r {
            #[unroll]
            for k in 0..cfg.dims_per_unit {
                let d = lane + k * cfg.span;
                if d < vec_dims {
                    #[unroll]
                    for g in 0..hpc {
                        let a = acc[g * cfg.dims_per_unit + k];
                        #[unroll]
                        for c in 0..width {
                            scratch[(g * vec_dims + d) * width + c] = a.extract(c);
                        }
                    }
                }
            }
        }
        sync_cube();
        if key_group == 0 {
            #[unroll]
            for k in 0..cfg.dims_per_unit {
                let d = lane + k * cfg.span;
                if d < vec_dims {
                    #[unroll]
                    for g in 0..hpc {
                        let mut a = acc[g * cfg.dims_per_unit + k];
                        #[unroll]
                        for c in 0..width {
                            a.insert(c, a.extract(c) + scratch[(g * vec_dims + d) * width + c]);
                        }
                        acc[g * cfg.dims_per_unit + k] = a;
                    }
                }
            }
        }
        sync_cube();
        r += 1;
    }

    if key_group == 0 {
        #[unroll]
        for g in 0..hpc {
            let row = token * heads + head0 + g;
            let mut inv = f32::new(0.0);
            if unit_sum[g] > 0.0f32 {
                inv = 1.0f32 / unit_sum[g];
            }
            #[unroll]
            for k in 0..cfg.dims_per_unit {
                let d = lane + k * cfg.span;
                if d < vec_dims {
                    let o = acc[g * cfg.dims_per_unit + k] * Vector::new(inv);
                    if cfg.partitioned {
                        partial[(row * parts + part) * vec_dims + d] = o;
                    } else {
                        out[row * vec_dims + d] = Vector::<F, N>::cast_from(o);
                    }
                }
            }
            if cfg.partitioned && unit == 0 {
                stats[(row * parts + part) * 2] = running_max[g];
                stats[(row * parts + part) * 2 + 1] = unit_sum[g];
            }
        }
    }
}

/// vLLM's v2 reduce: one cube per (token, head) combines the partitions that hold context,
/// each weighted by its exp-sum rescaled to the global maximum. An empty context gives zeros.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn paged_attention_merge_kernel<F: Float, N: Size>(
    partial: &Tensor<Vector<f32, N>>,
    stats: &Tensor<f32>,
    context_lens: &Tensor<u32>,
    out: &mut Tensor<Vector<F, N>>,
    heads: usize,
    parts: usize,
    total: usize,
    #[comptime] vec_dims: usize,
    #[comptime] threads: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= total {
        terminate!();
    }
    let context = context_lens[row / heads] as usize;
    let used = context.div_ceil(PARTITION);
    let base = row * parts;
    let mut global_max = f32::new(-3.0e38);
    for p in 0..used {
        global_max = f32::max(global_max, stats[(base + p) * 2]);
    }
    let mut weight_sum = f32::new(0.0);
    for p in 0..used {
        weight_sum += stats[(base + p) * 2 + 1] * f32::exp(stats[(base + p) * 2] - global_max);
    }
    let mut inv = f32::new(0.0);
    if weight_sum > 0.0f32 {
        inv = 1.0f32 / weight_sum;
    }
    let mut d = UNIT_POS as usize;
    while d < vec_dims {
        let mut o = Vector::<f32, N>::new(f32::new(0.0));
        for p in 0..used {
            let w = stats[(base + p) * 2 + 1] * f32::exp(stats[(base + p) * 2] - global_max) * inv;
            o += partial[(base + p) * vec_dims + d] * Vector::new(w);
        }
        out[row * vec_dims + d] = Vector::<F, N>::cast_from(o);
        d += threads;
    }
}

/// Partitions per (token, head) for a launch of `single_cubes` cubes without partitions, whose
/// partition buffers take `row_values · parts` f32 values (`row_values = T · H · head_dim`), over
/// contexts of at most `max_context` tokens: one (a single pass) when the context fits a
/// partition, when the batch alone fills the GPU, or when the buffers would be too large.
pub(super) fn partitions(single_cubes: usize, row_values: usize, max_context: usize) -> usize {
    let parts = max_context.div_ceil(PARTITION);
    let fits = row_values.saturating_mul(parts).saturating_mul(4) <= MAX_PARTIAL_BYTES;
    if parts > 1 && single_cubes < SINGLE_PASS_CUBES && fits { parts } else { 1 }
}

/// `f32` slots of the cube's scratch: the reductions' and the key groups' hand-over.
fn scratch_len(cfg: &Config) -> usize {
    let reduce = cfg.heads_per_cube * if cfg.plane { cfg.max_planes } else { cfg.threads };
    let handover = if cfg.key_groups > 1 { cfg.heads_per_cube * cfg.vec_dims * cfg.width } else { 0 };
    reduce.max(handover)
}
