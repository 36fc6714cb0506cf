//! Preemption (vLLM §5.4.5): when the device pool cannot hold the running groups' next tokens,
//! the latest-scheduled group is preempted, all or nothing, by swapping its blocks to the host
//! pool or by freeing them for recomputation.

use super::{GroupId, GroupStatus, Scheduler, SchedulerOutput, insert_by_arrival};
use crate::memory::BlockManager;

/// How a preempted group gets its KV cache back (vLLM §5.4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreemptionMode {
    /// Copy its blocks to the host pool and back later.
    Swap,
    /// Free its blocks and recompute them later from its tokens, as one prompt.
    Recompute,
    /// Pick per group: swap groups of several sequences (their shared blocks cannot be rebuilt
    /// by one prompt pass), otherwise whichever [`PreemptionCost`] says is cheaper.
    Auto,
}

impl std::str::FromStr for PreemptionMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "swap" => Ok(Self::Swap),
            "recompute" => Ok(Self::Recompute),
            "auto" => Ok(Self::Auto),
            other => Err(format!("`{other}`: preemption is swap, recompute or auto")),
        }
    }
}

/// Estimated costs that decide [`PreemptionMode::Auto`]: moving one block out and back in
/// (transfer of `2 · layers · block_size · kv_heads · head_dim` values each way, plus per-copy
/// overhead) against recomputing one token in a prompt pass. Small blocks make swapping
/// inefficient, long contexts make recomputation expensive (§5.7.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreemptionCost {
    /// Seconds to swap one block out and back in.
    pub swap_s_per_block: f64,
    /// Seconds to recompute one token's KV in a prompt pass.
    pub recompute_s_per_token: f64,
}

impl<T> Scheduler<T> {
    /// The mode used for `id` under the configured policy.
    fn mode_for(&self, id: GroupId, blocks: &BlockManager) -> PreemptionMode {
        let group = &self.groups[&id];
        let seqs = group.seq_ids();
        let can_swap = blocks.can_swap_out(&seqs);
        match self.config.preemption {
            PreemptionMode::Recompute if group.seqs.len() == 1 || !can_swap => PreemptionMode::Recompute,
            PreemptionMode::Recompute | PreemptionMode::Swap if can_swap => PreemptionMode::Swap,
            PreemptionMode::Swap | PreemptionMode::Recompute => PreemptionMode::Recompute,
            PreemptionMode::Auto => {
                if !can_swap {
                    return PreemptionMode::Recompute;
                }
                if group.seqs.len() > 1 {
                    return PreemptionMode::Swap;
                }
                let n_blocks: usize = seqs.iter().filter_map(|&s| blocks.table(s)).map(|t| t.num_blocks()).sum();
                let n_tokens: usize = group.seqs.iter().map(|s| s.num_computed).sum();
                let swap = n_blocks as f64 * self.config.cost.swap_s_per_block;
                let recompute = n_tokens as f64 * self.config.cost.recompute_s_per_token;
                if swap < recompute { PreemptionMode::Swap } else { PreemptionMode::Recompute }
            }
        }
    }

    /// Preempts a running group, all or nothing, the way the policy says.
    pub(super) fn preempt(&mut self, id: GroupId, blocks: &mut BlockManager, out: &mut SchedulerOutput) {
        let mode = self.mode_for(id, blocks);
        self.preempt_as(id, mode, blocks, out);
    }

    /// Preempts a running group by swapping (falling back to recomputation when the host pool is
    /// full) or by recomputation.
    pub(super) fn preempt_as(
        &mut self,
        id: GroupId,
        mode: PreemptionMode,
        blocks: &mut BlockManager,
        out: &mut SchedulerOutput,
    ) {
        let seqs = self.groups[&id].seq_ids();
        let swapped = mode == PreemptionMode::Swap && blocks.swap_out(&seqs).map(|m| out.swap_out.extend(m)).is_ok();
        if swapped {
            self.set_status(id, GroupStatus::Swapped);
            insert_by_arrival(&mut self.swapped, id, &self.groups);
            out.preempted.push((id, PreemptionMode::Swap));
        } else {
            self.undo_admission(id, blocks);
            insert_by_arrival(&mut self.waiting, id, &self.groups);
            out.preempted.push((id, PreemptionMode::Recompute));
        }
        // Work this group had already scheduled this step is void.
        out.seqs.retain(|s| s.group != id);
        self.running.retain(|&g| g != id);
    }
}
