//! Scheduler policy on a fake engine: every scheduled sequence "samples" a token; groups finish
//! after a fixed number of tokens.

use super::*;
use crate::memory::BlockManagerConfig;

/// The fake engine's per-group state: tokens still to generate.
type Left = usize;

pub(super) fn config(max_num_seqs: usize, preemption: PreemptionMode) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens: 64,
        preemption,
        cost: PreemptionCost { swap_s_per_block: 1.0, recompute_s_per_token: 1.0 },
        watermark_blocks: 0,
        scheduling: SchedulingPolicy::Fcfs,
        max_model_len: 64,
        chunked_prefill: false,
    }
}

pub(super) fn manager(device: usize, host: usize) -> BlockManager {
    BlockManager::new(BlockManagerConfig::new(device, host).with_block_size(4).with_prefix_caching(false)).unwrap()
}

pub(super) fn group(id: GroupId, prompt_len: usize, generate: usize) -> SequenceGroup<Left> {
    let tokens = (0..prompt_len as u32).map(|t| t + 100 * id as u32).collect();
    SequenceGroup::new(id, id, Sequence::new(id * 1000, tokens), 1, generate)
}

/// Samples one token for every sequence whose tokens are all computed after `out` (those
/// scheduled with `sample`), finishes groups with nothing left, and returns the finished group ids.
pub(super) fn advance(s: &mut Scheduler<Left>, out: &SchedulerOutput, blocks: &mut BlockManager) -> Vec<GroupId> {
    let mut done = Vec::new();
    let mut groups: Vec<GroupId> = out.seqs.iter().filter(|x| x.sample).map(|x| x.group).collect();
    groups.dedup();
    for id in groups {
        let g = s.group_mut(id).unwrap();
        for seq in &mut g.seqs {
            seq.tokens.push(7);
        }
        g.data -= 1;
        if g.data == 0 {
            done.push(id);
        }
    }
    for &id in &done {
        s.remove(id, blocks);
    }
    for &id in &out.rejected {
        s.remove(id, blocks);
    }
    done
}

#[test]
fn prompts_and_decodes_share_a_step() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(config(8, PreemptionMode::Recompute));
    s.add(group(1, 5, 3));
    let out = s.schedule(&mut blocks);
    assert_eq!(out.seqs.len(), 1);
    assert_eq!((out.seqs[0].start, out.seqs[0].tokens.len()), (0, 5));
    advance(&mut s, &out, &mut blocks);

    s.add(group(2, 3, 2));
    let out = s.schedule(&mut blocks);
    let shape: Vec<(GroupId, usize, usize)> = out.seqs.iter().map(|x| (x.group, x.start, x.tokens.len())).collect();
    assert_eq!(shape, vec![(1, 5, 1), (2, 0, 3)], "the decode of 1 and the prompt of 2 in one step");
    assert_eq!(out.seqs[0].slots, vec![5], "position 5 is slot 1 of the second block");
}

#[test]
fn limits_on_sequences_and_tokens() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(SchedulerConfig { max_num_batched_tokens: 10, ..config(2, PreemptionMode::Recompute) });
    for id in 1..=3 {
        s.add(group(id, 4, 5));
    }
    let out = s.schedule(&mut blocks);
    assert_eq!(out.seqs.iter().map(|x| x.group).collect::<Vec<_>>(), vec![1, 2], "two seats");
    assert_eq!(s.queue_lengths(), (1, 2, 0));

    let mut s = Scheduler::new(SchedulerConfig { max_num_batched_tokens: 6, ..config(8, PreemptionMode::Recompute) });
    let mut blocks = manager(64, 0);
    s.add(group(1, 4, 5));
    s.add(group(2, 4, 5));
    let out = s.schedule(&mut blocks);
    assert_eq!(out.num_batched_tokens(), 4, "the second prompt waits for the token budget");
}

#[test]
fn preemption_by_recompute_frees_the_latest_group() {
    // 4 blocks of 4 slots: two prompts of 7 take 2 blocks each; the next decode needs a block.
    let mut blocks = manager(4, 0);
    let mut s = Scheduler::new(config(8, PreemptionMode::Recompute));
    s.add(group(1, 7, 4));
    s.add(group(2, 7, 4));
    let out = s.schedule(&mut blocks);
    assert_eq!(out.seqs.len(), 2);
    advance(&mut s, &out, &mut blocks);
    // Both now have 8 tokens: the 8th fits in their second blocks.
    let out = s.schedule(&mut blocks);
    assert!(out.preempted.is_empty());
    advance(&mut s, &out, &mut blocks);
    // The 9th needs a third block each: group 2 (latest) is preempted, group 1 goes on.
    let out = s.schedule(&mut blocks);
    assert_eq!(out.preempted, vec![(2, PreemptionMode::Recompute)]);
    assert_eq!(out.seqs.iter().map(|x| x.group).collect::<Vec<_>>(), vec![1]);
    assert_eq!(s.group(2).unwrap().status(), GroupStatus::Waiting);
    assert_eq!(blocks.num_free_blocks(Location::Device), 1);
    s.check_consistency(&blocks).unwrap();
}

#[test]
fn swapped_groups_come_back_before_new_ones() {
    let mut blocks = manager(4, 8);
    let mut s = Scheduler::new(config(8, PreemptionMode::Swap));
    s.add(group(1, 7, 3));
    s.add(group(2, 7, 6));
    let out = s.schedule(&mut blocks);
    advance(&mut s, &out, &mut blocks);
    let out = s.schedule(&mut blocks);
    advance(&mut s, &out, &mut blocks);
    let out = s.schedule(&mut blocks);
    assert_eq!(out.preempted, vec![(2, PreemptionMode::Swap)]);
    assert_eq!(out.swap_out.len(), 2, "both blocks of group 2 move to the host");
    assert!(out.swap_in.is_empty(), "nothing comes back in a step that preempted");
    s.add(group(3, 3, 1));
    s.check_consistency(&blocks).unwrap();
    let done = advance(&mut s, &out, &mut blocks);
    assert_eq!(done, vec![1]);
    // Group 1 finished: group 2 swaps back in before group 3 is admitted.
    let out = s.schedule(&mut blocks);
    assert_eq!(out.swap_in.len(), 2);
    let order: Vec<GroupId> = out.seqs.iter().map(|x| x.group).collect();
    assert_eq!(order[0], 2);
    assert_eq!(out.seqs[0].tokens.len(), 1, "it resumes decoding where it stopped");
    s.check_consistency(&blocks).unwrap();
}

#[test]
fn impossible_prompts_are_rejected() {
    let mut blocks = manager(2, 0);
    let mut s = Scheduler::new(config(8, PreemptionMode::Recompute));
    s.add(group(1, 9, 1));
    let out = s.schedule(&mut blocks);
    assert_eq!(out.rejected, vec![1]);
    assert!(out.seqs.is_empty());
}

/// Many groups through a pool that forces constant preemption, every mode: all finish, every
/// token is computed exactly once per (re)computation, no block leaks.
#[test]
fn stress_no_request_lost_no_block_leaked() {
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute, PreemptionMode::Auto] {
        stress(config(6, mode), |_, _| {});
    }
}

/// Runs 200 random groups through a pool of 12 device and 12 host blocks under `config`, calling
/// `check(scheduler, output)` after every step, and asserts that every group finishes, that
/// every scheduled token is the sequence's next (a chunk's end is what the sequence has computed,
/// a sampled chunk ends its tokens), that preemption happened, and that no block leaks.
pub(super) fn stress(config: SchedulerConfig, mut check: impl FnMut(&Scheduler<Left>, &SchedulerOutput)) {
    let chunked = config.chunked_prefill && config.scheduling == SchedulingPolicy::Fcfs;
    let mut partial = 0;
    let mode = config.preemption;
    let mut blocks = manager(12, 12);
    let mut s = Scheduler::new(config);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let total = 200;
    let mut added = 0;
    let mut finished = 0;
    let mut preemptions = 0;
    for _ in 0..100_000 {
        if added < total && next() % 3 == 0 {
            added += 1;
            s.add(group(added, 1 + (next() % 20) as usize, 1 + (next() % 20) as usize));
        }
        let out = s.schedule(&mut blocks);
        preemptions += out.preempted.len();
        for x in &out.seqs {
            let g = s.group(x.group).unwrap();
            let seq = g.seqs.iter().find(|q| q.id == x.seq).unwrap();
            let end = x.start + x.tokens.len();
            assert_eq!(end, seq.num_computed);
            assert_eq!(x.sample, end == seq.tokens.len());
            assert_eq!(&seq.tokens[x.start..end], x.tokens.as_slice());
        }
        partial += out.seqs.iter().filter(|x| !x.sample).count();
        check(&s, &out);
        finished += advance(&mut s, &out, &mut blocks).len() + out.rejected.len();
        s.check_consistency(&blocks).unwrap();
        if finished == total as usize {
            break;
        }
    }
    assert_eq!(finished, total as usize, "{mode:?}: requests lost");
    assert!(preemptions > 10, "{mode:?}: the pool should force preemption ({preemptions})");
    assert!(s.is_empty());
    assert!(blocks.all_blocks_free(), "{mode:?}: blocks leaked");
    assert_eq!(partial > 0, chunked, "{mode:?}: prompt chunks ({partial}) exactly when chunking");
}

fn phased(
    encode_batch: usize,
    decode_batch: usize,
    decode_iterations: usize,
    base: SchedulerConfig,
) -> SchedulerConfig {
    SchedulerConfig { scheduling: SchedulingPolicy::Phased { encode_batch, decode_batch, decode_iterations }, ..base }
}

/// What one step computed: `P[groups]` (prompts only), `D[groups]` (decodes only), `-` (nothing)
/// or `mixed`. Without prefix caching a prompt (or a recomputation) starts at position 0 and a
/// decode never does.
fn kind(out: &SchedulerOutput) -> String {
    let groups = |prefill: bool| -> Vec<GroupId> {
        out.seqs.iter().filter(|x| (x.start == 0) == prefill).map(|x| x.group).collect()
    };
    match (groups(true), groups(false)) {
        (p, d) if p.is_empty() && d.is_empty() => "-".into(),
        (p, d) if d.is_empty() => format!("P{p:?}"),
        (p, d) if p.is_empty() => format!("D{d:?}"),
        _ => "mixed".into(),
    }
}

/// Schedules and advances until every group has finished: each step's [`kind`].
fn run_to_end(s: &mut Scheduler<Left>, blocks: &mut BlockManager) -> Vec<String> {
    let mut steps = Vec::new();
    while !s.is_empty() {
        let out = s.schedule(blocks);
        steps.push(kind(&out));
        advance(s, &out, blocks);
        assert!(steps.len() < 100, "the schedule stalls: {steps:?}");
    }
    steps
}

#[test]
fn fcfs_is_the_default_and_mixes_prompts_with_decodes() {
    assert_eq!(SchedulingPolicy::default(), SchedulingPolicy::Fcfs);
    assert_eq!(crate::EngineConfig::default().scheduling, SchedulingPolicy::Fcfs);
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(config(8, PreemptionMode::Recompute));
    s.add(group(1, 5, 3));
    let out = s.schedule(&mut blocks);
    advance(&mut s, &out, &mut blocks);
    s.add(group(2, 5, 3));
    s.add(group(3, 5, 3));
    let out = s.schedule(&mut blocks);
    assert_eq!(kind(&out), "mixed", "FCFS decodes 1 and prefills 2 and 3 in one step");
    assert_eq!(out.seqs.iter().map(|x| x.group).collect::<Vec<_>>(), vec![1, 2, 3]);
}

/// ExeGPT's RRA pattern: a prefill of at most `B_E` requests, then `N_D` decode steps over at
/// most `B_D` sequences, repeated; a due prefill that has no seat decodes instead, and one with
/// fewer than `B_E` free seats admits what fits.
#[test]
fn phased_schedule_alternates_prefill_and_decode_phases() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(phased(2, 3, 2, config(8, PreemptionMode::Recompute)));
    s.add(group(1, 5, 3));
    for id in 2..=6 {
        s.add(group(id, 5, 8));
    }
    let steps = run_to_end(&mut s, &mut blocks);
    let expected = [
        "P[1, 2]",
        "D[1, 2]",
        "D[1, 2]", // B_E = 2, then N_D = 2 decodes; 1 finishes
        "P[3, 4]",
        "D[2, 3, 4]",
        "D[2, 3, 4]", // two free seats: B_E = 2 more, B_D = 3 reached
        "D[2, 3, 4]",
        "D[2, 3, 4]",
        "D[2, 3, 4]", // prefills due, but no seat: 2 finishes
        "P[5]",
        "D[3, 4, 5]",
        "D[3, 4, 5]", // 3 and 4 finish
        "P[6]",
        "D[5, 6]",
        "D[5, 6]",
    ];
    assert_eq!(steps[..expected.len()], expected, "{steps:?}");
    assert!(steps[expected.len()..].iter().all(|k| k.starts_with('D')), "{steps:?}");
    assert!(blocks.all_blocks_free());
}

/// ExeGPT §5.2: once `B_E` seats are free the prefill is due, however many of the `N_D`
/// iterations are left (here `N_D` = 100 never runs out): the batch is refilled at each completion.
#[test]
fn phased_prefill_comes_early_when_encode_batch_seats_are_free() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(phased(1, 2, 100, config(8, PreemptionMode::Recompute)));
    for (id, output) in [(1, 2), (2, 6), (3, 3), (4, 2)] {
        s.add(group(id, 5, output));
    }
    let steps = run_to_end(&mut s, &mut blocks);
    let expected = [
        "P[1]", "P[2]",    // a seat is free: B_E = 1 more at once
        "D[1, 2]", // 1 finishes
        "P[3]", "D[2, 3]", "D[2, 3]", // 3 finishes
        "P[4]", "D[2, 4]", // 4 finishes; nothing waits, so the free seat decodes on
        "D[2]",
    ];
    assert_eq!(steps, expected);
    assert!(blocks.all_blocks_free());
}

/// A prefill does not take the block a running group needs for its next decode (which would get
/// the new group preempted right away): the prompt waits, the running group decodes.
#[test]
fn phased_prefill_leaves_the_running_groups_next_blocks() {
    // 4 blocks of 4 slots. Group 1 (prompt 8) fills 2 blocks, and its next token (the 9th) needs
    // a third. Group 2 (prompt 8) arrives then: a prefill is due (2 seats free, B_E = 2), and
    // its prompt would take both free blocks.
    let mut blocks = manager(4, 0);
    let mut s = Scheduler::new(phased(2, 4, 4, config(8, PreemptionMode::Recompute)));
    s.add(group(1, 8, 20));
    let mut steps = Vec::new();
    for step in 0..6 {
        if step == 1 {
            s.add(group(2, 8, 2));
        }
        let out = s.schedule(&mut blocks);
        assert!(out.preempted.is_empty());
        steps.push(kind(&out));
        advance(&mut s, &out, &mut blocks);
    }
    assert_eq!(steps, ["P[1]", "D[1]", "D[1]", "D[1]", "D[1]", "D[1]"]);
    assert_eq!(s.queue_lengths(), (1, 1, 0), "group 2 still waits");
}

/// Under a pool that forces preemption, the phased schedule keeps its shape (no step mixes
/// prompts and decodes, at most `B_E` prompts per step, at most `B_D` sequences running) and, like
/// FCFS, loses no request and leaks no block.
#[test]
fn phased_schedule_under_preemption_loses_nothing() {
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute, PreemptionMode::Auto] {
        for (encode_batch, decode_batch, decode_iterations) in [(2, 4, 3), (1, 6, 1), (4, 4, 8)] {
            stress(phased(encode_batch, decode_batch, decode_iterations, config(6, mode)), |s, out| {
                let k = kind(out);
                assert_ne!(k, "mixed", "{mode:?}: a step mixed prompts and decodes");
                if k.starts_with('P') {
                    let mut groups: Vec<GroupId> = out.seqs.iter().map(|x| x.group).collect();
                    groups.dedup();
                    assert!(groups.len() <= encode_batch, "{k}: more than B_E = {encode_batch}");
                }
                let (_, running, _) = s.queue_lengths();
                assert!(running <= decode_batch.min(6), "{running} running, more than B_D = {decode_batch}");
            });
        }
    }
}

#[test]
fn phased_schedule_with_a_zero_is_invalid() {
    let ok = SchedulingPolicy::Phased { encode_batch: 1, decode_batch: 1, decode_iterations: 1 };
    assert_eq!(ok.validate(), Ok(()));
    let err =
        SchedulingPolicy::Phased { encode_batch: 4, decode_batch: 8, decode_iterations: 0 }.validate().unwrap_err();
    assert!(err.contains("decode_iterations"), "{err}");
}

fn reserving(scheduling: SchedulingPolicy, max_model_len: usize) -> SchedulerConfig {
    SchedulerConfig { scheduling, max_model_len, ..config(8, PreemptionMode::Recompute) }
}

/// Three requests of 4 prompt tokens generating 2, 6 and 3 tokens, under `scheduling` with a model
/// of 32 positions and 16 blocks of 4 slots, run to the end: the groups of each step. Reserving
/// policies never preempt nor reject them.
fn run_three(scheduling: SchedulingPolicy) -> Vec<Vec<GroupId>> {
    let mut blocks = manager(16, 0);
    let mut s = Scheduler::new(reserving(scheduling, 32));
    for (id, out) in [(1, 2), (2, 6), (3, 3)] {
        s.add(group(id, 4, out).with_max_new_tokens(out));
    }
    let mut steps = Vec::new();
    while !s.is_empty() {
        let out = s.schedule(&mut blocks);
        assert!(out.preempted.is_empty() && out.rejected.is_empty());
        steps.push(groups_of(&out));
        advance(&mut s, &out, &mut blocks);
        assert!(steps.len() < 50, "stalls: {steps:?}");
    }
    assert!(blocks.all_blocks_free());
    steps
}

/// Groups scheduled by a step, in batch order.
fn groups_of(out: &SchedulerOutput) -> Vec<GroupId> {
    let mut groups: Vec<GroupId> = out.seqs.iter().map(|x| x.group).collect();
    groups.dedup();
    groups
}

#[test]
fn reservations_follow_the_thesis_variants() {
    // Prompt 10, output budget 25, model length 64.
    assert_eq!(KvReservation::Max.tokens(10, 25, 64), 64);
    assert_eq!(KvReservation::Pow2.tokens(10, 25, 64), 10 + 32);
    assert_eq!(KvReservation::Oracle.tokens(10, 25, 64), 35);
    // Capped by the model's length.
    assert_eq!(KvReservation::Pow2.tokens(40, 20, 64), 64);
    assert_eq!(KvReservation::Oracle.tokens(40, usize::MAX, 64), 64);
    assert_eq!(SchedulingPolicy::Static.reservation(), Some(KvReservation::Max));
    assert_eq!(SchedulingPolicy::Fcfs.reservation(), None);
}

/// Orca (Max): 16 blocks of 4 slots hold two reservations of the model's 32 positions, however
/// short the requests; a finished request's reservation is refilled at the next step
/// (iteration-level), and nothing is ever preempted.
#[test]
fn orca_max_admits_by_reservation_and_refills_at_the_next_step() {
    let steps = run_three(SchedulingPolicy::Orca(KvReservation::Max));
    // FCFS on this pool would run all three at once (they use 2 blocks each).
    assert_eq!(steps[..3], [vec![1, 2], vec![1, 2], vec![2, 3]], "{steps:?}");
}

/// Orca (Oracle) reserves only prompt + output, so the same pool runs all three at once.
#[test]
fn orca_oracle_reserves_what_the_request_needs() {
    assert_eq!(run_three(SchedulingPolicy::Orca(KvReservation::Oracle))[0], vec![1, 2, 3]);
}

/// Static batching: the second batch starts only when the first one's longest request is done.
#[test]
fn static_batches_wait_for_their_longest_request() {
    let batch = |groups: Vec<GroupId>, n: usize| std::iter::repeat_n(groups, n);
    let expected: Vec<Vec<GroupId>> = batch(vec![1, 2], 2).chain(batch(vec![2], 4)).chain(batch(vec![3], 3)).collect();
    assert_eq!(run_three(SchedulingPolicy::Static), expected);
}

/// A reservation larger than the whole pool can never be admitted: the group is rejected.
#[test]
fn a_reservation_beyond_the_pool_is_rejected() {
    let mut blocks = manager(4, 0);
    let mut s = Scheduler::new(reserving(SchedulingPolicy::Orca(KvReservation::Max), 32));
    s.add(group(1, 4, 2));
    let out = s.schedule(&mut blocks);
    assert_eq!(out.rejected, vec![1]);
}

/// A sequence whose prompt fills the whole device pool can never take its next token: it is
/// rejected at that step, in every preemption mode, instead of being swapped out for good (or
/// recomputed) and holding up the queue; the request behind it then runs, and no block leaks.
#[test]
fn a_sequence_that_outgrows_the_whole_pool_is_rejected_not_preempted_forever() {
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute, PreemptionMode::Auto] {
        let mut blocks = manager(2, 4);
        let mut s = Scheduler::new(config(8, mode));
        // 8 tokens fill both blocks of 4; generating 3 needs a third.
        s.add(group(1, 8, 3));
        s.add(group(2, 3, 2));
        let (mut rejected, mut finished) = (Vec::<GroupId>::new(), Vec::new());
        for _ in 0..20 {
            if s.is_empty() {
                break;
            }
            let out = s.schedule(&mut blocks);
            rejected.extend(&out.rejected);
            finished.extend(advance(&mut s, &out, &mut blocks));
            s.check_consistency(&blocks).unwrap();
        }
        assert_eq!(rejected, vec![1], "{mode:?}");
        assert_eq!(finished, vec![2], "{mode:?}");
        assert!(s.is_empty(), "{mode:?}: every request is done");
        assert_eq!(blocks.num_free_blocks(Location::Device), 2, "{mode:?}");
    }
}
