//! What the scheduler works on and hands back: a request's sequences ([`SequenceGroup`],
//! [`Sequence`]) and one step's plan ([`SchedulerOutput`], [`ScheduledSeq`]).

use super::{GroupId, PreemptionMode};
use crate::memory::{BlockId, SeqId};

/// One sequence (a sample or beam candidate) of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// Its id in the block manager.
    pub id: SeqId,
    /// Prompt and generated tokens.
    pub tokens: Vec<u32>,
    /// Leading tokens whose KV is in the cache (or being computed this step).
    pub num_computed: usize,
}

impl Sequence {
    /// A sequence that has computed nothing yet.
    pub fn new(id: SeqId, tokens: Vec<u32>) -> Self {
        Self { id, tokens, num_computed: 0 }
    }

    /// Tokens whose KV still has to be computed.
    pub fn pending(&self) -> &[u32] {
        &self.tokens[self.num_computed.min(self.tokens.len())..]
    }
}

/// Where a group is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStatus {
    /// Waiting for its (re)computation to be admitted.
    Waiting,
    /// Its KV cache is on the device and it advances every step.
    Running,
    /// Its KV cache is parked in the host pool.
    Swapped,
}

/// The sequences of one request, scheduled together (gang-scheduled, §5.4.5), with the engine's
/// per-request state `T`.
#[derive(Debug, Clone)]
pub struct SequenceGroup<T> {
    /// Its id.
    pub id: GroupId,
    /// Arrival order (FCFS key).
    pub arrival: u64,
    /// Live sequences.
    pub seqs: Vec<Sequence>,
    /// Sequences the group will run at most (`n`, `best_of` or the beam width), counted against
    /// `max_num_seqs` from admission on.
    pub max_seqs: usize,
    /// Engine state.
    pub data: T,
    /// Prompt tokens at arrival (reservations are sized from them).
    pub prompt_len: usize,
    /// Tokens each sequence may generate at most (`usize::MAX` when unbounded): what
    /// [`KvReservation::Oracle`] and [`KvReservation::Pow2`] reserve beyond the prompt.
    pub max_new_tokens: usize,
    pub(super) status: GroupStatus,
}

impl<T> SequenceGroup<T> {
    /// A new group with one sequence holding the prompt.
    pub fn new(id: GroupId, arrival: u64, first: Sequence, max_seqs: usize, data: T) -> Self {
        let prompt_len = first.tokens.len();
        Self {
            id,
            arrival,
            seqs: vec![first],
            max_seqs: max_seqs.max(1),
            data,
            prompt_len,
            max_new_tokens: usize::MAX,
            status: GroupStatus::Waiting,
        }
    }

    /// Bounds the tokens each sequence may generate (sizes Orca's reservations).
    pub fn with_max_new_tokens(mut self, max_new_tokens: usize) -> Self {
        self.max_new_tokens = max_new_tokens;
        self
    }

    /// Where the group is.
    pub fn status(&self) -> GroupStatus {
        self.status
    }

    /// Ids of its live sequences.
    pub fn seq_ids(&self) -> Vec<SeqId> {
        self.seqs.iter().map(|s| s.id).collect()
    }

    /// Whether it still has prompt (or recomputation) tokens to compute beyond one token per
    /// sequence: a partly prefilled group under chunked prefill.
    pub fn is_prefilling(&self) -> bool {
        self.seqs.iter().any(|s| s.pending().len() > 1)
    }

    pub(super) fn seats(&self) -> usize {
        self.max_seqs.max(self.seqs.len())
    }
}

/// Tokens of one sequence computed this step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Its group.
    pub group: GroupId,
    /// The sequence.
    pub seq: SeqId,
    /// Position of the first computed token.
    pub start: usize,
    /// Token ids to compute (positions `start..start + tokens.len()`).
    pub tokens: Vec<u32>,
    /// KV slot of each token.
    pub slots: Vec<usize>,
    /// Prompt tokens the prefix cache supplied (they are not recomputed).
    pub cached_tokens: usize,
    /// Whether these tokens complete the sequence's pending ones, so that its last token's
    /// logits are sampled; `false` for a chunk of a prompt still being prefilled.
    pub sample: bool,
}

/// What the engine must do this step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerOutput {
    /// Sequences to run, in batch order.
    pub seqs: Vec<ScheduledSeq>,
    /// `(device, host)` block copies of groups swapped out (do these first).
    pub swap_out: Vec<(BlockId, BlockId)>,
    /// `(host, device)` block copies of groups swapped in.
    pub swap_in: Vec<(BlockId, BlockId)>,
    /// Copy-on-write `(src, dst)` device block copies (after the swaps, before the forward pass).
    pub copies: Vec<(BlockId, BlockId)>,
    /// Groups preempted this step and how.
    pub preempted: Vec<(GroupId, PreemptionMode)>,
    /// Groups that can never run (a single sequence larger than the whole device pool); the
    /// engine must finish them.
    pub rejected: Vec<GroupId>,
}

impl SchedulerOutput {
    /// Tokens computed this step.
    pub fn num_batched_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}
