//! What one group computes in a step: all of its pending tokens, or, with chunked prefill, as
//! many as the step's remaining token budget allows (see the module docs of
//! [`scheduler`](super)), and the block-manager appends that reserve their slots.

use super::{GroupId, ScheduledSeq, Scheduler, SchedulerOutput, SchedulingPolicy};
use crate::memory::{BlockManager, Location};

/// The tokens one group computes this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chunk {
    /// Leading pending tokens of each sequence (in the order of the group's `seqs`) to append,
    /// prefix-cache hits included.
    pub take: Vec<usize>,
    /// Tokens charged to the step's budget.
    pub cost: usize,
    /// Whether the chunk is every pending token of every sequence (the group is sampled).
    pub complete: bool,
}

impl<T> Scheduler<T> {
    /// Whether prompts are cut into chunks: chunked prefill is on and the policy computes prompts
    /// a step at a time (FCFS, Orca). ExeGPT's prefill steps and static batches are whole prompts.
    pub fn chunks_prompts(&self) -> bool {
        self.config.chunked_prefill
            && matches!(self.config.scheduling, SchedulingPolicy::Fcfs | SchedulingPolicy::Orca(_))
    }

    /// What group `id` computes within `budget` tokens, or `None` when it cannot advance this step.
    ///
    /// Without chunking: every pending token, charged in full, or nothing. With chunking,
    /// prefix-cache hits are free, and when the rest does not fit, each sequence computes what
    /// is left of the budget in turn but keeps its last token back, so that no sequence of the
    /// group is sampled before all of them can be.
    pub(super) fn plan_chunk(&self, id: GroupId, budget: usize, blocks: &BlockManager) -> Option<Chunk> {
        let group = self.groups.get(&id)?;
        let pending: Vec<usize> = group.seqs.iter().map(|s| s.pending().len()).collect();
        if !self.chunks_prompts() {
            let cost: usize = pending.iter().sum();
            return (cost <= budget).then_some(Chunk { take: pending, cost, complete: true });
        }
        let hits: Vec<usize> = group.seqs.iter().map(|s| blocks.cached_prefix_len(s.id, s.pending())).collect();
        let cost: usize = pending.iter().zip(&hits).map(|(p, h)| p - h).sum();
        if cost <= budget {
            return Some(Chunk { take: pending, cost, complete: true });
        }
        let (mut left, mut take) = (budget, Vec::with_capacity(pending.len()));
        for (&p, &h) in pending.iter().zip(&hits) {
            // Hits never cover the last pending token, so `p - 1 - h` does not underflow.
            let computed = p.saturating_sub(1 + h).min(left);
            left -= computed;
            take.push(if computed > 0 { h + computed } else { 0 });
        }
        let cost = budget - left;
        (cost > 0).then_some(Chunk { take, cost, complete: false })
    }

    /// Whether group `id` (running or swapped) needs more than the whole device pool to compute
    /// the tokens it has: the distinct blocks its sequences hold (a shared prompt block once)
    /// plus the blocks their pending tokens fill, without copy-on-write, so never an
    /// overestimate. Such a group can never advance, whatever is preempted.
    pub(super) fn never_fits(&self, id: GroupId, blocks: &BlockManager) -> bool {
        let bs = blocks.block_size();
        let mut held = Vec::new();
        let mut growth = 0;
        for seq in &self.groups[&id].seqs {
            let Some(table) = blocks.table(seq.id) else { return false };
            held.extend_from_slice(table.blocks());
            growth += (table.num_tokens() + seq.pending().len()).div_ceil(bs).saturating_sub(table.num_blocks());
        }
        held.sort_unstable_by_key(|b| b.0);
        held.dedup();
        held.len() + growth > blocks.total_blocks(Location::Device)
    }

    /// Device blocks appending `chunk` to group `id` may consume (copy-on-write included; prefix
    /// hits counted as fresh blocks, so never an underestimate).
    pub(super) fn chunk_blocks(&self, id: GroupId, chunk: &Chunk, blocks: &BlockManager) -> usize {
        self.groups[&id]
            .seqs
            .iter()
            .zip(&chunk.take)
            .map(|(s, &n)| blocks.blocks_needed_to_append(s.id, n).unwrap_or(usize::MAX / 4))
            .sum()
    }

    /// Appends each sequence's share of `chunk` and schedules it; `false` (and nothing scheduled
    /// for the group) if the block manager refused.
    pub(super) fn append_chunk(
        &mut self,
        id: GroupId,
        chunk: &Chunk,
        blocks: &mut BlockManager,
        out: &mut SchedulerOutput,
    ) -> bool {
        let Some(group) = self.groups.get_mut(&id) else {
            return false;
        };
        let mut scheduled = Vec::new();
        let mut copies = Vec::new();
        for (seq, &n) in group.seqs.iter_mut().zip(&chunk.take) {
            let tokens = seq.pending()[..n.min(seq.pending().len())].to_vec();
            if tokens.is_empty() {
                continue;
            }
            match blocks.append(seq.id, &tokens) {
                Ok(outcome) => {
                    let start = seq.num_computed + outcome.cached_tokens;
                    seq.num_computed += tokens.len();
                    copies.extend(outcome.copies);
                    scheduled.push(ScheduledSeq {
                        group: id,
                        seq: seq.id,
                        start,
                        tokens: tokens[outcome.cached_tokens..].to_vec(),
                        slots: outcome.slots,
                        cached_tokens: outcome.cached_tokens,
                        sample: chunk.complete,
                    });
                }
                Err(_) => return false,
            }
        }
        out.copies.extend(copies);
        out.seqs.extend(scheduled);
        true
    }
}
