//! CubeCL kernels of [`FusedOps`] for every GPU runtime (wgpu, Vulkan, CUDA, Metal): one launch
//! per op, computing in `f32` whatever the storage dtype.
//!
//! The row reductions (RMSNorm, in every form one kernel: `cube_row_norm.rs`) sum in shared
//! memory: no plane (subgroup) operations, so the same code runs where the runtime enables none
//! (wgpu on a CPU Vulkan device such as lavapipe, where the tests run).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::cube_row_norm::{RowNorm, row_norm};
use super::ops::{FusedOps, halved};

/// Most units one row's cube uses (wgpu guarantees 256 invocations per workgroup).
pub(super) const MAX_THREADS: usize = 256;

/// The sum of every unit's `value` over the cube (`threads` units), through shared memory; every
/// unit gets it. One barrier, then each unit adds the `threads` partial sums itself: a tree would
/// need a barrier inside a loop, which naga's uniformity check rejects.
#[cube]
pub(super) fn cube_sum(value: f32, #[comptime] threads: usize) -> f32 {
    let mut partial = Shared::<[f32]>::new_slice(threads);
    // Every unit is past any earlier sum's reads before this one's writes.
    sync_cube();
    partial[UNIT_POS as usize] = value;
    sync_cube();
    let mut total = f32::new(0.0);
    for i in 0..threads {
        total += partial[i];
    }
    total
}

/// One cube per (token, head) over the `heads` query heads then the `kv_heads` key heads of
/// `q`/`k` (`[b, s, heads, d]`, any strides): unit `i` rotates the pairs `(j, j + d/2)` with
/// `j ≡ i` mod `threads` into the contiguous `q_out`/`k_out`. `cos`/`sin` are `[b, s, 1, d/2]`,
/// any strides.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn rotate_half_qk_kernel<F: Float, G: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    cos: &Tensor<G>,
    sin: &Tensor<G>,
    q_out: &mut Tensor<F>,
    k_out: &mut Tensor<F>,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    half: usize,
    total: usize,
    #[comptime] threads: usize,
    #[define(F, G)] _dtypes: [ElemType; 2],
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
    let mut j = UNIT_POS as usize;
    if head < heads {
        let at = b * q.stride(0) + s * q.stride(1) + head * q.stride(2);
        let out = (token * heads + head) * d;
        while j < half {
            let c = f32::cast_from(cos[angle + j * cos.stride(3)]);
            let sn = f32::cast_from(sin[angle_sin + j * sin.stride(3)]);
            let x1 = f32::cast_from(q[at + j * q.stride(3)]);
            let x2 = f32::cast_from(q[at + (j + half) * q.stride(3)]);
            q_out[out + j] = F::cast_from(x1 * c - x2 * sn);
            q_out[out + j + half] = F::cast_from(x2 * c + x1 * sn);
            j += threads;
        }
    } else {
        let kv = head - heads;
        let at = b * k.stride(0) + s * k.stride(1) + kv * k.stride(2);
        let out = (token * kv_heads + kv) * d;
        while j < half {
            let c = f32::cast_from(cos[angle + j * cos.stride(3)]);
            let sn = f32::cast_from(sin[angle_sin + j * sin.stride(3)]);
            let x1 = f32::cast_from(k[at + j * k.stride(3)]);
            let x2 = f32::cast_from(k[at + (j + half) * k.stride(3)]);
            k_out[out + j] = F::cast_from(x1 * c - x2 * sn);
            k_out[out + j + half] = F::cast_from(x2 * c + x1 * sn);
            j += threads;
        }
    }
}

/// One unit per output value: `out[r, c] = act(gate_up[r, c]) · gate_up[r, width + c]`, `act`
/// SiLU (`gelu = false`) or GELU's tanh approximation, both as `x / (1 + e^(−z))` (`z = x` for
/// SiLU, `2·√(2/π)(x + 0.044715x³)` for GELU, since `½(1 + tanh(z/2)) = σ(z)`), as the Flex twin.
#[cube(launch)]
fn gated_mul_kernel<F: Float>(
    gate_up: &Tensor<F>,
    out: &mut Tensor<F>,
    width: usize,
    #[comptime] gelu: bool,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= out.len() {
        terminate!();
    }
    let row = idx / width;
    let col = idx % width;
    let x = f32::cast_from(gate_up[row * 2 * width + col]);
    let up = f32::cast_from(gate_up[row * 2 * width + width + col]);
    let mut z = x;
    if gelu {
        z = f32::new(2.0 * 0.797_884_6) * (x + f32::new(0.044_715) * x * x * x);
    }
    out[idx] = F::cast_from(x / (f32::new(1.0) + f32::exp(-z)) * up);
}

/// Units per row cube for rows of `width` values: a multiple of 32, at most [`MAX_THREADS`] and
/// the hardware's limit.
pub(super) fn row_threads(client: &cubecl::client::Client, width: usize) -> usize {
    let hardware = client.properties().hardware.max_units_per_cube as usize;
    width.next_multiple_of(32).clamp(32, MAX_THREADS.min(hardware.max(1)))
}

/// Launch geometry of `cubes` cubes of `threads` units (more cubes than one grid dimension holds
/// spill into the next; the kernels skip cubes past `cubes`).
pub(super) fn cubes_of(client: &cubecl::client::Client, cubes: usize, threads: usize) -> (CubeCount, CubeDim) {
    let cube_dim = CubeDim::new_1d(threads as u32);
    (calculate_cube_count_elemwise(client, cubes * threads, cube_dim), cube_dim)
}

/// A new contiguous tensor of `x`'s device and dtype.
pub(super) fn empty_like(x: &CubeTensor, shape: burn::tensor::Shape) -> CubeTensor {
    empty_device_dtype(x.client.clone(), x.device.clone(), shape, x.dtype)
}

impl FusedOps for CubeBackend {
    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self> {
        row_norm(RowNorm::Plain, x, None, (gamma, None), (epsilon, 0.0)).0
    }

    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        row_norm(RowNorm::AddBefore, x, Some(residual), (gamma, None), (epsilon, 0.0))
    }

    fn fused_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [b, s, heads, d] = q.shape().dims::<4>();
        let kv_heads = k.shape().dims::<4>()[2];
        let (q_out, k_out) = (empty_like(&q, q.shape()), empty_like(&k, k.shape()));
        let half = d / 2;
        let total = b * s * (heads + kv_heads);
        if total == 0 || half == 0 {
            return (q_out, k_out);
        }
        let client = q.client.clone();
        let threads = half.next_multiple_of(32).min(MAX_THREADS);
        let (count, dim) = cubes_of(&client, total, threads);
        let dtypes = [dtype_to_storage_type(q.dtype), dtype_to_storage_type(cos.dtype)];
        rotate_half_qk_kernel::launch(
            &client,
            count,
            dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            cos.into_tensor_arg(),
            sin.into_tensor_arg(),
            q_out.clone().into_tensor_arg(),
            k_out.clone().into_tensor_arg(),
            s,
            heads,
            kv_heads,
            half,
            total,
            threads,
            dtypes,
        );
        (q_out, k_out)
    }

    fn fused_gated_mul(gate_up: FloatTensor<Self>, act: u32) -> FloatTensor<Self> {
        let gate_up = into_contiguous(gate_up);
        let shape = halved(&gate_up.shape());
        let width = shape[shape.num_dims() - 1];
        let out = empty_like(&gate_up, shape.clone());
        let n = shape.num_elements();
        if n == 0 {
            return out;
        }
        let client = gate_up.client.clone();
        let dim = CubeDim::new(&client, n);
        let count = calculate_cube_count_elemwise(&client, n, dim);
        let dtype = dtype_to_storage_type(gate_up.dtype);
        gated_mul_kernel::launch(
            &client,
            count,
            dim,
            gate_up.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            width,
            act == super::Gate::GeluTanh.code(),
            dtype,
        );
        out
    }

    fn fused_rms_norm_add(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        row_norm(RowNorm::AddAfter, x, Some(residual), (gamma, None), (epsilon, 0.0)).0
    }

    fn fused_norm_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma_first: FloatTensor<Self>,
        gamma_second: FloatTensor<Self>,
        epsilon_first: f32,
        epsilon_second: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let gammas = (gamma_first, Some(gamma_second));
        row_norm(RowNorm::AddBetween, x, Some(residual), gammas, (epsilon_first, epsilon_second))
    }

    fn fused_norm_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        q_gamma: FloatTensor<Self>,
        k_gamma: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        super::cube_norms::norm_rotate_half_qk(q, k, q_gamma, k_gamma, cos, sin, epsilon)
    }

    fn fused_prefix_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        len: usize,
        scale: f32,
    ) -> FloatTensor<Self> {
        super::cube_attention::prefix_attention(q, k, v, bias, len, scale)
    }
}
