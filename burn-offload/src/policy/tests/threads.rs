//! Thread selection from an operator graph's makespan.

use super::*;

/// Attention-like graph: q, k-cat, v-cat in parallel; QK bmm after q and k; softmax; AV bmm
/// after softmax and v.
fn attention_graph() -> Vec<ComputeOp> {
    let op = |name: &str, deps: Vec<usize>| ComputeOp { name: name.into(), deps };
    vec![
        op("q", vec![]),
        op("k_cat", vec![]),
        op("v_cat", vec![]),
        op("bmm_qk", vec![0, 1]),
        op("softmax", vec![3]),
        op("bmm_av", vec![4, 2]),
    ]
}

fn io(name: &str, bytes: f64, pts: &[(u32, f64)]) -> IoTaskProfile {
    IoTaskProfile {
        name: name.into(),
        bytes,
        samples: pts.iter().map(|&(threads, seconds)| IoSample { threads, seconds }).collect(),
    }
}

#[test]
fn max_concurrency_of_graphs() {
    let g = attention_graph();
    // q, k, v start together (3 running); makespan 1 + 4 + 1 + 4 = 10.
    let (c, span) = max_concurrency(&g, &[1.0, 1.0, 1.0, 4.0, 1.0, 4.0]).unwrap();
    assert_eq!(c, 3);
    assert_close!(span, 10.0);
    // A long v_cat overlaps the QK bmm: still 3 at t = 0, 2 afterwards.
    let (c, span) = max_concurrency(&g, &[1.0, 1.0, 6.0, 4.0, 1.0, 4.0]).unwrap();
    assert_eq!(c, 3);
    assert_close!(span, 10.0);
    let chain = vec![ComputeOp { name: "a".into(), deps: vec![] }, ComputeOp { name: "b".into(), deps: vec![0] }];
    assert_eq!(max_concurrency(&chain, &[1.0, 1.0]).unwrap().0, 1);
    let cycle = vec![ComputeOp { name: "a".into(), deps: vec![1] }, ComputeOp { name: "b".into(), deps: vec![0] }];
    assert!(max_concurrency(&cycle, &[1.0, 1.0]).is_err());
    let bad = vec![ComputeOp { name: "a".into(), deps: vec![7] }];
    assert!(max_concurrency(&bad, &[1.0]).is_err());
    assert!(max_concurrency(&chain, &[1.0]).is_err());
    assert!(max_concurrency(&chain, &[1.0, f64::NAN]).is_err());
}

fn thread_profile() -> ThreadProfile {
    let base = [1.0, 1.0, 1.0, 4.0, 1.0, 4.0].map(|t| t * 1e-3); // makespan 10 ms at 1 thread
    let sample =
        |intra: u32, f: f64| ComputeSample { intra_op_threads: intra, op_seconds: base.map(|t| t * f).to_vec() };
    ThreadProfile {
        max_threads: 32,
        compute_ops: attention_graph(),
        compute_samples: vec![sample(1, 1.0), sample(2, 0.55), sample(4, 0.35), sample(8, 0.2), sample(16, 0.18)],
        io_tasks: vec![
            io("load_weight", 1e9, &[(1, 8e-3), (2, 4.5e-3), (4, 3e-3), (8, 2.5e-3)]),
            io("load_cache", 1e8, &[(1, 5e-4), (4, 3e-4)]),
            io("load_activation", 1e6, &[(1, 5e-5)]),
            io("store_cache", 1e8, &[(1, 5e-4), (4, 3e-4)]),
            io("store_activation", 1e6, &[(1, 5e-5)]),
        ],
    }
}

#[test]
fn algorithm3_balances_compute_and_io_threads() {
    let plan = choose_threads(&thread_profile()).unwrap();
    // intra = 1, 2, 4 are compute-bound (10, 5.5, 3.5 ms). intra = 8: compute 2 ms with
    // inter-op 3 uses 24 threads; the 8 left give load_weight 4 threads (3 ms): step 3 ms, best.
    // intra = 16 needs 48 threads and is skipped.
    assert_eq!(plan.intra_op_compute, 8);
    assert_eq!(plan.inter_op_compute, 3);
    assert_eq!(plan.inter_op_total, 3 + 5);
    assert_eq!(plan.io_threads.iter().sum::<u32>(), 32 - 24);
    assert!(plan.io_threads.iter().all(|&t| t >= 1));
    assert_eq!(plan.io_threads[0], 4);
    assert_close!(plan.compute_seconds, 2e-3);
    assert_close!(plan.io_seconds[0], 3e-3);
    assert_close!(plan.step_seconds, 3e-3);
}

#[test]
fn algorithm3_refuses_unusable_profiles() {
    let mut p = thread_profile();
    p.max_threads = 4; // fewer than one thread per I/O task
    assert!(matches!(choose_threads(&p), Err(PolicyError::InvalidThreadProfile(_))));
    let mut p = thread_profile();
    p.io_tasks[0].samples.clear();
    assert!(choose_threads(&p).is_err());
    let mut p = thread_profile();
    p.compute_samples.clear();
    assert!(choose_threads(&p).is_err());
    let mut p = thread_profile();
    p.compute_samples[0].op_seconds.pop();
    assert!(choose_threads(&p).is_err());
}

/// The per-size matmul rate interpolates in log(rows), is flat beyond the table, and a bad table
/// is refused.
#[test]
fn matmul_rate_by_rows() {
    let mut hw = HardwareProfile::t4_like();
    assert_eq!(hw.matmul_flops(7.0), hw.gpu_matmul_flops);
    hw.gpu_matmul_flops_by_rows = vec![(1.0, 1e9), (100.0, 3e9)];
    assert_eq!(hw.matmul_flops(0.5), 1e9);
    assert_eq!(hw.matmul_flops(1000.0), 3e9);
    assert!((hw.matmul_flops(10.0) - 2e9).abs() < 1.0);
    hw.validate().unwrap();
    hw.gpu_matmul_flops_by_rows = vec![(4.0, 1e9), (2.0, 3e9)];
    assert!(hw.validate().is_err());
}
