//! Quantized paged storage: writes store exactly what [`quantize`] makes of the new keys, the
//! in-kernel dequantizing attention equals float attention over the dequantized cache (Flex and
//! GPU), block copies, reads, writes and host round trips move codes with their scales and
//! minimums, and mismatched storage is an error.

use burn::tensor::{DType, Device, Tensor};
use rand::SeedableRng;

use super::tests::{Batch, CASES, Rng8, assert_close, random, tensor, values};
use super::*;
use crate::quant::{GroupQuantized, QuantSpec, dequantize, quantize};
use crate::test_devices::devices;

/// 4-bit groups of 8 along the head (`--kv-quant 4`'s default: one code word per group); 8-bit
/// groups of 64, or of 16 where 64 does not tile the head (what `fit_kv_quant` does with whole
/// heads; 16 tiles every head of [`CASES`]).
pub(super) fn spec(bits: u32, head_dim: usize) -> QuantSpec {
    let group = match bits {
        4 => 8,
        _ if head_dim.is_multiple_of(64) => 64,
        _ => 16,
    };
    QuantSpec::new(bits, group, 3).unwrap()
}

/// A pool of `cache`'s contents (`shape`), written through [`KvPool::write`] as one step whose
/// token `t` goes to slot `t`.
pub(super) fn written(cache: &[f32], shape: [usize; 4], spec: QuantSpec, device: &Device) -> KvPool {
    let [blocks, heads, block_size, head_dim] = shape;
    let mut pool = KvPool::zeros(shape, Some(spec), DType::F32, device).unwrap();
    let tokens = blocks * block_size;
    let new = tensor(cache.to_vec(), shape, device).swap_dims(1, 2).reshape([tokens, heads, head_dim]);
    let slots: Vec<u32> = (0..tokens as u32).collect();
    pool.write(new, &SlotMapping::new(&slots, device).unwrap()).unwrap();
    pool
}

/// The cache quantized and dequantized in one piece by the group kernels.
fn round_trip(cache: &[f32], shape: [usize; 4], spec: QuantSpec, device: &Device) -> Vec<f32> {
    let q: GroupQuantized<4> = quantize(tensor(cache.to_vec(), shape, device), spec).unwrap();
    values(dequantize(&q))
}

/// Attention of `batch`'s queries over the pools `k` and `v` (dequantized inside the kernel)
/// equals float attention over their dequantized contents.
pub(super) fn assert_pool_attention_matches_dense(batch: &Batch, k: &KvPool, v: &KvPool, device: &Device, what: &str) {
    let [_, _, block_size, head_dim] = batch.shape;
    let q = tensor(batch.q.clone(), [batch.tokens(), batch.heads, head_dim], device);
    let paged =
        PagedBatch::new(&batch.tables, batch.max_blocks, block_size, &batch.query_seq, &batch.context_lens, device)
            .unwrap();
    let found = values(paged_attention_pool(q.clone(), k, v, &paged, batch.scale()).unwrap());
    let reference = values(paged_attention_with(q, &k.dense(), &v.dense(), &paged, batch.scale()).unwrap());
    assert_close(&found, &reference, what);
}

/// Every slot written through the pool holds the codes `quantize` makes of it (so the paged cache
/// stores what the contiguous cache stores), and the dequantizing kernel equals float attention
/// over those dequantized keys and values, for 8 and 4 bits, on every case and device.
#[test]
fn quantized_attention_equals_attention_over_dequantized_cache() {
    let mut rng = Rng8::seed_from_u64(31);
    for device in devices() {
        for bits in [8, 4] {
            for (i, &(heads, kv_heads, head_dim, block_size, lens)) in CASES.iter().enumerate() {
                let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, i % lens.len());
                let spec = spec(bits, head_dim);
                let (k, v) =
                    (written(&batch.k, batch.shape, spec, &device), written(&batch.v, batch.shape, spec, &device));
                let what = format!("{device:?} {bits}-bit case {i}");
                assert_eq!(values(k.dense()), round_trip(&batch.k, batch.shape, spec, &device), "{what}: keys");
                assert_eq!(values(v.dense()), round_trip(&batch.v, batch.shape, spec, &device), "{what}: values");

                assert_pool_attention_matches_dense(&batch, &k, &v, &device, &what);
            }
        }
    }
}

/// Skipped tokens write nothing, and a second step's writes leave the first step's slots as
/// they were: the codes and group parameters of every slot follow its own token.
#[test]
fn quantized_writes_skip_and_keep_other_slots() {
    let mut rng = Rng8::seed_from_u64(32);
    let shape = [4, 2, 4, 16];
    let spec = spec(4, 16);
    for device in devices() {
        let mut pool = KvPool::zeros(shape, Some(spec), DType::F32, &device).unwrap();
        let first = random(&mut rng, 3 * 2 * 16);
        let second = random(&mut rng, 2 * 2 * 16);
        let step = |pool: &mut KvPool, data: &[f32], slots: &[u32]| {
            let new = tensor(data.to_vec(), [slots.len(), 2, 16], &device);
            pool.write(new, &SlotMapping::new(slots, &device).unwrap()).unwrap();
        };
        step(&mut pool, &first, &[5, SKIP_SLOT, 9]);
        step(&mut pool, &second, &[0, 15]);
        // Expected: each written token's round trip at its slot, zeros elsewhere.
        let token = |data: &[f32], t: usize| round_trip(&data[t * 32..(t + 1) * 32], [1, 2, 1, 16], spec, &device);
        let dense = values(pool.dense());
        let mut expected = vec![0f32; dense.len()];
        for (slot, row) in
            [(5, token(&first, 0)), (9, token(&first, 2)), (0, token(&second, 0)), (15, token(&second, 1))]
        {
            let (block, offset) = (slot / 4, slot % 4);
            for h in 0..2 {
                let at = ((block * 2 + h) * 4 + offset) * 16;
                expected[at..at + 16].copy_from_slice(&row[h * 16..(h + 1) * 16]);
            }
        }
        assert_eq!(dense, expected, "{device:?}");
    }
}

/// Copy-on-write, block reads and writes, and a round trip through host data move codes, scales
/// and minimums together: the moved blocks dequantize to the source blocks.
#[test]
fn quantized_blocks_copy_read_write_and_round_trip() {
    let mut rng = Rng8::seed_from_u64(33);
    let shape = [6, 2, 4, 64];
    let block = 2 * 4 * 64;
    for device in devices() {
        for bits in [8, 4] {
            let data = random(&mut rng, shape.iter().product());
            let mut pool = written(&data, shape, spec(bits, 64), &device);
            let before = values(pool.dense());
            pool.copy_blocks(&[(1, 4), (1, 5)]).unwrap();
            let after = values(pool.dense());
            for dst in [4, 5] {
                assert_eq!(after[dst * block..(dst + 1) * block], before[block..2 * block], "{device:?} copy to {dst}");
            }
            assert_eq!(after[..4 * block], before[..4 * block], "{device:?}: other blocks kept");

            let read = pool.read_blocks(&[0, 2]).unwrap();
            let parts = read.parts();
            let host = read.into_data();
            assert_eq!(host.len(), 3);
            assert_eq!(parts[0], ([2, 4, 64 * bits as usize / 32], DType::U32));
            let back = KvPool::from_data(host, Some(spec(bits, 64)), &device).unwrap();
            pool.write_blocks(&[3, 1], back).unwrap();
            let moved = values(pool.dense());
            assert_eq!(moved[3 * block..4 * block], before[..block], "{device:?}: block 0 → 3");
            assert_eq!(moved[block..2 * block], before[2 * block..3 * block], "{device:?}: block 2 → 1");
        }
    }
}

/// Storage that does not match is an error, never a panic: float blocks into a quantized pool,
/// float keys with quantized values, groups that do not tile the head, bad block ids.
#[test]
fn quantized_storage_mismatches_are_errors() {
    let device = Device::flex();
    let shape = [2, 1, 4, 16];
    let mut pool = KvPool::zeros(shape, Some(spec(8, 16)), DType::F32, &device).unwrap();
    let dense = KvPool::zeros(shape, None, DType::F32, &device).unwrap();
    let err = pool.write_blocks(&[0], dense.read_blocks(&[0]).unwrap()).unwrap_err();
    assert!(matches!(err, PagedKernelError::Storage { .. }), "{err}");
    let batch = PagedBatch::new(&[0], 1, 4, &[0], &[1], &device).unwrap();
    let q = Tensor::<3>::zeros([1, 1, 16], &device);
    let err = paged_attention_pool(q, &dense, &pool, &batch, 1.0).unwrap_err();
    assert!(matches!(err, PagedKernelError::Storage { .. }), "{err}");
    let err = KvPool::zeros(shape, Some(QuantSpec::new(8, 32, 3).unwrap()), DType::F32, &device).unwrap_err();
    assert!(matches!(err, PagedKernelError::Quant(_)), "{err}");
    assert!(matches!(pool.copy_blocks(&[(0, 7)]), Err(PagedKernelError::Block { .. })));
    let new = Tensor::<3>::zeros([1, 1, 8], &device);
    let err = pool.write(new, &SlotMapping::new(&[0], &device).unwrap()).unwrap_err();
    assert!(matches!(err, PagedKernelError::Shape { .. }), "{err}");
    let err = pool.write(Tensor::<3>::zeros([1, 1, 16], &device), &SlotMapping::new(&[99], &device).unwrap());
    assert!(matches!(err, Err(PagedKernelError::Slot { .. })));
}

/// On Flex, a step with prompt rows (the blocks it reads decoded once, then attended as floats)
/// gives each row the same bits as that row attended alone (decoded row by row), for keys grouped
/// along the head and keys per channel.
#[test]
fn prompt_rows_over_quantized_blocks_equal_each_row_alone_bit_for_bit() {
    let device = Device::flex();
    let mut rng = Rng8::seed_from_u64(33);
    for (i, &(heads, kv_heads, head_dim, block_size, lens)) in CASES.iter().enumerate() {
        let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, i % lens.len());
        for (bits, channels) in [(8, false), (4, false), (4, true)] {
            if channels && !block_size.is_multiple_of(32 / bits as usize) {
                continue;
            }
            let v = written(&batch.v, batch.shape, spec(bits, head_dim), &device);
            let k = if channels {
                let counts = vec![block_size; batch.shape[0]];
                KvPool::Quantized(super::channel_tests::channel_keys(&batch.k, batch.shape, bits, &counts, &device))
            } else {
                written(&batch.k, batch.shape, spec(bits, head_dim), &device)
            };
            let run = |q: Vec<f32>, query_seq: &[u32], context_lens: &[u32]| {
                let rows = query_seq.len();
                let q = tensor(q, [rows, heads, head_dim], &device);
                let paged =
                    PagedBatch::new(&batch.tables, batch.max_blocks, block_size, query_seq, context_lens, &device)
                        .unwrap();
                values(paged_attention_pool(q, &k, &v, &paged, batch.scale()).unwrap())
            };
            let together = run(batch.q.clone(), &batch.query_seq, &batch.context_lens);
            let row = heads * head_dim;
            for (t, (&seq, &context)) in batch.query_seq.iter().zip(&batch.context_lens).enumerate() {
                let alone = run(batch.q[t * row..(t + 1) * row].to_vec(), &[seq], &[context]);
                let same = alone.iter().zip(&together[t * row..]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "case {i}, {bits} bits, channels {channels}, row {t}");
            }
        }
    }
}
