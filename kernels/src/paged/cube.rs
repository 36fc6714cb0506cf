//! CubeCL kernels of [`PagedKvOps`] for every GPU runtime (wgpu, Vulkan, CUDA, Metal): the cache
//! writes here, attention in [`cube_v2`].

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::cube_v2::{self, KvOperands};
use super::ops::PagedKvOps;

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
        let kv = KvOperands::Dense { k: k_cache, v: v_cache };
        cube_v2::paged_attention(q, kv, block_tables, query_seq, context_lens, scale)
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
        let kv = KvOperands::Quantized {
            k: [k_codes, k_scale, k_min],
            v: [v_codes, v_scale, v_min],
            bits,
            group,
            key_channels: key_channels != 0,
        };
        cube_v2::paged_attention(q, kv, block_tables, query_seq, context_lens, scale)
    }
}
