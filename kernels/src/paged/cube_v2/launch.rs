//! The host side of PagedAttention v2: the launch plan (heads per cube, units, partitions,
//! plane or shared-memory reductions) from the device's properties, and the two launches.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::features::Plane;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::{
    Config, MAX_HEADS_PER_CUBE, THREADS, paged_attention_merge_kernel, paged_attention_v2_kernel, partitions,
    scratch_len,
};

/// The K and V operands of one attention launch.
#[allow(clippy::large_enum_variant)] // built once per launch and consumed at once
pub(in crate::paged) enum KvOperands {
    /// Float caches `[num_blocks, kv_heads, block_size, head_dim]`.
    Dense { k: CubeTensor, v: CubeTensor },
    /// Group-quantized caches: `[codes, scale, min]` each, `bits` per code, `group` values per
    /// scale, keys per channel if `key_channels` (the layouts of
    /// [`PagedKvOps::paged_attention_quantized`](super::ops::PagedKvOps)).
    Quantized { k: [CubeTensor; 3], v: [CubeTensor; 3], bits: u32, group: usize, key_channels: bool },
}

/// Block size and the code layout of one launch (`words`, `groups`, `group`: a value row's;
/// `k_words`: a key row's, or a key channel's when keys are per channel).
struct Geometry {
    kv_heads: usize,
    block_size: usize,
    words: usize,
    k_words: usize,
    groups: usize,
    group: usize,
    bits: u32,
}

/// How one launch splits its work.
struct Plan {
    cfg: Config,
    /// Partitions per (token, head).
    parts: usize,
    /// Cubes of the attention kernel.
    cubes: usize,
}

/// Environment variable forcing the reductions: `0` the shared-memory tree, `1` plane ops even
/// where the runtime does not report them (CubeCL's wgpu runtime leaves them off on CPU devices
/// such as lavapipe, whose Vulkan driver has subgroups), so that either path can be tested and
/// timed on any device.
const PLANE_ENV: &str = "BURN_LLM_PAGED_PLANE";

/// The reduction [`PLANE_ENV`] forces, if any (read once).
fn forced_plane() -> Option<bool> {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var(PLANE_ENV).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    })
}

/// The launch plan for `tokens` queries of `heads` heads over `kv_heads` KV heads of `head_dim`,
/// `width` values per vector, contexts of at most `max_context` tokens, on `client`'s device.
#[allow(clippy::too_many_arguments)]
fn plan(
    client: &cubecl::client::Client,
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    width: usize,
    max_context: usize,
    quantized: bool,
    key_channels: bool,
) -> Plan {
    let props = client.properties();
    let hardware = &props.hardware;
    let group = heads / kv_heads;
    let divisor_below = |limit: usize| (1..=limit.min(group)).rev().find(|h| group.is_multiple_of(*h)).unwrap_or(1);
    let mut heads_per_cube = divisor_below(MAX_HEADS_PER_CUBE);
    let mut threads = THREADS;
    while threads > (hardware.max_units_per_cube as usize).max(32) {
        threads /= 2;
    }
    let (plane_min, plane_max) = (hardware.plane_size_min as usize, hardware.plane_size_max as usize);
    let plane_ops = forced_plane().unwrap_or_else(|| props.features.plane.contains(Plane::Ops)) && plane_min > 0;
    let vec_dims = head_dim / width;
    let cfg = loop {
        let plane = plane_ops && plane_max <= threads && threads.is_multiple_of(plane_max);
        let span = vec_dims.min(threads);
        let cfg = Config {
            vec_dims,
            width,
            heads_per_cube,
            threads,
            span,
            key_groups: threads / span,
            dims_per_unit: vec_dims.div_ceil(span),
            max_planes: threads / plane_min.max(1),
            plane,
            quantized,
            key_channels,
            partitioned: false,
        };
        let shared = 4 * (heads_per_cube * head_dim + heads_per_cube * threads + scratch_len(&cfg));
        if shared <= hardware.max_shared_memory_size || (heads_per_cube == 1 && threads <= 32) {
            break cfg;
        }
        if heads_per_cube > 1 {
            heads_per_cube = divisor_below(heads_per_cube - 1);
        } else {
            threads /= 2;
        }
    };
    let single = tokens * kv_heads * (group / cfg.heads_per_cube);
    let parts = partitions(single, tokens * heads * head_dim, max_context);
    Plan { cfg: Config { partitioned: parts > 1, ..cfg }, parts, cubes: single * parts }
}

/// PagedAttention v2 of `q` (`[T, H, D]`) over `kv`: the attention kernel, then the merge kernel
/// when the plan partitions the context. Arguments were validated by the public wrappers.
pub(in crate::paged) fn paged_attention(
    q: CubeTensor,
    kv: KvOperands,
    block_tables: CubeTensor,
    query_seq: CubeTensor,
    context_lens: CubeTensor,
    scale: f32,
) -> CubeTensor {
    let q = into_contiguous(q);
    let (block_tables, query_seq, context_lens) =
        (into_contiguous(block_tables), into_contiguous(query_seq), into_contiguous(context_lens));
    let [tokens, heads, head_dim] = q.shape().dims::<3>();
    let max_blocks = block_tables.shape().dims::<2>()[1];
    let client = q.client.clone();
    let out = empty_device_dtype(client.clone(), q.device.clone(), q.shape(), q.dtype);
    if tokens == 0 || heads == 0 || head_dim == 0 {
        return out;
    }
    let width = if head_dim.is_multiple_of(4) { 4 } else { 1 };
    // Operands a launch does not read (the other row loader's, or the partition buffers of a
    // single pass) are bound to small placeholder buffers.
    let placeholder =
        |dtype: DType, n: usize| empty_device_dtype(client.clone(), q.device.clone(), Shape::new([n]), dtype);
    let (floats, [k_codes, k_scale, k_min], [v_codes, v_scale, v_min], geometry, flags) = match kv {
        KvOperands::Dense { k, v } => {
            let unused = || [placeholder(DType::U32, 1), placeholder(q.dtype, 1), placeholder(q.dtype, 1)];
            let [_, kv_heads, block_size, _] = k.shape().dims::<4>();
            let geometry = Geometry { kv_heads, block_size, words: 0, k_words: 0, groups: 0, group: 1, bits: 32 };
            ([into_contiguous(k), into_contiguous(v)], unused(), unused(), geometry, (false, false))
        }
        KvOperands::Quantized { k, v, bits, group, key_channels } => {
            let [_, kv_heads, block_size, words] = v[0].shape().dims::<4>();
            let (k_words, groups) = (k[0].shape().dims::<4>()[3], v[1].shape().dims::<4>()[3]);
            let floats = [placeholder(q.dtype, width), placeholder(q.dtype, width)];
            let geometry = Geometry { kv_heads, block_size, words, k_words, groups, group, bits };
            (floats, k.map(into_contiguous), v.map(into_contiguous), geometry, (true, key_channels))
        }
    };
    let Geometry { kv_heads, block_size, words, k_words, groups, group, bits } = geometry;
    let (quantized, key_channels) = flags;
    let [k_cache, v_cache] = floats;
    let Plan { cfg, parts, cubes } =
        plan(&client, tokens, heads, kv_heads, head_dim, width, max_blocks * block_size, quantized, key_channels);
    let (partial, stats) = if cfg.partitioned {
        (
            placeholder(DType::F32, tokens * heads * parts * head_dim),
            placeholder(DType::F32, tokens * heads * parts * 2),
        )
    } else {
        (placeholder(DType::F32, width), placeholder(DType::F32, 1))
    };
    let cube_dim = CubeDim::new_1d(cfg.threads as u32);
    let cube_count = calculate_cube_count_elemwise(&client, cubes * cfg.threads, cube_dim);
    let dtype = dtype_to_storage_type(q.dtype);
    // SAFETY: every index the kernel reads was validated by the public wrappers (block ids in
    // the cache, table rows, context lengths within the table, shapes), cubes past `cubes`
    // return at once, and the operands not read are never indexed (comptime branches).
    unsafe {
        paged_attention_v2_kernel::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            width,
            q.into_tensor_arg(),
            k_cache.into_tensor_arg(),
            v_cache.into_tensor_arg(),
            k_codes.into_tensor_arg(),
            k_scale.into_tensor_arg(),
            k_min.into_tensor_arg(),
            v_codes.into_tensor_arg(),
            v_scale.into_tensor_arg(),
            v_min.into_tensor_arg(),
            block_tables.into_tensor_arg(),
            query_seq.into_tensor_arg(),
            context_lens.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            scale,
            heads,
            kv_heads,
            block_size,
            max_blocks,
            parts,
            cubes,
            words,
            k_words,
            groups,
            group,
            bits,
            cfg,
            dtype,
        );
    }
    if cfg.partitioned {
        let rows = tokens * heads;
        let threads = cfg.vec_dims.next_power_of_two().clamp(32, cfg.threads);
        let cube_dim = CubeDim::new_1d(threads as u32);
        let cube_count = calculate_cube_count_elemwise(&client, rows * threads, cube_dim);
        // SAFETY: as above; partitions read are those before the context's end, all written.
        unsafe {
            paged_attention_merge_kernel::launch_unchecked(
                &client,
                cube_count,
                cube_dim,
                width,
                partial.into_tensor_arg(),
                stats.into_tensor_arg(),
                context_lens.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                heads,
                parts,
                rows,
                cfg.vec_dims,
                threads,
                dtype,
            );
        }
    }
    out
}
