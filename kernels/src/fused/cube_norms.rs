//! The CubeCL kernel of the QK-norm Gemma 3 and Qwen3 add to a decoder layer, fused with the RoPE
//! after it. Every normalized value is rounded to the storage dtype where the unfused path stores
//! it, so the kernel computes what the separate ops did. (Their post-norms with the residual add
//! are forms of the one row-norm kernel, `cube_row_norm.rs`.)

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use cubecl::prelude::*;

use super::cube::{MAX_THREADS, cube_sum, cubes_of, empty_like};

/// `x` rounded to `F` and back: the value an unfused op would have stored.
#[cube]
fn rounded<F: Float>(x: f32) -> f32 {
    f32::cast_from(F::cast_from(x))
}

/// `super::cube`'s RoPE kernel with each head first RMS-normalized over its `d` values (QK-norm:
/// Gemma 3, Qwen3) by `q_gamma` or `k_gamma` (`[d]`): one cube per (token, head) whose units
/// (`threads`, a power of two) sum the head's squares in shared memory, then scale and rotate
/// their pairs.
#[cube(launch)]
// The defaults of the per-branch values are overwritten on both branches.
#[allow(clippy::too_many_arguments, unused_assignments)]
fn norm_rotate_half_qk_kernel<F: Float, G: Float, W: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    q_gamma: &Tensor<W>,
    k_gamma: &Tensor<W>,
    cos: &Tensor<G>,
    sin: &Tensor<G>,
    q_out: &mut Tensor<F>,
    k_out: &mut Tensor<F>,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    half: usize,
    total: usize,
    epsilon: f32,
    #[comptime] threads: usize,
    #[define(F, G, W)] _dtypes: [ElemType; 3],
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    let all_heads = heads + kv_heads;
    let token = cube / all_heads;
    let head = cube % all_heads;
    let b = token / seq;
    let s = token % seq;
    let angle = b * cos.stride(0) + s * cos.stride(1);
    let angle_sin = b * sin.stride(0) + s * sin.stride(1);
    let d = 2 * half;
    let is_q = head < heads;
    let mut at = 0usize;
    let mut step = 0usize;
    let mut out = 0usize;
    if is_q {
        at = b * q.stride(0) + s * q.stride(1) + head * q.stride(2);
        step = q.stride(3);
        out = (token * heads + head) * d;
    } else {
        let kv = head - heads;
        at = b * k.stride(0) + s * k.stride(1) + kv * k.stride(2);
        step = k.stride(3);
        out = (token * kv_heads + kv) * d;
    }
    let mut squares = f32::new(0.0);
    let mut j = UNIT_POS as usize;
    while j < half {
        let mut x1 = f32::new(0.0);
        let mut x2 = f32::new(0.0);
        if is_q {
            x1 = f32::cast_from(q[at + j * step]);
            x2 = f32::cast_from(q[at + (j + half) * step]);
        } else {
            x1 = f32::cast_from(k[at + j * step]);
            x2 = f32::cast_from(k[at + (j + half) * step]);
        }
        squares += x1 * x1 + x2 * x2;
        j += threads;
    }
    let total_squares = cube_sum(squares, threads);
    let inv = f32::new(1.0) / f32::sqrt(total_squares / f32::cast_from(d) + epsilon);
    let mut j = UNIT_POS as usize;
    while j < half {
        let c = f32::cast_from(cos[angle + j * cos.stride(3)]);
        let sn = f32::cast_from(sin[angle_sin + j * sin.stride(3)]);
        if is_q {
            let x1 = rounded::<F>(f32::cast_from(q[at + j * step]) * inv * f32::cast_from(q_gamma[j]));
            let x2 = rounded::<F>(f32::cast_from(q[at + (j + half) * step]) * inv * f32::cast_from(q_gamma[j + half]));
            q_out[out + j] = F::cast_from(x1 * c - x2 * sn);
            q_out[out + j + half] = F::cast_from(x2 * c + x1 * sn);
        } else {
            let x1 = rounded::<F>(f32::cast_from(k[at + j * step]) * inv * f32::cast_from(k_gamma[j]));
            let x2 = rounded::<F>(f32::cast_from(k[at + (j + half) * step]) * inv * f32::cast_from(k_gamma[j + half]));
            k_out[out + j] = F::cast_from(x1 * c - x2 * sn);
            k_out[out + j + half] = F::cast_from(x2 * c + x1 * sn);
        }
        j += threads;
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn norm_rotate_half_qk(
    q: FloatTensor<CubeBackend>,
    k: FloatTensor<CubeBackend>,
    q_gamma: FloatTensor<CubeBackend>,
    k_gamma: FloatTensor<CubeBackend>,
    cos: FloatTensor<CubeBackend>,
    sin: FloatTensor<CubeBackend>,
    epsilon: f32,
) -> (FloatTensor<CubeBackend>, FloatTensor<CubeBackend>) {
    let [b, s, heads, d] = q.shape().dims::<4>();
    let kv_heads = k.shape().dims::<4>()[2];
    let (q_out, k_out) = (empty_like(&q, q.shape()), empty_like(&k, k.shape()));
    let half = d / 2;
    let total = b * s * (heads + kv_heads);
    if total == 0 || half == 0 {
        return (q_out, k_out);
    }
    let (q_gamma, k_gamma) = (into_contiguous(q_gamma), into_contiguous(k_gamma));
    let client = q.client.clone();
    let threads = half.next_multiple_of(32).min(MAX_THREADS);
    let (count, dim) = cubes_of(&client, total, threads);
    let dtypes =
        [dtype_to_storage_type(q.dtype), dtype_to_storage_type(cos.dtype), dtype_to_storage_type(q_gamma.dtype)];
    norm_rotate_half_qk_kernel::launch(
        &client,
        count,
        dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        q_gamma.into_tensor_arg(),
        k_gamma.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        q_out.clone().into_tensor_arg(),
        k_out.clone().into_tensor_arg(),
        s,
        heads,
        kv_heads,
        half,
        total,
        epsilon,
        threads,
        dtypes,
    );
    (q_out, k_out)
}
