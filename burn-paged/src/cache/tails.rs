//! The float residual of per-channel (KIVI) keys: a 4-bit cache quantizes a block's keys per
//! channel over the block's tokens, which needs all of them, so the keys of each sequence's
//! unfinished last block are kept as floats in a small pool of tail blocks beside the quantized
//! pool (at most one tail per running sequence).
//!
//! Every step, the blocks a micro-batch writes are staged as floats (from their tail, or for a
//! block rewritten from its middle without one, from its codes), the new keys are scattered into
//! the staging blocks, and each staging block is quantized per channel over the tokens it holds
//! so far and written to the quantized pool; the unfinished ones go back to their tails. So the
//! attention kernel reads every block, finished or not, from the quantized pool, and an
//! unfinished block's codes are always recomputed from exact floats (no error accumulates while
//! it fills). A block that fills frees its tail.
//!
//! Tails follow their block through swap (host copies by host block), copy-on-write (the copy
//! gets its own tail), the prefill/decode hand-off, and are dropped when the block manager frees
//! the block ([`PagedKvCache::drop_free_tails`]).

use std::collections::HashMap;

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm_kernels::paged::{
    KvPool, SKIP_SLOT, SlotMapping, copy_blocks_mut, read_blocks, reshape_and_cache_with, write_blocks_mut,
};
use burn_llm_models::KvLayout;
use burn_llm_models::cache::LayerDevices;

use super::{PagedKvCache, PagedStep};
use crate::error::{PagedError, Result};
use crate::memory::BlockId;

/// Which device blocks have a tail, which tail slots are free, and the swapped-out tails.
#[derive(Debug, Default)]
pub(super) struct TailBook {
    /// Tail slot of each device block whose keys are unfinished.
    of_block: HashMap<u32, u32>,
    /// Free tail slots.
    free: Vec<u32>,
    /// Tail slots in each layer's pool.
    capacity: usize,
    /// Swapped-out tails by host block: each layer's floats.
    host: HashMap<u32, Vec<TensorData>>,
}

/// How one micro-batch's new keys reach per-channel key blocks.
#[derive(Debug, Default)]
pub(super) struct KeyPlan {
    /// Blocks written, in order of first write.
    blocks: Vec<u32>,
    /// Tokens each holds after the write.
    counts: Vec<usize>,
    /// Per distinct device: each token's slot in the staging blocks (`index · block_size +
    /// offset`, [`SKIP_SLOT`] for skipped tokens).
    staging: Vec<SlotMapping>,
    /// Some block continues from its middle without a tail: stage from the codes.
    from_codes: bool,
    /// `(staging block, tail slot)`: staging blocks that start from a tail's floats.
    seeds: Vec<(u32, u32)>,
    /// `(staging block, tail slot)`: unfinished blocks whose floats go back to a tail.
    keep: Vec<(u32, u32)>,
}

impl TailBook {
    /// A tail slot, growing every layer's pool by half when none is free.
    fn alloc(&mut self, pools: &mut [Tensor<4>]) -> u32 {
        if self.free.is_empty() {
            self.grow(pools, (self.capacity / 2).max(1));
        }
        self.free.pop().expect("grown above")
    }

    /// Adds `more` free tail slots to every layer's pool.
    fn grow(&mut self, pools: &mut [Tensor<4>], more: usize) {
        for pool in pools.iter_mut() {
            let [_, heads, block_size, head_dim] = pool.dims();
            let zeros = Tensor::zeros([more, heads, block_size, head_dim], (&pool.device(), pool.dtype()));
            *pool = if self.capacity == 0 { zeros } else { Tensor::cat(vec![pool.clone(), zeros], 0) };
        }
        self.free.extend((self.capacity..self.capacity + more).rev().map(|s| s as u32));
        self.capacity += more;
    }

    /// The key plans of a step's micro-batches, in order (a block a later micro-batch continues
    /// starts from what the earlier one left in its tail). Tails of blocks that fill are freed
    /// at once: a slot taken again in the same step is written only after its old floats were
    /// read, in each layer's write.
    fn plan(
        &mut self,
        steps: &[PagedStep],
        block_size: usize,
        pools: &mut [Tensor<4>],
        devices: &[Device],
    ) -> Result<Vec<KeyPlan>> {
        let mut plans = Vec::with_capacity(steps.len());
        for step in steps {
            let mut plan = KeyPlan::default();
            let mut index: HashMap<u32, usize> = HashMap::new();
            let mut spans: Vec<(usize, usize)> = Vec::new();
            let mut staging = Vec::with_capacity(step.slots.len());
            for &slot in &step.slots {
                if slot == SKIP_SLOT {
                    staging.push(SKIP_SLOT);
                    continue;
                }
                let (block, offset) = (slot / block_size as u32, slot as usize % block_size);
                let i = *index.entry(block).or_insert_with(|| {
                    plan.blocks.push(block);
                    spans.push((offset, offset));
                    spans.len() - 1
                });
                spans[i] = (spans[i].0.min(offset), spans[i].1.max(offset));
                staging.push((i * block_size + offset) as u32);
            }
            for (i, (&block, &(first, last))) in plan.blocks.iter().zip(&spans).enumerate() {
                let count = last + 1;
                plan.counts.push(count);
                let tail = self.of_block.get(&block).copied();
                if first > 0 {
                    match tail {
                        Some(t) => plan.seeds.push((i as u32, t)),
                        None => plan.from_codes = true,
                    }
                }
                if count < block_size {
                    let t = match tail {
                        Some(t) => t,
                        None => self.alloc(pools),
                    };
                    self.of_block.insert(block, t);
                    plan.keep.push((i as u32, t));
                } else if let Some(t) = self.of_block.remove(&block) {
                    self.free.push(t);
                }
            }
            plan.staging =
                devices.iter().map(|d| SlotMapping::new(&staging, d)).collect::<std::result::Result<_, _>>()?;
            plans.push(plan);
        }
        Ok(plans)
    }
}

/// Writes a micro-batch's new keys `new` (`[T, kv_heads, head_dim]`) of one layer as `plan`
/// says: staged as floats, quantized per channel into `keys`, unfinished blocks back to `tails`.
pub(super) fn write_keys(
    keys: &mut KvPool,
    tails: &mut Tensor<4>,
    plan: &KeyPlan,
    device_slot: usize,
    new: Tensor<3>,
) -> Result<()> {
    let KvPool::Quantized(pool) = keys else {
        return Err(PagedError::Internal("per-channel key plan for a float key pool".into()));
    };
    if plan.blocks.is_empty() {
        return Ok(());
    }
    let [_, heads, block_size, head_dim] = pool.dims();
    let n = plan.blocks.len();
    let mut staging = if plan.from_codes {
        pool.read_blocks(&plan.blocks)?.dequantize()
    } else {
        Tensor::zeros([n, heads, block_size, head_dim], (&tails.device(), tails.dtype()))
    };
    if !plan.seeds.is_empty() {
        let (at, slots): (Vec<u32>, Vec<u32>) = plan.seeds.iter().copied().unzip();
        write_blocks_mut(&mut staging, &at, read_blocks(tails, &slots)?)?;
    }
    let slots = plan
        .staging
        .get(device_slot)
        .ok_or_else(|| PagedError::Internal(format!("no key staging slots for device {device_slot}")))?;
    reshape_and_cache_with(&mut staging, new, slots)?;
    if !plan.keep.is_empty() {
        let (at, slots): (Vec<u32>, Vec<u32>) = plan.keep.iter().copied().unzip();
        write_blocks_mut(tails, &slots, read_blocks(&staging, &at)?)?;
    }
    pool.write_channels(&plan.blocks, staging, &plan.counts)?;
    Ok(())
}

impl PagedKvCache {
    /// Bytes one tail block takes over all layers: one block's keys as floats in the layout's
    /// dtype (the residual of per-channel keys; [`PagedKvCache::key_channels`]).
    pub fn tail_bytes(layout: &KvLayout, block_size: usize) -> usize {
        layout.num_layers * Self::block_values(layout, block_size) * layout.dtype.size_bytes()
    }

    /// Tail blocks allocated per layer (0 unless keys are per channel).
    pub fn num_tail_blocks(&self) -> usize {
        self.tails.as_ref().map_or(0, |t| t.capacity)
    }

    /// Grows the tail pool to at least `n` blocks per layer (an engine reserves one per
    /// sequence it runs at once; the pool grows by itself past that). No-op for caches without
    /// per-channel keys.
    pub fn reserve_tails(&mut self, n: usize) {
        let Some(book) = self.tails.as_mut() else { return };
        if book.capacity < n {
            book.grow(&mut self.tail_pools, n - book.capacity);
        }
    }

    /// Forgets the tails of device blocks `live` says are no longer held by any sequence (a
    /// finished or recomputed sequence's unfinished block), returning their slots.
    pub fn drop_free_tails(&mut self, live: impl Fn(BlockId) -> bool) {
        let Some(book) = self.tails.as_mut() else { return };
        let dead: Vec<u32> = book.of_block.keys().copied().filter(|&b| !live(BlockId(b))).collect();
        for block in dead {
            if let Some(t) = book.of_block.remove(&block) {
                book.free.push(t);
            }
        }
    }

    /// Plans the per-channel key writes of a step's micro-batches (nothing without such keys).
    pub(super) fn plan_keys(&mut self, steps: &[PagedStep]) -> Result<()> {
        let Some(book) = self.tails.as_mut() else { return Ok(()) };
        let devices = self.placement.distinct();
        self.key_plans = book.plan(steps, self.block_size, &mut self.tail_pools, devices)?;
        Ok(())
    }

    /// Swap-out of the tails of `pairs`' device blocks, kept on the host by host block.
    pub(super) fn swap_out_tails(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<()> {
        let Some(book) = self.tails.as_mut() else { return Ok(()) };
        for (device, host) in pairs {
            let Some(t) = book.of_block.remove(&device.0) else { continue };
            let floats =
                self.tail_pools.iter().map(|p| Ok(read_blocks(p, &[t])?.into_data())).collect::<Result<_>>()?;
            book.host.insert(host.0, floats);
            book.free.push(t);
        }
        Ok(())
    }

    /// Swap-in of the tails of `pairs`' host blocks into tails of their device blocks.
    pub(super) fn swap_in_tails(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<()> {
        let Some(book) = self.tails.as_mut() else { return Ok(()) };
        for (host, device) in pairs {
            let Some(floats) = book.host.remove(&host.0) else { continue };
            let t = book.alloc(&mut self.tail_pools);
            book.of_block.insert(device.0, t);
            let floats = floats.into_iter().enumerate().map(|(layer, data)| {
                let dtype = data.dtype();
                Tensor::from_data(data, (self.placement.device(layer), dtype))
            });
            write_tail(&mut self.tail_pools, &self.placement, t, floats)?;
        }
        Ok(())
    }

    /// Copy-on-write of tails: each `(src, dst)` whose source has a tail gives the copy its own.
    pub(super) fn copy_tails(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        let Some(book) = self.tails.as_mut() else { return Ok(()) };
        for &(src, dst) in pairs {
            let Some(&from) = book.of_block.get(&src) else { continue };
            let to = book.alloc(&mut self.tail_pools);
            book.of_block.insert(dst, to);
            for pool in self.tail_pools.iter_mut() {
                copy_blocks_mut(pool, &[(from, to)])?;
            }
        }
        Ok(())
    }

    /// The tails of device blocks `ids` (index in `ids`, each layer's floats) for a hand-off.
    pub(super) fn read_tails(&self, ids: &[u32]) -> Result<Vec<(usize, Vec<Tensor<4>>)>> {
        let Some(book) = self.tails.as_ref() else { return Ok(Vec::new()) };
        ids.iter()
            .enumerate()
            .filter_map(|(i, b)| book.of_block.get(b).map(|&t| (i, t)))
            .map(|(i, t)| {
                Ok((i, self.tail_pools.iter().map(|p| read_blocks(p, &[t])).collect::<std::result::Result<_, _>>()?))
            })
            .collect()
    }

    /// Takes handed-off tails (from [`PagedKvCache::read_tails`]) for device blocks `ids`.
    pub(super) fn write_tails(&mut self, ids: &[u32], tails: Vec<(usize, Vec<Tensor<4>>)>) -> Result<()> {
        let Some(book) = self.tails.as_mut() else {
            return if tails.is_empty() {
                Ok(())
            } else {
                Err(PagedError::Internal("key tails handed to a cache without per-channel keys".into()))
            };
        };
        for (i, floats) in tails {
            let block = *ids.get(i).ok_or_else(|| PagedError::Internal(format!("handed-off tail {i} has no block")))?;
            let t = book.alloc(&mut self.tail_pools);
            book.of_block.insert(block, t);
            write_tail(&mut self.tail_pools, &self.placement, t, floats.into_iter())?;
        }
        Ok(())
    }
}

/// Writes each layer's floats over tail slot `t` of that layer's pool.
fn write_tail(
    pools: &mut [Tensor<4>],
    placement: &LayerDevices,
    t: u32,
    floats: impl Iterator<Item = Tensor<4>>,
) -> Result<()> {
    for (layer, (pool, floats)) in pools.iter_mut().zip(floats).enumerate() {
        write_blocks_mut(pool, &[t], floats.to_device(placement.device(layer)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};
    use burn_llm_kernels::QuantSpec;
    use burn_llm_models::cache::LayerDevices;
    use burn_llm_models::{KvCache, KvLayout, Precision};

    use super::super::{PagedKvCache, PagedStep};
    use crate::memory::BlockId;

    const LAYOUT: KvLayout = KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 16, dtype: Precision::F32 };
    const BS: usize = 8;

    fn kv4() -> Option<QuantSpec> {
        Some(QuantSpec::new(4, 16, 3).unwrap())
    }

    fn cache() -> PagedKvCache {
        let device = Device::flex();
        PagedKvCache::placed(LAYOUT, BS, 4, 4, LayerDevices::uniform(&device, 1), kv4()).unwrap()
    }

    /// Key `p` of the test sequence: a steady outlier channel and small others.
    fn key(p: usize) -> Vec<f32> {
        (0..16)
            .map(|e| if e == 2 { 30.0 + (p % 3) as f32 } else { ((p * 7 + e * 3) % 11) as f32 / 10.0 - 0.5 })
            .collect()
    }

    /// Writes positions `positions` of a one-sequence step whose blocks are `table`.
    fn write(cache: &mut PagedKvCache, table: &[u32], positions: std::ops::Range<usize>) {
        let device = Device::flex();
        let slots: Vec<u32> = positions.clone().map(|p| table[p / BS] * BS as u32 + (p % BS) as u32).collect();
        let n = slots.len();
        let step = PagedStep {
            slots,
            block_tables: table.to_vec(),
            max_blocks: table.len(),
            query_seq: vec![0; n],
            context_lens: positions.clone().map(|p| p as u32 + 1).collect(),
        };
        cache.begin_step(&step).unwrap();
        let k: Vec<f32> = positions.flat_map(key).collect();
        let k = Tensor::<4>::from_data(TensorData::new(k, [1, 1, n, 16]), &device);
        cache.attend(0, k.clone(), k.clone(), k, 0.25, None).unwrap();
    }

    /// Block `b`'s keys, dequantized.
    fn keys(cache: &PagedKvCache, b: u32) -> Vec<f32> {
        cache.keys[0].read_blocks(&[b]).unwrap().dense().into_data().try_into_vec_as::<f32>().unwrap()
    }

    /// A block filled over several steps (from its float tail each time) holds exactly the codes
    /// of the same keys written in one step: no error accumulates while it fills; the tail is
    /// freed once it is full.
    #[test]
    fn a_block_filled_a_token_at_a_time_equals_one_written_whole() {
        let (mut whole, mut stepped) = (cache(), cache());
        stepped.reserve_tails(1);
        write(&mut whole, &[0], 0..BS);
        write(&mut stepped, &[0], 0..3);
        assert_eq!(stepped.tails.as_ref().unwrap().of_block.len(), 1, "an unfinished block has a tail");
        for p in 3..BS {
            write(&mut stepped, &[0], p..p + 1);
        }
        assert_eq!(keys(&whole, 0), keys(&stepped, 0));
        // Per channel, the steady outlier channel (2) costs the others nothing; one group along
        // the 16-wide head (what 4 bits stored before) would spend its 16 levels on it.
        let expected: Vec<f32> = (0..BS).flat_map(key).collect();
        let worst = keys(&whole, 0)
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(i, _)| i % 16 != 2)
            .map(|(_, (a, b))| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1.0 / 15.0 / 2.0 + 1e-5, "keys are not quantized per channel: error {worst}");
        assert!(stepped.tails.as_ref().unwrap().of_block.is_empty(), "a full block frees its tail");
        assert_eq!(stepped.num_tail_blocks(), 1, "one tail served every step");
    }

    /// A partly filled block swapped out and in (to another block) or copied (copy-on-write)
    /// keeps its float tail: the writes that finish it give the codes of the keys written whole.
    #[test]
    fn tails_follow_their_block_through_swap_and_copy() {
        let mut whole = cache();
        write(&mut whole, &[0], 0..BS);
        let expected = keys(&whole, 0);

        let mut swapped = cache();
        write(&mut swapped, &[0], 0..5);
        swapped.swap_out(&[(BlockId(0), BlockId(2))]).unwrap();
        swapped.drop_free_tails(|_| false);
        swapped.swap_in(&[(BlockId(2), BlockId(3))]).unwrap();
        write(&mut swapped, &[3], 5..BS);
        assert_eq!(keys(&swapped, 3), expected, "swapped out and in");

        let mut copied = cache();
        write(&mut copied, &[1], 0..5);
        copied.copy_blocks(&[(BlockId(1), BlockId(2))]).unwrap();
        write(&mut copied, &[2], 5..BS);
        write(&mut copied, &[1], 5..BS);
        assert_eq!(keys(&copied, 2), expected, "the copy");
        assert_eq!(keys(&copied, 1), expected, "the original");
    }

    /// The pool reserves the tails asked for; tails of blocks no sequence holds any more are
    /// dropped, live ones stay.
    #[test]
    fn freed_blocks_drop_their_tails() {
        let mut cache = cache();
        cache.reserve_tails(5);
        assert_eq!(cache.num_tail_blocks(), 5);
        write(&mut cache, &[0], 0..3);
        write(&mut cache, &[1], 0..2);
        cache.drop_free_tails(|b| b == BlockId(1));
        let book = cache.tails.as_ref().unwrap();
        assert_eq!(book.of_block.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(book.free.len() + 1, book.capacity);
    }
}
