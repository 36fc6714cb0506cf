//! Batch invariance of the Flex products (issue 32 §6): each output row is bit for bit the same
//! whatever the number of input rows beside it, on the integer path (8-bit input rows, the
//! default for GGUF-layout weights), the exact path and the dense `f32` products. A row's
//! arithmetic must not depend on the tile, strip, thread split or kernel that `m` selects.

use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::*;

/// Row counts around every threshold of the products: tiles of 4 and 8, strips, the split at 32
/// rows, the parallel quantization of 64-row parts.
const ROWS: [usize; 14] = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33, 65, 130];

fn values(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

/// Asserts that `product(x[..m])` gives row `i` of `product(x[..1])`… bit for bit: every row of
/// every `m` in [`ROWS`] equals that row computed alone.
fn assert_rows_invariant(what: &str, k: usize, product: impl Fn(Tensor<2>) -> Tensor<2>) {
    let device = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(32);
    let max = *ROWS.iter().max().unwrap();
    let x: Vec<f32> =
        (0..max * k).map(|_| (rng.random::<f32>() - 0.5) * if rng.random_bool(0.05) { 9.0 } else { 1.0 }).collect();
    let rows = |range: std::ops::Range<usize>| {
        Tensor::<2>::from_data(TensorData::new(x[range.start * k..range.end * k].to_vec(), [range.len(), k]), &device)
    };
    let alone: Vec<Vec<f32>> = (0..max).map(|i| values(product(rows(i..i + 1)))).collect();
    for m in ROWS {
        let out = values(product(rows(0..m)));
        let n = out.len() / m;
        for (i, row) in out.chunks_exact(n).enumerate() {
            let same = row.iter().zip(&alone[i]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: row {i} of {m} differs from the row alone");
        }
    }
}

/// GGUF-layout weights (`[n, k]`, groups along `k`) of 4 and 8 bits, in groups of whole blocks
/// and of 16 (the K-quants' sub-blocks), on the default integer path and the exact one; shapes
/// with partial strips (`n` not a multiple of 16) and with enough multiply-adds to run on two
/// threads.
#[test]
fn quantized_products_are_batch_invariant() {
    let device = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(33);
    for (k, n, bits, group) in
        [(64, 37, 4, 32), (576, 1536, 4, 32), (1536, 100, 8, 32), (128, 70, 4, 64), (2048, 200, 8, 16), (96, 45, 4, 16)]
    {
        let w: Vec<f32> = (0..n * k).map(|_| rng.random::<f32>() - 0.5).collect();
        let w = Tensor::<2>::from_data(TensorData::new(w, [n, k]), &device);
        let w = quantize(w, QuantSpec::new(bits, group, 1).unwrap()).unwrap();
        for precision in [MatmulPrecision::Int8Activations, MatmulPrecision::Exact] {
            let what = format!("[{k}, {n}] {bits}-bit groups of {group}, {precision:?}");
            assert_rows_invariant(&what, k, |x| {
                with_matmul_precision(precision, || qmatmul_transposed(x, &w).unwrap())
            });
        }
    }
}

/// Weights of the symmetric GGUF types (`Q4_0`, `Q5_0`/`Q8_0`, `Q3_K`, `Q6_K`: every minimum is
/// `−offset · scale`), whose minimums the integer kernels derive instead of reading: the product
/// equals, bit for bit and for every row count, the one that reads the stored minimums (the same
/// weight without its symmetric offset), so it is batch invariant as well.
#[test]
fn derived_minimums_equal_stored_ones() {
    let device = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(35);
    for (k, n, bits, group, offset) in
        [(576, 100, 8, 32, 16), (576, 40, 8, 32, 128), (1536, 37, 8, 16, 32), (128, 70, 4, 32, 8), (96, 45, 4, 16, 4)]
    {
        let groups = n * k / group;
        let codes: Vec<u32> = (0..n * k * bits as usize / 32).map(|_| rng.random()).collect();
        // Some zero scales (constant groups): `0 · −offset` is `−0`, stored and derived alike.
        let scale: Vec<f32> =
            (0..groups).map(|_| if rng.random_bool(0.02) { 0.0 } else { rng.random::<f32>() * 0.02 }).collect();
        let min: Vec<f32> = scale.iter().map(|s| s * -(offset as f32)).collect();
        let spec = QuantSpec::new(bits, group, 1).unwrap();
        let weight = |spec: QuantSpec| {
            GroupQuantized::from_host(codes.clone(), scale.clone(), min.clone(), [n, k], spec, &device).unwrap()
        };
        let (derived, stored) = (weight(spec.with_symmetric_offset(offset)), weight(spec));
        let what = format!("[{k}, {n}] {bits}-bit groups of {group}, offset {offset}");
        let product = |w: &GroupQuantized<2>, x: Tensor<2>| {
            with_matmul_precision(MatmulPrecision::Int8Activations, || qmatmul_transposed(x, w).unwrap())
        };
        assert_rows_invariant(&what, k, |x| product(&derived, x));
        let x: Vec<f32> = (0..33 * k).map(|_| rng.random::<f32>() - 0.5).collect();
        for m in [1, 8, 33] {
            let x = Tensor::<2>::from_data(TensorData::new(x[..m * k].to_vec(), [m, k]), &device);
            let (a, b) = (values(product(&derived, x.clone())), values(product(&stored, x)));
            assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}, {m} rows: derived ≠ stored");
        }
    }
}

/// Dense `f32` products ([`crate::matmul`]): a `Linear` weight `[k, n]` and a transposed table
/// (a tied LM head's `[n, k]` embedding read as its transpose).
#[test]
fn dense_products_are_batch_invariant() {
    let device = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
    for (k, n) in [(64, 37), (576, 1536), (256, 1000)] {
        let w: Vec<f32> = (0..n * k).map(|_| rng.random::<f32>() - 0.5).collect();
        let linear = Tensor::<2>::from_data(TensorData::new(w.clone(), [k, n]), &device);
        assert_rows_invariant(&format!("dense [{k}, {n}]"), k, |x| crate::matmul(x, linear.clone()));
        let table = Tensor::<2>::from_data(TensorData::new(w, [n, k]), &device);
        assert_rows_invariant(&format!("transposed [{n}, {k}]"), k, |x| crate::matmul(x, table.clone().transpose()));
    }
}
