//! The matrix-vector kernels on the GPU under test (wgpu on lavapipe here, whose Vulkan driver
//! has no plane operations: these tests run the shared-memory reductions; the `plane_sum` path
//! runs only on a GPU) equal a plain `f32` product on Flex, for `m` across the row buckets, `k`
//! and `n` that are not multiples of the vector width or of a workgroup, `k` long enough to be
//! split across workgroups, `f32` and `f16`, both weight layouts, dense and 4/8-bit quantized.

use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use crate::quant::{GroupQuantized, QuantSpec, dequantize, qmatmul, qmatmul_transposed, quantize};
use crate::test_devices::gpu_device;

/// Input rows: one per row bucket, odd counts and both ends.
const ROWS: [usize; 6] = [1, 2, 5, 8, 17, 32];

fn values(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32).into_data().try_into_vec_as::<f32>().unwrap()
}

fn random(rng: &mut impl Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// `x · w` in `f32` on Flex from host values (`w` `[k, n]`).
fn reference(x: &[f32], w: &[f32], [m, k, n]: [usize; 3]) -> Vec<f32> {
    let cpu = Device::flex();
    let x = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [m, k]), &cpu);
    let w = Tensor::<2>::from_data(TensorData::new(w.to_vec(), [k, n]), &cpu);
    values(x.matmul(w))
}

/// Values rounded to `dtype` and back, so that a reference sees the GPU's inputs.
fn rounded(v: &[f32], dtype: DType) -> Vec<f32> {
    let t = Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &Device::flex());
    t.cast(dtype).cast(DType::F32).into_data().try_into_vec_as::<f32>().unwrap()
}

/// Every value within `tolerance · max(1, largest reference value)`.
fn assert_close(found: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(found.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    for (idx, (a, b)) in found.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tolerance * scale,
            "{what}: element {idx}: {a} vs {b} (tolerance {tolerance} × {scale})"
        );
    }
}

/// Relative tolerance of a result stored in `dtype` (accumulated in `f32` either way).
fn tolerance(dtype: DType) -> f32 {
    if dtype == DType::F16 { 2e-3 } else { 2e-5 }
}

/// `[m, k] × [k, n]` shapes: vector widths 4, 2 and 1 along `n` or `k`, a single column, `k`
/// split across workgroups (long `k`, few columns), more columns than one workgroup covers.
fn dense_shapes(m: usize) -> Vec<[usize; 3]> {
    vec![[m, 64, 128], [m, 33, 30], [m, 17, 7], [m, 1000, 1], [m, 2051, 68], [m, 96, 1030]]
}

/// Dense `[k, n]` weights (a `Linear`'s) through [`crate::matmul`] on the GPU, and the same
/// values as the transposed view of an `[n, k]` table (a tied LM head), read in place.
#[test]
fn dense_products_equal_f32_reference() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(33);
    for dtype in [DType::F32, DType::F16] {
        if !gpu.supports_dtype(dtype) {
            continue;
        }
        for m in ROWS {
            for [m, k, n] in dense_shapes(m) {
                let (x, w) = (rounded(&random(&mut rng, m * k), dtype), rounded(&random(&mut rng, k * n), dtype));
                let want = reference(&x, &w, [m, k, n]);
                let what = format!("{dtype:?} [{m}, {k}] × [{k}, {n}]");
                let xs = Tensor::<2>::from_data(TensorData::new(x, [m, k]), (&gpu, dtype));
                let ws = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), (&gpu, dtype));
                assert!(super::applies(&xs, &ws), "{what}: not sent to the matrix-vector kernels");
                assert_close(&values(crate::matmul(xs.clone(), ws)), &want, tolerance(dtype), &what);

                let table: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
                let table = Tensor::<2>::from_data(TensorData::new(table, [n, k]), (&gpu, dtype));
                let found = values(crate::matmul(xs, table.transpose()));
                assert_close(&found, &want, tolerance(dtype), &format!("{what}, transposed table"));
            }
        }
    }
}

/// A weight that is neither contiguous nor a transposed contiguous tensor (a column slice) is
/// copied to contiguous first; rows above `MATVEC_MAX_ROWS` keep Burn's matmul.
#[test]
fn other_views_and_larger_m_are_correct() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
    let (k, n, wide) = (40, 12, 20);
    let w = random(&mut rng, k * wide);
    let full = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, wide]), &gpu);
    let sliced: Vec<f32> = (0..k * n).map(|i| w[(i / n) * wide + i % n]).collect();
    for m in [3, super::MATVEC_MAX_ROWS + 1] {
        let x = random(&mut rng, m * k);
        let xs = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &gpu);
        let found = values(crate::matmul(xs, full.clone().slice([0..k, 0..n])));
        assert_close(&found, &reference(&x, &sliced, [m, k, n]), 2e-5, &format!("m = {m}, sliced weight"));
    }
}

/// Split sums are added in a fixed order: the same product twice gives the same bits.
#[test]
fn split_products_are_deterministic() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(35);
    let (m, k, n) = (3, 4096, 8);
    let x = Tensor::<2>::from_data(TensorData::new(random(&mut rng, m * k), [m, k]), &gpu);
    let w = Tensor::<2>::from_data(TensorData::new(random(&mut rng, k * n), [k, n]), &gpu);
    let bits = |t: Tensor<2>| values(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(crate::matmul(x.clone(), w.clone())), bits(crate::matmul(x, w)));
}

/// `W` quantized on Flex, moved to the GPU with its scales in `dtype`; the reference multiplies
/// by the dequantized weight (the same rounded scales) in `f32`.
fn quantized_case(
    rng: &mut impl Rng,
    [m, k, n]: [usize; 3],
    spec: QuantSpec,
    transposed: bool,
    dtype: DType,
    gpu: &Device,
) -> (Vec<f32>, Vec<f32>) {
    let cpu = Device::flex();
    let shape = if transposed { [n, k] } else { [k, n] };
    let w = Tensor::<2>::from_data(TensorData::new(random(rng, k * n), shape), &cpu);
    let q = quantize(w, spec).unwrap();
    let q =
        GroupQuantized { scale: q.scale.cast(dtype).cast(DType::F32), min: q.min.cast(dtype).cast(DType::F32), ..q };
    let dense = dequantize(&q);
    let dense = values(if transposed { dense.transpose() } else { dense });
    let x = rounded(&random(rng, m * k), dtype);
    let want = reference(&x, &dense, [m, k, n]);
    let on_gpu = GroupQuantized {
        codes: q.codes.to_device(gpu),
        scale: q.scale.to_device(gpu).cast(dtype),
        min: q.min.to_device(gpu).cast(dtype),
        ..q
    };
    let xs = Tensor::<2>::from_data(TensorData::new(x, [m, k]), (gpu, dtype));
    let out = if transposed { qmatmul_transposed(xs, &on_gpu) } else { qmatmul(xs, &on_gpu) };
    (values(out.unwrap()), want)
}

/// Both quantized layouts, 4 and 8 bits, several group sizes, `f32` and `f16`, every row bucket
/// and one `m` above `MATVEC_MAX_ROWS` (the per-output kernel).
#[test]
fn quantized_products_equal_f32_reference() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(36);
    for dtype in [DType::F32, DType::F16] {
        if !gpu.supports_dtype(dtype) {
            continue;
        }
        for m in ROWS.into_iter().chain([super::MATVEC_MAX_ROWS + 1]) {
            // (k, n, bits, group): quantized axis a whole number of groups; `n` or `k` odd
            // multiples of the word, `k` long enough to split (FlexGen) or many words a lane.
            for (k, n, bits, group) in [(64, 128, 4, 64), (40, 24, 8, 8), (1032, 72, 4, 8), (120, 1000, 8, 40)] {
                for transposed in [false, true] {
                    let spec = QuantSpec::new(bits, group, 1).unwrap();
                    let (found, want) = quantized_case(&mut rng, [m, k, n], spec, transposed, dtype, &gpu);
                    let what = format!("{dtype:?} m = {m}, k = {k}, n = {n}, {spec}, transposed {transposed}");
                    assert_close(&found, &want, tolerance(dtype) * 2.0, &what);
                }
            }
        }
    }
}
