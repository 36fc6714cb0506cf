//! Chunked prefill on the fake engine of [`tests`](super::tests): the budget split, decodes
//! first, partial prefills continued before new prompts, prefix hits free of charge, groups of
//! several sequences sampled together, and preemption of a partly prefilled group.

use super::tests::{advance, config, group, manager, stress};
use super::*;
use crate::memory::BlockManagerConfig;

/// FCFS with chunked prefill and a budget of `budget` tokens per step.
fn chunked(budget: usize, preemption: PreemptionMode) -> SchedulerConfig {
    SchedulerConfig { max_num_batched_tokens: budget, chunked_prefill: true, ..config(8, preemption) }
}

/// `(group, start, tokens, sample)` of each scheduled sequence.
fn shape(out: &SchedulerOutput) -> Vec<(GroupId, usize, usize, bool)> {
    out.seqs.iter().map(|x| (x.group, x.start, x.tokens.len(), x.sample)).collect()
}

#[test]
fn a_prompt_longer_than_the_budget_is_computed_in_chunks() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(chunked(8, PreemptionMode::Recompute));
    assert!(s.chunks_prompts());
    s.add(group(1, 20, 2));
    let mut steps = Vec::new();
    for _ in 0..3 {
        let out = s.schedule(&mut blocks);
        steps.extend(shape(&out));
        advance(&mut s, &out, &mut blocks);
    }
    assert_eq!(steps, vec![(1, 0, 8, false), (1, 8, 8, false), (1, 16, 4, true)]);
    let g = s.group(1).unwrap();
    assert_eq!((g.seqs[0].tokens.len(), g.seqs[0].num_computed), (21, 20), "sampled once, after the last chunk");
    assert_eq!(blocks.table(1000).unwrap().num_tokens(), 20);

    // Without chunking the same prompt never fits the budget (the engine refuses it up front).
    let mut s = Scheduler::new(SchedulerConfig { chunked_prefill: false, ..chunked(8, PreemptionMode::Recompute) });
    let mut blocks = manager(64, 0);
    s.add(group(1, 20, 2));
    assert!(s.schedule(&mut blocks).seqs.is_empty());
}

#[test]
fn decodes_come_first_then_partial_prefills_then_new_prompts() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(chunked(8, PreemptionMode::Recompute));
    s.add(group(1, 3, 10));
    let out = s.schedule(&mut blocks);
    advance(&mut s, &out, &mut blocks);
    s.add(group(2, 20, 10));
    let out = s.schedule(&mut blocks);
    assert_eq!(shape(&out), vec![(1, 3, 1, true), (2, 0, 7, false)], "the decode, then the rest of the budget");
    advance(&mut s, &out, &mut blocks);
    s.add(group(3, 5, 10));
    let out = s.schedule(&mut blocks);
    assert_eq!(shape(&out), vec![(1, 4, 1, true), (2, 7, 7, false)], "the partial prefill before the new prompt");
    advance(&mut s, &out, &mut blocks);
    let out = s.schedule(&mut blocks);
    assert_eq!(shape(&out), vec![(1, 5, 1, true), (2, 14, 6, true), (3, 0, 1, false)]);
    advance(&mut s, &out, &mut blocks);
    let out = s.schedule(&mut blocks);
    assert_eq!(shape(&out), vec![(1, 6, 1, true), (2, 20, 1, true), (3, 1, 4, true)]);
    s.check_consistency(&blocks).unwrap();
}

#[test]
fn prefix_cache_hits_are_not_charged_to_the_budget() {
    let mut blocks =
        BlockManager::new(BlockManagerConfig::new(64, 0).with_block_size(4).with_prefix_caching(true)).unwrap();
    let mut s = Scheduler::new(chunked(4, PreemptionMode::Recompute));
    let prompt: Vec<u32> = (0..16).collect();
    s.add(SequenceGroup::new(1, 1, Sequence::new(10, prompt.clone()), 1, 1));
    for _ in 0..4 {
        let out = s.schedule(&mut blocks);
        advance(&mut s, &out, &mut blocks);
    }
    assert!(s.is_empty(), "16 tokens in chunks of 4");
    let longer: Vec<u32> = (0..24).collect();
    s.add(SequenceGroup::new(2, 2, Sequence::new(20, longer), 1, 1));
    let out = s.schedule(&mut blocks);
    assert_eq!(shape(&out), vec![(2, 16, 4, false)], "four cached blocks, then a chunk of the budget");
    assert_eq!(out.seqs[0].cached_tokens, 16);
}

#[test]
fn a_group_of_several_sequences_is_sampled_only_when_all_are_computed() {
    let mut blocks = manager(64, 0);
    let mut s = Scheduler::new(chunked(8, PreemptionMode::Recompute));
    let mut g = group(1, 10, 3);
    g.seqs.push(Sequence::new(1001, (0..10).collect()));
    g.max_seqs = 2;
    s.add(g);
    let mut steps = Vec::new();
    for _ in 0..3 {
        let out = s.schedule(&mut blocks);
        steps.push(shape(&out));
        advance(&mut s, &out, &mut blocks);
    }
    assert_eq!(
        steps,
        vec![vec![(1, 0, 8, false)], vec![(1, 8, 1, false), (1, 0, 7, false)], vec![(1, 9, 1, true), (1, 7, 3, true)],],
        "each sequence keeps its last token back until one step computes them all"
    );
}

/// Group 1 decodes while group 2's 16-token prompt fills the rest of a 6-block pool in chunks
/// of 3; group 1's next block then preempts group 2, the prefilling group, partly prefilled.
fn preempt_partial(mode: PreemptionMode) -> (Scheduler<usize>, BlockManager, SchedulerOutput) {
    let mut blocks = manager(6, 8);
    let mut s = Scheduler::new(chunked(4, mode));
    s.add(group(1, 4, 20));
    let out = s.schedule(&mut blocks);
    advance(&mut s, &out, &mut blocks);
    s.add(group(2, 16, 2));
    loop {
        let out = s.schedule(&mut blocks);
        if !out.preempted.is_empty() {
            return (s, blocks, out);
        }
        assert!(out.seqs.iter().all(|x| x.group == 1 || !x.sample), "group 2 is preempted before its last chunk");
        advance(&mut s, &out, &mut blocks);
    }
}

#[test]
fn a_partly_prefilled_group_preempted_by_recomputation_restarts_its_prompt() {
    let (mut s, mut blocks, out) = preempt_partial(PreemptionMode::Recompute);
    assert_eq!(out.preempted, vec![(2, PreemptionMode::Recompute)]);
    assert!(out.seqs.iter().all(|x| x.group == 1), "{:?}", shape(&out));
    let g = s.group(2).unwrap();
    assert_eq!((g.status(), g.seqs[0].num_computed), (GroupStatus::Waiting, 0));
    advance(&mut s, &out, &mut blocks);
    let restarted = (0..40).find_map(|_| {
        let out = s.schedule(&mut blocks);
        let start = out.seqs.iter().find(|x| x.group == 2).map(|x| x.start);
        advance(&mut s, &out, &mut blocks);
        start
    });
    assert_eq!(restarted, Some(0), "its prompt is computed again from the start");
    s.check_consistency(&blocks).unwrap();
}

#[test]
fn a_partly_prefilled_group_preempted_by_swapping_keeps_its_computed_tokens() {
    let (mut s, mut blocks, out) = preempt_partial(PreemptionMode::Swap);
    assert_eq!(out.preempted, vec![(2, PreemptionMode::Swap)]);
    let computed = s.group(2).unwrap().seqs[0].num_computed;
    assert!(computed > 0 && computed < 16, "{computed}");
    assert_eq!(blocks.table(2000).unwrap().num_tokens(), computed);
    advance(&mut s, &out, &mut blocks);
    let resumed = (0..40).find_map(|_| {
        let out = s.schedule(&mut blocks);
        let start = out.seqs.iter().find(|x| x.group == 2).map(|x| (x.start, out.swap_in.len()));
        advance(&mut s, &out, &mut blocks);
        start
    });
    assert_eq!(resumed.map(|(start, _)| start), Some(computed), "it resumes where it stopped");
    assert!(resumed.is_some_and(|(_, swapped_in)| swapped_in > 0));
    s.check_consistency(&blocks).unwrap();
}

#[test]
fn phased_and_static_schedules_keep_prompts_whole() {
    let phased = SchedulingPolicy::Phased { encode_batch: 2, decode_batch: 4, decode_iterations: 2 };
    for scheduling in [phased, SchedulingPolicy::Static] {
        let s: Scheduler<usize> = Scheduler::new(SchedulerConfig { scheduling, ..chunked(8, PreemptionMode::Swap) });
        assert!(!s.chunks_prompts(), "{scheduling:?}");
    }
    let orca = SchedulingPolicy::Orca(KvReservation::Oracle);
    assert!(
        Scheduler::<usize>::new(SchedulerConfig { scheduling: orca, ..chunked(8, PreemptionMode::Swap) })
            .chunks_prompts()
    );
}

/// The stress run of [`stress`] with chunks of at most 8 tokens, in every preemption mode.
#[test]
fn stress_with_chunked_prefill_loses_nothing() {
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute, PreemptionMode::Auto] {
        stress(chunked(8, mode), |_, out| assert!(out.num_batched_tokens() <= 8));
    }
}
