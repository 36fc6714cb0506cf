//! Paged KV-cache memory: physical block pools, per-sequence block tables and the block manager
//! that ties them together (vLLM, Kwon et al., §5.4.2–§5.4.5 and §5.5.2).
//!
//! The KV cache is cut into fixed-size *blocks* of `block_size` token slots, like pages in an
//! operating system's virtual memory. Every sequence owns a [`BlockTable`] mapping its *logical*
//! blocks (filled left to right) to *physical* blocks of a [`BlockPool`]. Physical blocks carry
//! reference counts, so several sequences can share one block:
//!
//! * **parallel sampling / beam search** — [`BlockManager::fork`] gives the child the parent's
//!   table and bumps every block's count; a write into a shared, partly filled last block triggers
//!   *copy-on-write* ([`AppendOutcome::copies`]);
//! * **shared prefixes** — with prefix caching on, every full block is registered under a hash of
//!   its tokens *and everything before it* ([`BlockHash`]); a later prompt whose leading blocks
//!   hash the same maps them instead of recomputing them. Cached blocks nobody uses any more stay
//!   cached but are *evictable*, reclaimed least-recently-used first;
//! * **preemption by swapping** — [`BlockManager::swap_out`] / [`BlockManager::swap_in`] move a
//!   whole sequence group, all or nothing, between the device pool and a host (CPU RAM) pool,
//!   keeping in-group sharing intact.
//!
//! The manager only does bookkeeping: it hands back slot numbers (where to write each token's
//! K/V), `(src, dst)` block pairs to copy, and never touches tensor memory. Scheduling policy
//! (which group to preempt, swap versus recompute) belongs to the caller.
//!
//! Every fallible operation is all-or-nothing: on `Err` the manager is exactly as it was.

#![warn(missing_docs)]

mod manager;
mod pool;
mod table;

#[cfg(test)]
mod tests;

use std::fmt;

pub use manager::{AppendOutcome, BlockManager, BlockManagerConfig, DEFAULT_BLOCK_SIZE};
pub use pool::{BlockHash, BlockPool};
pub use table::BlockTable;

/// Identifier of a sequence (one sample / beam candidate of a request), chosen by the caller.
pub type SeqId = u64;

/// Index of a physical KV block inside one tier's pool.
///
/// Block ids are per tier: `BlockId(3)` on the device and `BlockId(3)` on the host are different
/// blocks. The slot of offset `o` in block `b` is `b * block_size + o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The id as an index into per-block arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where a block pool (and hence a sequence's blocks) lives: vLLM's GPU and CPU block allocators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Location {
    /// Accelerator memory: the only tier attention kernels read from.
    Device,
    /// Host RAM: swap space for preempted sequence groups.
    Host,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Location::Device => "device",
            Location::Host => "host",
        })
    }
}

/// Why a block-manager operation was refused. The manager is unchanged whenever one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// Not enough free blocks right now; freeing or preempting other sequences may help.
    #[error("out of KV blocks on the {tier} tier: need {needed}, only {free} free")]
    OutOfBlocks {
        /// Location whose pool ran short.
        tier: Location,
        /// Free blocks the operation would consume.
        needed: usize,
        /// Free blocks (evictable cached ones included) available.
        free: usize,
    },
    /// The sequence would need more blocks than the whole device pool holds: it can never run.
    #[error(
        "sequence {seq} would need {needed} KV blocks but the device pool only has {total}; \
         it can never fit"
    )]
    ExceedsCapacity {
        /// Sequence that was being extended or created.
        seq: SeqId,
        /// Blocks its table would span after the operation.
        needed: usize,
        /// Size of the device pool.
        total: usize,
    },
    /// No sequence with this id is known to the manager.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// A sequence with this id already exists (e.g. the child of a fork).
    #[error("sequence {0} already exists")]
    SequenceExists(SeqId),
    /// The sequence lives on a tier the operation cannot act on (e.g. appending while swapped out).
    #[error("sequence {seq} is on the {actual} tier, but the operation needs it on the {expected} tier")]
    WrongTier {
        /// Offending sequence.
        seq: SeqId,
        /// Location the operation requires.
        expected: Location,
        /// Location the sequence is on.
        actual: Location,
    },
    /// The configuration cannot describe a valid cache.
    #[error("invalid block manager configuration: {0}")]
    InvalidConfig(&'static str),
}
