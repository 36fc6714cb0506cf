//! Per-channel (KIVI) quantized keys: whole-block writes hold what [`quantize`] makes of each
//! channel over the block's written tokens (unwritten ones never widen a range), the error stays
//! within half a step of each channel's own range (so an outlier channel costs the others
//! nothing, which groups along the head cannot do), and the dequantizing attention kernels (Flex
//! twin and CubeCL) equal float attention over the dequantized keys: odd lengths, partly filled
//! last blocks, GQA and MHA.

use burn::tensor::{DType, Device};
use rand::{Rng, SeedableRng};

use super::quant_tests::{assert_pool_attention_matches_dense, spec, written};
use super::tests::{Batch, CASES, Rng8, random, tensor, values};
use super::*;
use crate::quant::QuantSpec;
use crate::test_devices::devices;

/// Per-channel key blocks of `shape` holding `cache`'s keys, block `b` written whole over its
/// first `counts[b]` tokens.
pub(super) fn channel_keys(
    cache: &[f32],
    shape: [usize; 4],
    bits: u32,
    counts: &[usize],
    device: &Device,
) -> QuantizedBlocks {
    let mut keys = QuantizedBlocks::zeros_per_channel(shape, bits, DType::F32, device).unwrap();
    let ids: Vec<u32> = (0..shape[0] as u32).collect();
    keys.write_channels(&ids, tensor(cache.to_vec(), shape, device), counts).unwrap();
    keys
}

/// `[blocks, heads, block_size, head_dim]` element index.
fn at([_, heads, block_size, head_dim]: [usize; 4], b: usize, h: usize, t: usize, e: usize) -> usize {
    ((b * heads + h) * block_size + t) * head_dim + e
}

/// Each written key is within half a step of its channel's range over the block's written
/// tokens, `(max − min) / (2^bits − 1) / 2`; unwritten tokens (here huge) do not count.
#[test]
fn per_channel_keys_round_trip_within_half_a_step_of_each_channel() {
    let mut rng = Rng8::seed_from_u64(7);
    let shape = [3, 2, 16, 24];
    let [blocks, heads, block_size, head_dim] = shape;
    for device in devices() {
        for bits in [4, 8] {
            let mut data = random(&mut rng, shape.iter().product());
            let counts = [16, 5, 1];
            for (b, &count) in counts.iter().enumerate() {
                for h in 0..heads {
                    for t in count..block_size {
                        for e in 0..head_dim {
                            data[at(shape, b, h, t, e)] = 1e4;
                        }
                    }
                }
            }
            let keys = channel_keys(&data, shape, bits, &counts, &device);
            assert!(keys.per_channel());
            let back = values(keys.dequantize());
            let top = ((1u32 << bits) - 1) as f32;
            for (b, &count) in counts.iter().enumerate().take(blocks) {
                for h in 0..heads {
                    for e in 0..head_dim {
                        let channel: Vec<f32> = (0..count).map(|t| data[at(shape, b, h, t, e)]).collect();
                        let (lo, hi) = channel.iter().fold((f32::MAX, f32::MIN), |(l, u), &x| (l.min(x), u.max(x)));
                        let bound = (hi - lo) / top / 2.0 + 1e-5;
                        for (t, &x) in channel.iter().enumerate() {
                            let err = (back[at(shape, b, h, t, e)] - x).abs();
                            assert!(
                                err <= bound,
                                "{device:?} {bits}-bit block {b} head {h} token {t} channel {e}: {err} > {bound}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Keys with an outlier channel (a large, steady offset, as real models' keys have): per channel,
/// every other channel keeps its own small step; one group along the head spends the 16 levels
/// on the outlier and loses the rest. This fails if paged 4-bit keys are grouped along the head
/// again.
#[test]
fn an_outlier_channel_costs_the_other_channels_nothing() {
    let mut rng = Rng8::seed_from_u64(8);
    let shape = [2, 1, 16, 32];
    let mut data = random(&mut rng, shape.iter().product());
    for (i, x) in data.iter_mut().enumerate() {
        if i % 32 == 3 {
            *x = 40.0 + *x * 0.5;
        }
    }
    let worst_other = |back: &[f32]| {
        data.iter()
            .zip(back)
            .enumerate()
            .filter(|(i, _)| i % 32 != 3)
            .map(|(_, (a, b))| (a - b).abs())
            .fold(0f32, f32::max)
    };
    for device in devices() {
        let keys = channel_keys(&data, shape, 4, &[16, 16], &device);
        let per_channel = worst_other(&values(keys.dequantize()));
        let per_token = worst_other(&values(written(&data, shape, QuantSpec::new(4, 32, 3).unwrap(), &device).dense()));
        assert!(per_channel <= 2.0 / 15.0 / 2.0 + 1e-5, "{device:?}: per-channel error {per_channel}");
        assert!(per_token > 10.0 * per_channel, "{device:?}: per-token {per_token} vs per-channel {per_channel}");
    }
}

/// The dequantizing attention over per-channel keys and per-token values equals float attention
/// over the dequantized blocks, on every case and device (the Flex twin and the CubeCL kernel):
/// 4-bit keys where the block size holds whole code words (8-bit ones otherwise), blocks written
/// only up to random lengths (partly filled tails), and a context of several partitions.
#[test]
fn attention_over_per_channel_keys_equals_attention_over_their_dequantized_blocks() {
    let mut rng = Rng8::seed_from_u64(9);
    for device in devices() {
        // Plus a context of several 512-token partitions (the GPU kernel's split-and-merge path).
        let long: (usize, usize, usize, usize, &[usize]) = (4, 2, 64, 16, &[1100, 33]);
        for (i, &(heads, kv_heads, head_dim, block_size, lens)) in CASES.iter().chain([&long]).enumerate() {
            for bits in [4, 8] {
                if !block_size.is_multiple_of(32 / bits as usize) {
                    continue;
                }
                let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, i % lens.len());
                let counts: Vec<usize> = (0..batch.shape[0]).map(|_| rng.random_range(1..=block_size)).collect();
                let k = KvPool::Quantized(channel_keys(&batch.k, batch.shape, bits, &counts, &device));
                let v = written(&batch.v, batch.shape, spec(bits, head_dim), &device);
                let what = format!("{device:?} {bits}-bit case {i}");
                assert_pool_attention_matches_dense(&batch, &k, &v, &device, &what);
            }
        }
    }
}

/// Per-channel blocks take whole-block writes only, swap through host data as themselves, and
/// refuse what does not fit: per-token writes, bad counts, per-channel values.
#[test]
fn per_channel_blocks_move_whole_and_refuse_what_does_not_fit() {
    let device = Device::flex();
    let shape = [3, 1, 8, 16];
    let mut rng = Rng8::seed_from_u64(10);
    let data = random(&mut rng, shape.iter().product());
    let keys = channel_keys(&data, shape, 4, &[8, 8, 3], &device);
    let mut pool = KvPool::Quantized(keys.clone());
    let parts = pool.read_blocks(&[2]).unwrap();
    let back = KvPool::from_data(parts.clone().into_data(), parts.quantization(), &device).unwrap();
    pool.write_blocks(&[0], back).unwrap();
    let moved = values(pool.dense());
    let block = 8 * 16;
    assert_eq!(moved[..block], moved[2 * block..], "block 2 → 0 through host data");

    let new = tensor(vec![0.0; 16], [1, 1, 16], &device);
    let err = pool.write(new, &SlotMapping::new(&[0], &device).unwrap()).unwrap_err();
    assert!(matches!(err, PagedKernelError::Layout(_)), "{err}");
    let mut keys = keys;
    let floats = tensor(data[..block].to_vec(), [1, 1, 8, 16], &device);
    let err = keys.write_channels(&[0], floats.clone(), &[9]).unwrap_err();
    assert!(matches!(err, PagedKernelError::Length { .. }), "{err}");
    let err = keys.write_channels(&[0, 1], floats, &[8]).unwrap_err();
    assert!(matches!(err, PagedKernelError::Length { .. }), "{err}");
    let err = QuantizedBlocks::zeros_per_channel([1, 1, 4, 16], 4, DType::F32, &device).unwrap_err();
    assert!(matches!(err, PagedKernelError::Quant(_)), "{err}");
    let values_pool = KvPool::Quantized(QuantizedBlocks::zeros_per_channel(shape, 4, DType::F32, &device).unwrap());
    let q = tensor(vec![0.0; 16], [1, 1, 16], &device);
    let batch = PagedBatch::new(&[0], 1, 8, &[0], &[1], &device).unwrap();
    let err = paged_attention_pool(q, &pool, &values_pool, &batch, 1.0).unwrap_err();
    assert!(matches!(err, PagedKernelError::Storage { .. }), "{err}");
}
