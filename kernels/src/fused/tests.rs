//! Each fused op against the same computation in plain Burn ops (on Flex the fused loops, on wgpu
//! the Burn-ops path), on seeded random shapes that include widths which are not multiples of the
//! eight SIMD lanes.

use burn::module::Param;
use burn::nn::RmsNorm;
use burn::tensor::activation::{gelu_approximate, silu};
use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::*;
use crate::test_devices::devices;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

fn random<const D: usize>(rng: &mut impl Rng, shape: [usize; D], device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 4.0 - 2.0).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tolerance * e.abs().max(1.0), "{what}: element {i}: {g} vs {e}");
    }
}

#[test]
fn exp_matches_libm() {
    let mut worst = 0f32;
    for i in 0..=200_000 {
        let x = -87.0 + 175.0 * i as f32 / 200_000.0;
        let (got, expected) = (exp::exp(x), x.exp());
        worst = worst.max((got - expected).abs() / expected);
    }
    assert!(worst < 3e-7, "relative error {worst}");
    assert_eq!(exp::exp(-1.0e30), 0.0);
    assert_eq!(exp::exp(-100.0), 0.0);
    assert_eq!(exp::exp(0.0), 1.0);
    assert!(exp::exp(f32::NAN).is_nan());
}

#[test]
fn rms_norm_matches_burn_rms_norm() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for device in devices() {
        for shape in [[1, 1, 576], [3, 5, 40], [2, 300, 64]] {
            let x = random(&mut rng, shape, &device);
            let gamma = random(&mut rng, [shape[2]], &device);
            let reference = RmsNorm { gamma: Param::from_tensor(gamma.clone()), epsilon: 1e-5 };
            let expected = values(reference.forward(x.clone()));
            assert_close(&values(rms_norm(x, gamma, 1e-5)), &expected, 1e-5, &format!("{device:?} {shape:?}"));
        }
    }
}

/// HF's rotate-half on `[b, heads, s, d]`, as the model computed it before the fused op.
fn rotate_half_reference(x: Tensor<4>, cos: Tensor<4>, sin: Tensor<4>) -> Tensor<4> {
    let [b, h, s, d] = x.dims();
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..h, 0..s, 0..half]);
    let x2 = x.slice([0..b, 0..h, 0..s, half..d]);
    let out1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
    let out2 = x2 * cos + x1 * sin;
    Tensor::cat(vec![out1, out2], 3)
}

#[test]
fn rotate_half_matches_slices_and_leaves_shared_inputs_alone() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for device in devices() {
        for [b, s, h, d] in [[1, 1, 9, 64], [2, 3, 4, 20], [3, 7, 2, 6]] {
            let x = random(&mut rng, [b, s, h, d], &device);
            let angles = random(&mut rng, [b, s, 1, d / 2], &device) * 3.0;
            let (cos, sin) = (angles.clone().cos(), angles.sin());
            let before = values(x.clone());
            let expected = rotate_half_reference(
                x.clone().swap_dims(1, 2),
                cos.clone().swap_dims(1, 2),
                sin.clone().swap_dims(1, 2),
            );
            let got = rotate_half(x.clone(), &cos, &sin);
            let what = format!("{device:?} {:?}", [b, s, h, d]);
            assert_close(&values(got.swap_dims(1, 2)), &values(expected), 1e-6, &what);
            assert_eq!(values(x), before, "{what}: the shared input was written");
        }
    }
}

#[test]
fn gated_mul_matches_burn_ops_and_leaves_shared_inputs_alone() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for device in devices() {
        for act in [Gate::Silu, Gate::GeluTanh] {
            for shape in [[1, 1, 1536], [2, 3, 13], [4, 200, 96]] {
                let gate = random(&mut rng, shape, &device) * 20.0;
                let up = random(&mut rng, shape, &device);
                let before = values(gate.clone());
                let activated = match act {
                    Gate::Silu => silu(gate.clone()),
                    Gate::GeluTanh => gelu_approximate(gate.clone()),
                };
                let expected = values(activated * up.clone());
                let what = format!("{device:?} {act:?} {shape:?}");
                assert_close(&values(gated_mul(act, gate.clone(), up)), &expected, 1e-5, &what);
                assert_eq!(values(gate), before, "{what}: the shared input was written");
            }
        }
    }
}

/// A bias of `shape` (broadcastable to `[b, 1, s, len]`) with about a quarter of the scores
/// masked, and one row masked entirely.
fn random_bias(rng: &mut impl Rng, shape: [usize; 4], device: &Device) -> Tensor<4> {
    let n: usize = shape.iter().product();
    let len = shape[3];
    let data: Vec<f32> =
        (0..n).map(|i| if i < len || rng.random_bool(0.25) { -1.0e30 } else { rng.random::<f32>() - 0.5 }).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// A causal bias `[b, 1, s, len]`: query `i` sees keys up to `len − s + i`, after `pad[b]` masked
/// keys of left padding (whose own rows see nothing).
pub(super) fn causal_bias(pad: &[usize], s: usize, len: usize, device: &Device) -> Tensor<4> {
    let mut data = vec![0f32; pad.len() * s * len];
    for (bi, &pad) in pad.iter().enumerate() {
        for i in 0..s {
            for j in 0..len {
                if j < pad || j > len - s + i {
                    data[(bi * s + i) * len + j] = -1.0e30;
                }
            }
        }
    }
    Tensor::from_data(TensorData::new(data, [pad.len(), 1, s, len]), device)
}

#[test]
fn prefix_attention_matches_burn_attention_over_the_visible_slots() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    for device in devices() {
        for (b, heads, kv_heads, s, d, slots, len) in [
            (1, 9, 3, 1, 64, 40, 33),
            (2, 6, 2, 3, 20, 10, 7),
            (3, 4, 4, 1, 8, 5, 5),
            (2, 2, 1, 12, 16, 20, 14),
            (1, 9, 3, 150, 64, 160, 150),
            (2, 4, 2, 70, 24, 100, 90),
        ] {
            let q = random(&mut rng, [b, heads, s, d], &device);
            let k = random(&mut rng, [b, kv_heads, slots, d], &device);
            let v = random(&mut rng, [b, kv_heads, slots, d], &device);
            let visible = [0..b, 0..kv_heads, 0..len, 0..d];
            // Fused against Burn ops over the visible slots, for one bias.
            let check = |bias: Tensor<4>, what: String| {
                let (k_visible, v_visible) = (k.clone().slice(visible.clone()), v.clone().slice(visible.clone()));
                let expected = attention_with(q.clone(), k_visible, v_visible, bias.clone(), 0.125, |scores| scores);
                let got = prefix_attention(q.clone(), k.clone(), v.clone(), bias, len, 0.125);
                assert_eq!(got.dims(), [b, heads, s, d]);
                let what = format!("{device:?} b{b} h{heads}/{kv_heads} s{s} d{d} len {len}/{slots} {what}");
                assert_close(&values(got), &values(expected), 1e-5, &what);
            };
            for bias_shape in [[b, 1, s, len], [1, 1, s, len]] {
                check(random_bias(&mut rng, bias_shape, &device), format!("bias {bias_shape:?}"));
            }
            if s > 1 {
                let pad: Vec<usize> = (0..b).map(|i| i * 3).collect();
                check(causal_bias(&pad, s, len, &device), "causal".into());
            }
        }
    }
}

/// Every query row gets the same bits from the prefill path (many rows, keys transposed) as from
/// the decode path (the row alone), after any number of masked slots (a static batch's left
/// padding): so a sequence's output does not depend on its batch, and a prefill of a context
/// equals the decode step that reached it. Gemma 3's shape (four query heads on one key/value
/// head of width 256, so pairs of heads share their keys), SmolLM2's (three query heads per
/// key/value head: a pair and a single head), and a width that is not a multiple of 64.
#[test]
fn prefix_attention_rows_are_the_same_bits_on_every_path() {
    let device = Device::flex();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    for (heads, kv_heads, d, s) in [(4, 1, 256, 37), (9, 3, 64, 41), (2, 1, 80, 20)] {
        let q = random(&mut rng, [1, heads, s, d], &device);
        let k = random(&mut rng, [1, kv_heads, s, d], &device);
        let v = random(&mut rng, [1, kv_heads, s, d], &device);
        let scale = 0.0625;
        let prefill =
            values(prefix_attention(q.clone(), k.clone(), v.clone(), causal_bias(&[0], s, s, &device), s, scale));
        for pad in [0, 1, 3, 6, 13] {
            let noise = |rng: &mut rand_chacha::ChaCha8Rng| random(rng, [1, kv_heads, pad, d], &device);
            let (k_pad, v_pad) =
                (Tensor::cat(vec![noise(&mut rng), k.clone()], 2), Tensor::cat(vec![noise(&mut rng), v.clone()], 2));
            let len = pad + s;
            let bias = causal_bias(&[pad], s, len, &device);
            let padded = prefix_attention(q.clone(), k_pad.clone(), v_pad.clone(), bias, len, scale);
            assert!(
                values(padded).iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()),
                "h{heads}/{kv_heads} d{d}: prefill after {pad} masked slots differs from the prefill without them"
            );
            for i in 0..s {
                let row = q.clone().slice([0..1, 0..heads, i..i + 1, 0..d]);
                let bias: Vec<f32> = (0..len).map(|j| if j < pad || j > pad + i { -1.0e30 } else { 0.0 }).collect();
                let bias = Tensor::from_data(TensorData::new(bias, [1, 1, 1, len]), &device);
                let alone = values(prefix_attention(row, k_pad.clone(), v_pad.clone(), bias, len, scale));
                for h in 0..heads {
                    let expected = &prefill[(h * s + i) * d..(h * s + i + 1) * d];
                    assert!(
                        alone[h * d..(h + 1) * d].iter().zip(expected).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "h{heads}/{kv_heads} d{d}, row {i}, head {h}, after {pad} masked slots: the decode path \
                         differs from the prefill path"
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_matches_burn_matmul_for_contiguous_and_transposed_weights() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    for device in devices() {
        for (m, k, n) in
            [(1, 8, 3), (5, 17, 40), (6, 64, 32), (13, 96, 70), (512, 64, 100), (600, 96, 9), (3, 0, 5), (0, 4, 4)]
        {
            let x = random(&mut rng, [m, k], &device);
            let w = random(&mut rng, [k, n], &device);
            let table = random(&mut rng, [n, k], &device);
            let what = format!("{device:?} [{m}, {k}] × [{k}, {n}]");
            let expected = values(x.clone().matmul(w.clone()));
            assert_close(&values(matmul(x.clone(), w)), &expected, 1e-5, &what);
            let expected = values(x.clone().matmul(table.clone().transpose()));
            assert_close(&values(matmul(x, table.transpose())), &expected, 1e-5, &format!("{what}, transposed"));
        }
    }
}

/// `argmax_rows` equals Burn's `argmax(1)` on every test device: random rows of widths that are
/// not multiples of eight (the largest value in the tail included), repeated maxima (the first
/// wins), and, on Flex, where the fused loop runs, NaNs inside a row (passed over).
#[test]
fn argmax_rows_matches_burn_argmax() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
    let ids = |t: Tensor<2, burn::tensor::Int>| t.into_data().try_into_vec_as::<i64>().unwrap();
    for device in devices() {
        for [rows, width] in [[1, 1], [3, 7], [5, 49157], [32, 100]] {
            let mut data: Vec<f32> = (0..rows * width).map(|_| rng.random::<f32>() * 4.0 - 2.0).collect();
            for (r, row) in data.chunks_exact_mut(width).enumerate() {
                match r % 3 {
                    // The row's largest value twice, the second in the tail past the last 8 lanes.
                    1 if width > 3 => {
                        row[1] = 9.0;
                        row[width - 1] = 9.0;
                    }
                    2 => row[width - 1] = 9.0,
                    _ => {}
                }
            }
            let logits = Tensor::<2>::from_data(TensorData::new(data.clone(), [rows, width]), &device);
            let expected = ids(logits.clone().argmax(1));
            assert_eq!(ids(argmax_rows(logits)), expected, "{device:?} [{rows}, {width}]");
        }
    }
    let device = Device::flex();
    let mut row: Vec<f32> = (0..20).map(|i| i as f32).collect();
    row[5] = f32::NAN;
    row[19] = f32::NAN;
    let logits = Tensor::<2>::from_data(TensorData::new(row, [1, 20]), &device);
    assert_eq!(ids(argmax_rows(logits)), vec![18]);
}
