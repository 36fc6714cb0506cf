//! CubeCL kernels of [`PagedKvOps`] for every GPU runtime (wgpu, Vulkan, CUDA, Metal).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::ops::PagedKvOps;

/// Most threads one attention cube uses (wgpu guarantees 256 invocations per workgroup).
const MAX_THREADS: usize = 256;

/// One thread per value of `new` (`[T, kv_heads, head_dim]`): copies it to its slot.
#[cube(launch)]
fn reshape_and_cache_kernel<F: Float>(
    cache: &mut Tensor<F>,
    new: &Tensor<F>,
    slots: &Tensor<u32>,
    kv_heads: usize,
    block_size: usize,
    head_dim: usize,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= new.len() {
        terminate!();
    }
    let row = kv_heads * head_dim;
    let token = idx / row;
    let slot = slots[token];
    if slot != 0xFFFF_FFFFu32 {
        let slot = slot as usize;
        let within = idx % row;
        let head = within / head_dim;
        let d = within % head_dim;
        let block = slot / block_size;
        let offset = slot % block_size;
        cache[((block * kv_heads + head) * block_size + offset) * head_dim + d] = new[idx];
    }
}

/// One thread per value of the copied blocks: `cache[dst][e] = cache[src][e]`.
#[cube(launch)]
fn copy_blocks_kernel<F: Float>(
    cache: &mut Tensor<F>,
    pairs: &Tensor<u32>,
    block_len: usize,
    total: usize,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= total {
        terminate!();
    }
    let pair = idx / block_len;
    let e = idx % block_len;
    let src = pairs[2 * pair] as usize;
    let dst = pairs[2 * pair + 1] as usize;
    cache[dst * block_len + e] = cache[src * block_len + e];
}

/// One thread per value of `blocks`: `cache[ids[i]][e] = blocks[i][e]`.
#[cube(launch)]
fn write_blocks_kernel<F: Float>(
    cache: &mut Tensor<F>,
    ids: &Tensor<u32>,
    blocks: &Tensor<F>,
    block_len: usize,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= blocks.len() {
        terminate!();
    }
    let block = ids[idx / block_len] as usize;
    cache[block * block_len + idx % block_len] = blocks[idx];
}

/// One cube per (query `t`, head `h`) with `threads` units. Keys are taken in tiles of `threads`:
/// unit `i` scores key `tile + i` (a full dot product, its key read through the block table)
/// into shared memory; after a barrier every unit finds the tile maximum, unit `i` turns its
/// score into `exp(s − m)`, and after a second barrier every unit folds the tile into the running
/// sum and into the accumulators of the output dims it owns (`unit + k · threads`), rescaling by
/// `exp(m_old − m_new)` (online softmax). V is read with consecutive units on consecutive dims
/// (coalesced). Accumulation is in `f32` whatever the storage dtype.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn paged_attention_kernel<F: Float>(
    q: &Tensor<F>,
    k_cache: &Tensor<F>,
    v_cache: &Tensor<F>,
    block_tables: &Tensor<u32>,
    query_seq: &Tensor<u32>,
    context_lens: &Tensor<u32>,
    out: &mut Tensor<F>,
    scale: f32,
    heads: usize,
    kv_heads: usize,
    block_size: usize,
    max_blocks: usize,
    total: usize,
    #[comptime] head_dim: usize,
    #[comptime] threads: usize,
    #[comptime] dims_per_thread: usize,
    #[define(F)] _dtype: ElemType,
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    let token = cube / heads;
    let head = cube % heads;
    let kv_head = head / (heads / kv_heads);
    let unit = UNIT_POS as usize;
    let table = (query_seq[token] as usize) * max_blocks;
    let context = context_lens[token] as usize;
    let base = cube * head_dim;
    let head_stride = block_size * head_dim;
    let block_stride = kv_heads * head_stride;
    let head_offset = kv_head * head_stride;

    let mut q_shared = Shared::<[f32]>::new_slice(head_dim);
    let mut scores = Shared::<[f32]>::new_slice(threads);
    let mut probs = Shared::<[f32]>::new_slice(threads);

    let mut d = unit;
    while d < head_dim {
        q_shared[d] = f32::cast_from(q[base + d]) * scale;
        d += threads;
    }
    sync_cube();

    let mut acc = Array::<f32>::new(dims_per_thread);
    #[unroll]
    for k in 0..dims_per_thread {
        acc[k] = f32::new(0.0);
    }
    // Finite "minus infinity": WGSL has no infinite literals, and exp(−3e38 − m) is 0 anyway.
    let mut running_max = f32::new(-3.0e38);
    let mut running_sum = f32::new(0.0);

    let mut start = 0usize;
    while start < context {
        let mut valid = context - start;
        if valid > threads {
            valid = threads;
        }
        if unit < valid {
            let pos = start + unit;
            let block = block_tables[table + pos / block_size] as usize;
            let key = block * block_stride + head_offset + (pos % block_size) * head_dim;
            let mut s = f32::new(0.0);
            for i in 0..head_dim {
                s += q_shared[i] * f32::cast_from(k_cache[key + i]);
            }
            scores[unit] = s;
        }
        sync_cube();

        let mut tile_max = running_max;
        for i in 0..valid {
            tile_max = f32::max(tile_max, scores[i]);
        }
        if unit < valid {
            probs[unit] = f32::exp(scores[unit] - tile_max);
        }
        sync_cube();
        // Two barriers per tile suffice: `scores` is rewritten (next tile) only by units past the
        // barrier above, so after every unit has read it; `probs` is rewritten only after the
        // next tile's first barrier, which every unit reaches after the loop below.

        let correction = f32::exp(running_max - tile_max);
        running_sum *= correction;
        #[unroll]
        for k in 0..dims_per_thread {
            acc[k] *= correction;
        }
        for i in 0..valid {
            let pos = start + i;
            let block = block_tables[table + pos / block_size] as usize;
            let value = block * block_stride + head_offset + (pos % block_size) * head_dim;
            let p = probs[i];
            running_sum += p;
            #[unroll]
            for k in 0..dims_per_thread {
                let d = unit + k * threads;
                if d < head_dim {
                    acc[k] += p * f32::cast_from(v_cache[value + d]);
                }
            }
        }
        running_max = tile_max;
        start += threads;
    }

    #[unroll]
    for k in 0..dims_per_thread {
        let d = unit + k * threads;
        if d < head_dim {
            let mut o = f32::new(0.0);
            if running_sum > 0.0f32 {
                o = acc[k] / running_sum;
            }
            out[base + d] = F::cast_from(o);
        }
    }
}

/// Element `e` of slot row `row` of a group-quantized cache: `code · scale + min`, in `f32`
/// (the codes `32 / bits` to a `u32` word, lowest bits first).
#[cube]
#[allow(clippy::too_many_arguments)]
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

/// [`paged_attention_kernel`] over group-quantized keys and values, each read through
/// [`dequantized`] where the float kernel reads the cache: the same tiles, barriers and online
/// softmax.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn paged_attention_quantized_kernel<F: Float>(
    q: &Tensor<F>,
    k_codes: &Tensor<u32>,
    k_scale: &Tensor<F>,
    k_min: &Tensor<F>,
    v_codes: &Tensor<u32>,
    v_scale: &Tensor<F>,
    v_min: &Tensor<F>,
    block_tables: &Tensor<u32>,
    query_seq: &Tensor<u32>,
    context_lens: &Tensor<u32>,
    out: &mut Tensor<F>,
    scale: f32,
    heads: usize,
    kv_heads: usize,
    block_size: usize,
    max_blocks: usize,
    total: usize,
    words: usize,
    groups: usize,
    group: usize,
    bits: u32,
    #[comptime] head_dim: usize,
    #[comptime] threads: usize,
    #[comptime] dims_per_thread: usize,
    #[define(F)] _dtype: ElemType,
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    let token = cube / heads;
    let head = cube % heads;
    let kv_head = head / (heads / kv_heads);
    let unit = UNIT_POS as usize;
    let table = (query_seq[token] as usize) * max_blocks;
    let context = context_lens[token] as usize;
    let base = cube * head_dim;

    let mut q_shared = Shared::<[f32]>::new_slice(head_dim);
    let mut scores = Shared::<[f32]>::new_slice(threads);
    let mut probs = Shared::<[f32]>::new_slice(threads);

    let mut d = unit;
    while d < head_dim {
        q_shared[d] = f32::cast_from(q[base + d]) * scale;
        d += threads;
    }
    sync_cube();

    let mut acc = Array::<f32>::new(dims_per_thread);
    #[unroll]
    for k in 0..dims_per_thread {
        acc[k] = f32::new(0.0);
    }
    let mut running_max = f32::new(-3.0e38);
    let mut running_sum = f32::new(0.0);

    let mut start = 0usize;
    while start < context {
        let mut valid = context - start;
        if valid > threads {
            valid = threads;
        }
        if unit < valid {
            let pos = start + unit;
            let block = block_tables[table + pos / block_size] as usize;
            let row = (block * kv_heads + kv_head) * block_size + pos % block_size;
            let mut s = f32::new(0.0);
            for i in 0..head_dim {
                s += q_shared[i] * dequantized::<F>(k_codes, k_scale, k_min, row, i, words, groups, group, bits);
            }
            scores[unit] = s;
        }
        sync_cube();

        let mut tile_max = running_max;
        for i in 0..valid {
            tile_max = f32::max(tile_max, scores[i]);
        }
        if unit < valid {
            probs[unit] = f32::exp(scores[unit] - tile_max);
        }
        sync_cube();

        let correction = f32::exp(running_max - tile_max);
        running_sum *= correction;
        #[unroll]
        for k in 0..dims_per_thread {
            acc[k] *= correction;
        }
        for i in 0..valid {
            let pos = start + i;
            let block = block_tables[table + pos / block_size] as usize;
            let row = (block * kv_heads + kv_head) * block_size + pos % block_size;
            let p = probs[i];
            running_sum += p;
            #[unroll]
            for k in 0..dims_per_thread {
                let d = unit + k * threads;
                if d < head_dim {
                    acc[k] += p * dequantized::<F>(v_codes, v_scale, v_min, row, d, words, groups, group, bits);
                }
            }
        }
        running_max = tile_max;
        start += threads;
    }

    #[unroll]
    for k in 0..dims_per_thread {
        let d = unit + k * threads;
        if d < head_dim {
            let mut o = f32::new(0.0);
            if running_sum > 0.0f32 {
                o = acc[k] / running_sum;
            }
            out[base + d] = F::cast_from(o);
        }
    }
}

/// Threads per attention cube for heads of `head_dim` on `client`'s hardware, and the output dims
/// each thread owns.
fn attention_threads(client: &cubecl::client::Client, head_dim: usize) -> (usize, usize) {
    let hardware = client.properties().hardware.max_units_per_cube as usize;
    let threads = head_dim.next_multiple_of(32).clamp(32, MAX_THREADS.min(hardware.max(1)));
    (threads, head_dim.div_ceil(threads))
}

/// The cache to write into: itself when this is the only reference to a non-overlapping
/// buffer (no copy of a cache that may be gigabytes), otherwise a contiguous copy (the caller's
/// other references keep the old contents). Same rule as burn-cubecl's `slice_assign`.
fn writable(cache: CubeTensor) -> CubeTensor {
    let cache = into_contiguous(cache);
    if cache.can_mut() && cache.is_nonoverlapping() { cache } else { cache.copy() }
}

/// One-dimensional elementwise launch geometry for `n` threads.
fn elementwise(client: &cubecl::client::Client, n: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new(client, n);
    (calculate_cube_count_elemwise(client, n, cube_dim), cube_dim)
}

impl PagedKvOps for CubeBackend {
    fn reshape_and_cache(
        cache: FloatTensor<Self>,
        new: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.shape().dims::<4>();
        let cache = writable(cache);
        let (new, slots) = (into_contiguous(new), into_contiguous(slots));
        let n = new.shape().num_elements();
        if n == 0 {
            return cache;
        }
        let client = cache.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, n);
        let dtype = dtype_to_storage_type(cache.dtype);
        reshape_and_cache_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            cache.clone().into_tensor_arg(),
            new.into_tensor_arg(),
            slots.into_tensor_arg(),
            kv_heads,
            block_size,
            head_dim,
            dtype,
        );
        cache
    }

    fn copy_blocks(cache: FloatTensor<Self>, pairs: IntTensor<Self>) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.shape().dims::<4>();
        let block_len = kv_heads * block_size * head_dim;
        let cache = writable(cache);
        let pairs = into_contiguous(pairs);
        let total = pairs.shape().dims::<2>()[0] * block_len;
        if total == 0 {
            return cache;
        }
        let client = cache.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, total);
        let dtype = dtype_to_storage_type(cache.dtype);
        copy_blocks_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            cache.clone().into_tensor_arg(),
            pairs.into_tensor_arg(),
            block_len,
            total,
            dtype,
        );
        cache
    }

    fn write_blocks(cache: FloatTensor<Self>, ids: IntTensor<Self>, blocks: FloatTensor<Self>) -> FloatTensor<Self> {
        let [_, kv_heads, block_size, head_dim] = cache.shape().dims::<4>();
        let block_len = kv_heads * block_size * head_dim;
        let cache = writable(cache);
        let (ids, blocks) = (into_contiguous(ids), into_contiguous(blocks));
        let n = blocks.shape().num_elements();
        if n == 0 {
            return cache;
        }
        let client = cache.client.clone();
        let (cube_count, cube_dim) = elementwise(&client, n);
        let dtype = dtype_to_storage_type(cache.dtype);
        write_blocks_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            cache.clone().into_tensor_arg(),
            ids.into_tensor_arg(),
            blocks.into_tensor_arg(),
            block_len,
            dtype,
        );
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
        let (q, k_cache, v_cache) = (into_contiguous(q), into_contiguous(k_cache), into_contiguous(v_cache));
        let (block_tables, query_seq, context_lens) =
            (into_contiguous(block_tables), into_contiguous(query_seq), into_contiguous(context_lens));
        let [tokens, heads, head_dim] = q.shape().dims::<3>();
        let [_, kv_heads, block_size, _] = k_cache.shape().dims::<4>();
        let max_blocks = block_tables.shape().dims::<2>()[1];
        let client = q.client.clone();
        let out = empty_device_dtype(client.clone(), q.device.clone(), q.shape(), q.dtype);
        let total = tokens * heads;
        if total == 0 || head_dim == 0 {
            return out;
        }
        let (threads, dims_per_thread) = attention_threads(&client, head_dim);
        let cube_dim = CubeDim::new_1d(threads as u32);
        let cube_count = calculate_cube_count_elemwise(&client, total * threads, cube_dim);
        let dtype = dtype_to_storage_type(q.dtype);
        paged_attention_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            q.into_tensor_arg(),
            k_cache.into_tensor_arg(),
            v_cache.into_tensor_arg(),
            block_tables.into_tensor_arg(),
            query_seq.into_tensor_arg(),
            context_lens.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            scale,
            heads,
            kv_heads,
            block_size,
            max_blocks,
            total,
            head_dim,
            threads,
            dims_per_thread,
            dtype,
        );
        out
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
    ) -> FloatTensor<Self> {
        let q = into_contiguous(q);
        let [k_codes, v_codes] = [k_codes, v_codes].map(into_contiguous);
        let [k_scale, k_min, v_scale, v_min] = [k_scale, k_min, v_scale, v_min].map(into_contiguous);
        let (block_tables, query_seq, context_lens) =
            (into_contiguous(block_tables), into_contiguous(query_seq), into_contiguous(context_lens));
        let [tokens, heads, head_dim] = q.shape().dims::<3>();
        let [_, kv_heads, block_size, words] = k_codes.shape().dims::<4>();
        let groups = k_scale.shape().dims::<4>()[3];
        let max_blocks = block_tables.shape().dims::<2>()[1];
        let client = q.client.clone();
        let out = empty_device_dtype(client.clone(), q.device.clone(), q.shape(), q.dtype);
        let total = tokens * heads;
        if total == 0 || head_dim == 0 {
            return out;
        }
        let (threads, dims_per_thread) = attention_threads(&client, head_dim);
        let cube_dim = CubeDim::new_1d(threads as u32);
        let cube_count = calculate_cube_count_elemwise(&client, total * threads, cube_dim);
        let dtype = dtype_to_storage_type(q.dtype);
        paged_attention_quantized_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            q.into_tensor_arg(),
            k_codes.into_tensor_arg(),
            k_scale.into_tensor_arg(),
            k_min.into_tensor_arg(),
            v_codes.into_tensor_arg(),
            v_scale.into_tensor_arg(),
            v_min.into_tensor_arg(),
            block_tables.into_tensor_arg(),
            query_seq.into_tensor_arg(),
            context_lens.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            scale,
            heads,
            kv_heads,
            block_size,
            max_blocks,
            total,
            words,
            groups,
            group,
            bits,
            head_dim,
            threads,
            dims_per_thread,
            dtype,
        );
        out
    }
}
