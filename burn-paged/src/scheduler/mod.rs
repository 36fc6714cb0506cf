//! Iteration-level scheduling (Orca's continuous batching with vLLM's memory policy, thesis
//! §5.4.5): every step picks the sequences to run, reserves their KV slots in the
//! [`BlockManager`], and preempts whole sequence groups when blocks run out.
//!
//! Policy, in order, each step:
//! 1. **Running** groups, first come first served: each live sequence appends its pending tokens
//!    (usually the one just sampled). When the device pool cannot hold them, the latest-arrived
//!    running group is preempted, all or nothing — swapped to the host pool or dropped for
//!    recomputation — until the group fits (or is itself the victim).
//! 2. **Swapped** groups come back next, oldest first, if no group was preempted this step.
//! 3. **Waiting** groups (new requests and recomputation victims) are admitted oldest first only
//!    when nothing is swapped out and nothing was preempted this step, within `max_num_seqs`,
//!    `max_num_batched_tokens` and the free blocks (keeping a small watermark free so a new prompt
//!    does not cause an immediate preemption).
//!
//! Prompts and decodes share a step under the default [`SchedulingPolicy::Fcfs`].
//! [`SchedulingPolicy::Phased`] (ExeGPT's RRA schedule) separates them instead: a prefill step
//! admits waiting groups (step 3 alone, within `encode_batch` groups and without taking the blocks
//! the running groups need next), then up to `decode_iterations` steps run steps 1 and 2 alone,
//! within `decode_batch` sequences; the next prefill comes sooner when `encode_batch` seats have
//! freed (ExeGPT §5.2's runtime adjustment).
//!
//! The baselines of the thesis (§5.6.1) run on the same machinery: [`SchedulingPolicy::Orca`]
//! admits like FCFS but only while every admitted group's contiguous reservation
//! ([`KvReservation`]) fits the device pool, so running groups never outgrow their memory and
//! nothing is preempted; [`SchedulingPolicy::Static`] admits only when nothing runs (a batch
//! waits for its longest request), with max-length reservations.
//!
//! **Chunked prefill** (vLLM's, on by default under FCFS and Orca, [`SchedulerConfig::chunked_prefill`]):
//! a prompt whose tokens do not fit the step's remaining token budget is not held back but cut,
//! and the step computes as much of it as the budget allows; the sequence remembers how many of
//! its tokens are computed ([`Sequence::num_computed`]) and continues next step. The budget goes
//! to the decodes first (running groups whose every sequence has one token to compute), then to
//! partly prefilled groups (oldest first), then to swapped and waiting ones, so a long prompt
//! neither fails nor stalls the running sequences' decoding. Prefix-cache hits are not charged
//! to the budget. Only a step that computes a group's last pending tokens samples it
//! ([`ScheduledSeq::sample`]); a group of several sequences (recomputed samples or beams) keeps
//! each sequence's last token back until one step can compute them all, so its sequences are
//! sampled together. Admission still requires the blocks of the whole prompt to be free (vLLM
//! v0's rule), so chunking changes when tokens are computed, not how much memory a request is
//! admitted with. ExeGPT's phased schedule and static batching compute whole prompts: their
//! prefill steps are defined by whole prompts (and the ExeGPT planner's replay assumes so).
//!
//! The scheduler never touches tensors: it returns the tokens to compute with their slots, and
//! the block copies the engine must perform before the forward pass.

mod chunk;
#[cfg(test)]
mod chunk_tests;
mod group;
mod handoff;
mod policy;
mod preempt;
#[cfg(test)]
mod tests;

pub use group::{GroupStatus, ScheduledSeq, SchedulerOutput, Sequence, SequenceGroup};
use policy::Admission;
pub use policy::{KvReservation, SchedulingPolicy};
pub use preempt::{PreemptionCost, PreemptionMode};

use std::collections::{HashMap, VecDeque};

use burn_plan::admission::PhasedAdmission;

use crate::memory::{BlockManager, Location};

/// Identifier of a sequence group (one request).
pub type GroupId = u64;

/// Limits of one scheduling step.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Sequences running at once, at most.
    pub max_num_seqs: usize,
    /// Tokens computed in one step, at most (prompt tokens count in full unless
    /// `chunked_prefill` cuts them).
    pub max_num_batched_tokens: usize,
    /// How groups are preempted.
    pub preemption: PreemptionMode,
    /// Costs for [`PreemptionMode::Auto`].
    pub cost: PreemptionCost,
    /// Device blocks kept free when admitting prompts (vLLM keeps 1%).
    pub watermark_blocks: usize,
    /// Which steps prefill and which decode.
    pub scheduling: SchedulingPolicy,
    /// The model's maximum sequence length (prompt + output): what [`KvReservation::Max`] reserves.
    pub max_model_len: usize,
    /// Cut prompts that do not fit a step's token budget into chunks computed over several steps
    /// (FCFS and Orca; see the module docs).
    pub chunked_prefill: bool,
}

/// The scheduler: the groups, their queues, and the step policy.
#[derive(Debug)]
pub struct Scheduler<T> {
    config: SchedulerConfig,
    groups: HashMap<GroupId, SequenceGroup<T>>,
    waiting: VecDeque<GroupId>,
    running: Vec<GroupId>,
    swapped: VecDeque<GroupId>,
    /// Decode steps since the last prefill step ([`SchedulingPolicy::Phased`]).
    decodes_since_prefill: usize,
}

impl<T> Scheduler<T> {
    /// An empty scheduler.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            groups: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            decodes_since_prefill: usize::MAX,
        }
    }

    /// Its limits.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Queues a new group (FCFS by `arrival`).
    pub fn add(&mut self, group: SequenceGroup<T>) {
        let id = group.id;
        self.groups.insert(id, group);
        insert_by_arrival(&mut self.waiting, id, &self.groups);
    }

    /// The group `id`.
    pub fn group(&self, id: GroupId) -> Option<&SequenceGroup<T>> {
        self.groups.get(&id)
    }

    /// The group `id`, mutably (the engine appends sampled tokens and forks or drops sequences).
    pub fn group_mut(&mut self, id: GroupId) -> Option<&mut SequenceGroup<T>> {
        self.groups.get_mut(&id)
    }

    /// All groups.
    pub fn groups(&self) -> impl Iterator<Item = &SequenceGroup<T>> {
        self.groups.values()
    }

    /// Whether no group is left.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Groups in each queue: (waiting, running, swapped).
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        (self.waiting.len(), self.running.len(), self.swapped.len())
    }

    /// Rejects group `id`, taken off its queue by the caller: its blocks go back to the pools
    /// now, so that the groups behind it may use them this step, and the engine finishes it
    /// ([`SchedulerOutput::rejected`]).
    fn reject(&mut self, id: GroupId, blocks: &mut BlockManager, out: &mut SchedulerOutput) {
        if let Some(group) = self.groups.get(&id) {
            for seq in &group.seqs {
                // A sequence without blocks has nothing to give back.
                let _ = blocks.free(seq.id);
            }
        }
        out.rejected.push(id);
    }

    /// Removes a group (finished or aborted), freeing its sequences' blocks.
    pub fn remove(&mut self, id: GroupId, blocks: &mut BlockManager) -> Option<SequenceGroup<T>> {
        let group = self.groups.remove(&id)?;
        self.waiting.retain(|&g| g != id);
        self.running.retain(|&g| g != id);
        self.swapped.retain(|&g| g != id);
        for seq in &group.seqs {
            // Waiting groups own no blocks; the others own one table per sequence.
            let _ = blocks.free(seq.id);
        }
        Some(group)
    }

    /// Plans one step (see the module docs) and reserves its blocks.
    pub fn schedule(&mut self, blocks: &mut BlockManager) -> SchedulerOutput {
        match self.config.scheduling {
            SchedulingPolicy::Fcfs => self.schedule_fcfs(blocks),
            SchedulingPolicy::Phased { encode_batch, decode_batch, decode_iterations } => {
                self.schedule_phased(blocks, encode_batch, decode_batch, decode_iterations)
            }
            SchedulingPolicy::Orca(reservation) => self.schedule_reserved(blocks, reservation, false),
            SchedulingPolicy::Static => self.schedule_reserved(blocks, KvReservation::Max, true),
        }
    }

    /// One step of Orca (iteration-level: running groups advance, then waiting ones are admitted
    /// while their reservations fit) or, with `static_batches`, of request-level static batching
    /// (waiting groups are admitted only once every running group has finished).
    fn schedule_reserved(
        &mut self,
        blocks: &mut BlockManager,
        reservation: KvReservation,
        static_batches: bool,
    ) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut token_budget = self.config.max_num_batched_tokens;
        let seats = self.config.max_num_seqs;
        let batch_done = self.running.is_empty() && self.swapped.is_empty();
        self.schedule_running(blocks, &mut out, &mut token_budget);
        if out.preempted.is_empty() {
            self.schedule_swapped(blocks, &mut out, &mut token_budget, seats);
        }
        if out.preempted.is_empty() && self.swapped.is_empty() && (batch_done || !static_batches) {
            let admission = Admission { reservation: Some(reservation), ..Admission::fcfs(seats) };
            // A static batch is every request the reservations admit, formed at once: its prompts
            // are not split across steps by the token budget (a later step would not admit them).
            let mut whole_batch = usize::MAX;
            let budget = if static_batches { &mut whole_batch } else { &mut token_budget };
            self.schedule_waiting(blocks, &mut out, budget, admission);
        }
        out
    }

    /// Device blocks `id` reserves under `reservation`: one contiguous reservation per seat.
    fn reserved_blocks(&self, id: GroupId, reservation: KvReservation, block_size: usize) -> usize {
        let g = &self.groups[&id];
        let tokens = reservation.tokens(g.prompt_len, g.max_new_tokens, self.config.max_model_len);
        g.seats() * tokens.div_ceil(block_size.max(1))
    }

    /// One FCFS step: running groups, then swapped ones, then waiting ones.
    fn schedule_fcfs(&mut self, blocks: &mut BlockManager) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut token_budget = self.config.max_num_batched_tokens;
        let seats = self.config.max_num_seqs;
        self.schedule_running(blocks, &mut out, &mut token_budget);
        if out.preempted.is_empty() {
            self.schedule_swapped(blocks, &mut out, &mut token_budget, seats);
        }
        if out.preempted.is_empty() && self.swapped.is_empty() {
            self.schedule_waiting(blocks, &mut out, &mut token_budget, Admission::fcfs(seats));
        }
        out
    }

    /// One step of ExeGPT's RRA schedule: a prefill step when one is due
    /// ([`PhasedAdmission::prefill_due`]) and it admits something; otherwise a decode step over
    /// the running groups (and swapped ones coming back).
    fn schedule_phased(
        &mut self,
        blocks: &mut BlockManager,
        encode_batch: usize,
        decode_batch: usize,
        decode_iterations: usize,
    ) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut token_budget = self.config.max_num_batched_tokens;
        let seats = self.config.max_num_seqs.min(decode_batch);
        let rule = PhasedAdmission { encode_batch, decode_iterations, seats };
        let due = rule.prefill_due(self.running.is_empty(), self.seats_used(), self.decodes_since_prefill);
        if due && self.swapped.is_empty() {
            // The prompts must not take the blocks the running groups need for their next decode.
            let reserved_blocks = self.running.iter().map(|&g| self.blocks_to_append(g, blocks)).sum();
            let admission = Admission { seats, groups: encode_batch, reserved_blocks, reservation: None };
            self.schedule_waiting(blocks, &mut out, &mut token_budget, admission);
            if !out.seqs.is_empty() {
                self.decodes_since_prefill = 0;
                return out;
            }
        }
        self.schedule_running(blocks, &mut out, &mut token_budget);
        if out.preempted.is_empty() {
            self.schedule_swapped(blocks, &mut out, &mut token_budget, seats);
        }
        if !out.seqs.is_empty() {
            self.decodes_since_prefill = self.decodes_since_prefill.saturating_add(1);
        }
        out
    }

    fn schedule_running(&mut self, blocks: &mut BlockManager, out: &mut SchedulerOutput, budget: &mut usize) {
        // Decodes first, then groups still prefilling, each in arrival order: the budget serves the
        // running sequences' next tokens before any prompt chunk, and preemption takes the last
        // of this order first.
        let groups = &self.groups;
        self.running.sort_by_key(|g| (groups[g].is_prefilling(), groups[g].arrival));
        let mut queue: VecDeque<GroupId> = std::mem::take(&mut self.running).into();
        let mut kept = Vec::new();
        'groups: while let Some(id) = queue.pop_front() {
            let Some(chunk) = self.plan_chunk(id, *budget, blocks) else {
                // Out of token budget, not of memory: it advances next step.
                kept.push(id);
                continue;
            };
            // Checked only when it is short of blocks (which `never_fits` implies), so that a step
            // with room pays nothing for it.
            if self.chunk_blocks(id, &chunk, blocks) > blocks.num_free_blocks(Location::Device)
                && self.never_fits(id, blocks)
            {
                // Its next tokens need more than the whole device pool: preempting it (or anyone)
                // would only bring it back to the same step. It is finished, as a prompt that can
                // never fit is.
                self.reject(id, blocks, out);
                continue;
            }
            while self.chunk_blocks(id, &chunk, blocks) > blocks.num_free_blocks(Location::Device) {
                // Preempt the latest arrival; when none is left behind this group, itself.
                match queue.pop_back() {
                    Some(victim) => self.preempt(victim, blocks, out),
                    None => {
                        self.preempt(id, blocks, out);
                        continue 'groups;
                    }
                }
            }
            if self.append_chunk(id, &chunk, blocks, out) {
                *budget -= chunk.cost;
                kept.push(id);
            } else {
                // Only reachable if the estimate above was wrong; recomputation leaves no
                // half-appended state behind.
                self.preempt_as(id, PreemptionMode::Recompute, blocks, out);
            }
        }
        self.running = kept;
    }

    fn schedule_swapped(
        &mut self,
        blocks: &mut BlockManager,
        out: &mut SchedulerOutput,
        budget: &mut usize,
        seats: usize,
    ) {
        while let Some(&id) = self.swapped.front() {
            let group = &self.groups[&id];
            let seqs = group.seq_ids();
            let chunk = self.plan_chunk(id, *budget, blocks);
            let seats_used = self.seats_used();
            // After swapping in, each sequence still needs room for its pending tokens.
            let table_blocks: usize = seqs.iter().filter_map(|&s| blocks.table(s)).map(|t| t.num_blocks()).sum();
            let growth: usize = group
                .seqs
                .iter()
                .filter_map(|s| {
                    blocks.table(s.id).map(|t| {
                        (t.num_tokens() + s.pending().len()).div_ceil(blocks.block_size()) - t.num_blocks() + 1
                    })
                })
                .sum();
            let fits = blocks.can_swap_in(&seqs)
                && table_blocks + growth <= blocks.num_free_blocks(Location::Device)
                && seats_used + group.seats() <= seats;
            if !fits && self.never_fits(id, blocks) {
                // It can never come back: even the whole device pool cannot hold it and its next
                // tokens. Finished, as a prompt that can never fit is; the queue behind it moves.
                self.swapped.pop_front();
                self.reject(id, blocks, out);
                continue;
            }
            let Some(chunk) = chunk.filter(|_| fits) else {
                break;
            };
            self.swapped.pop_front();
            match blocks.swap_in(&seqs) {
                Ok(mapping) => out.swap_in.extend(mapping),
                Err(_) => {
                    self.swapped.push_front(id);
                    break;
                }
            }
            self.set_status(id, GroupStatus::Running);
            self.running.push(id);
            if !self.append_chunk(id, &chunk, blocks, out) {
                // Only reachable if the growth estimate above was wrong.
                self.preempt_as(id, PreemptionMode::Recompute, blocks, out);
                break;
            }
            *budget -= chunk.cost;
        }
    }

    fn schedule_waiting(
        &mut self,
        blocks: &mut BlockManager,
        out: &mut SchedulerOutput,
        budget: &mut usize,
        limits: Admission,
    ) {
        let total = blocks.total_blocks(Location::Device);
        let mut admitted = 0;
        while let Some(&id) = self.waiting.front() {
            if admitted == limits.groups {
                break;
            }
            let group = &self.groups[&id];
            let per_seq: Vec<usize> =
                group.seqs.iter().map(|s| blocks.blocks_needed_for_new(Some(s.id), s.pending())).collect();
            let needed: usize = per_seq.iter().sum();
            let longest = group.seqs.iter().map(|s| s.tokens.len().div_ceil(blocks.block_size())).max().unwrap_or(0);
            let alone = self.running.is_empty() && self.swapped.is_empty();
            let bs = blocks.block_size();
            let reserve = limits.reservation.map(|r| (r, self.reserved_blocks(id, r, bs)));
            if longest > total
                || (alone && needed > blocks.num_free_blocks(Location::Device))
                || reserve.is_some_and(|(_, reserved)| reserved > total)
            {
                // Even with the device pool to itself it would not fit.
                self.waiting.pop_front();
                out.rejected.push(id);
                continue;
            }
            let chunk = self.plan_chunk(id, *budget, blocks);
            let seats_used = self.seats_used();
            let free = blocks.num_free_blocks(Location::Device);
            let watermark = if self.running.is_empty() || reserve.is_some() { 0 } else { self.config.watermark_blocks };
            let over_reserved = reserve.is_some_and(|(r, mine)| {
                let held: usize =
                    self.running.iter().chain(&self.swapped).map(|&g| self.reserved_blocks(g, r, bs)).sum();
                held + mine > total
            });
            if over_reserved
                || needed + watermark + limits.reserved_blocks > free
                || (seats_used + group.seats() > limits.seats && !self.running.is_empty())
            {
                break;
            }
            let Some(chunk) = chunk else { break };
            self.waiting.pop_front();
            self.set_status(id, GroupStatus::Running);
            if !self.append_chunk(id, &chunk, blocks, out) {
                // Only reachable if the estimate above was wrong: put it back for a later step.
                self.undo_admission(id, blocks);
                self.waiting.push_front(id);
                break;
            }
            *budget -= chunk.cost;
            self.running.push(id);
            admitted += 1;
        }
    }

    /// Device blocks the group's pending tokens need (copy-on-write included).
    fn blocks_to_append(&self, id: GroupId, blocks: &BlockManager) -> usize {
        self.groups[&id]
            .seqs
            .iter()
            .map(|s| blocks.blocks_needed_to_append(s.id, s.pending().len()).unwrap_or(usize::MAX / 4))
            .sum()
    }

    /// Seats the running groups hold.
    fn seats_used(&self) -> usize {
        self.running.iter().map(|g| self.groups[g].seats()).sum()
    }

    fn undo_admission(&mut self, id: GroupId, blocks: &mut BlockManager) {
        if let Some(group) = self.groups.get_mut(&id) {
            for seq in &mut group.seqs {
                let _ = blocks.free(seq.id);
                seq.num_computed = 0;
            }
            group.status = GroupStatus::Waiting;
        }
    }

    fn set_status(&mut self, id: GroupId, status: GroupStatus) {
        if let Some(g) = self.groups.get_mut(&id) {
            g.status = status;
        }
    }

    /// Checks the scheduler's and the block manager's views agree: every running group's
    /// sequences are on the device, swapped ones on the host, waiting ones own no blocks.
    pub fn check_consistency(&self, blocks: &BlockManager) -> Result<(), String> {
        for group in self.groups.values() {
            for seq in &group.seqs {
                let tier = blocks.tier(seq.id);
                let expected = match group.status {
                    GroupStatus::Waiting => None,
                    GroupStatus::Running => Some(Location::Device),
                    GroupStatus::Swapped => Some(Location::Host),
                };
                if tier != expected
                    && !(group.status == GroupStatus::Running && tier.is_none() && seq.num_computed == 0)
                {
                    return Err(format!("group {} ({:?}) sequence {} is on {tier:?}", group.id, group.status, seq.id));
                }
            }
        }
        Ok(())
    }
}

/// Inserts `id` into `queue` keeping it ordered by arrival (FCFS).
fn insert_by_arrival<T>(queue: &mut VecDeque<GroupId>, id: GroupId, groups: &HashMap<GroupId, SequenceGroup<T>>) {
    let arrival = groups.get(&id).map_or(u64::MAX, |g| g.arrival);
    let at = queue.iter().position(|g| groups.get(g).is_some_and(|g| g.arrival > arrival)).unwrap_or(queue.len());
    queue.insert(at, id);
}
