//! The Flex twin of [`FusedOps`]: the row loops the public wrappers run on Flex (`normalize`,
//! `rotate`, the gated products), over inputs of any float dtype (converted to `f32` and back).
//! The wrappers call the loops directly for `f32` Flex tensors; this twin is what a Flex device
//! reaches otherwise (other dtypes, a remote server over Flex devices).

use burn::backend::Flex;
use burn::backend::TensorMetadata;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorData};

use super::activation::{gelu_tanh_mul_rows, silu_mul_rows};
use super::attention::flex_attention;
use super::norm::normalize;
use super::ops::{FusedOps, halved};
use super::rope::rotate;

/// The values of `t` in `f32`, row-major, with its shape and dtype.
fn values(t: FlexTensor) -> (Vec<f32>, Shape, DType) {
    let (shape, dtype) = (t.shape(), t.dtype());
    let values = t.into_data().convert::<f32>().try_into_vec::<f32>().expect("converted to f32");
    (values, shape, dtype)
}

/// A Flex tensor of `shape` holding `values` in `dtype`.
fn tensor(values: Vec<f32>, shape: Shape, dtype: DType) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape).convert_dtype(dtype))
}

/// `values` rounded to `dtype` (as stored there) and back to `f32`.
fn rounded(values: Vec<f32>, shape: &Shape, dtype: DType) -> Vec<f32> {
    self::values(tensor(values, shape.clone(), dtype)).0
}

/// `x`'s rows (of `gamma.len()` values) normalized into a new vector.
fn normalize_rows(x: &[f32], gamma: &[f32], epsilon: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    if !gamma.is_empty() {
        for (row, o) in x.chunks_exact(gamma.len()).zip(out.chunks_exact_mut(gamma.len())) {
            normalize(row, gamma, epsilon, o);
        }
    }
    out
}

/// Every head (`2 · half` values, `heads` a token) of `x` rotated in place by its token's
/// `cos`/`sin` (`half` values each).
fn rotate_heads(x: &mut [f32], heads: usize, half: usize, cos: &[f32], sin: &[f32]) {
    if half == 0 || heads == 0 {
        return;
    }
    for (token, (c, s)) in x.chunks_exact_mut(heads * 2 * half).zip(cos.chunks_exact(half).zip(sin.chunks_exact(half)))
    {
        for head in token.chunks_exact_mut(2 * half) {
            rotate(head, c, s);
        }
    }
}

impl FusedOps for Flex {
    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self> {
        let (x, shape, dtype) = values(x);
        let (gamma, _, _) = values(gamma);
        tensor(normalize_rows(&x, &gamma, epsilon), shape, dtype)
    }

    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, shape, dtype) = values(x);
        let (residual, _, _) = values(residual);
        let (gamma, _, _) = values(gamma);
        // The sum rounded to the storage dtype, as the GPU kernel (and an unfused add) sees it.
        let sum = values(tensor(x.iter().zip(&residual).map(|(a, b)| a + b).collect(), shape.clone(), dtype)).0;
        let out = normalize_rows(&sum, &gamma, epsilon);
        (tensor(out, shape.clone(), dtype), tensor(sum, shape, dtype))
    }

    fn fused_rms_norm_add(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        let (x, shape, dtype) = values(x);
        let (gamma, _, _) = values(gamma);
        let (residual, _, _) = values(residual);
        let normed = rounded(normalize_rows(&x, &gamma, epsilon), &shape, dtype);
        tensor(normed.iter().zip(&residual).map(|(a, b)| a + b).collect(), shape, dtype)
    }

    fn fused_norm_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma_first: FloatTensor<Self>,
        gamma_second: FloatTensor<Self>,
        epsilon_first: f32,
        epsilon_second: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (x, shape, dtype) = values(x);
        let (residual, _, _) = values(residual);
        let (first, second) = (values(gamma_first).0, values(gamma_second).0);
        let normed = rounded(normalize_rows(&x, &first, epsilon_first), &shape, dtype);
        let sum = rounded(normed.iter().zip(&residual).map(|(a, b)| a + b).collect(), &shape, dtype);
        let out = normalize_rows(&sum, &second, epsilon_second);
        (tensor(out, shape.clone(), dtype), tensor(sum, shape, dtype))
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
        let normed = |x: FlexTensor, gamma: FlexTensor| {
            let (x, shape, dtype) = values(x);
            let gamma = values(gamma).0;
            tensor(normalize_rows(&x, &gamma, epsilon), shape, dtype)
        };
        Self::fused_rotate_half_qk(normed(q, q_gamma), normed(k, k_gamma), cos, sin)
    }

    fn fused_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (heads, kv_heads, half) = (q.shape()[2], k.shape()[2], q.shape()[3] / 2);
        let (mut q, q_shape, dtype) = values(q);
        let (mut k, k_shape, _) = values(k);
        let (cos, sin) = (values(cos).0, values(sin).0);
        rotate_heads(&mut q, heads, half, &cos, &sin);
        rotate_heads(&mut k, kv_heads, half, &cos, &sin);
        (tensor(q, q_shape, dtype), tensor(k, k_shape, dtype))
    }

    fn fused_gated_mul(gate_up: FloatTensor<Self>, act: u32) -> FloatTensor<Self> {
        let (gate_up, shape, dtype) = values(gate_up);
        let shape = halved(&shape);
        let width = shape[shape.num_dims() - 1];
        let rows = if act == super::Gate::GeluTanh.code() { gelu_tanh_mul_rows } else { silu_mul_rows };
        let mut out = vec![0f32; shape.num_elements()];
        if width > 0 {
            for (o, row) in out.chunks_exact_mut(width).zip(gate_up.chunks_exact(2 * width)) {
                let (gate, up) = row.split_at(width);
                o.copy_from_slice(gate);
                rows(o, up);
            }
        }
        tensor(out, shape, dtype)
    }

    fn fused_prefix_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        len: usize,
        scale: f32,
    ) -> FloatTensor<Self> {
        let dtype = q.dtype();
        let f32_of = |t: FlexTensor| Tensor::<4>::from_primitive::<Flex>(t).cast(DType::F32);
        let out = flex_attention(f32_of(q), f32_of(k), f32_of(v), f32_of(bias), len, scale);
        // `[b, heads, s, d]` as a view of the `[b, s, heads, d]` buffer: that buffer, contiguous.
        let out = out.swap_dims(1, 2).cast(dtype);
        let out = out.try_into_primitive::<Flex>().expect("computed on Flex");
        if out.is_contiguous() { out } else { out.to_contiguous() }
    }
}
