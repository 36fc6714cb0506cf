//! Groups leaving one scheduler and joining another with their KV cache: disaggregated prefill
//! and decode (ExeGPT's WAA, [`DisaggEngine`](crate::DisaggEngine)). The scheduler hands over
//! the bookkeeping only; the engine moves the blocks' contents.

use super::{GroupId, GroupStatus, Scheduler, SequenceGroup};
use crate::memory::BlockManager;

impl<T> Scheduler<T> {
    /// Running groups whose prompts are computed and sampled, oldest first: every sequence has
    /// exactly its last sampled token left to compute. They are what a prefill device hands on.
    pub fn prefilled(&self) -> Vec<GroupId> {
        let mut ids: Vec<GroupId> = self
            .running
            .iter()
            .copied()
            .filter(|id| {
                self.groups[id]
                    .seqs
                    .iter()
                    .all(|s| s.num_computed >= self.groups[id].prompt_len && s.pending().len() == 1)
            })
            .collect();
        ids.sort_by_key(|id| self.groups[id].arrival);
        ids
    }

    /// Takes a running group out of this scheduler without freeing its blocks (the caller reads
    /// them, then frees them).
    pub fn detach(&mut self, id: GroupId) -> Option<SequenceGroup<T>> {
        if !self.running.contains(&id) {
            return None;
        }
        self.running.retain(|&g| g != id);
        self.groups.remove(&id)
    }

    /// Adds a group whose sequences' blocks the caller has just allocated in `blocks` and filled:
    /// it runs from the next step on, as if it had been prefilled here.
    pub fn attach_running(&mut self, mut group: SequenceGroup<T>) {
        group.status = GroupStatus::Running;
        let id = group.id;
        self.groups.insert(id, group);
        self.running.push(id);
    }

    /// Adds a group that holds no blocks as waiting (an arriving group aborted before it could
    /// join: the engine finishes it from there).
    pub fn attach_waiting(&mut self, mut group: SequenceGroup<T>) {
        group.status = GroupStatus::Waiting;
        self.add(group);
    }

    /// Whether `group` may join the running groups now: its seats are free within
    /// `max_num_seqs`, and no group preempted here (swapped out, or waiting to be recomputed)
    /// waits to come back first: those keep their FCFS priority.
    pub fn has_seats_for(&self, group: &SequenceGroup<T>) -> bool {
        self.swapped.is_empty()
            && self.waiting.is_empty()
            && self.seats_used() + group.seats() <= self.config.max_num_seqs
    }

    /// Free device blocks kept back from arriving groups: the blocks the running groups need for
    /// their next tokens plus the watermark, so an arrival never causes an immediate preemption.
    pub fn blocks_reserved(&self, blocks: &BlockManager) -> usize {
        self.running.iter().map(|&g| self.blocks_to_append(g, blocks)).sum::<usize>() + self.config.watermark_blocks
    }
}
