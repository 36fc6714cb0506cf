//! Each CubeCL kernel of [`ops::FusedOps`] against its Flex twin, on the GPU device under test
//! (wgpu on lavapipe here): several shapes with odd widths, `f32` and `f16` storage, strided
//! inputs, and the degenerate shapes (one value, one row). The Flex side runs the same inputs,
//! rounded to the dtype under test, so both read identical values.

use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::*;
use crate::test_devices::gpu_device;

pub(super) fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().try_into_vec_as::<f32>().unwrap()
}

/// The same random values (rounded to `dtype`) on the GPU and on Flex.
pub(super) fn pair<const D: usize>(
    rng: &mut impl Rng,
    shape: [usize; D],
    dtype: DType,
    gpu: &Device,
) -> (Tensor<D>, Tensor<D>) {
    let n = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 4.0 - 2.0).collect();
    let flex = Tensor::<D>::from_data(TensorData::new(data, shape), &Device::flex()).cast(dtype).cast(DType::F32);
    let gpu = Tensor::<D>::from_data(flex.to_data(), gpu).cast(dtype);
    (gpu, flex)
}

/// Within `tolerance` relative to the magnitude (at least 1), and the same length.
pub(super) fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tolerance * e.abs().max(1.0), "{what}: element {i}: {g} vs {e}");
    }
}

/// `f32` kernels agree with the twin to rounding; `f16` ones to the storage precision.
pub(super) fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::F16 { 4e-3 } else { 1e-5 }
}

pub(super) const DTYPES: [DType; 2] = [DType::F32, DType::F16];

#[test]
fn rms_norm_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for dtype in DTYPES {
        for shape in [[1, 1, 1], [1, 1, 576], [3, 5, 40], [2, 7, 33], [1, 3, 1000], [2, 65, 257]] {
            let (x, x_flex) = pair(&mut rng, shape, dtype, &gpu);
            // Norm weights stay f32 (`models::precision`), whatever the activations' dtype.
            let (gamma, gamma_flex) = pair(&mut rng, [shape[2]], DType::F32, &gpu);
            let got = rms_norm(x, gamma, 1e-5);
            assert_eq!(got.dtype(), dtype);
            let expected = rms_norm(x_flex, gamma_flex, 1e-5);
            assert_close(&values(got), &values(expected), tolerance(dtype), &format!("{dtype:?} {shape:?}"));
        }
    }
}

#[test]
fn rms_norm_kernel_reads_strided_rows() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let (x, x_flex) = pair(&mut rng, [4, 3, 20], DType::F32, &gpu);
    let (gamma, gamma_flex) = pair(&mut rng, [3], DType::F32, &gpu);
    // Rows of 3 along a strided axis: the kernel's input is a transposed view.
    let got = rms_norm(x.swap_dims(1, 2), gamma, 1e-6);
    let expected = rms_norm(x_flex.swap_dims(1, 2), gamma_flex, 1e-6);
    assert_close(&values(got), &values(expected), 1e-5, "transposed rows");
}

#[test]
fn add_rms_norm_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    for dtype in DTYPES {
        for shape in [[1, 1, 1], [1, 1, 576], [2, 7, 33], [1, 4, 1001]] {
            let (x, x_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (r, r_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (gamma, gamma_flex) = pair(&mut rng, [shape[2]], DType::F32, &gpu);
            let (out, sum) = add_rms_norm(x, r, gamma, 1e-6);
            let (out_flex, sum_flex) = add_rms_norm(x_flex.cast(dtype), r_flex.cast(dtype), gamma_flex, 1e-6);
            let what = format!("{dtype:?} {shape:?}");
            assert_eq!((out.dtype(), sum.dtype()), (dtype, dtype), "{what}");
            // The sum is one rounding of the same two values on both sides: equal.
            assert_eq!(values(sum), values(sum_flex), "{what}: sum");
            assert_close(&values(out), &values(out_flex), tolerance(dtype), &format!("{what}: norm"));
        }
    }
}

#[test]
fn rotate_half_qk_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
    for dtype in DTYPES {
        // (batch, seq, heads, kv_heads, head_dim), with head dims past one cube's 256 units.
        for (b, s, h, kv, d) in
            [(1, 1, 1, 1, 2), (1, 1, 9, 3, 64), (2, 5, 4, 2, 30), (3, 2, 3, 3, 18), (1, 2, 2, 1, 640)]
        {
            let (q, q_flex) = pair(&mut rng, [b, s, h, d], dtype, &gpu);
            let (k, k_flex) = pair(&mut rng, [b, s, kv, d], dtype, &gpu);
            let (cos, cos_flex) = pair(&mut rng, [b, s, 1, d / 2], DType::F32, &gpu);
            let (sin, sin_flex) = pair(&mut rng, [b, s, 1, d / 2], DType::F32, &gpu);
            let (q_got, k_got) = rotate_half_qk(q, k, &cos, &sin);
            let (q_want, k_want) = rotate_half_qk(q_flex, k_flex, &cos_flex, &sin_flex);
            let what = format!("{dtype:?} {:?}", (b, s, h, kv, d));
            assert_eq!(q_got.dtype(), dtype, "{what}");
            assert_close(&values(q_got), &values(q_want), tolerance(dtype), &format!("{what}: q"));
            assert_close(&values(k_got), &values(k_want), tolerance(dtype), &format!("{what}: k"));
        }
    }
}

/// Queries and keys as views into one fused q|k|v output, cos/sin as views into a wider table
/// (Gemma's local and global RoPE): read through their strides.
#[test]
fn rotate_half_qk_kernel_reads_views() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    let (b, s, h, kv, d) = (2, 3, 4, 2, 10);
    let (qkv, qkv_flex) = pair(&mut rng, [b, s, (h + 2 * kv) * d], DType::F32, &gpu);
    let (table, table_flex) = pair(&mut rng, [b, s, 1, d], DType::F32, &gpu);
    let views = |qkv: Tensor<3>, table: Tensor<4>| {
        let q = qkv.clone().narrow(2, 0, h * d).reshape([b, s, h, d]);
        let k = qkv.narrow(2, h * d, kv * d).reshape([b, s, kv, d]);
        let (cos, sin) = (table.clone().narrow(3, d / 2, d / 2), table.narrow(3, 0, d / 2));
        rotate_half_qk(q, k, &cos, &sin)
    };
    let (q_got, k_got) = views(qkv, table);
    let (q_want, k_want) = views(qkv_flex, table_flex);
    assert_close(&values(q_got), &values(q_want), 1e-5, "q view");
    assert_close(&values(k_got), &values(k_want), 1e-5, "k view");
}

#[test]
fn gated_mul_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
    for dtype in DTYPES {
        for act in [Gate::Silu, Gate::GeluTanh] {
            for shape in [[1, 1, 2], [1, 1, 3072], [2, 7, 66], [3, 1, 1002]] {
                let (gate_up, gate_up_flex) = pair(&mut rng, shape, dtype, &gpu);
                let got = gated_mul_fused(act, gate_up);
                let expected = gated_mul_fused(act, gate_up_flex);
                let what = format!("{dtype:?} {act:?} {shape:?}");
                assert_eq!(got.dims(), [shape[0], shape[1], shape[2] / 2], "{what}");
                assert_eq!(got.dtype(), dtype, "{what}");
                assert_close(&values(got), &values(expected), tolerance(dtype), &what);
            }
        }
    }
}

#[test]
fn prefix_attention_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
    for dtype in DTYPES {
        // (batch, heads, kv_heads, queries, slots, len, head_dim, bias batch, bias rows).
        let cases = [
            (1, 1, 1, 1, 1, 1, 2, 1, 1),
            (1, 9, 3, 1, 40, 37, 64, 1, 1),
            (2, 4, 2, 3, 20, 20, 30, 2, 3),
            (3, 2, 1, 2, 300, 290, 18, 1, 2),
            (1, 2, 2, 16, 9, 9, 256, 1, 16),
        ];
        for (b, h, kv, s, slots, len, d, bb, bs) in cases {
            let (q, q_flex) = pair(&mut rng, [b, s, h, d], dtype, &gpu);
            let (k, k_flex) = pair(&mut rng, [b, kv, slots, d], dtype, &gpu);
            let (v, v_flex) = pair(&mut rng, [b, kv, slots, d], dtype, &gpu);
            let (bias, bias_flex) = pair(&mut rng, [bb, 1, bs, len], DType::F32, &gpu);
            let scale = 1.0 / (d as f32).sqrt();
            // Queries as the model passes them: a `[b, heads, s, d]` view of `[b, s, heads, d]`.
            let got = prefix_attention(q.swap_dims(1, 2), k, v, bias, len, scale);
            let flex = |t: Tensor<4>| t.cast(DType::F32);
            let expected =
                prefix_attention(flex(q_flex).swap_dims(1, 2), flex(k_flex), flex(v_flex), bias_flex, len, scale);
            let what = format!("{dtype:?} {:?}", (b, h, kv, s, slots, len, d, bb, bs));
            assert_eq!(got.dims(), [b, h, s, d], "{what}");
            assert_eq!(got.dtype(), dtype, "{what}");
            assert_close(&values(got), &values(expected), tolerance(dtype), &what);
        }
    }
}

/// Keys behind a large negative bias (a causal mask) get no weight, as in the twin.
#[test]
fn prefix_attention_kernel_masks() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(19);
    let (q, q_flex) = pair(&mut rng, [1, 2, 2, 8], DType::F32, &gpu);
    let (k, k_flex) = pair(&mut rng, [1, 2, 6, 8], DType::F32, &gpu);
    let (v, v_flex) = pair(&mut rng, [1, 2, 6, 8], DType::F32, &gpu);
    // Row 0 sees keys 0..3, row 1 sees keys 0..6.
    let mask: Vec<f32> = (0..2 * 6).map(|i| if i < 6 && i % 6 >= 3 { -1e30 } else { 0.0 }).collect();
    let bias = Tensor::<4>::from_data(TensorData::new(mask.clone(), [1, 1, 2, 6]), &gpu);
    let bias_flex = Tensor::<4>::from_data(TensorData::new(mask, [1, 1, 2, 6]), &Device::flex());
    let got = prefix_attention(q.swap_dims(1, 2), k, v, bias, 6, 0.3);
    let expected = prefix_attention(q_flex.swap_dims(1, 2), k_flex, v_flex, bias_flex, 6, 0.3);
    assert_close(&values(got), &values(expected), 1e-5, "masked keys");
}

#[test]
fn rms_norm_add_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20);
    for dtype in DTYPES {
        for shape in [[1, 1, 1], [1, 1, 640], [2, 7, 33], [1, 4, 1001]] {
            let (x, x_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (r, r_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (gamma, gamma_flex) = pair(&mut rng, [shape[2]], DType::F32, &gpu);
            let got = rms_norm_add(x, gamma, 1e-6, r);
            // The twin in the same dtype: the normalized value is rounded before the add.
            let expected = rms_norm_add(x_flex.cast(dtype), gamma_flex, 1e-6, r_flex.cast(dtype));
            let what = format!("{dtype:?} {shape:?}");
            assert_eq!(got.dtype(), dtype, "{what}");
            assert_close(&values(got), &values(expected), tolerance(dtype), &what);
        }
    }
}

#[test]
fn norm_add_norm_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    for dtype in DTYPES {
        for shape in [[1, 1, 1], [1, 1, 640], [2, 7, 33], [1, 4, 1001]] {
            let (x, x_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (r, r_flex) = pair(&mut rng, shape, dtype, &gpu);
            let (g1, g1_flex) = pair(&mut rng, [shape[2]], DType::F32, &gpu);
            let (g2, g2_flex) = pair(&mut rng, [shape[2]], DType::F32, &gpu);
            let (out, sum) = norm_add_norm(x, r, (g1, 1e-6), (g2, 1e-5));
            let (out_flex, sum_flex) =
                norm_add_norm(x_flex.cast(dtype), r_flex.cast(dtype), (g1_flex, 1e-6), (g2_flex, 1e-5));
            let what = format!("{dtype:?} {shape:?}");
            assert_eq!((out.dtype(), sum.dtype()), (dtype, dtype), "{what}");
            assert_close(&values(sum), &values(sum_flex), tolerance(dtype), &format!("{what}: sum"));
            assert_close(&values(out), &values(out_flex), tolerance(dtype), &format!("{what}: norm"));
        }
    }
}

#[test]
fn norm_rotate_half_qk_kernel_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(22);
    for dtype in DTYPES {
        for (b, s, h, kv, d) in [(1, 1, 1, 1, 2), (1, 1, 4, 1, 256), (2, 5, 4, 2, 30), (1, 2, 2, 1, 640)] {
            let (qkv, qkv_flex) = pair(&mut rng, [b, s, h + 2 * kv, d], dtype, &gpu);
            let (qg, qg_flex) = pair(&mut rng, [d], DType::F32, &gpu);
            let (kg, kg_flex) = pair(&mut rng, [d], DType::F32, &gpu);
            let (cos, cos_flex) = pair(&mut rng, [b, s, 1, d / 2], DType::F32, &gpu);
            let (sin, sin_flex) = pair(&mut rng, [b, s, 1, d / 2], DType::F32, &gpu);
            // Queries and keys as views of a fused q|k|v output, as the model passes them.
            let views = |t: Tensor<4>| (t.clone().narrow(2, 0, h), t.narrow(2, h, kv));
            let (q, k) = views(qkv);
            let (q_flex, k_flex) = views(qkv_flex);
            let (q_got, k_got) = norm_rotate_half_qk((q, qg), (k, kg), 1e-6, &cos, &sin);
            let (q_want, k_want) =
                norm_rotate_half_qk((q_flex, qg_flex), (k_flex, kg_flex), 1e-6, &cos_flex, &sin_flex);
            let what = format!("{dtype:?} {:?}", (b, s, h, kv, d));
            assert_eq!(q_got.dtype(), dtype, "{what}");
            assert_close(&values(q_got), &values(q_want), tolerance(dtype), &format!("{what}: q"));
            assert_close(&values(k_got), &values(k_want), tolerance(dtype), &format!("{what}: k"));
        }
    }
}
