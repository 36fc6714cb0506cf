//! The custom ops behind the paged KV cache, as a Burn backend extension: a CubeCL kernel for
//! every GPU runtime and a pure-Rust twin for Flex.
//!
//! These are unchecked: the public wrappers in [`crate::paged`] validate every argument (shapes,
//! ids in range, no duplicate writes) before calling them. Layout shared by all: a cache is a
//! contiguous-or-not float tensor `[num_blocks, num_kv_heads, block_size, head_dim]`; every index
//! tensor has dtype `U32`. Ops that write the cache return it, written in place when the
//! backend holds the only reference and copied first otherwise.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, backend_extension};

/// Paged KV-cache ops (vLLM's fused kernels).
#[backend_extension(
    Cube: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Fusion: cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")),
    Flex: cfg(feature = "flex"),
    Remote: cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))
)]
pub trait PagedKvOps: Backend {
    /// `cache[slot / bs, h, slot % bs, :] = new[t, h, :]` for every token `t` with
    /// `slot = slots[t] != u32::MAX` (`new`: `[T, num_kv_heads, head_dim]`, `slots`: `[T]`).
    #[fusion(dtype = cache, shape = cache)]
    fn reshape_and_cache(cache: FloatTensor<Self>, new: FloatTensor<Self>, slots: IntTensor<Self>)
    -> FloatTensor<Self>;

    /// `cache[dst] = cache[src]` for every row `(src, dst)` of `pairs` (`[n, 2]`); no block may be
    /// both a source and a destination.
    #[fusion(dtype = cache, shape = cache)]
    fn copy_blocks(cache: FloatTensor<Self>, pairs: IntTensor<Self>) -> FloatTensor<Self>;

    /// `cache[ids[i]] = blocks[i]` (`blocks`: `[n, num_kv_heads, block_size, head_dim]`,
    /// `ids`: `[n]`, distinct).
    #[fusion(dtype = cache, shape = cache)]
    fn write_blocks(cache: FloatTensor<Self>, ids: IntTensor<Self>, blocks: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `out[t, h] = softmax(q[t, h] · Kᵀ · scale) · V` over key positions
    /// `0..context_lens[t]` of block-table row `query_seq[t]`, kv head `h / (H / H_kv)`
    /// (`q`: `[T, H, D]`, `block_tables`: `[S, max_blocks]`, `query_seq`, `context_lens`: `[T]`).
    /// Zeros where the context is empty.
    #[fusion(dtype = q, shape = q)]
    fn paged_attention(
        q: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        block_tables: IntTensor<Self>,
        query_seq: IntTensor<Self>,
        context_lens: IntTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self>;

    /// [`PagedKvOps::paged_attention`] over group-quantized caches, dequantized inside the kernel:
    /// key (value) element `e` of a slot is `code · scale[e / group] + min[e / group]`, the codes
    /// packed little-end-first into `u32` words (`k_codes`: `[num_blocks, H_kv, block_size,
    /// D · bits / 32]`; `k_scale`, `k_min`: `[num_blocks, H_kv, block_size, D / group]`, the dtype
    /// of `q`), the layout [`crate::quant::quantize`] writes. With `key_channels = 1` the keys
    /// are instead quantized per channel over each block's tokens (KIVI): `k_codes` is
    /// `[num_blocks, H_kv, D, block_size · bits / 32]` and `k_scale`, `k_min` are `[num_blocks,
    /// H_kv, D, 1]`, so key element `e` of a block's token `t` is `code(t) · scale[e] + min[e]`.
    #[fusion(dtype = q, shape = q)]
    #[allow(clippy::too_many_arguments)]
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
    ) -> FloatTensor<Self>;
}
