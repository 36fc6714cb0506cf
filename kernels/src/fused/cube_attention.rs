//! The CubeCL kernel of [`FusedOps::fused_prefix_attention`]: masked attention of a few queries
//! over the first `len` slots of a contiguous KV cache in one launch, where Burn's ops take a
//! matmul, a cast, a bias add, a softmax (two reductions and three elementwise passes), another
//! cast and a second matmul.
//!
//! One cube per (sequence, query position, head), as the PagedAttention kernel
//! (`crate::paged::cube`): keys in tiles of `threads`, unit `i` scoring key `tile + i` into shared
//! memory, an online softmax, and each unit accumulating the output dims it owns. Sums in `f32`.
//! Prefill-sized steps go to the flash-attention kernel (`cube_flash.rs`) instead.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::attention::GPU_MAX_QUERIES;
use super::cube_flash::{flash_attention, flash_plan};

/// Most units one cube uses (wgpu guarantees 256 invocations per workgroup).
const MAX_THREADS: usize = 256;

/// Strides of a `[b, 1, s, t]` bias, with `0` along its size-1 (broadcast) axes.
pub(super) fn broadcast_strides(t: &burn_cubecl::tensor::CubeTensor) -> [usize; 4] {
    let (shape, strides) = (t.shape(), t.meta.strides());
    std::array::from_fn(|i| if shape[i] == 1 { 0 } else { strides[i] })
}

/// `out[b, s, h, :] = softmax(q[b, h, s] · K[b, h / group, :len]ᵀ · scale + bias[b, 0, s, :len]) ·
/// V[b, h / group, :len]`, all inputs read through their strides (the bias's passed as scalars,
/// `0` on its broadcast axes), `out` contiguous `[b, s, heads, d]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn prefix_attention_kernel<F: Float, G: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    bias: &Tensor<G>,
    out: &mut Tensor<F>,
    bias_sb: usize,
    bias_ss: usize,
    bias_st: usize,
    seq: usize,
    heads: usize,
    group: usize,
    len: usize,
    scale: f32,
    total: usize,
    #[comptime] head_dim: usize,
    #[comptime] threads: usize,
    #[comptime] dims_per_thread: usize,
    #[define(F, G)] _dtypes: [ElemType; 2],
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    // Cube order matches `out`'s rows: (b, s, head).
    let head = cube % heads;
    let si = (cube / heads) % seq;
    let b = cube / (heads * seq);
    let kv = head / group;
    let unit = UNIT_POS as usize;
    let q_base = b * q.stride(0) + head * q.stride(1) + si * q.stride(2);
    let k_base = b * k.stride(0) + kv * k.stride(1);
    let v_base = b * v.stride(0) + kv * v.stride(1);
    let bias_base = b * bias_sb + si * bias_ss;
    let q_d = q.stride(3);
    let k_t = k.stride(2);
    let k_d = k.stride(3);
    let v_t = v.stride(2);
    let v_d = v.stride(3);

    let mut q_shared = Shared::<[f32]>::new_slice(head_dim);
    let mut scores = Shared::<[f32]>::new_slice(threads);
    let mut probs = Shared::<[f32]>::new_slice(threads);
    let mut d = unit;
    while d < head_dim {
        q_shared[d] = f32::cast_from(q[q_base + d * q_d]) * scale;
        d += threads;
    }
    sync_cube();

    let mut acc = Array::<f32>::new(dims_per_thread);
    #[unroll]
    for i in 0..dims_per_thread {
        acc[i] = f32::new(0.0);
    }
    // Finite "minus infinity": WGSL has no infinite literals, and exp(−3e38 − m) is 0 anyway.
    let mut running_max = f32::new(-3.0e38);
    let mut running_sum = f32::new(0.0);
    let mut start = 0usize;
    while start < len {
        let mut valid = len - start;
        if valid > threads {
            valid = threads;
        }
        if unit < valid {
            let t = start + unit;
            let key = k_base + t * k_t;
            let mut s = f32::new(0.0);
            for i in 0..head_dim {
                s += q_shared[i] * f32::cast_from(k[key + i * k_d]);
            }
            scores[unit] = s + f32::cast_from(bias[bias_base + t * bias_st]);
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
        for i in 0..dims_per_thread {
            acc[i] *= correction;
        }
        for i in 0..valid {
            let value = v_base + (start + i) * v_t;
            let p = probs[i];
            running_sum += p;
            #[unroll]
            for j in 0..dims_per_thread {
                let d = unit + j * threads;
                if d < head_dim {
                    acc[j] += p * f32::cast_from(v[value + d * v_d]);
                }
            }
        }
        running_max = tile_max;
        start += threads;
    }
    let base = cube * head_dim;
    #[unroll]
    for j in 0..dims_per_thread {
        let d = unit + j * threads;
        if d < head_dim {
            let mut o = f32::new(0.0);
            if running_sum > f32::new(0.0) {
                o = acc[j] / running_sum;
            }
            out[base + d] = F::cast_from(o);
        }
    }
}

/// [`FusedOps::fused_prefix_attention`] on a CubeCL backend: the flash-attention kernel
/// (`cube_flash.rs`) for steps of more than [`GPU_MAX_QUERIES`] query rows where its tiles fit the
/// device, this module's kernel otherwise. Returns `[b, s, heads, d]`.
pub(super) fn prefix_attention(
    q: FloatTensor<CubeBackend>,
    k: FloatTensor<CubeBackend>,
    v: FloatTensor<CubeBackend>,
    bias: FloatTensor<CubeBackend>,
    len: usize,
    scale: f32,
) -> FloatTensor<CubeBackend> {
    if q.shape()[2] > GPU_MAX_QUERIES
        && let Some(plan) = flash_plan(&q, &k, &v)
    {
        return flash_attention(q, k, v, bias, len, scale, plan);
    }
    let [b, heads, s, d] = q.shape().dims::<4>();
    let kv_heads = k.shape().dims::<4>()[1];
    let out = empty_device_dtype(q.client.clone(), q.device.clone(), Shape::new([b, s, heads, d]), q.dtype);
    let total = b * s * heads;
    if total == 0 || d == 0 {
        return out;
    }
    let client = q.client.clone();
    let hardware = client.properties().hardware.max_units_per_cube as usize;
    let threads = d.next_multiple_of(32).clamp(32, MAX_THREADS.min(hardware.max(1)));
    let cube_dim = CubeDim::new_1d(threads as u32);
    let cube_count = calculate_cube_count_elemwise(&client, total * threads, cube_dim);
    let [bias_sb, _, bias_ss, bias_st] = broadcast_strides(&bias);
    let dtypes = [dtype_to_storage_type(q.dtype), dtype_to_storage_type(bias.dtype)];
    prefix_attention_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        bias_sb,
        bias_ss,
        bias_st,
        s,
        heads,
        heads / kv_heads,
        len,
        scale,
        total,
        d,
        threads,
        d.div_ceil(threads),
        dtypes,
    );
    out
}
