//! Every instruction set against the scalar kernel, and the scalar kernel against the `f32`
//! product of the decoded weights.

use super::*;

/// Deterministic pseudo-random values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// A random `[n, k]` weight of `bits`-bit codes in groups of 16, with its decoded `f32` values.
struct Weight {
    codes: Vec<u32>,
    scale: Vec<f32>,
    min: Vec<f32>,
    dense: Vec<f32>,
}

fn weight(n: usize, k: usize, bits: u32, seed: u64) -> Weight {
    let per = (32 / bits) as usize;
    let raw = values(n * k, seed);
    let codes_u: Vec<u32> = raw.iter().map(|v| ((v + 1.0) * 0.5 * ((1u32 << bits) - 1) as f32) as u32).collect();
    let groups = n * k / GROUP;
    let scale: Vec<f32> = values(groups, seed + 1).iter().map(|v| 0.01 + v.abs() * 0.1).collect();
    let min: Vec<f32> = values(groups, seed + 2).iter().map(|v| v * 0.5).collect();
    let codes = codes_u
        .chunks_exact(per)
        .map(|c| c.iter().enumerate().fold(0, |w, (t, &q)| w | (q << (bits as usize * t))))
        .collect();
    let dense = codes_u.iter().enumerate().map(|(e, &q)| q as f32 * scale[e / GROUP] + min[e / GROUP]).collect();
    Weight { codes, scale, min, dense }
}

fn product(w: &Weight, bits: u32, a: &Rows16, n: usize, isa: Isa) -> Vec<f32> {
    let m = a.rows();
    let weights = Weights { codes: &w.codes, scale: &w.scale, min: &w.min, bits, group: GROUP, symmetric_offset: 0 };
    let mut out = vec![0f32; m * n];
    weight_rows(&weights, a, 0..n, isa, |i, j, v| out[i * n + j] = v);
    out
}

/// Odd and even block counts, both code widths, several input rows.
#[test]
fn every_isa_matches_scalar_and_the_f32_product() {
    for (k, bits) in [(256, 4), (256, 8), (96, 4), (96, 8), (32, 8)] {
        let (m, n) = (3, 5);
        let w = weight(n, k, bits, k as u64 + u64::from(bits));
        let x = values(m * k, 7);
        let a = Rows16::new(&x, k, bits);
        let reference = product(&w, bits, &a, n, Isa::Scalar);
        for isa in Isa::available() {
            let out = product(&w, bits, &a, n, isa);
            for (o, r) in out.iter().zip(&reference) {
                assert!((o - r).abs() <= 1e-5 * r.abs().max(1.0), "{isa:?} k={k} bits={bits}: {o} vs {r}");
            }
        }
        // Against the dense f32 product: the error is the activations' 8-bit rounding only.
        for i in 0..m {
            for j in 0..n {
                let exact: f32 = (0..k).map(|t| x[i * k + t] * w.dense[j * k + t]).sum();
                let scale: f32 = (0..k).map(|t| (x[i * k + t] * w.dense[j * k + t]).abs()).sum();
                let got = reference[i * n + j];
                assert!((got - exact).abs() <= 0.02 * scale, "k={k} bits={bits} ({i},{j}): {got} vs {exact}");
            }
        }
    }
}

#[test]
fn supports_only_groups_of_sixteen() {
    assert!(supports(4, 16) && supports(8, 16));
    assert!(!supports(4, 32) && !supports(2, 16));
}

/// Through the public op on Flex: groups of 16 take this module's kernels on the default
/// (8-bit activation) path, within the activations' rounding of the exact product, for decode-
/// and prefill-sized row counts.
#[test]
fn fused_qmatmul_transposed_takes_the_group_16_kernels() {
    use crate::quant::{MatmulPrecision, QuantSpec, qmatmul_transposed, quantize, with_matmul_precision};
    use burn::tensor::{Device, Tensor, TensorData};
    let device = Device::flex();
    for (m, k, n, bits) in [(1, 576, 300, 8), (1, 512, 77, 4), (9, 256, 65, 8), (40, 96, 33, 4)] {
        let w = Tensor::<2>::from_data(TensorData::new(values(n * k, 3), [n, k]), &device);
        let x = Tensor::<2>::from_data(TensorData::new(values(m * k, 4), [m, k]), &device);
        let q = quantize(w, QuantSpec::new(bits, GROUP, 1).unwrap()).unwrap();
        let run = |p| {
            let out = with_matmul_precision(p, || qmatmul_transposed(x.clone(), &q).unwrap());
            out.into_data().try_into_vec_as::<f32>().unwrap()
        };
        let (int8, exact) = (run(MatmulPrecision::Int8Activations), run(MatmulPrecision::Exact));
        assert_ne!(int8, exact, "the integer path ran");
        let scale = exact.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
        for (f, e) in int8.iter().zip(&exact) {
            assert!((f - e).abs() <= 2e-2 * scale, "({m}, {k}, {n}, {bits}): int8 {f} vs exact {e}");
        }
    }
}

/// The strip kernel on a split panel (groups of 16, AVX-512 VNNI) against this module's scalar
/// kernel, within `f32` rounding (the two sum the same exact integer dots in another order):
/// partial strips (`n` not a multiple of 16), partial tiles of input rows, odd block counts.
#[test]
fn the_split_strip_kernel_matches_the_scalar_kernel() {
    use crate::quant::q8::strips::{self, Panel};
    let Some(isa) = Isa::available().into_iter().find(|&isa| strips::supports_halves(isa, 8)) else {
        return; // no AVX-512 VNNI on this CPU: groups of 16 stay on the row kernels
    };
    for (m, k, n, bits) in [(1, 256, 37, 8), (3, 96, 16, 4), (8, 2048, 33, 8), (9, 160, 50, 4), (17, 32, 70, 8)] {
        let w = weight(n, k, bits, 11 + k as u64);
        let x = values(m * k, 12);
        let reference = product(&w, bits, &Rows16::new(&x, k, bits), n, Isa::Scalar);
        let weights =
            Weights { codes: &w.codes, scale: &w.scale, min: &w.min, bits, group: GROUP, symmetric_offset: 0 };
        let panel = Panel::halves(&x, m, k, bits);
        let mut out = vec![f32::NAN; m * n];
        strips::weight_rows(&weights, &panel, 0..n, isa, |i, j0, v| {
            out[i * n + j0..i * n + j0 + v.len()].copy_from_slice(v)
        });
        let scale = reference.iter().fold(1.0f32, |a, v| a.max(v.abs()));
        for (at, (o, r)) in out.iter().zip(&reference).enumerate() {
            assert!((o - r).abs() <= 1e-5 * scale, "({m}, {k}, {n}, {bits}) output {at}: {o} vs {r}");
        }
    }
}
