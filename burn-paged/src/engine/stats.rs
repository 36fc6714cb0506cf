//! Counters over the paged engine's life ([`EngineStats`]), and the KV-usage sums one model step
//! adds to them.

use std::collections::HashMap;

use crate::memory::{BlockManager, Location};
use crate::scheduler::ScheduledSeq;

/// Counters over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Steps run.
    pub steps: usize,
    /// Steps that ran the model.
    pub model_steps: usize,
    /// Sequences in the batch, summed over model steps (÷ `model_steps`: average batch size).
    pub batched_seqs: usize,
    /// Tokens computed (prompt, recomputation and decode).
    pub computed_tokens: usize,
    /// Prompt tokens the prefix cache supplied.
    pub cached_tokens: usize,
    /// Prompt chunks computed that left part of their prompt for later steps (chunked prefill).
    pub partial_prefills: usize,
    /// Tokens sampled.
    pub generated_tokens: usize,
    /// Groups preempted by swapping.
    pub swaps: usize,
    /// Groups preempted by recomputation.
    pub recomputes: usize,
    /// KV tokens stored in device blocks, summed over model steps.
    pub kv_tokens: usize,
    /// Slots of the device blocks in use, summed over model steps.
    pub kv_slots: usize,
    /// Most device blocks in use at once.
    pub peak_blocks: usize,
    /// Blocks the sequences' tables reference (a shared block counted once per table), summed
    /// over model steps: what the cache would hold without sharing.
    pub logical_blocks: usize,
    /// Distinct device blocks in use, summed over model steps.
    pub physical_blocks: usize,
    /// Sequences whose KV blocks moved from the prefill device's pool to the decode device's
    /// (disaggregated prefill and decode, [`DisaggEngine`](crate::DisaggEngine)).
    pub kv_transfers: usize,
    /// Bytes of KV blocks so moved.
    pub kv_transfer_bytes: u64,
    /// Seconds spent moving them (`to_device` and the writes into the decode pool).
    pub kv_transfer_s: f64,
    /// Seconds the prefill device's steps took ([`DisaggEngine`](crate::DisaggEngine); 0 otherwise).
    pub prefill_busy_s: f64,
    /// Seconds the decode device's steps took ([`DisaggEngine`](crate::DisaggEngine); 0 otherwise).
    pub decode_busy_s: f64,
}

impl EngineStats {
    /// Mean sequences per model step.
    pub fn average_batch(&self) -> f64 {
        self.batched_seqs as f64 / self.model_steps.max(1) as f64
    }

    /// KV tokens stored ÷ KV slots reserved, over all model steps (1 − internal fragmentation).
    pub fn kv_utilization(&self) -> f64 {
        self.kv_tokens as f64 / self.kv_slots.max(1) as f64
    }

    /// Fraction of KV memory that block sharing saved (parallel samples, beams, prefixes):
    /// `1 − physical ÷ logical` blocks over all model steps.
    pub fn sharing_saving(&self) -> f64 {
        1.0 - self.physical_blocks as f64 / self.logical_blocks.max(1) as f64
    }
}

impl EngineStats {
    /// The counters of two engines over separate pools (a prefill and a decode device) as one:
    /// sums, the peaks of the two pools added.
    pub fn combined(a: &Self, b: &Self) -> Self {
        Self {
            steps: a.steps.max(b.steps),
            model_steps: a.model_steps + b.model_steps,
            batched_seqs: a.batched_seqs + b.batched_seqs,
            computed_tokens: a.computed_tokens + b.computed_tokens,
            cached_tokens: a.cached_tokens + b.cached_tokens,
            partial_prefills: a.partial_prefills + b.partial_prefills,
            generated_tokens: a.generated_tokens + b.generated_tokens,
            swaps: a.swaps + b.swaps,
            recomputes: a.recomputes + b.recomputes,
            kv_tokens: a.kv_tokens + b.kv_tokens,
            kv_slots: a.kv_slots + b.kv_slots,
            peak_blocks: a.peak_blocks + b.peak_blocks,
            logical_blocks: a.logical_blocks + b.logical_blocks,
            physical_blocks: a.physical_blocks + b.physical_blocks,
            kv_transfers: a.kv_transfers + b.kv_transfers,
            kv_transfer_bytes: a.kv_transfer_bytes + b.kv_transfer_bytes,
            kv_transfer_s: a.kv_transfer_s + b.kv_transfer_s,
            prefill_busy_s: a.prefill_busy_s + b.prefill_busy_s,
            decode_busy_s: a.decode_busy_s + b.decode_busy_s,
        }
    }

    /// Counts one model step over `seqs`: its batch, the tokens it computes (one slot each) and
    /// those the prefix cache supplied.
    pub(super) fn record_model_step(&mut self, seqs: &[ScheduledSeq]) {
        self.model_steps += 1;
        self.batched_seqs += seqs.len();
        self.computed_tokens += seqs.iter().map(|s| s.tokens.len()).sum::<usize>();
        self.cached_tokens += seqs.iter().map(|s| s.cached_tokens).sum::<usize>();
        self.partial_prefills += seqs.iter().filter(|s| !s.sample).count();
    }

    /// Adds the KV tokens stored against slots reserved in device blocks now (shared blocks
    /// counted once), and the blocks the tables reference against those in use.
    pub(super) fn record_usage(&mut self, blocks: &BlockManager) {
        let bs = blocks.block_size();
        let mut fill: HashMap<u32, usize> = HashMap::new();
        for seq in blocks.sequences() {
            let Some(table) = blocks.table(seq) else { continue };
            if table.tier() != Location::Device {
                continue;
            }
            let n = table.num_tokens();
            self.logical_blocks += table.num_blocks();
            for (i, b) in table.blocks().iter().enumerate() {
                let f = (n - (i * bs).min(n)).min(bs);
                let entry = fill.entry(b.0).or_default();
                *entry = (*entry).max(f);
            }
        }
        self.kv_tokens += fill.values().sum::<usize>();
        self.kv_slots += fill.len() * bs;
        self.physical_blocks += fill.len();
        self.peak_blocks = self.peak_blocks.max(blocks.used_blocks(Location::Device));
    }
}
