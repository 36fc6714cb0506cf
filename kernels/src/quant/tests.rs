//! Round trips within half a quantization step, GPU kernels equal to their Flex twins, and
//! argument checks. Shapes, group sizes, bit widths and axes are drawn at random (seeded).

use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::*;
use crate::test_devices::devices;
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
use crate::test_devices::gpu_device;

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
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn cube_kernels_equal_flex_twins() {
    let Some(gpu) = gpu_device() else { return };
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

/// The transposed kernel (GGUF layout: `W` `[n, k]` grouped along `k`) in exact precision equals
/// dequantize + `x · Wᵀ` on every device, including shapes whose rows do not fill a parallel task.
#[test]
fn fused_qmatmul_transposed_equals_dequantize_then_matmul() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    for device in devices() {
        // Groups of 16: the K-quants with sub-blocks of 16 (Q2_K, Q3_K, Q6_K) as repacked at load.
        let k_quants = [(3, 256, 9, 8, 16), (2, 96, 7, 4, 16)];
        for (m, k, n, bits, group) in [(1, 64, 40, 4, 32), (2, 96, 17, 8, 32), (16, 128, 33, 4, 64), (33, 64, 8, 8, 4)]
            .into_iter()
            .chain(k_quants)
        {
            let w: Vec<f32> = (0..k * n).map(|_| rng.random::<f32>() - 0.5).collect();
            let x: Vec<f32> = (0..m * k).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect();
            let w = Tensor::<2>::from_data(TensorData::new(w, [n, k]), &device);
            let x = Tensor::<2>::from_data(TensorData::new(x, [m, k]), &device);
            let q = quantize(w, QuantSpec::new(bits, group, 1).unwrap()).unwrap();
            let reference = values(x.clone().matmul(dequantize(&q).transpose()));
            let found = with_matmul_precision(MatmulPrecision::Exact, || qmatmul_transposed(x, &q).unwrap());
            assert_close(&values(found), &reference, (m, k, n));
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
        // These minimums are the groups' own, not `−8 · scale`: a symmetric spec refuses them.
        let symmetric = spec.with_symmetric_offset(8);
        let wrong =
            GroupQuantized::<2>::from_host(codes.clone(), scale.clone(), min.clone(), [4, 64], symmetric, &device);
        assert!(matches!(wrong, Err(KernelError::SymmetricMinimum { group: 0, offset: 8 })), "{wrong:?}");
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

/// Random codes, scales and minimums of a `[n, k]` GGUF-layout weight, and `[m, k]` input rows.
struct Int8Case {
    m: usize,
    k: usize,
    n: usize,
    bits: u32,
    group: usize,
    codes: Vec<u32>,
    scale: Vec<f32>,
    min: Vec<f32>,
    x: Vec<f32>,
}

impl Int8Case {
    fn new(rng: &mut impl Rng, (m, k, n, bits, group): (usize, usize, usize, u32, usize)) -> Self {
        let groups = n * k / group;
        Self {
            m,
            k,
            n,
            bits,
            group,
            codes: (0..n * k * bits as usize / 32).map(|_| rng.random()).collect(),
            scale: (0..groups).map(|_| rng.random::<f32>() * 0.02).collect(),
            min: (0..groups).map(|_| -rng.random::<f32>() * 0.1).collect(),
            x: (0..m * k)
                .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * if rng.random_bool(0.1) { 8.0 } else { 1.0 })
                .collect(),
        }
    }

    fn weights(&self) -> q8::Weights<'_> {
        let (codes, scale, min) = (&self.codes, &self.scale, &self.min);
        q8::Weights { codes, scale, min, bits: self.bits, group: self.group, symmetric_offset: 0 }
    }

    /// `out[i, j]` of the integer formula in `f64` from the quantized rows, and `Σ |terms|` (the
    /// scale of `f32` rounding error).
    fn reference(&self, a: &q8::QuantizedRows) -> (Vec<f64>, Vec<f64>) {
        let (per, groups, blocks) = (32 / self.bits as usize, self.k / self.group, self.k / q8::BLOCK);
        let block_words = q8::BLOCK / per;
        let (mut out, mut magnitude) = (vec![0f64; self.m * self.n], vec![0f64; self.m * self.n]);
        for i in 0..self.m {
            for j in 0..self.n {
                for b in 0..blocks {
                    let (q, d) = a.block(i, b);
                    let words = &self.codes[(j * blocks + b) * block_words..][..block_words];
                    let dot = q8::block_dot_scalar(words, &q, self.bits) as f64;
                    let qsum: f64 = q.iter().map(|&v| v as f64).sum();
                    let g = j * groups + b * q8::BLOCK / self.group;
                    let terms = [self.scale[g] as f64 * d as f64 * dot, self.min[g] as f64 * d as f64 * qsum];
                    out[i * self.n + j] += terms[0] + terms[1];
                    magnitude[i * self.n + j] += terms[0].abs() + terms[1].abs();
                }
            }
        }
        (out, magnitude)
    }
}

/// The plain-Rust integer product equals the `f64` integer formula within `f32` rounding, for both
/// code widths, groups of one, two and three blocks (pairs of blocks that straddle groups), odd
/// block counts, and weight row ranges that do not start at 0.
#[test]
fn int8_kernels_equal_the_integer_formula() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(22);
    let shapes = [(1, 32, 7, 4, 32), (2, 96, 9, 8, 32), (5, 128, 13, 4, 64), (7, 64, 3, 8, 64), (4, 576, 5, 4, 32)];
    // More weight rows than one chunk, more input rows than one tile.
    let shapes = shapes.into_iter().chain([(6, 64, 37, 4, 32), (9, 96, 40, 8, 32)]);
    for shape in shapes.chain([(3, 192, 5, 4, 96), (6, 96, 4, 8, 96)]) {
        let case = Int8Case::new(&mut rng, shape);
        let a = q8::QuantizedRows::new(&case.x, case.m, case.k, case.group, case.bits);
        let (reference, magnitude) = case.reference(&a);
        let rows = 1..case.n;
        let mut out = vec![f32::NAN; case.m * case.n];
        q8::weight_rows(&case.weights(), &a, rows.clone(), |i, j, v| out[i * case.n + j] = v);
        for i in 0..case.m {
            for j in rows.clone() {
                let (found, want) = (out[i * case.n + j] as f64, reference[i * case.n + j]);
                let tolerance = 1e-6 * magnitude[i * case.n + j] + 1e-9;
                assert!((found - want).abs() <= tolerance, "{shape:?} [{i}, {j}]: {found} vs {want}");
            }
        }
    }
}

/// The strip kernel (16 weight rows × up to 8 input rows; AVX-512 VNNI and AVX2, on every CPU that
/// has them) equals the `f64` integer formula within `f32` rounding for every `m` in 1..=9 and past
/// two tiles, 4- and 8-bit codes, odd block counts, groups of one and two blocks, weight-row ranges
/// that start off a strip boundary and end in a partial strip, code rows long enough for the
/// register transposition and with a tail past it; columns outside the range are left alone. Codes
/// at their largest against activation codes of ±127 (the AVX2 kernel's `i16` block sums at their
/// bound) are exact too. Every output is bit for bit the plain-Rust product's ([`q8::weight_rows`]:
/// the same float operations), on both instruction sets, for every `m`.
#[test]
fn int8_strip_kernel_equals_the_integer_formula() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(25);
    let shapes = [(96, 37, 4, 32), (576, 35, 4, 32), (128, 47, 8, 32), (192, 19, 8, 64), (160, 16, 4, 32)];
    for m in (1..=9).chain([16, 17]) {
        for (k, n, bits, group) in shapes {
            check_strips(&Int8Case::new(&mut rng, (m, k, n, bits, group)));
        }
    }
    for bits in [4, 8] {
        for sign in [1.0, -1.0] {
            let mut case = Int8Case::new(&mut rng, (5, 64, 20, bits, 32));
            case.codes.fill(u32::MAX);
            case.x.iter_mut().for_each(|x| *x = sign);
            check_strips(&case);
        }
    }
}

/// [`int8_strip_kernel_equals_the_integer_formula`] for one case, on every ISA with strips.
fn check_strips(case: &Int8Case) {
    let (m, k, n, bits, group) = (case.m, case.k, case.n, case.bits, case.group);
    let a = q8::QuantizedRows::new(&case.x, m, k, group, bits);
    let panel = q8::strips::Panel::new(&a);
    let (reference, magnitude) = case.reference(&a);
    let mut scalar = vec![f32::NAN; m * n];
    q8::weight_rows(&case.weights(), &a, 0..n, |i, j, v| scalar[i * n + j] = v);
    for isa in q8::Isa::available().into_iter().filter(|&isa| q8::strips::supports(isa, bits)) {
        for rows in [0..n, 3..n, 1..2] {
            let mut out = vec![f32::NAN; m * n];
            q8::strips::weight_rows(&case.weights(), &panel, rows.clone(), isa, |i, j0, v| {
                out[i * n + j0..][..v.len()].copy_from_slice(v)
            });
            for i in 0..m {
                for j in 0..n {
                    let (found, want) = (out[i * n + j] as f64, reference[i * n + j]);
                    if !rows.contains(&j) {
                        assert!(found.is_nan(), "[{i}, {j}] written outside {rows:?}");
                        continue;
                    }
                    let tolerance = 1e-6 * magnitude[i * n + j] + 1e-9;
                    let at = (isa, m, k, n, bits, group, &rows, i, j);
                    assert!((found - want).abs() <= tolerance, "{at:?}: {found} vs {want}");
                    assert_eq!(
                        found.to_bits(),
                        (scalar[i * n + j] as f64).to_bits(),
                        "{at:?}: not the scalar product's bits"
                    );
                }
            }
        }
    }
}

/// Activation quantization: `|x − d·q| ≤ d/2`, `d = max|x| / 127` (at `f16` precision) per block of 32,
/// `f16` rounding as the hardware rounds, zero blocks
/// give zero codes, and rows quantized in parts and concatenated equal rows quantized at once.
#[test]
fn int8_rows_round_within_half_a_step() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
    let case = Int8Case::new(&mut rng, (6, 64, 1, 8, 32));
    let mut x = case.x.clone();
    x[32..64].iter_mut().for_each(|v| *v = 0.0);
    let a = q8::QuantizedRows::new(&x, 6, 64, 32, 8);
    for (b, block) in x.chunks_exact(32).enumerate() {
        let (q, d) = a.block(b / 2, b % 2);
        let exact = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        assert!((d - exact).abs() <= exact / 2048.0, "scale {d} is {exact} at f16 precision");
        for (v, c) in block.iter().zip(q) {
            assert!((v - d * c as f32).abs() <= d / 2.0 * 1.002 + 127.0 * (d - exact).abs(), "{v} vs {c}·{d}");
        }
    }
    assert!(a.block(0, 1).0.iter().all(|&c| c == 0));
    // f16 values: 1 + 2^-10 is one, 1 + 2^-11 a tie (to even: 1), 2^-20 a subnormal step multiple.
    let one = 1.0 + 2f32.powi(-10);
    let cases = [
        (one, one),
        (1.0 + 2f32.powi(-11), 1.0),
        (one + 2f32.powi(-11), 1.0 + 2f32.powi(-9)),
        (2f32.powi(-20), 2f32.powi(-20)),
    ];
    for (x, rounded) in cases {
        let rows = q8::QuantizedRows::new(&[x * 127.0; 32], 1, 32, 32, 4);
        assert_eq!(rows.block(0, 0).1, rounded, "{x}");
    }
    let parts = q8::QuantizedRows::concat(vec![
        q8::QuantizedRows::new(&x[..128], 2, 64, 32, 8),
        q8::QuantizedRows::new(&x[128..], 4, 64, 32, 8),
    ]);
    assert_eq!(parts.rows(), 6);
    for i in 0..6 {
        assert_eq!(parts.block(i, 1), a.block(i, 1));
    }
}

/// The AVX2 activation quantizer gives the portable one's codes, scales and sums bit for bit:
/// rows of random values with spikes, all-zero blocks, exact ties (`x / d` at `n + ½`, rounded to
/// even), tiny values (subnormal `f16` scales), for 4- and 8-bit code orders, odd block counts
/// and groups of one to three blocks.
#[test]
fn int8_quantizer_simd_equals_portable() {
    if q8::Isa::best() == q8::Isa::Scalar {
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(24);
    for (m, k, group) in [(1, 576, 32), (3, 96, 32), (2, 192, 64), (5, 288, 96), (1, 32, 32), (33, 64, 32)] {
        for bits in [4, 8] {
            for round in 0..20 {
                let x: Vec<f32> = (0..m * k)
                    .map(|t| match round % 5 {
                        // Ties: amax 127 gives d = 1, so halves are exact ties.
                        0 if t % 32 == 0 => 127.0,
                        0 => (rng.random_range(-254..=254) as f32) / 2.0,
                        1 if (t / 32) % 3 == 0 => 0.0,
                        2 => (rng.random::<f32>() * 2.0 - 1.0) * 1e-6,
                        _ => (rng.random::<f32>() * 2.0 - 1.0) * if rng.random_bool(0.05) { 30.0 } else { 1.0 },
                    })
                    .collect();
                let portable = q8::QuantizedRows::new_with(&x, m, k, group, bits, false);
                let simd = q8::QuantizedRows::new_with(&x, m, k, group, bits, true);
                assert_eq!(simd, portable, "{m}×{k}, group {group}, {bits} bits, round {round}");
            }
        }
    }
}

/// The Flex op in its default precision runs the integer kernels, split across threads (decode:
/// one part per thread; prefill: row tiles and quantization in parallel), serially for small
/// products, and falls back to `f32` for groups that are not whole blocks of 32. Row counts are
/// not multiples of the thread count.
#[test]
fn int8_fused_qmatmul_transposed_on_flex() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(24);
    let device = Device::flex();
    // Decode-sized products split in two (row-by-row kernel: 1 row, 3 rows of 8-bit codes; strip
    // kernel: 2 and 9 rows of 4-bit codes, 12 of 8-bit codes), prefill-sized ones in rayon parts
    // (40 rows), serial small ones (either kernel).
    let shapes = [(1, 576, 999, 4, 32), (3, 96, 1001, 8, 32), (40, 256, 301, 4, 64), (2, 64, 5, 4, 32)];
    let strips = [(2, 576, 1001, 4, 32), (9, 576, 333, 4, 32), (12, 128, 700, 8, 32), (8, 128, 77, 8, 32)];
    for shape in shapes.into_iter().chain(strips).chain([(5, 96, 50, 4, 96), (33, 64, 40, 8, 32)]) {
        let case = Int8Case::new(&mut rng, shape);
        let (m, k, n) = (case.m, case.k, case.n);
        let groups = k / case.group;
        let w = GroupQuantized::from_host(
            case.codes.clone(),
            case.scale.clone(),
            case.min.clone(),
            [n, k],
            QuantSpec::new(case.bits, case.group, 1).unwrap(),
            &device,
        )
        .unwrap();
        assert_eq!(w.scale.dims(), [n, groups]);
        let x = Tensor::<2>::from_data(TensorData::new(case.x.clone(), [m, k]), &device);
        let found = values(with_matmul_precision(MatmulPrecision::Int8Activations, || {
            qmatmul_transposed(x.clone(), &w).unwrap()
        }));
        let a = q8::QuantizedRows::new(&case.x, m, k, case.group, case.bits);
        let (reference, magnitude) = case.reference(&a);
        for ((f, r), mag) in found.iter().zip(&reference).zip(&magnitude) {
            assert!((*f as f64 - r).abs() <= 1e-6 * mag + 1e-9, "{shape:?}: {f} vs {r}");
        }
        // Within the activations' rounding of the exact product.
        let exact = values(qmatmul_transposed_exact(x, &w));
        let scale = exact.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
        for (f, e) in found.iter().zip(&exact) {
            assert!((f - e).abs() <= 2e-2 * scale, "{shape:?}: int8 {f} vs exact {e}");
        }
    }
    // Groups of 8 codes are not whole activation blocks: the f32 path, equal to the exact one.
    let x = Tensor::<2>::from_data(TensorData::new(vec![0.5f32; 2 * 64], [2, 64]), &device);
    let w = quantize(Tensor::<2>::ones([3, 64], &device), QuantSpec::new(4, 8, 1).unwrap()).unwrap();
    assert_eq!(values(qmatmul_transposed(x.clone(), &w).unwrap()), values(qmatmul_transposed_exact(x, &w)));
}

fn qmatmul_transposed_exact(x: Tensor<2>, w: &GroupQuantized<2>) -> Tensor<2> {
    with_matmul_precision(MatmulPrecision::Exact, || qmatmul_transposed(x, w).unwrap())
}

/// The precision is a process-wide default with a per-thread override that is restored after.
#[test]
fn matmul_precision_override_is_scoped() {
    let outer = matmul_precision();
    let inner = with_matmul_precision(MatmulPrecision::Exact, || {
        std::thread::spawn(matmul_precision).join().map(|other| (matmul_precision(), other))
    });
    assert_eq!(inner.unwrap(), (MatmulPrecision::Exact, MatmulPrecision::Int8Activations));
    assert_eq!(matmul_precision(), outer);
}

/// Half-precision scales dequantize into half precision, and the fused products return the
/// input's dtype, equal to the `f32` computation rounded once (the twin and the GPU kernel
/// accumulate in `f32`), on every device that computes in the dtype.
#[test]
fn half_precision_in_and_out() {
    use burn::tensor::DType;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (k, n, m) = (64, 32, 3);
    let w: Vec<f32> = (0..k * n).map(|_| rng.random::<f32>() - 0.5).collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.random::<f32>() - 0.5).collect();
    for device in devices() {
        for dtype in [DType::F16, DType::BF16] {
            if !device.supports_dtype(dtype) {
                continue;
            }
            let eps = if dtype == DType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
            let spec = QuantSpec::new(8, 16, 1).unwrap();
            let q32 = quantize(Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &device), spec).unwrap();
            let q = GroupQuantized {
                scale: q32.scale.clone().cast(dtype),
                min: q32.min.clone().cast(dtype),
                ..q32.clone()
            };
            let dense = dequantize(&q);
            assert_eq!(dense.dtype(), dtype, "{device:?}");
            let want = values(dequantize(&q32));
            // Scale and minimum are rounded to the dtype: errors scale with the groups' range (±0.5).
            for (a, b) in values(dense.cast(DType::F32)).iter().zip(&want) {
                assert!((a - b).abs() <= 4.0 * eps * 0.5, "{device:?} {dtype:?}: {a} vs {b}");
            }
            let xs = Tensor::<2>::from_data(TensorData::new(x.clone(), [m, k]), &device);
            let out = qmatmul(xs.clone().cast(dtype), &q).unwrap();
            assert_eq!(out.dtype(), dtype);
            let want = values(qmatmul(xs, &q32).unwrap());
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in values(out.cast(DType::F32)).iter().zip(&want) {
                assert!((a - b).abs() <= 8.0 * eps * scale, "{device:?} {dtype:?}: {a} vs {b}");
            }
        }
    }
}
