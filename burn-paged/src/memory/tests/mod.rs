//! Unit tests of the paged KV memory layer, in the spirit of vLLM's block-manager tests.

use super::*;

mod stress;

fn manager(block_size: usize, device: usize, host: usize, caching: bool) -> BlockManager {
    let config = BlockManagerConfig::new(device, host).with_block_size(block_size).with_prefix_caching(caching);
    BlockManager::new(config).expect("valid config")
}

fn ids(v: &[u32]) -> Vec<BlockId> {
    v.iter().copied().map(BlockId).collect()
}

fn rc(m: &BlockManager, tier: Location, block: u32) -> u32 {
    m.ref_count(tier, BlockId(block)).expect("block in range")
}

fn check(m: &BlockManager) {
    if let Err(e) = m.check_invariants() {
        panic!("invariant violated: {e}");
    }
}

#[test]
fn config_validation() {
    assert_eq!(BlockManagerConfig::new(4, 4).block_size, DEFAULT_BLOCK_SIZE);
    let zero = BlockManagerConfig::new(4, 4).with_block_size(0);
    assert!(matches!(BlockManager::new(zero), Err(BlockError::InvalidConfig(_))));
    let huge = BlockManagerConfig::new(usize::MAX, 0);
    assert!(matches!(BlockManager::new(huge), Err(BlockError::InvalidConfig(_))));
}

#[test]
fn allocates_only_what_the_prompt_needs() {
    // Fig. 5.6: a 7-token prompt with block size 4 spans two blocks, one slot reserved.
    let mut m = manager(4, 8, 0, false);
    let out = m.append(1, &[10, 11, 12, 13, 14, 15, 16]).unwrap();
    assert_eq!(out.cached_tokens, 0);
    assert!(out.copies.is_empty());
    assert_eq!(out.slots, vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(m.block_table(1), Some(&ids(&[0, 1])[..]));
    assert_eq!(m.num_tokens(1), Some(7));
    assert_eq!(m.tier(1), Some(Location::Device));
    assert_eq!(m.table(1).unwrap().last_block_fill(), 3);
    assert_eq!(m.used_blocks(Location::Device), 2);
    assert_eq!(m.num_free_blocks(Location::Device), 6);
    check(&m);
}

#[test]
fn append_across_block_boundaries() {
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &[1, 2, 3]).unwrap();
    let _ = m.append(2, &[1]).unwrap(); // interleave so block ids are not contiguous
    let out = m.append(1, &[4]).unwrap();
    assert_eq!(out.slots, vec![3]);
    assert_eq!(m.block_table(1), Some(&ids(&[0])[..]));
    let out = m.append(1, &[5]).unwrap(); // new block, after seq 2's block 1
    assert_eq!(out.slots, vec![8]);
    let out = m.append(1, &[6, 7, 8, 9, 10, 11]).unwrap(); // 3 more in block 2, 3 in block 3
    assert_eq!(out.slots, vec![9, 10, 11, 12, 13, 14]);
    assert_eq!(m.block_table(1), Some(&ids(&[0, 2, 3])[..]));
    assert_eq!(m.num_tokens(1), Some(11));
    assert_eq!(m.slot(1, 4), Some(8));
    assert_eq!(m.slot(1, 10), Some(14));
    assert_eq!(m.slot(1, 11), None);
    assert_eq!(m.slot(99, 0), None);
    // Empty appends change nothing but may create an empty sequence.
    let out = m.append(1, &[]).unwrap();
    assert_eq!(out, AppendOutcome::default());
    let _ = m.append(3, &[]).unwrap();
    assert_eq!(m.num_tokens(3), Some(0));
    check(&m);
}

#[test]
fn fork_shares_every_block() {
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5, 6]).unwrap();
    m.fork(1, 2).unwrap();
    m.fork(2, 3).unwrap();
    assert_eq!(m.block_table(2), m.block_table(1));
    assert_eq!(rc(&m, Location::Device, 0), 3);
    assert_eq!(rc(&m, Location::Device, 1), 3);
    assert_eq!(m.used_blocks(Location::Device), 2);
    assert_eq!(m.fork(9, 4), Err(BlockError::UnknownSequence(9)));
    assert_eq!(m.fork(1, 2), Err(BlockError::SequenceExists(2)));
    assert_eq!(m.fork(1, 1), Err(BlockError::SequenceExists(1)));
    check(&m);
}

#[test]
fn copy_on_write_of_shared_partial_block() {
    // Fig. 5.8: two samples share the prompt; the first to write copies the last block.
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5, 6, 7]).unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(m.blocks_needed_to_append(2, 1), Ok(1));
    let out = m.append(2, &[8]).unwrap();
    assert_eq!(out.copies, vec![(BlockId(1), BlockId(2))]);
    assert_eq!(out.slots, vec![2 * 4 + 3]);
    assert_eq!(m.block_table(2), Some(&ids(&[0, 2])[..]));
    assert_eq!(rc(&m, Location::Device, 0), 2);
    assert_eq!(rc(&m, Location::Device, 1), 1);
    assert_eq!(rc(&m, Location::Device, 2), 1);
    // The parent is now the sole owner of block 1 and writes in place.
    assert_eq!(m.blocks_needed_to_append(1, 1), Ok(0));
    let out = m.append(1, &[9]).unwrap();
    assert!(out.copies.is_empty());
    assert_eq!(out.slots, vec![7]);
    assert_eq!(m.block_table(1), Some(&ids(&[0, 1])[..]));
    check(&m);
}

#[test]
fn no_copy_when_shared_last_block_is_full() {
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &[1, 2, 3, 4]).unwrap();
    m.fork(1, 2).unwrap();
    assert_eq!(m.blocks_needed_to_append(2, 1), Ok(1));
    let out = m.append(2, &[5]).unwrap();
    assert!(out.copies.is_empty());
    assert_eq!(m.block_table(2), Some(&ids(&[0, 1])[..]));
    assert_eq!(rc(&m, Location::Device, 0), 2);
    check(&m);
}

#[test]
fn copy_on_write_with_multi_token_append() {
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5, 6]).unwrap();
    m.fork(1, 2).unwrap();
    // 6 + 5 = 11 tokens -> 3 blocks: one new block plus the CoW copy.
    assert_eq!(m.blocks_needed_to_append(2, 5), Ok(2));
    let free = m.num_free_blocks(Location::Device);
    let out = m.append(2, &[7, 8, 9, 10, 11]).unwrap();
    assert_eq!(free - m.num_free_blocks(Location::Device), 2);
    assert_eq!(out.copies, vec![(BlockId(1), BlockId(2))]);
    assert_eq!(out.slots, vec![10, 11, 12, 13, 14]);
    check(&m);
}

#[test]
fn free_returns_everything() {
    let mut m = manager(4, 8, 4, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5]).unwrap();
    m.fork(1, 2).unwrap();
    let _ = m.append(2, &[6, 7, 8, 9]).unwrap();
    let _ = m.append(3, &[1; 9]).unwrap();
    let _ = m.swap_out(&[3]).unwrap();
    for seq in [2, 1, 3] {
        m.free(seq).unwrap();
        check(&m);
    }
    assert!(m.is_empty());
    assert!(m.all_blocks_free());
    assert_eq!(m.num_free_blocks(Location::Device), 8);
    assert_eq!(m.num_free_blocks(Location::Host), 4);
    assert_eq!(m.free(1), Err(BlockError::UnknownSequence(1)));
}

#[test]
fn swap_round_trip_keeps_sharing() {
    let mut m = manager(4, 8, 8, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap(); // blocks 0, 1, 2
    m.fork(1, 2).unwrap();
    let out = m.append(2, &[11]).unwrap(); // CoW: 2 -> 3
    assert_eq!(out.copies, vec![(BlockId(2), BlockId(3))]);
    assert!(m.can_swap_out(&[1, 2]));

    let pairs = m.swap_out(&[1, 2, 1]).unwrap();
    assert_eq!(
        pairs,
        vec![(BlockId(0), BlockId(0)), (BlockId(1), BlockId(1)), (BlockId(2), BlockId(2)), (BlockId(3), BlockId(3))]
    );
    assert_eq!(m.tier(1), Some(Location::Host));
    assert_eq!(m.block_table(1), Some(&ids(&[0, 1, 2])[..]));
    assert_eq!(m.block_table(2), Some(&ids(&[0, 1, 3])[..]));
    assert_eq!([0, 1, 2, 3].map(|b| rc(&m, Location::Host, b)), [2, 2, 1, 1]);
    assert_eq!(m.used_blocks(Location::Device), 0);
    assert_eq!(m.used_blocks(Location::Host), 4);
    check(&m);

    // Swapped-out sequences cannot grow.
    let before = m.clone();
    assert_eq!(
        m.append(1, &[5]),
        Err(BlockError::WrongTier { seq: 1, expected: Location::Device, actual: Location::Host })
    );
    assert_eq!(
        m.blocks_needed_to_append(1, 1).unwrap_err(),
        BlockError::WrongTier { seq: 1, expected: Location::Device, actual: Location::Host }
    );
    assert_eq!(
        m.swap_out(&[1]).unwrap_err(),
        BlockError::WrongTier { seq: 1, expected: Location::Device, actual: Location::Host }
    );
    assert_eq!(m, before);

    let _ = m.append(7, &[1; 13]).unwrap(); // occupy device blocks so ids change
    assert!(m.can_swap_in(&[2, 1]));
    let pairs = m.swap_in(&[2, 1]).unwrap();
    assert_eq!(pairs.len(), 4);
    assert_eq!(m.tier(2), Some(Location::Device));
    let t1 = m.block_table(1).unwrap().to_vec();
    let t2 = m.block_table(2).unwrap().to_vec();
    assert_eq!(&t1[..2], &t2[..2]);
    assert_ne!(t1[2], t2[2]);
    assert_eq!(rc(&m, Location::Device, t1[0].0), 2);
    assert_eq!(rc(&m, Location::Device, t1[1].0), 2);
    assert_eq!(rc(&m, Location::Device, t1[2].0), 1);
    assert_eq!(m.used_blocks(Location::Host), 0);
    assert_eq!((m.num_tokens(1), m.num_tokens(2)), (Some(10), Some(11)));
    // Pairs map host blocks onto the new device tables.
    assert!(pairs.contains(&(BlockId(0), t2[0])) && pairs.contains(&(BlockId(3), t2[2])));
    check(&m);

    let _ = m.append(1, &[12, 13]).unwrap();
    for seq in [1, 2, 7] {
        m.free(seq).unwrap();
    }
    assert!(m.all_blocks_free());
}

#[test]
fn swap_out_leaves_blocks_shared_outside_the_group() {
    let mut m = manager(4, 8, 8, false);
    let _ = m.append(1, &[1, 2, 3, 4, 5]).unwrap();
    m.fork(1, 2).unwrap(); // seq 2 stands for another group sharing seq 1's blocks
    let pairs = m.swap_out(&[1]).unwrap();
    assert_eq!(pairs.len(), 2);
    assert_eq!(rc(&m, Location::Device, 0), 1);
    assert_eq!(rc(&m, Location::Device, 1), 1);
    assert_eq!(rc(&m, Location::Host, 0), 1);
    assert_eq!(m.used_blocks(Location::Device), 2);
    check(&m);
}

#[test]
fn swap_errors_leave_manager_unchanged() {
    let mut m = manager(4, 8, 1, false);
    let _ = m.append(1, &[1; 6]).unwrap();
    let _ = m.append(2, &[1; 2]).unwrap();
    let before = m.clone();
    assert!(!m.can_swap_out(&[1]));
    assert_eq!(m.swap_out(&[1]), Err(BlockError::OutOfBlocks { tier: Location::Host, needed: 2, free: 1 }));
    assert_eq!(m.swap_out(&[2, 9]), Err(BlockError::UnknownSequence(9)));
    assert_eq!(
        m.swap_in(&[2]).unwrap_err(),
        BlockError::WrongTier { seq: 2, expected: Location::Host, actual: Location::Device }
    );
    assert_eq!(m, before);
    assert_eq!(m.swap_out(&[]), Ok(vec![]));
    // Swap in fails when the device filled up meanwhile.
    let _ = m.swap_out(&[2]).unwrap();
    let _ = m.append(3, &[1; 24]).unwrap();
    let before = m.clone();
    assert!(!m.can_swap_in(&[2]));
    assert_eq!(m.swap_in(&[2]), Err(BlockError::OutOfBlocks { tier: Location::Device, needed: 1, free: 0 }));
    assert_eq!(m, before);
    check(&m);
}

#[test]
fn out_of_blocks_leaves_manager_unchanged() {
    let mut m = manager(4, 4, 0, true);
    let _ = m.append(1, &[1; 10]).unwrap(); // 3 blocks
    m.fork(1, 2).unwrap();
    let before = m.clone();
    assert!(!m.can_append(3, &[2; 8]));
    assert_eq!(m.append(3, &[2; 8]), Err(BlockError::OutOfBlocks { tier: Location::Device, needed: 2, free: 1 }));
    // CoW plus one new block needs 2 as well.
    assert_eq!(m.append(2, &[3; 3]), Err(BlockError::OutOfBlocks { tier: Location::Device, needed: 2, free: 1 }));
    assert_eq!(m.append(4, &[5; 17]), Err(BlockError::ExceedsCapacity { seq: 4, needed: 5, total: 4 }));
    assert_eq!(m.append(1, &[5; 7]), Err(BlockError::ExceedsCapacity { seq: 1, needed: 5, total: 4 }));
    assert_eq!(m, before);
    assert!(m.can_append(2, &[3]));
    let msg = BlockError::OutOfBlocks { tier: Location::Device, needed: 2, free: 1 }.to_string();
    assert_eq!(msg, "out of KV blocks on the device tier: need 2, only 1 free");
    check(&m);
}

#[test]
fn prefix_hits_share_full_blocks() {
    let mut m = manager(4, 16, 0, true);
    let prompt: Vec<u32> = (1..=10).collect();
    let out = m.append(1, &prompt).unwrap();
    assert_eq!(out.cached_tokens, 0);
    assert_eq!(m.pool(Location::Device).num_cached(), 2); // two full blocks registered

    // Same first two full blocks: mapped, not allocated.
    let mut second: Vec<u32> = (1..=8).collect();
    second.extend([20, 21]);
    assert_eq!(m.blocks_needed_for_prompt(&second), 1);
    let free = m.num_free_blocks(Location::Device);
    let out = m.append(2, &second).unwrap();
    assert_eq!(out.cached_tokens, 8);
    assert_eq!(out.slots, vec![12, 13]);
    assert_eq!(free - m.num_free_blocks(Location::Device), 1);
    assert_eq!(m.block_table(2), Some(&ids(&[0, 1, 3])[..]));
    assert_eq!(rc(&m, Location::Device, 0), 2);
    assert_eq!(rc(&m, Location::Device, 1), 2);

    // Block 1 equal, block 0 different: the hash chain prevents a hit.
    let mut third = vec![50, 51, 52, 53];
    third.extend(5..=8);
    third.push(9);
    let out = m.append(3, &third).unwrap();
    assert_eq!(out.cached_tokens, 0);
    assert_eq!(m.block_table(3), Some(&ids(&[4, 5, 6])[..]));
    assert_eq!(rc(&m, Location::Device, 1), 2);
    check(&m);
}

#[test]
fn prefix_hit_never_covers_the_last_token() {
    let mut m = manager(4, 16, 0, true);
    let _ = m.append(1, &(1..=12).collect::<Vec<_>>()).unwrap(); // 3 full cached blocks
    let out = m.append(2, &(1..=8).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.cached_tokens, 4); // (8 - 1) / 4 = 1 block
    assert_eq!(out.slots.len(), 4);
    assert_eq!(m.block_table(2).unwrap()[0], BlockId(0));
    assert_ne!(m.block_table(2).unwrap()[1], BlockId(1));
    let out = m.append(3, &(1..=9).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.cached_tokens, 8);
    let out = m.append(4, &[1, 2, 3, 4]).unwrap();
    assert_eq!(out.cached_tokens, 0);
    check(&m);
}

#[test]
fn generated_tokens_are_cached_when_a_block_fills() {
    let mut m = manager(4, 16, 0, true);
    let _ = m.append(1, &[1, 2, 3]).unwrap();
    assert_eq!(m.pool(Location::Device).num_cached(), 0);
    let _ = m.append(1, &[4]).unwrap(); // "generated" token fills block 0
    let _ = m.append(1, &[5, 6, 7, 8, 9]).unwrap();
    assert_eq!(m.pool(Location::Device).num_cached(), 2);
    let out = m.append(2, &[1, 2, 3, 4, 5, 6, 7, 8, 0]).unwrap();
    assert_eq!(out.cached_tokens, 8);
    // A cache hit on an aligned running sequence works too (e.g. a multi-turn continuation).
    let _ = m.append(3, &[1, 2, 3, 4, 7]).unwrap();
    m.free(3).unwrap();
    let _ = m.append(4, &[1, 2, 3, 4]).unwrap();
    // [1, 2, 3, 4] alone is never a hit (its last token must be computed), so block 0 is
    // duplicated; the continuation still hits block 1 because identity is the hash chain.
    let out = m.append(4, &[5, 6, 7, 8, 9]).unwrap();
    assert_eq!(out.cached_tokens, 4);
    assert_eq!(m.block_table(4).unwrap()[..2], ids(&[4, 1])[..]);
    check(&m);
}

#[test]
fn freed_cached_blocks_stay_matchable() {
    let mut m = manager(4, 8, 0, true);
    let _ = m.append(1, &(1..=9).collect::<Vec<_>>()).unwrap();
    m.free(1).unwrap();
    assert!(m.all_blocks_free());
    assert_eq!(m.pool(Location::Device).num_evictable(), 2);
    assert_eq!(m.num_free_blocks(Location::Device), 8);
    // Reviving evictable hits consumes free blocks, so they count.
    assert_eq!(m.blocks_needed_for_prompt(&(1..=9).collect::<Vec<_>>()), 3);
    let out = m.append(2, &(1..=9).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.cached_tokens, 8);
    assert_eq!(m.pool(Location::Device).num_evictable(), 0);
    assert_eq!(m.num_free_blocks(Location::Device), 5);
    assert_eq!(rc(&m, Location::Device, 0), 1);
    check(&m);
}

#[test]
fn eviction_is_least_recently_used_first() {
    let mut m = manager(2, 4, 0, true);
    let _ = m.append(1, &[1, 2, 3, 4]).unwrap(); // blocks 0, 1, both cached
    m.free(1).unwrap(); // released tail first: 1 is older than 0
    let _ = m.append(2, &[5, 6, 7, 8, 9, 10]).unwrap(); // 2, 3 free; then evicts 1
    assert_eq!(m.block_table(2), Some(&ids(&[2, 3, 1])[..]));
    let pool = m.pool(Location::Device);
    assert_eq!(pool.lookup(BlockHash::new(None, &[1, 2])), Some(BlockId(0)));
    let h0 = BlockHash::new(None, &[1, 2]);
    assert_eq!(pool.lookup(BlockHash::new(Some(h0), &[3, 4])), None);
    assert!(pool.is_evictable(BlockId(0)));
    check(&m);
}

#[test]
fn rehit_block_is_taken_off_the_eviction_list() {
    let mut m = manager(2, 4, 0, true);
    let _ = m.append(1, &[1, 2, 9]).unwrap(); // 0 cached, 1 partial
    let _ = m.append(2, &[3, 4, 9]).unwrap(); // 2 cached, 3 partial
    m.free(1).unwrap(); // 0 evictable (oldest)
    m.free(2).unwrap(); // 2 evictable
    let out = m.append(3, &[1, 2, 5]).unwrap(); // re-hit 0
    assert_eq!(out.cached_tokens, 2);
    assert!(!m.pool(Location::Device).is_evictable(BlockId(0)));
    let _ = m.append(4, &[7, 8, 6]).unwrap(); // takes a free block, then evicts 2 (not 0)
    assert!(m.block_table(4).unwrap().contains(&BlockId(2)));
    assert_eq!(m.pool(Location::Device).lookup(BlockHash::new(None, &[1, 2])), Some(BlockId(0)));
    assert_eq!(m.pool(Location::Device).lookup(BlockHash::new(None, &[3, 4])), None);
    check(&m);
}

#[test]
fn no_sharing_without_prefix_caching() {
    let mut m = manager(4, 8, 0, false);
    let _ = m.append(1, &(1..=9).collect::<Vec<_>>()).unwrap();
    let out = m.append(2, &(1..=9).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.cached_tokens, 0);
    assert_eq!(m.used_blocks(Location::Device), 6);
    assert_eq!(m.pool(Location::Device).num_cached(), 0);
}

#[test]
fn reset_prefix_cache_forgets_everything() {
    let mut m = manager(4, 8, 0, true);
    let _ = m.append(1, &(1..=9).collect::<Vec<_>>()).unwrap();
    let _ = m.append(2, &[7; 5]).unwrap();
    m.free(2).unwrap();
    assert_eq!(m.pool(Location::Device).num_evictable(), 1);
    assert_eq!(m.reset_prefix_cache(), 3);
    assert_eq!(m.pool(Location::Device).num_evictable(), 0);
    assert_eq!(m.num_free_blocks(Location::Device), 5);
    let out = m.append(3, &(1..=9).collect::<Vec<_>>()).unwrap();
    assert_eq!(out.cached_tokens, 0);
    // New full blocks are registered again.
    assert_eq!(m.pool(Location::Device).num_cached(), 2);
    check(&m);
}

#[test]
fn swap_in_re_registers_full_blocks() {
    let mut m = manager(4, 8, 8, true);
    let prompt: Vec<u32> = (1..=9).collect();
    let _ = m.append(1, &prompt).unwrap();
    let _ = m.swap_out(&[1]).unwrap();
    m.reset_prefix_cache();
    let _ = m.swap_in(&[1]).unwrap();
    assert_eq!(m.pool(Location::Device).num_cached(), 2);
    let out = m.append(2, &prompt).unwrap();
    assert_eq!(out.cached_tokens, 8);
    assert_eq!(m.block_table(2).unwrap()[..2], m.block_table(1).unwrap()[..2]);
    check(&m);
}
