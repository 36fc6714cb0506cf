//! One tier's physical KV blocks: free list, reference counts and the prefix cache.
//!
//! Mirrors vLLM v1's `BlockPool`: the pool knows nothing about sequences, only which physical
//! blocks are in use (reference count > 0), which are free, and which free blocks still hold a
//! cached, content-addressed prefix that a later request may revive.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::{BlockError, BlockId, Location};

/// Content identity of a *full* block: a hash of the parent block's hash and this block's token
/// ids, so equal hashes mean equal tokens at equal positions all the way back to the start of the
/// sequence (the KV of a token depends on every token before it).
///
/// Deterministic across runs and processes of the same build: two domain-separated SipHash-1-3
/// passes with the fixed keys of [`DefaultHasher::new`] give 128 bits, so accidental collisions
/// are negligible. It is not a cryptographic hash; do not share a cache between mutually
/// distrusting tenants on the strength of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockHash(u128);

impl BlockHash {
    /// Hash of a full block holding `tokens`, following the block whose hash is `parent`
    /// (`None` for the first block of a sequence).
    pub fn new(parent: Option<BlockHash>, tokens: &[u32]) -> Self {
        let half = |domain: u8| {
            let mut hasher = DefaultHasher::new();
            domain.hash(&mut hasher);
            parent.hash(&mut hasher);
            tokens.hash(&mut hasher);
            hasher.finish()
        };
        Self((u128::from(half(0)) << 64) | u128::from(half(1)))
    }

    /// The raw 128-bit value (for logging or external cache indexes).
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

/// Physical blocks of one tier.
///
/// Every block is in exactly one state:
/// * **in use** — reference count > 0 (held by one or more block tables);
/// * **free** — count 0, no cached content, on the free list;
/// * **evictable** — count 0 but registered in the prefix cache; it still counts as free and is
///   reclaimed least-recently-released first, only once the plain free list is empty.
///
/// Mutation is crate-private: only the [`BlockManager`](super::BlockManager) may change counts, so
/// the pool can never disagree with the tables that reference it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPool {
    tier: Location,
    ref_counts: Vec<u32>,
    /// Uncached free blocks, used as a stack (most recently freed is reused first).
    free: Vec<BlockId>,
    /// Prefix-cache registration of each block.
    hashes: Vec<Option<BlockHash>>,
    cache: HashMap<BlockHash, BlockId>,
    /// Release tick of each evictable block (key into `evictable`).
    lru_tick: Vec<Option<u64>>,
    /// Evictable blocks ordered by release tick: first entry is the least recently used.
    evictable: BTreeMap<u64, BlockId>,
    clock: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks on `tier`, ids `0..num_blocks`.
    pub fn new(tier: Location, num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        Self {
            tier,
            ref_counts: vec![0; n],
            // Reversed so that allocation hands out block 0 first.
            free: (0..num_blocks).rev().map(BlockId).collect(),
            hashes: vec![None; n],
            cache: HashMap::new(),
            lru_tick: vec![None; n],
            evictable: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Location this pool manages.
    pub fn tier(&self) -> Location {
        self.tier
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks available to allocation: plain free plus evictable cached blocks.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks held by at least one block table.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Free blocks that still hold cached prefix content.
    pub fn num_evictable(&self) -> usize {
        self.evictable.len()
    }

    /// Blocks registered in the prefix cache (in use or evictable).
    pub fn num_cached(&self) -> usize {
        self.cache.len()
    }

    /// Reference count of `block`, or `None` if the id is outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.ref_counts.get(block.index()).copied()
    }

    /// Prefix-cache hash `block` is registered under, if any.
    pub fn cached_hash(&self, block: BlockId) -> Option<BlockHash> {
        self.hashes.get(block.index()).copied().flatten()
    }

    /// Whether `block` is free but cached, i.e. on the eviction list.
    pub fn is_evictable(&self, block: BlockId) -> bool {
        self.lru_tick.get(block.index()).is_some_and(Option::is_some)
    }

    /// The cached block holding the content identified by `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cache.get(&hash).copied()
    }

    /// Takes `n` blocks (reference count 1 each), all or nothing. Plain free blocks go first;
    /// then evictable cached blocks are reclaimed least-recently-used first, dropping their
    /// cache registration.
    pub(crate) fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, BlockError> {
        let free = self.num_free();
        if n > free {
            return Err(BlockError::OutOfBlocks { tier: self.tier, needed: n, free });
        }
        let blocks: Vec<BlockId> = (0..n).filter_map(|_| self.take_one()).collect();
        debug_assert_eq!(blocks.len(), n);
        for &b in &blocks {
            self.ref_counts[b.index()] = 1;
        }
        Ok(blocks)
    }

    /// Pops a plain free block, else evicts the least recently used cached one.
    fn take_one(&mut self) -> Option<BlockId> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        let (_, b) = self.evictable.pop_first()?;
        self.lru_tick[b.index()] = None;
        self.unregister(b);
        Some(b)
    }

    /// Adds one reference to `block`. A block in use just gains a holder; an evictable cached
    /// block (a prefix-cache hit) is taken off the eviction list.
    pub(crate) fn retain(&mut self, block: BlockId) {
        let i = block.index();
        if self.ref_counts[i] == 0 {
            debug_assert!(self.is_evictable(block), "retaining a block that is neither used nor cached");
            if let Some(tick) = self.lru_tick[i].take() {
                self.evictable.remove(&tick);
            }
        }
        self.ref_counts[i] += 1;
    }

    /// Drops one reference to `block`. At zero the block becomes evictable if it is cached (most
    /// recently used end of the LRU), otherwise it goes back to the free list.
    pub(crate) fn release(&mut self, block: BlockId) {
        let i = block.index();
        debug_assert!(self.ref_counts[i] > 0, "releasing free block {block}");
        self.ref_counts[i] = self.ref_counts[i].saturating_sub(1);
        if self.ref_counts[i] > 0 {
            return;
        }
        if self.hashes[i].is_some() {
            self.clock += 1;
            self.lru_tick[i] = Some(self.clock);
            self.evictable.insert(self.clock, block);
        } else {
            self.free.push(block);
        }
    }

    /// Registers in-use `block` as holding the content `hash`. Returns `false` (and changes
    /// nothing) if that content is already cached in another block or the block already has a
    /// registration: the first copy stays canonical, duplicates are freed normally.
    pub(crate) fn register(&mut self, block: BlockId, hash: BlockHash) -> bool {
        let i = block.index();
        if self.hashes[i].is_some() || self.cache.contains_key(&hash) {
            return false;
        }
        self.hashes[i] = Some(hash);
        self.cache.insert(hash, block);
        true
    }

    fn unregister(&mut self, block: BlockId) {
        if let Some(hash) = self.hashes[block.index()].take() {
            self.cache.remove(&hash);
        }
    }

    /// Forgets every prefix-cache registration. Evictable blocks become plain free blocks; blocks
    /// in use keep their contents and holders but will no longer be matched or kept after release.
    /// Returns how many registrations were dropped.
    pub(crate) fn reset_cache(&mut self) -> usize {
        let dropped = self.cache.len();
        for (_, b) in std::mem::take(&mut self.evictable) {
            self.lru_tick[b.index()] = None;
            self.free.push(b);
        }
        self.cache.clear();
        self.hashes.fill(None);
        dropped
    }

    /// Checks the pool's internal bookkeeping (test helper).
    #[cfg(test)]
    pub(crate) fn check_consistency(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let mut seen = vec![0u8; n];
        for &b in &self.free {
            seen[b.index()] += 1;
            if self.ref_counts[b.index()] != 0 || self.hashes[b.index()].is_some() {
                return Err(format!("{:?} free block {b} is used or cached", self.tier));
            }
        }
        for (&tick, &b) in &self.evictable {
            seen[b.index()] += 1;
            if self.ref_counts[b.index()] != 0 || self.hashes[b.index()].is_none() {
                return Err(format!("{:?} evictable block {b} is used or uncached", self.tier));
            }
            if self.lru_tick[b.index()] != Some(tick) {
                return Err(format!("{:?} evictable block {b} has a stale tick", self.tier));
            }
        }
        for (i, (&states, &rc)) in seen.iter().zip(&self.ref_counts).enumerate() {
            let in_use = rc > 0;
            let total = usize::from(states) + usize::from(in_use);
            if total != 1 {
                return Err(format!("{:?} block {i} is in {total} states", self.tier));
            }
            if in_use && self.lru_tick[i].is_some() {
                return Err(format!("{:?} used block {i} has an LRU tick", self.tier));
            }
        }
        for (h, b) in &self.cache {
            if self.hashes[b.index()] != Some(*h) {
                return Err(format!("{:?} cache entry for {b} disagrees with its hash", self.tier));
            }
        }
        if self.hashes.iter().flatten().count() != self.cache.len() {
            return Err(format!("{:?} registered blocks and cache size differ", self.tier));
        }
        Ok(())
    }
}
