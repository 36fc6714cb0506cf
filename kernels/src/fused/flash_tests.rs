//! The flash-attention kernel (`cube_flash.rs`, prefill steps of more than 16 query rows on a
//! GPU) against the Flex twin, on the GPU device under test (wgpu on lavapipe here): causal masks
//! with and without a cached prefix, left padding, sliding windows, arbitrary biases, fully
//! masked rows, grouped-query ratios 1 to 8, head dims 16 to 256 (and 30, read by ones), step and
//! context lengths that are not multiples of a tile, `f32` and `f16` storage; and the skipping
//! of hidden key tiles, which must change no bit.

use std::sync::{Mutex, PoisonError};

use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use super::tests::causal_bias;
use super::twin_tests::{DTYPES, assert_close, pair, tolerance, values};
use super::*;
use crate::test_devices::gpu_device;

/// The bias of one case, `[b or 1, 1, s or 1, len]`.
#[derive(Debug, Clone)]
enum Mask {
    /// Causal, query `i` at position `len − s + i`, after each sequence's left padding.
    Causal(Vec<usize>),
    /// Causal over the last `window` positions only (a sliding-window layer).
    Window(usize),
    /// Random finite values with a quarter of the keys masked, `[bias_b, 1, bias_s, len]`.
    Random(usize, usize),
}

/// The bias of `mask` on Flex, `b` sequences of `s` queries over `len` keys.
fn bias_of(mask: &Mask, rng: &mut impl Rng, b: usize, s: usize, len: usize) -> Tensor<4> {
    let flex = Device::flex();
    match mask {
        Mask::Causal(pads) => causal_bias(pads, s, len, &flex),
        Mask::Window(window) => {
            let data = (0..b * s * len)
                .map(|i| {
                    let (query, key) = (len - s + (i / len) % s, i % len);
                    if key > query || query - key >= *window { -1.0e30 } else { 0.0 }
                })
                .collect();
            Tensor::from_data(TensorData::new(data, [b, 1, s, len]), &flex)
        }
        Mask::Random(bias_b, bias_s) => {
            let n = bias_b * bias_s * len;
            let data =
                (0..n).map(|_| if rng.random_bool(0.25) { -1.0e30 } else { rng.random::<f32>() * 4.0 - 2.0 }).collect();
            Tensor::from_data(TensorData::new(data, [*bias_b, 1, *bias_s, len]), &flex)
        }
    }
}

/// `prefix_attention` of the same values on the GPU (in `dtype`) and on Flex (`f32`), queries as
/// the model passes them (a `[b, heads, s, d]` view of `[b, s, heads, d]`): `(gpu, flex)`.
#[allow(clippy::too_many_arguments)]
fn both(
    gpu: &Device,
    (q, q_flex): (Tensor<4>, Tensor<4>),
    (k, k_flex): (Tensor<4>, Tensor<4>),
    (v, v_flex): (Tensor<4>, Tensor<4>),
    bias: Tensor<4>,
    len: usize,
    scale: f32,
) -> (Tensor<4>, Tensor<4>) {
    let bias_gpu = Tensor::<4>::from_data(bias.to_data(), gpu);
    let got = prefix_attention(q.swap_dims(1, 2), k, v, bias_gpu, len, scale);
    let flex = |t: Tensor<4>| t.cast(DType::F32);
    let expected = prefix_attention(flex(q_flex).swap_dims(1, 2), flex(k_flex), flex(v_flex), bias, len, scale);
    (got, expected)
}

#[test]
fn flash_attention_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
    // (batch, heads, kv_heads, queries, slots, len, head_dim, mask).
    let cases = [
        (1, 2, 2, 17, 17, 17, 16, Mask::Causal(vec![0])),
        (1, 4, 2, 33, 40, 37, 64, Mask::Causal(vec![0])),
        (2, 8, 2, 19, 50, 45, 80, Mask::Causal(vec![0, 7])),
        (1, 8, 1, 24, 24, 24, 128, Mask::Causal(vec![0])),
        (1, 2, 1, 21, 70, 67, 256, Mask::Random(1, 21)),
        // Sequence 1's first rows see nothing (padding longer than the cached prefix).
        (2, 3, 3, 65, 130, 129, 30, Mask::Causal(vec![0, 70])),
        (1, 1, 1, 100, 300, 299, 64, Mask::Window(37)),
        (3, 4, 4, 18, 18, 18, 32, Mask::Random(3, 1)),
    ];
    for dtype in DTYPES {
        for (b, h, kv, s, slots, len, d, mask) in cases.clone() {
            let q = pair(&mut rng, [b, s, h, d], dtype, &gpu);
            let k = pair(&mut rng, [b, kv, slots, d], dtype, &gpu);
            let v = pair(&mut rng, [b, kv, slots, d], dtype, &gpu);
            let bias = bias_of(&mask, &mut rng, b, s, len);
            let scale = 1.0 / (d as f32).sqrt();
            let (got, expected) = both(&gpu, q, k, v, bias, len, scale);
            let what = format!("{dtype:?} {:?}", (b, h, kv, s, slots, len, d, &mask));
            assert_eq!(got.dims(), [b, h, s, d], "{what}");
            assert_eq!(got.dtype(), dtype, "{what}");
            let got = values(got);
            assert!(got.iter().all(|x| x.is_finite()), "{what}: not finite");
            assert_close(&got, &values(expected), tolerance(dtype), &what);
        }
    }
}

/// Serializes the tests that switch [`set_gpu_prefill`] (process-wide).
static MODE: Mutex<()> = Mutex::new(());

/// Puts the default mode back when dropped, even when a test fails.
struct DefaultMode;

impl Drop for DefaultMode {
    fn drop(&mut self) {
        set_gpu_prefill(GpuPrefill::Flash);
    }
}

/// Left padding of 128 slots (every tile of them hidden from every row of sequence 0) and the
/// causal triangle: skipping their tiles gives the bits of visiting every tile, and the skipped
/// slots are not read at all (NaN there leaves the result as it is), nor are the slots past
/// `len`.
#[test]
fn flash_attention_skips_hidden_key_tiles_without_changing_a_bit() {
    let Some(gpu) = gpu_device() else { return };
    let _serial = MODE.lock().unwrap_or_else(PoisonError::into_inner);
    let _restore = DefaultMode;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(32);
    let (b, h, kv, s, d, pad) = (2, 4, 2, 40, 64, 128);
    let (len, slots) = (pad + s, pad + s + 9);
    let bias = causal_bias(&[pad, 0], s, len, &Device::flex());
    let q = pair(&mut rng, [b, s, h, d], DType::F32, &gpu);
    let k = pair(&mut rng, [b, kv, slots, d], DType::F32, &gpu);
    let v = pair(&mut rng, [b, kv, slots, d], DType::F32, &gpu);
    let run = |mode, k: Tensor<4>, v: Tensor<4>| {
        set_gpu_prefill(mode);
        values(prefix_attention(q.0.clone().swap_dims(1, 2), k, v, Tensor::from_data(bias.to_data(), &gpu), len, 0.125))
    };
    let (skipping, launched) = crate::launches::count_launches(|| run(GpuPrefill::Flash, k.0.clone(), v.0.clone()));
    // The flash kernel served the call (the observer is process-wide: other tests' launches may
    // show up too, never hide this one).
    assert!(launched.by_kernel.contains_key("FlashAttentionKernel"), "{launched:?}");
    let every_tile = run(GpuPrefill::FlashEveryTile, k.0.clone(), v.0.clone());
    // The first element whose bits differ, if any.
    let differs = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits())
    };
    assert_eq!(differs(&skipping, &every_tile), None, "skipping hidden key tiles changed the result");
    let (_, expected) = both(&gpu, q.clone(), k.clone(), v.clone(), bias.clone(), len, 0.125);
    assert_close(&skipping, &values(expected), 1e-5, "against the Flex twin");

    // NaN in sequence 0's padding and in every slot past `len`: never read.
    let poisoned = |t: &Tensor<4>| {
        let mut data = t.to_data().try_to_vec::<f32>().expect("f32");
        for (i, x) in data.iter_mut().enumerate() {
            let (seq, slot) = (i / (kv * slots * d), (i / d) % slots);
            if (seq == 0 && slot < pad) || slot >= len {
                *x = f32::NAN;
            }
        }
        Tensor::<4>::from_data(TensorData::new(data, [b, kv, slots, d]), &gpu)
    };
    let read = run(GpuPrefill::Flash, poisoned(&k.0), poisoned(&v.0));
    assert_eq!(differs(&read, &skipping), None, "hidden slots or slots past len were read");
}
