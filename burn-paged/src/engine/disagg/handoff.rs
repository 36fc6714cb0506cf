//! A prefilled request leaving one [`LlmEngine`] with its KV blocks and joining another: the
//! two halves of ExeGPT's WAA hand-off, each engine's bookkeeping kept whole on both sides.

use std::time::Instant;

use burn_llm_models::LanguageModel;

use super::super::{LlmEngine, RequestData};
use crate::cache::KvBlocks;
use crate::error::{PagedError, Result};
use crate::memory::Location;
use crate::scheduler::SequenceGroup;

/// A prefilled request between two engines: its scheduler group (sequences, sampled tokens,
/// request state) and the KV blocks of each sequence's computed tokens, still on the device that
/// computed them.
#[derive(Debug)]
pub(super) struct Handoff {
    pub(super) group: SequenceGroup<RequestData>,
    /// Per sequence of `group.seqs`, in order.
    pub(super) kv: Vec<KvBlocks>,
}

impl Handoff {
    /// Device blocks the request needs on arrival.
    pub(super) fn blocks(&self) -> usize {
        self.kv.iter().map(KvBlocks::num_blocks).sum()
    }

    /// The request's id.
    pub(super) fn request_id(&self) -> &str {
        &self.group.data.request_id
    }
}

impl<M: LanguageModel> LlmEngine<M> {
    /// Takes every running request whose prompt is computed and sampled out of this engine,
    /// oldest first: its KV blocks are read into tensors (on this engine's devices) and freed
    /// here, its group leaves the scheduler.
    pub(super) fn take_prefilled(&mut self) -> Result<Vec<Handoff>> {
        let mut out = Vec::new();
        for id in self.scheduler.prefilled() {
            let Some(group) = self.scheduler.detach(id) else { continue };
            let mut kv = Vec::with_capacity(group.seqs.len());
            for seq in &group.seqs {
                let table = self
                    .blocks
                    .block_table(seq.id)
                    .ok_or_else(|| PagedError::Internal(format!("prefilled sequence {} has no block table", seq.id)))?;
                kv.push(self.runner.cache.read_blocks(table)?);
                self.blocks.free(seq.id)?;
            }
            self.requests.remove(&group.data.request_id);
            out.push(Handoff { group, kv });
        }
        Ok(out)
    }

    /// Whether `handoff` can join now: a seat within `max_num_seqs` (the decode batch), nothing
    /// swapped out ahead of it, and its blocks free beyond what the running requests need next.
    pub(super) fn has_room_for(&self, handoff: &Handoff) -> bool {
        let free = self.blocks.num_free_blocks(Location::Device);
        self.scheduler.has_seats_for(&handoff.group)
            && handoff.blocks() + self.scheduler.blocks_reserved(&self.blocks) <= free
    }

    /// Admits `handoff` as a running request: allocates its blocks here, moves its KV into them
    /// (`to_device`), and counts the bytes and the time in this engine's stats. The caller checks
    /// [`LlmEngine::has_room_for`] first.
    pub(super) fn admit(&mut self, handoff: Handoff) -> Result<()> {
        let start = Instant::now();
        let Handoff { group, kv } = handoff;
        let request_id = group.data.request_id.clone();
        if self.requests.contains_key(&request_id) {
            return Err(PagedError::DuplicateRequest(request_id));
        }
        let mut bytes = 0;
        for (seq, blocks) in group.seqs.iter().zip(kv) {
            bytes += blocks.bytes();
            // The moved blocks hold the KV: no prefix-cache hit may stand in for them.
            self.blocks.set_prefix_lookup(seq.id, false);
            let appended = self.blocks.append(seq.id, &seq.tokens[..seq.num_computed]);
            self.blocks.set_prefix_lookup(seq.id, true);
            // A fresh table: every slot is new, nothing is copied or cached.
            let _slots = appended?;
            let table = self.blocks.block_table(seq.id).map(<[_]>::to_vec).unwrap_or_default();
            self.runner.cache.write_blocks(&table, blocks)?;
        }
        self.requests.insert(request_id, group.id);
        self.scheduler.attach_running(group);
        self.stats.kv_transfers += 1;
        self.stats.kv_transfer_bytes += bytes;
        self.stats.kv_transfer_s += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Finishes `handoff` as aborted from here, where it never ran: what it had generated comes
    /// back with finish reason `abort`.
    pub(super) fn abort_arriving(&mut self, handoff: Handoff) -> Result<Vec<burn_llm_models::RequestOutput>> {
        let group = handoff.group;
        let id = group.id;
        self.requests.insert(group.data.request_id.clone(), id);
        self.scheduler.attach_waiting(group);
        self.finish_group(id, true)
    }
}
