//! A randomized stress test of the block manager against a shadow model of its blocks, with and
//! without prefix caching.

use super::*;

/// xorshift64* — tiny deterministic RNG.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())])
    }
}

/// Shadow of the physical KV memory: each slot stores a fingerprint of the whole prefix up to
/// its token, which is what a real K/V vector depends on.
struct Shadow {
    bs: usize,
    device: Vec<Option<u64>>,
    host: Vec<Option<u64>>,
    /// Expected prefix fingerprints of every live sequence.
    seqs: std::collections::BTreeMap<SeqId, Vec<u64>>,
    /// Counts of interesting events, to prove the test exercises them.
    cached_tokens: usize,
    copies: usize,
    swapped: usize,
}

fn fingerprint(prev: Option<u64>, token: u32) -> u64 {
    let mut h = prev.unwrap_or(0xcbf2_9ce4_8422_2325);
    h ^= u64::from(token) + 1;
    h.wrapping_mul(0x0000_0100_0000_01B3).rotate_left(17)
}

impl Shadow {
    fn mem(&mut self, tier: Location) -> &mut Vec<Option<u64>> {
        match tier {
            Location::Device => &mut self.device,
            Location::Host => &mut self.host,
        }
    }

    fn copy_blocks(&mut self, from: Location, to: Location, pairs: &[(BlockId, BlockId)]) {
        let bs = self.bs;
        if from != to {
            self.swapped += pairs.len();
        }
        for &(src, dst) in pairs {
            let data: Vec<_> = self.mem(from)[src.index() * bs..][..bs].to_vec();
            self.mem(to)[dst.index() * bs..][..bs].copy_from_slice(&data);
        }
    }

    fn verify(&self, m: &BlockManager) {
        for (&seq, expected) in &self.seqs {
            let mem = match m.tier(seq).unwrap() {
                Location::Device => &self.device,
                Location::Host => &self.host,
            };
            assert_eq!(m.num_tokens(seq), Some(expected.len()));
            for (pos, &fp) in expected.iter().enumerate() {
                let slot = m.slot(seq, pos).unwrap();
                assert_eq!(mem[slot], Some(fp), "seq {seq} position {pos} corrupted");
            }
        }
    }
}

fn stress(seed: u64, block_size: usize, caching: bool, ops: usize) {
    let (dev, host) = (40, 24);
    let mut m = manager(block_size, dev, host, caching);
    let mut rng = Rng(seed);
    let mut shadow = Shadow {
        bs: block_size,
        device: vec![None; dev * block_size],
        host: vec![None; host * block_size],
        seqs: Default::default(),
        cached_tokens: 0,
        copies: 0,
        swapped: 0,
    };
    let bases: Vec<Vec<u32>> = (0..4).map(|b| (0..40).map(|i| (i * 7 + b * 3) as u32 % 11).collect()).collect();
    let mut next_id: SeqId = 0;
    let mut errors = 0;

    for step in 0..ops {
        let device: Vec<SeqId> = m.sequences().filter(|&s| m.tier(s) == Some(Location::Device)).collect();
        let hosted: Vec<SeqId> = m.sequences().filter(|&s| m.tier(s) == Some(Location::Host)).collect();
        let before = m.clone();
        let ok = match rng.below(10) {
            0..=1 => {
                // New request: a prefix of a shared base prompt plus a random tail.
                let base = &bases[rng.below(bases.len())];
                let mut prompt = base[..rng.below(base.len())].to_vec();
                prompt.extend((0..1 + rng.below(6)).map(|_| rng.below(11) as u32));
                let seq = next_id;
                next_id += 1;
                let needed = m.blocks_needed_for_prompt(&prompt);
                append(&mut m, &mut shadow, seq, &prompt, Some(needed))
            }
            2..=4 => match rng.pick(&device) {
                Some(seq) => {
                    let tokens: Vec<u32> = (0..1 + rng.below(3)).map(|_| rng.below(11) as u32).collect();
                    let needed = m.blocks_needed_to_append(seq, tokens.len()).unwrap();
                    append(&mut m, &mut shadow, seq, &tokens, Some(needed).filter(|_| tokens.len() <= block_size))
                }
                None => true,
            },
            5 => match rng.pick(&m.sequences().collect::<Vec<_>>()) {
                Some(parent) => {
                    let child = next_id;
                    next_id += 1;
                    m.fork(parent, child).unwrap();
                    let data = shadow.seqs[&parent].clone();
                    shadow.seqs.insert(child, data);
                    true
                }
                None => true,
            },
            6..=7 => match rng.pick(&m.sequences().collect::<Vec<_>>()) {
                Some(seq) => {
                    m.free(seq).unwrap();
                    shadow.seqs.remove(&seq);
                    true
                }
                None => m.free(next_id + 1).is_err(),
            },
            8 => {
                let group: Vec<SeqId> = (0..1 + rng.below(3)).filter_map(|_| rng.pick(&device)).collect();
                let can = m.can_swap_out(&group);
                let res = m.swap_out(&group);
                assert_eq!(can, res.is_ok());
                if let Ok(pairs) = &res {
                    shadow.copy_blocks(Location::Device, Location::Host, pairs);
                }
                res.is_ok()
            }
            _ => {
                let group: Vec<SeqId> = (0..1 + rng.below(3)).filter_map(|_| rng.pick(&hosted)).collect();
                let can = m.can_swap_in(&group);
                let res = m.swap_in(&group);
                assert_eq!(can, res.is_ok());
                if let Ok(pairs) = &res {
                    shadow.copy_blocks(Location::Host, Location::Device, pairs);
                }
                res.is_ok()
            }
        };
        if !ok {
            errors += 1;
            assert_eq!(m, before, "failed op changed the manager at step {step}");
        }
        if let Err(e) = m.check_invariants() {
            panic!("seed {seed} step {step}: {e}");
        }
        if step % 16 == 0 {
            shadow.verify(&m);
        }
    }
    shadow.verify(&m);
    assert!(errors > 0, "stress test never hit a full pool; make it smaller");
    assert!(shadow.swapped > 0 && (shadow.copies > 0 || block_size == 1));
    assert_eq!(shadow.cached_tokens > 0, caching);

    for seq in m.sequences().collect::<Vec<_>>() {
        m.free(seq).unwrap();
    }
    check(&m);
    assert!(m.is_empty() && m.all_blocks_free());
    assert_eq!(m.num_free_blocks(Location::Device), dev);
    assert_eq!(m.num_free_blocks(Location::Host), host);
}

/// Appends through the manager and mirrors it in the shadow memory, checking slots, cached
/// contents and (where given) the predicted block consumption. Returns whether it succeeded.
fn append(m: &mut BlockManager, shadow: &mut Shadow, seq: SeqId, tokens: &[u32], predicted: Option<usize>) -> bool {
    let can = m.can_append(seq, tokens);
    let free = m.num_free_blocks(Location::Device);
    let start = m.num_tokens(seq).unwrap_or(0);
    let out = match m.append(seq, tokens) {
        Ok(out) => out,
        Err(_) => {
            assert!(!can);
            return false;
        }
    };
    assert!(can);
    if let Some(needed) = predicted {
        assert_eq!(free - m.num_free_blocks(Location::Device), needed, "block prediction for seq {seq}");
    }
    assert!(out.cached_tokens < tokens.len().max(1) && out.cached_tokens % shadow.bs == 0);
    assert_eq!(out.slots.len(), tokens.len() - out.cached_tokens);
    shadow.copy_blocks(Location::Device, Location::Device, &out.copies);
    shadow.copies += out.copies.len();
    shadow.cached_tokens += out.cached_tokens;

    let expected = shadow.seqs.entry(seq).or_default();
    for (i, &token) in tokens.iter().enumerate() {
        let fp = fingerprint(expected.last().copied(), token);
        expected.push(fp);
        let pos = start + i;
        let slot = m.slot(seq, pos).unwrap();
        if i < out.cached_tokens {
            assert_eq!(shadow.device[slot], Some(fp), "prefix hit returned wrong KV");
        } else {
            assert_eq!(out.slots[i - out.cached_tokens], slot);
            shadow.device[slot] = Some(fp);
        }
    }
    true
}

#[test]
fn stress_random_ops_with_prefix_caching() {
    for seed in 1..=4u64 {
        stress(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 4, true, 3000);
    }
    stress(77, 1, true, 2000);
    stress(78, 16, true, 2000);
}

#[test]
fn stress_random_ops_without_prefix_caching() {
    for seed in 1..=2u64 {
        stress(seed.wrapping_mul(0xD1B5_4A32_D192_ED03), 4, false, 3000);
    }
}
