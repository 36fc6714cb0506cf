//! Whole-group swapping between the device and the host pool (vLLM §5.4.5), all or nothing.

use std::collections::{HashMap, HashSet};

use super::{BlockManager, ensure_tier};
use crate::memory::{BlockError, BlockId, Location, SeqId};

/// A swap, computed without mutating anything.
#[derive(Debug)]
struct SwapPlan {
    /// The group's sequences, duplicates removed, in the caller's order.
    group: Vec<SeqId>,
    /// Distinct source blocks in first-seen order, with how many of the group's tables hold each.
    blocks: Vec<(BlockId, u32)>,
}

impl BlockManager {
    /// Moves a whole sequence group from the device to the host pool, all or nothing (§5.4.5).
    ///
    /// Blocks shared inside the group are moved once and stay shared: the host copy gets one
    /// reference per table of the group holding it. Blocks also held outside the group stay on
    /// the device with fewer references. Returns `(device block, host block)` pairs to copy;
    /// duplicate ids in `seqs` are ignored.
    pub fn swap_out(&mut self, seqs: &[SeqId]) -> Result<Vec<(BlockId, BlockId)>, BlockError> {
        self.swap(seqs, Location::Device, Location::Host)
    }

    /// Moves a swapped-out sequence group back to the device, all or nothing; the reverse of
    /// [`swap_out`](Self::swap_out). Returns `(host block, device block)` pairs to copy. Full
    /// blocks are re-registered in the prefix cache unless their content is already cached.
    pub fn swap_in(&mut self, seqs: &[SeqId]) -> Result<Vec<(BlockId, BlockId)>, BlockError> {
        self.swap(seqs, Location::Host, Location::Device)
    }

    /// Whether [`swap_out`](Self::swap_out)`(seqs)` would succeed right now.
    pub fn can_swap_out(&self, seqs: &[SeqId]) -> bool {
        self.plan_swap(seqs, Location::Device, Location::Host).is_ok()
    }

    /// Whether [`swap_in`](Self::swap_in)`(seqs)` would succeed right now.
    pub fn can_swap_in(&self, seqs: &[SeqId]) -> bool {
        self.plan_swap(seqs, Location::Host, Location::Device).is_ok()
    }

    /// Validates a group swap from `from` to `to` and lists the distinct blocks to move.
    fn plan_swap(&self, seqs: &[SeqId], from: Location, to: Location) -> Result<SwapPlan, BlockError> {
        let mut seen = HashSet::new();
        let group: Vec<SeqId> = seqs.iter().copied().filter(|s| seen.insert(*s)).collect();
        let mut index: HashMap<BlockId, usize> = HashMap::new();
        let mut blocks: Vec<(BlockId, u32)> = Vec::new();
        for &seq in &group {
            let table = self.tables.get(&seq).ok_or(BlockError::UnknownSequence(seq))?;
            ensure_tier(seq, table, from)?;
            for &block in table.blocks() {
                let i = *index.entry(block).or_insert_with(|| {
                    blocks.push((block, 0));
                    blocks.len() - 1
                });
                blocks[i].1 += 1;
            }
        }
        let (needed, free) = (blocks.len(), self.pool(to).num_free());
        if needed > free {
            return Err(BlockError::OutOfBlocks { tier: to, needed, free });
        }
        Ok(SwapPlan { group, blocks })
    }

    fn swap(&mut self, seqs: &[SeqId], from: Location, to: Location) -> Result<Vec<(BlockId, BlockId)>, BlockError> {
        let plan = self.plan_swap(seqs, from, to)?;
        let targets = self.pool_mut(to).allocate(plan.blocks.len())?;
        let pairs: Vec<(BlockId, BlockId)> =
            plan.blocks.iter().zip(&targets).map(|(&(src, _), &dst)| (src, dst)).collect();
        for (&(_, holders), &dst) in plan.blocks.iter().zip(&targets) {
            for _ in 1..holders {
                self.pool_mut(to).retain(dst);
            }
        }
        for &(src, holders) in plan.blocks.iter().rev() {
            for _ in 0..holders {
                self.pool_mut(from).release(src);
            }
        }
        let mapping: HashMap<BlockId, BlockId> = pairs.iter().copied().collect();
        for seq in &plan.group {
            if let Some(table) = self.tables.get_mut(seq) {
                table.remap(to, |b| mapping.get(&b).copied().unwrap_or(b));
            }
        }
        if to == Location::Device && self.config.enable_prefix_caching {
            self.register_full_blocks(&plan.group);
        }
        Ok(pairs)
    }

    /// Registers the full blocks of device-tier `seqs` in the prefix cache (after a swap-in).
    fn register_full_blocks(&mut self, seqs: &[SeqId]) {
        for seq in seqs {
            if let Some(table) = self.tables.get(seq) {
                for (&block, &hash) in table.blocks().iter().zip(table.block_hashes()) {
                    self.device.register(block, hash);
                }
            }
        }
    }
}
