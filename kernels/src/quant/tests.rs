//! Round trips within half a quantization step, GPU kernels equal to their Flex twins, and
//! argument checks. Shapes, group sizes, bit widths and axes are drawn at random (seeded).

use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::*;
use crate::test_devices::devices;
#[cfg(feature = "wgpu")]
use crate::test_devices::wgpu_device;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

/// A random case: a 3-D shape whose `axis` holds whole groups, and data with some constant groups.
fn case(rng: &mut impl Rng) -> ([usize; 3], QuantSpec, Vec<f32>) {
    let bits = if rng.random_bool(0.5) { 4 } else { 8 };
    let per = 32 / bits as usize;
    let group = per * rng.random_range(1..=8);
    let axis = rng.random_range(0..3);
    let mut shape = [rng.random_range(1..4), rng.random_range(1..5), rng.random_range(1..4)];
    shape[axis] = group * rng.random_range(1..4);
    let n: usize = shape.iter().product();
    let spread = 10f32.powi(rng.random_range(-2..3));
    let constant = rng.random_bool(0.2);
    let data = (0..n).map(|_| if constant { 1.25 } else { (rng.random::<f32>() - 0.3) * spread }).collect();
    (shape, QuantSpec::new(bits, group, axis).unwrap(), data)
}

/// Each value is back within half a step of its group (plus float rounding).
#[test]
fn round_trip_error_is_at_most_half_a_step() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for device in devices() {
        for _ in 0..60 {
            let (shape, spec, data) = case(&mut rng);
            let x = Tensor::<3>::from_data(TensorData::new(data.clone(), shape), &device);
            let q = quantize(x, spec).unwrap();
            let back = values(dequantize(&q));
            // Step of each element's group: scale broadcast back through the same layout.
            let steps = q.scale.clone().reshape([q.scale.dims()[0], q.scale.dims()[1], 1]);
            let steps = steps
                .repeat_dim(2, spec.group_size())
                .reshape(moved_last(shape, spec.axis()))
                .swap_dims(spec.axis(), 2);
            let steps = values(steps);
            for ((x, y), step) in data.iter().zip(&back).zip(&steps) {
                let tolerance = step / 2.0 + 1e-5 * x.abs().max(1.0);
                assert!((x - y).abs() <= tolerance, "{shape:?} {spec:?}: {x} came back as {y} (step {step})");
            }
        }
    }
}

/// Constant groups (max = min) come back exactly.
#[test]
fn constant_groups_are_exact() {
    for device in devices() {
        let x = Tensor::<2>::from_data(TensorData::new(vec![-3.5f32; 4 * 64], [4, 64]), &device);
        let q = quantize(x, QuantSpec::new(4, 32, 1).unwrap()).unwrap();
        assert!(values(dequantize(&q)).iter().all(|&v| v == -3.5));
    }
}

/// The GPU kernels agree with the Flex twins: unpacking the same codes gives the same values, and
/// packing the same inputs gives the same codes except, rarely, at exact rounding ties.
#[cfg(feature = "wgpu")]
#[test]
fn cube_kernels_equal_flex_twins() {
    let Some(gpu) = wgpu_device() else { return };
    let cpu = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for _ in 0..30 {
        let (shape, spec, data) = case(&mut rng);
        let on = |d: &Device| quantize(Tensor::<3>::from_data(TensorData::new(data.clone(), shape), d), spec).unwrap();
        let (a, b) = (on(&cpu), on(&gpu));
        let codes = |q: &GroupQuantized<3>| q.codes.clone().into_data().try_into_vec_as::<u32>().unwrap();
        let (ca, cb) = (codes(&a), codes(&b));
        let differing = ca.iter().zip(&cb).filter(|(x, y)| x != y).count();
        assert!(differing * 100 <= ca.len().max(100), "{differing} of {} words differ", ca.len());

        let moved = GroupQuantized {
            codes: a.codes.clone().to_device(&gpu),
            scale: a.scale.clone().to_device(&gpu),
            min: a.min.clone().to_device(&gpu),
            ..a.clone()
        };
        let (va, vb) = (values(dequantize(&a)), values(dequantize(&moved)));
        for (x, y) in va.iter().zip(&vb) {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
}

/// Bit widths and group sizes are checked when a spec is built, the axis and the axis length
/// against each tensor.
#[test]
fn bad_specs_are_errors() {
    assert_eq!(QuantSpec::new(3, 32, 1).unwrap_err(), KernelError::Bits(3));
    assert_eq!(QuantSpec::new(8, 6, 1).unwrap_err(), KernelError::GroupWords { group: 6, bits: 8, per_word: 4 });
    assert!(matches!(QuantSpec::new(4, 0, 1), Err(KernelError::GroupWords { group: 0, .. })));
    let x = Tensor::<2>::zeros([4, 48], &Device::flex());
    let spec = |bits, group, axis| QuantSpec::new(bits, group, axis).unwrap();
    assert!(matches!(quantize(x.clone(), spec(4, 32, 1)), Err(KernelError::GroupSize { group: 32, len: 48, .. })));
    assert!(matches!(quantize(x, spec(4, 8, 2)), Err(KernelError::Axis { axis: 2, rank: 2 })));
    assert_eq!(QuantSpec::flexgen(3), spec(4, 64, 3));
    assert_eq!(spec(8, 32, 0).along(1), spec(8, 32, 1));
}

/// The size the cost model prices per value is the size quantized tensors take.
#[test]
fn bytes_per_value_matches_storage_bytes() {
    for (bits, group) in [(4, 64), (8, 32), (4, 8)] {
        let spec = QuantSpec::new(bits, group, 0).unwrap();
        let values = 3 * group;
        assert_eq!(spec.storage_bytes(values) as f64, spec.bytes_per_value() * values as f64, "{spec}");
    }
    assert_eq!(QuantSpec::flexgen(0).bytes_per_value(), 0.625);
}

#[test]
fn four_bits_pack_eight_codes_a_word() {
    let x = Tensor::<2>::from_data(
        TensorData::new((0..64).map(|v| v as f32).collect::<Vec<_>>(), [1, 64]),
        &Device::flex(),
    );
    let q = quantize(x, QuantSpec::new(4, 64, 1).unwrap()).unwrap();
    assert_eq!(q.codes.dims(), [1, 8]);
    assert_eq!(q.scale.dims(), [1, 1]);
    assert_eq!(q.size_bytes(), 8 * 4 + 2 * 4);
}

/// The fused kernel equals dequantize + f32 matmul within 1e-4 relative, on every device, at
/// decode- and prefill-sized `m`.
#[test]
fn fused_qmatmul_equals_dequantize_then_matmul() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for device in devices() {
        for (m, k, n, bits, group) in
            [(1, 64, 128, 4, 64), (3, 96, 64, 8, 32), (8, 40, 256, 4, 32), (32, 17, 64, 8, 64)]
        {
            let w: Vec<f32> = (0..k * n).map(|_| rng.random::<f32>() - 0.5).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let w = Tensor::<2>::from_data(TensorData::new(w, [k, n]), &device);
            let x = Tensor::<2>::from_data(TensorData::new(x, [m, k]), &device);
            let q = quantize(w, QuantSpec::new(bits, group, 1).unwrap()).unwrap();
            let reference = values(x.clone().matmul(dequantize(&q)));
            assert_close(&values(qmatmul(x, &q).unwrap()), &reference, (m, k, n));
        }
    }
}

/// Within 1e-4 of the largest reference value (relative, at least absolute 1e-4).
fn assert_close(found: &[f32], reference: &[f32], case: (usize, usize, usize)) {
    assert_eq!(found.len(), reference.len());
    let scale = reference.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
    for (a, b) in found.iter().zip(reference) {
        assert!((a - b).abs() <= 1e-4 * scale.max(1.0), "(m, k, n) = {case:?}: {a} vs {b}");
    }
}

/// The transposed kernel (GGUF layout: `W` `[n, k]` grouped along `k`) equals dequantize +
/// `x · Wᵀ` on every device, including shapes whose rows do not fill a parallel task.
#[test]
fn fused_qmatmul_transposed_equals_dequantize_then_matmul() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    for device in devices() {
        for (m, k, n, bits, group) in [(1, 64, 40, 4, 32), (2, 96, 17, 8, 32), (16, 128, 33, 4, 64), (33, 64, 8, 8, 4)]
        {
            let w: Vec<f32> = (0..k * n).map(|_| rng.random::<f32>() - 0.5).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let w = Tensor::<2>::from_data(TensorData::new(w, [n, k]), &device);
            let x = Tensor::<2>::from_data(TensorData::new(x, [m, k]), &device);
            let q = quantize(w, QuantSpec::new(bits, group, 1).unwrap()).unwrap();
            let reference = values(x.clone().matmul(dequantize(&q).transpose()));
            assert_close(&values(qmatmul_transposed(x, &q).unwrap()), &reference, (m, k, n));
        }
    }
}

/// Host buffers become the same quantized tensor as quantizing on the device; wrong lengths are
/// an error; selected rows dequantize to the selected rows.
#[test]
fn host_buffers_and_row_selection() {
    for device in devices() {
        let data: Vec<f32> = (0..4 * 64).map(|v| ((v * 37) % 23) as f32 - 11.0).collect();
        let x = Tensor::<2>::from_data(TensorData::new(data.clone(), [4, 64]), &device);
        let spec = QuantSpec::new(4, 32, 1).unwrap();
        let q = quantize(x, spec).unwrap();
        let codes = q.codes.clone().into_data().try_into_vec_as::<u32>().unwrap();
        let (scale, min) = (values(q.scale.clone()), values(q.min.clone()));
        let rebuilt =
            GroupQuantized::from_host(codes.clone(), scale.clone(), min.clone(), [4, 64], spec, &device).unwrap();
        assert_eq!(values(dequantize(&rebuilt)), values(dequantize(&q)));
        let short = GroupQuantized::<2>::from_host(codes[1..].to_vec(), scale, min, [4, 64], spec, &device);
        assert!(matches!(short, Err(KernelError::HostBuffers { .. })));

        let index = Tensor::<1, Int>::from_data(TensorData::new(vec![2i64, 0, 2], [3]), &device);
        let rows = values(dequantize(&q.select_rows(index)));
        let all = values(dequantize(&q));
        assert_eq!(rows, [&all[128..192], &all[0..64], &all[128..192]].concat());
    }
}

#[test]
fn qmatmul_checks_the_layout() {
    let w = Tensor::<2>::zeros([64, 32], &Device::flex());
    let q = quantize(w, QuantSpec::new(4, 32, 0).unwrap()).unwrap();
    let x = Tensor::<2>::zeros([1, 64], &Device::flex());
    assert!(qmatmul(x.clone(), &q).is_err());
    assert!(qmatmul_transposed(x, &q).is_err());
}
