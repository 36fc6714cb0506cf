//! Per-sequence mapping from logical to physical KV blocks.

use super::{BlockHash, BlockId, Location};

/// One sequence's block table: the physical block behind each logical block, how many tokens the
/// sequence holds (the fill of the last block follows from it), and the tier its blocks live on.
///
/// With prefix caching on it also carries the hash chain of its full blocks and the token ids of
/// its partly filled last block, so the block can be hashed and cached the moment it fills up —
/// generated tokens included.
///
/// Tables are created and changed only by the [`BlockManager`](super::BlockManager); callers read
/// them through [`BlockManager::table`](super::BlockManager::table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    tier: Location,
    block_size: usize,
    blocks: Vec<BlockId>,
    num_tokens: usize,
    /// Hashes of the full blocks, in order (empty when hashing is off).
    block_hashes: Vec<BlockHash>,
    /// Token ids in the partly filled last block (empty when hashing is off).
    partial_tokens: Vec<u32>,
}

impl BlockTable {
    /// An empty table on `tier`. `block_size` must be non-zero (the manager validates it).
    pub(crate) fn new(tier: Location, block_size: usize) -> Self {
        debug_assert!(block_size > 0);
        Self {
            tier,
            block_size,
            blocks: Vec::new(),
            num_tokens: 0,
            block_hashes: Vec::new(),
            partial_tokens: Vec::new(),
        }
    }

    /// Location whose pool the block ids refer to.
    pub fn tier(&self) -> Location {
        self.tier
    }

    /// Physical block of each logical block, in order (what the attention kernel reads).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Number of logical blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Tokens whose KV the sequence holds (or is about to hold, once the step that appended them
    /// has run).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Filled positions of the last block: `0` for an empty table, `block_size` when it is full.
    pub fn last_block_fill(&self) -> usize {
        match self.num_tokens % self.block_size {
            0 if self.num_tokens > 0 => self.block_size,
            fill => fill,
        }
    }

    /// Unfilled slots left in the last block (reserved for the next tokens).
    pub fn room_in_last_block(&self) -> usize {
        self.blocks.len() * self.block_size - self.num_tokens
    }

    /// Whether the table ends exactly on a block boundary (no partly filled block).
    pub fn is_block_aligned(&self) -> bool {
        self.num_tokens.is_multiple_of(self.block_size)
    }

    /// Last physical block, if any.
    pub fn last_block(&self) -> Option<BlockId> {
        self.blocks.last().copied()
    }

    /// Hash chain of the full blocks (empty when prefix caching is off).
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    /// Physical slot (`block * block_size + offset`) of token `position`, if the table holds it.
    pub fn slot(&self, position: usize) -> Option<usize> {
        if position >= self.num_tokens {
            return None;
        }
        let block = self.blocks.get(position / self.block_size)?;
        Some(block.index() * self.block_size + position % self.block_size)
    }

    /// Slot the next appended token will occupy, if the last block has room.
    pub(crate) fn next_slot(&self) -> Option<usize> {
        let block = self.blocks.get(self.num_tokens / self.block_size)?;
        Some(block.index() * self.block_size + self.num_tokens % self.block_size)
    }

    /// Appends a physical block for the next logical block.
    pub(crate) fn push_block(&mut self, block: BlockId) {
        self.blocks.push(block);
    }

    /// Appends an already-filled (prefix-cache hit) block with content hash `hash`.
    pub(crate) fn push_cached_block(&mut self, block: BlockId, hash: BlockHash) {
        debug_assert!(self.is_block_aligned() && self.partial_tokens.is_empty());
        self.blocks.push(block);
        self.block_hashes.push(hash);
        self.num_tokens += self.block_size;
    }

    /// Removes the last `n` blocks pushed by [`push_cached_block`](Self::push_cached_block)
    /// (rollback of a failed append) and returns them in logical order.
    pub(crate) fn pop_cached_blocks(&mut self, n: usize) -> Vec<BlockId> {
        let keep = self.blocks.len().saturating_sub(n);
        let popped = self.blocks.split_off(keep);
        self.block_hashes.truncate(self.block_hashes.len().saturating_sub(popped.len()));
        self.num_tokens = self.num_tokens.saturating_sub(popped.len() * self.block_size);
        popped
    }

    /// Points the last logical block at `block` (copy-on-write) and returns the old one.
    pub(crate) fn replace_last_block(&mut self, block: BlockId) -> Option<BlockId> {
        self.blocks.last_mut().map(|last| std::mem::replace(last, block))
    }

    /// Records one more token in the last block. With `hashing`, returns the hash of the last
    /// block if this token filled it.
    pub(crate) fn push_token(&mut self, token: u32, hashing: bool) -> Option<BlockHash> {
        debug_assert!(self.num_tokens < self.blocks.len() * self.block_size);
        self.num_tokens += 1;
        if !hashing {
            return None;
        }
        self.partial_tokens.push(token);
        if self.partial_tokens.len() < self.block_size {
            return None;
        }
        let hash = BlockHash::new(self.block_hashes.last().copied(), &self.partial_tokens);
        self.block_hashes.push(hash);
        self.partial_tokens.clear();
        Some(hash)
    }

    /// Rewrites every block id through `map` and moves the table to `tier` (swapping).
    pub(crate) fn remap(&mut self, tier: Location, mut map: impl FnMut(BlockId) -> BlockId) {
        for block in &mut self.blocks {
            *block = map(*block);
        }
        self.tier = tier;
    }
}
