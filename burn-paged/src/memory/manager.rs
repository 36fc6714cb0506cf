//! The block manager: block tables of all sequences over a device pool and a host (swap) pool.
//!
//! Implements vLLM's three sequence primitives (§5.5.2) — [`append`](BlockManager::append),
//! [`fork`](BlockManager::fork), [`free`](BlockManager::free) — plus whole-group swapping between
//! tiers (§5.4.5) and side-effect-free capacity queries for the scheduler.

use std::collections::{BTreeMap, BTreeSet};

use super::{BlockError, BlockHash, BlockId, BlockPool, BlockTable, Location, SeqId};

mod swap;

/// Default number of token slots per KV block (vLLM's default).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Sizes and switches of a [`BlockManager`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockManagerConfig {
    /// Token slots per block. Larger blocks batch the attention kernel's reads better but waste
    /// up to `block_size - 1` slots per sequence.
    pub block_size: usize,
    /// Physical blocks in the device (accelerator) KV cache.
    pub num_device_blocks: usize,
    /// Physical blocks in the host swap space.
    pub num_host_blocks: usize,
    /// Share full blocks between requests by content hash (automatic prefix caching).
    pub enable_prefix_caching: bool,
}

impl BlockManagerConfig {
    /// `num_device_blocks` / `num_host_blocks` blocks of [`DEFAULT_BLOCK_SIZE`] slots, prefix
    /// caching on (as in vLLM v1).
    pub fn new(num_device_blocks: usize, num_host_blocks: usize) -> Self {
        Self { block_size: DEFAULT_BLOCK_SIZE, num_device_blocks, num_host_blocks, enable_prefix_caching: true }
    }

    /// The same configuration with `block_size` slots per block.
    pub fn with_block_size(mut self, block_size: usize) -> Self {
        self.block_size = block_size;
        self
    }

    /// The same configuration with prefix caching switched on or off.
    pub fn with_prefix_caching(mut self, enable: bool) -> Self {
        self.enable_prefix_caching = enable;
        self
    }

    /// Checks that the block size is non-zero, block ids fit in `u32` and every slot number fits
    /// in `usize`.
    pub fn validate(&self) -> Result<(), BlockError> {
        if self.block_size == 0 {
            return Err(BlockError::InvalidConfig("block_size must be at least 1"));
        }
        for blocks in [self.num_device_blocks, self.num_host_blocks] {
            if u32::try_from(blocks).is_err() {
                return Err(BlockError::InvalidConfig("block count does not fit in a u32 block id"));
            }
            if blocks.checked_mul(self.block_size).is_none() {
                return Err(BlockError::InvalidConfig("block count * block_size overflows usize"));
            }
        }
        Ok(())
    }
}

/// What an [`append`](BlockManager::append) did, for the engine to act on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "copies must be performed and K/V written to the slots"]
pub struct AppendOutcome {
    /// Leading appended tokens whose KV was found in the prefix cache: they need no compute.
    /// Always a whole number of blocks and always less than the number of appended tokens, so
    /// the last token is computed and yields logits.
    pub cached_tokens: usize,
    /// Slot (`block * block_size + offset`) for each token that must be computed:
    /// `slots[i]` belongs to `tokens[cached_tokens + i]` (the reshape-and-cache slot mapping).
    pub slots: Vec<usize>,
    /// Copy-on-write `(src, dst)` device block pairs: copy `src` into `dst` before writing any
    /// slot of this step.
    pub copies: Vec<(BlockId, BlockId)>,
}

/// What an append would do, computed without mutating anything.
#[derive(Debug)]
struct AppendPlan {
    /// Prefix-cache hits to map, with their hashes.
    hits: Vec<(BlockId, BlockHash)>,
    /// Whether the shared, partly filled last block must be copied first.
    cow: bool,
    /// Fresh blocks for new logical blocks (copy-on-write target excluded).
    fresh: usize,
    /// Hits on evictable blocks: they leave the free count too.
    revived: usize,
    /// Blocks the table spans afterwards.
    total_blocks: usize,
}

impl AppendPlan {
    /// Free blocks (as counted by [`BlockPool::num_free`]) the append consumes.
    fn consumed(&self) -> usize {
        self.fresh + usize::from(self.cow) + self.revived
    }
}

/// Block tables of all live sequences over a device pool and a host swap pool.
///
/// Design follows vLLM: the manager owns the tables and the two [`BlockPool`]s, hands out slot
/// numbers and block-copy lists, and enforces all-or-nothing semantics — every `Err` leaves it
/// exactly as it was. Only device-tier sequences can grow; host-tier ones are parked until
/// [`swap_in`](Self::swap_in). Prefix caching applies to the device pool only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockManager {
    config: BlockManagerConfig,
    device: BlockPool,
    host: BlockPool,
    tables: BTreeMap<SeqId, BlockTable>,
    /// Sequences whose appends never take prefix-cache hits (their whole prompt must be computed:
    /// prompt log-probabilities).
    no_prefix_lookup: BTreeSet<SeqId>,
}

impl BlockManager {
    /// A manager with every block free, after validating `config`.
    pub fn new(config: BlockManagerConfig) -> Result<Self, BlockError> {
        config.validate()?;
        let count = |n: usize| u32::try_from(n).map_err(|_| BlockError::InvalidConfig("block count"));
        Ok(Self {
            device: BlockPool::new(Location::Device, count(config.num_device_blocks)?),
            host: BlockPool::new(Location::Host, count(config.num_host_blocks)?),
            config,
            tables: BTreeMap::new(),
            no_prefix_lookup: BTreeSet::new(),
        })
    }

    /// The configuration the manager was built with.
    pub fn config(&self) -> &BlockManagerConfig {
        &self.config
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    // ----- mutation primitives -------------------------------------------------------------

    /// Appends `tokens` to `seq` (creating it if new) and reserves KV slots for them.
    ///
    /// * With prefix caching on and `seq` ending on a block boundary, leading full blocks of
    ///   `tokens` whose hash chain is cached are mapped (reference count + 1) instead of
    ///   allocated; they are reported as [`AppendOutcome::cached_tokens`]. At most
    ///   `(tokens.len() - 1) / block_size` blocks are matched so the last token is always computed.
    /// * If the last block is partly filled and shared, it is copied on write: a fresh block is
    ///   allocated, the pair is reported in [`AppendOutcome::copies`], and the old block loses a
    ///   reference.
    /// * Every block that becomes full is registered in the prefix cache (when on), generated
    ///   tokens included. Registration happens now, so the caller must write the K/V of this step
    ///   before (or in the same forward pass as) any request that hits these blocks reads them.
    ///
    /// Errors: [`BlockError::WrongTier`] if `seq` is swapped out, [`BlockError::ExceedsCapacity`]
    /// if the sequence would outgrow the whole device pool, [`BlockError::OutOfBlocks`] if too
    /// few blocks are free now.
    pub fn append(&mut self, seq: SeqId, tokens: &[u32]) -> Result<AppendOutcome, BlockError> {
        let plan = self.plan_append(seq, tokens)?;
        let bs = self.config.block_size;
        let existing = self.tables.remove(&seq);
        let existed = existing.is_some();
        let mut table = existing.unwrap_or_else(|| BlockTable::new(Location::Device, bs));

        for &(block, hash) in &plan.hits {
            self.device.retain(block);
            table.push_cached_block(block, hash);
        }
        // Cannot fail: `plan_append` checked the free count after hits were accounted for.
        let mut new_blocks = match self.device.allocate(plan.fresh + usize::from(plan.cow)) {
            Ok(blocks) => blocks.into_iter(),
            Err(err) => {
                self.undo_hits(seq, table, plan.hits.len(), existed);
                return Err(err);
            }
        };

        let mut copies = Vec::new();
        if plan.cow
            && let Some(dst) = new_blocks.next()
            && let Some(src) = table.replace_last_block(dst)
        {
            self.device.release(src);
            copies.push((src, dst));
        }

        let cached_tokens = plan.hits.len() * bs;
        let rest = &tokens[cached_tokens..];
        let mut slots = Vec::with_capacity(rest.len());
        let (head, tail) = rest.split_at(table.room_in_last_block().min(rest.len()));
        self.write_tokens(&mut table, head, &mut slots);
        for (chunk, block) in tail.chunks(bs).zip(new_blocks.by_ref()) {
            table.push_block(block);
            self.write_tokens(&mut table, chunk, &mut slots);
        }
        debug_assert!(new_blocks.next().is_none() && slots.len() == rest.len());
        debug_assert_eq!(table.num_blocks(), plan.total_blocks);

        self.tables.insert(seq, table);
        Ok(AppendOutcome { cached_tokens, slots, copies })
    }

    /// Creates `child` sharing all of `parent`'s blocks (every reference count + 1), for parallel
    /// sampling and beam search. Works on either tier; never allocates.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), BlockError> {
        let table = self.table(parent).ok_or(BlockError::UnknownSequence(parent))?.clone();
        if self.tables.contains_key(&child) {
            return Err(BlockError::SequenceExists(child));
        }
        let pool = self.pool_mut(table.tier());
        for &block in table.blocks() {
            pool.retain(block);
        }
        self.tables.insert(child, table);
        Ok(())
    }

    /// Deletes `seq`, dropping one reference to each of its blocks. Blocks reaching zero return
    /// to their pool; cached ones stay matchable until evicted. Blocks are released tail first so
    /// a prefix's later blocks are evicted before its earlier, more shareable ones.
    pub fn free(&mut self, seq: SeqId) -> Result<(), BlockError> {
        let table = self.tables.remove(&seq).ok_or(BlockError::UnknownSequence(seq))?;
        let pool = self.pool_mut(table.tier());
        for &block in table.blocks().iter().rev() {
            pool.release(block);
        }
        Ok(())
    }

    /// Forgets the device prefix cache (e.g. after the weights changed). Evictable blocks become
    /// plain free blocks; sequences keep their blocks. Returns the number of entries dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.device.reset_cache()
    }

    // ----- capacity checks (no mutation) ------------------------------------------------------

    /// Whether [`append`](Self::append)`(seq, tokens)` would succeed right now.
    pub fn can_append(&self, seq: SeqId, tokens: &[u32]) -> bool {
        self.plan_append(seq, tokens).is_ok()
    }

    /// Free device blocks appending `n_tokens` (of unknown content, so no prefix hits) to `seq`
    /// would consume, copy-on-write included. An unknown `seq` counts as new. Summing this over
    /// forked siblings over-counts copy-on-write (only all but one sibling copy), which is safe.
    pub fn blocks_needed_to_append(&self, seq: SeqId, n_tokens: usize) -> Result<usize, BlockError> {
        let bs = self.config.block_size;
        let Some(table) = self.tables.get(&seq) else {
            return Ok(n_tokens.div_ceil(bs));
        };
        ensure_tier(seq, table, Location::Device)?;
        let total = (table.num_tokens() + n_tokens).div_ceil(bs);
        Ok(total - table.num_blocks() + usize::from(self.needs_cow(table, n_tokens)))
    }

    /// Free device blocks a new sequence with prompt `tokens` would consume, after prefix hits
    /// (hits on evictable cached blocks count, since they stop being free). Compare with
    /// [`num_free_blocks`](Self::num_free_blocks)`(Location::Device)`.
    pub fn blocks_needed_for_prompt(&self, tokens: &[u32]) -> usize {
        self.blocks_needed_for_new(None, tokens)
    }

    /// [`blocks_needed_for_prompt`](Self::blocks_needed_for_prompt) for the new sequence `seq`,
    /// honouring [`set_prefix_lookup`](Self::set_prefix_lookup).
    pub fn blocks_needed_for_new(&self, seq: Option<SeqId>, tokens: &[u32]) -> usize {
        let empty = BlockTable::new(Location::Device, self.config.block_size);
        self.demand(seq, &empty, tokens).consumed()
    }

    /// Leading tokens of `tokens` an [`append`](Self::append) to `seq` (new or on the device)
    /// would map from the prefix cache right now, honouring
    /// [`set_prefix_lookup`](Self::set_prefix_lookup): a whole number of blocks, never the last
    /// token. `0` for a swapped-out sequence.
    pub fn cached_prefix_len(&self, seq: SeqId, tokens: &[u32]) -> usize {
        if self.no_prefix_lookup.contains(&seq) {
            return 0;
        }
        let empty;
        let table = match self.tables.get(&seq) {
            Some(table) if table.tier() == Location::Device => table,
            Some(_) => return 0,
            None => {
                empty = BlockTable::new(Location::Device, self.config.block_size);
                &empty
            }
        };
        self.match_prefix(table, tokens).len() * self.config.block_size
    }

    /// Whether `seq`'s appends may take prefix-cache hits (the default). Off for a request that
    /// needs every prompt position computed (prompt log-probabilities, as vLLM does); the setting
    /// outlives [`free`](Self::free) (a preempted prompt is recomputed the same way) until set
    /// back on.
    pub fn set_prefix_lookup(&mut self, seq: SeqId, on: bool) {
        if on {
            self.no_prefix_lookup.remove(&seq);
        } else {
            self.no_prefix_lookup.insert(seq);
        }
    }

    // ----- queries ------------------------------------------------------------------------------

    /// The block table of `seq`.
    pub fn table(&self, seq: SeqId) -> Option<&BlockTable> {
        self.tables.get(&seq)
    }

    /// Physical block ids of `seq`, in logical order.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.table(seq).map(BlockTable::blocks)
    }

    /// Tokens held by `seq`.
    pub fn num_tokens(&self, seq: SeqId) -> Option<usize> {
        self.table(seq).map(BlockTable::num_tokens)
    }

    /// Location `seq` lives on.
    pub fn tier(&self, seq: SeqId) -> Option<Location> {
        self.table(seq).map(BlockTable::tier)
    }

    /// Slot of token `position` of `seq` in its tier's pool.
    pub fn slot(&self, seq: SeqId, position: usize) -> Option<usize> {
        self.table(seq)?.slot(position)
    }

    /// Ids of all live sequences, ascending.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.tables.keys().copied()
    }

    /// Number of live sequences.
    pub fn num_sequences(&self) -> usize {
        self.tables.len()
    }

    /// Whether no sequence is live.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Whether every block of both pools is free (evictable cached blocks count as free): the
    /// leak check after freeing every sequence.
    pub fn all_blocks_free(&self) -> bool {
        self.device.num_used() == 0 && self.host.num_used() == 0
    }

    /// Free blocks on `tier`, evictable cached blocks included.
    pub fn num_free_blocks(&self, tier: Location) -> usize {
        self.pool(tier).num_free()
    }

    /// Blocks on `tier` held by at least one sequence.
    pub fn used_blocks(&self, tier: Location) -> usize {
        self.pool(tier).num_used()
    }

    /// Total blocks on `tier`.
    pub fn total_blocks(&self, tier: Location) -> usize {
        self.pool(tier).num_blocks()
    }

    /// Reference count of `block` on `tier` (`None` if out of range).
    pub fn ref_count(&self, tier: Location, block: BlockId) -> Option<u32> {
        self.pool(tier).ref_count(block)
    }

    /// The pool of `tier`, for read-only inspection (cache size, evictable blocks, ...).
    pub fn pool(&self, tier: Location) -> &BlockPool {
        match tier {
            Location::Device => &self.device,
            Location::Host => &self.host,
        }
    }

    // ----- internals -----------------------------------------------------------------------------

    fn pool_mut(&mut self, tier: Location) -> &mut BlockPool {
        match tier {
            Location::Device => &mut self.device,
            Location::Host => &mut self.host,
        }
    }

    /// Validates an append and computes what it needs, without side effects.
    fn plan_append(&self, seq: SeqId, tokens: &[u32]) -> Result<AppendPlan, BlockError> {
        let empty;
        let table = match self.tables.get(&seq) {
            Some(table) => {
                ensure_tier(seq, table, Location::Device)?;
                table
            }
            None => {
                empty = BlockTable::new(Location::Device, self.config.block_size);
                &empty
            }
        };
        let plan = self.demand(Some(seq), table, tokens);
        let total = self.device.num_blocks();
        if plan.total_blocks > total {
            return Err(BlockError::ExceedsCapacity { seq, needed: plan.total_blocks, total });
        }
        let (needed, free) = (plan.consumed(), self.device.num_free());
        if needed > free {
            return Err(BlockError::OutOfBlocks { tier: Location::Device, needed, free });
        }
        Ok(plan)
    }

    /// Blocks appending `tokens` to `table` touches, prefix hits included.
    fn demand(&self, seq: Option<SeqId>, table: &BlockTable, tokens: &[u32]) -> AppendPlan {
        let lookup = seq.is_none_or(|seq| !self.no_prefix_lookup.contains(&seq));
        let hits = if lookup { self.match_prefix(table, tokens) } else { Vec::new() };
        let total_blocks = (table.num_tokens() + tokens.len()).div_ceil(self.config.block_size);
        let revived = hits.iter().filter(|&&(b, _)| self.device.ref_count(b) == Some(0)).count();
        AppendPlan {
            cow: hits.is_empty() && self.needs_cow(table, tokens.len()),
            fresh: total_blocks - table.num_blocks() - hits.len(),
            revived,
            total_blocks,
            hits,
        }
    }

    /// Leading full blocks of `tokens` already in the prefix cache, following `table`'s chain.
    /// Only when caching is on and `table` ends on a block boundary with every block hashed;
    /// never covers the last token.
    fn match_prefix(&self, table: &BlockTable, tokens: &[u32]) -> Vec<(BlockId, BlockHash)> {
        let bs = self.config.block_size;
        let chain_intact = table.block_hashes().len() == table.num_blocks();
        if !self.config.enable_prefix_caching || !table.is_block_aligned() || !chain_intact {
            return Vec::new();
        }
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut parent = table.block_hashes().last().copied();
        let mut hits = Vec::new();
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            let hash = BlockHash::new(parent, chunk);
            let Some(block) = self.device.lookup(hash) else {
                break;
            };
            hits.push((block, hash));
            parent = Some(hash);
        }
        hits
    }

    /// Whether writing `n_tokens` into `table` starts in a partly filled block others share.
    fn needs_cow(&self, table: &BlockTable, n_tokens: usize) -> bool {
        n_tokens > 0
            && !table.is_block_aligned()
            && table.last_block().and_then(|b| self.pool(table.tier()).ref_count(b)).is_some_and(|rc| rc > 1)
    }

    /// Records `tokens` into `table`'s last block (which has room for them), pushing their slots
    /// and registering the block in the prefix cache if it fills up.
    fn write_tokens(&mut self, table: &mut BlockTable, tokens: &[u32], slots: &mut Vec<usize>) {
        let hashing = self.config.enable_prefix_caching;
        for &token in tokens {
            if let Some(slot) = table.next_slot() {
                slots.push(slot);
            }
            if let (Some(hash), Some(block)) = (table.push_token(token, hashing), table.last_block()) {
                self.device.register(block, hash);
            }
        }
    }

    /// Rolls back the prefix hits of an append whose allocation failed after mapping them.
    /// Unreachable when the plan is right (it counts revived hits against the free blocks); kept
    /// so a planning bug surfaces as an error instead of leaked references.
    fn undo_hits(&mut self, seq: SeqId, mut table: BlockTable, n_hits: usize, existed: bool) {
        for block in table.pop_cached_blocks(n_hits).into_iter().rev() {
            self.device.release(block);
        }
        if existed {
            self.tables.insert(seq, table);
        }
    }

    /// Checks pool bookkeeping and that every reference count equals the number of tables
    /// holding the block (test helper).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        for tier in [Location::Device, Location::Host] {
            let pool = self.pool(tier);
            pool.check_consistency()?;
            let mut holders = vec![0u32; pool.num_blocks()];
            for table in self.tables.values().filter(|t| t.tier() == tier) {
                for &b in table.blocks() {
                    holders[b.index()] += 1;
                }
            }
            for (i, &h) in holders.iter().enumerate() {
                let rc = pool.ref_count(BlockId(i as u32)).unwrap_or(u32::MAX);
                if rc != h {
                    return Err(format!("{tier} block {i}: ref count {rc}, held by {h} tables"));
                }
            }
            let used = holders.iter().filter(|&&h| h > 0).count();
            if used != pool.num_used() || used + pool.num_free() != pool.num_blocks() {
                return Err(format!("{tier}: used {used} + free {} != total", pool.num_free()));
            }
        }
        Ok(())
    }
}

fn ensure_tier(seq: SeqId, table: &BlockTable, expected: Location) -> Result<(), BlockError> {
    match table.tier() {
        actual if actual == expected => Ok(()),
        actual => Err(BlockError::WrongTier { seq, expected, actual }),
    }
}
