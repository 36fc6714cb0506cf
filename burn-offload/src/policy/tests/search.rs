//! The LP policy search: invariants over a small space, FlexGen-like choices, baselines,
//! compression and rounding.

use super::*;

/// Small space for the invariant sweeps.
pub(super) fn small_space() -> SearchSpace {
    SearchSpace {
        gpu_batch_sizes: vec![1, 4, 8, 16, 32, 64, 128],
        num_gpu_batches: vec![1, 2, 4, 8, 12, 16],
        ..SearchSpace::default()
    }
}

fn assert_valid(r: &SearchResult) {
    for pl in [r.policy.weights, r.policy.cache, r.policy.activations] {
        for v in pl.to_array() {
            assert!((0.0..=1.0).contains(&v), "{pl:?}");
        }
        assert!((pl.to_array().iter().sum::<f64>() - 1.0).abs() < 1e-9, "{pl:?}");
    }
    for (c, used) in r.estimate.peak_memory.by_constraint() {
        let cap = r.available.on(c.tier());
        assert!(used <= cap * (1.0 + 1e-6) + 1.0, "{c:?}: {used} > {cap}");
    }
    assert!(r.policy.validate().is_ok());
    assert!(r.estimate.throughput_tokens_per_s > 0.0);
}

#[test]
fn lp_results_respect_constraints() {
    let hw = HardwareProfile::t4_like();
    let cases = [
        (ModelShape::opt_6_7b(), OffloadWorkload::new(512, 32)),
        (ModelShape::opt_30b(), OffloadWorkload::new(512, 32)),
        (ModelShape::opt_30b(), OffloadWorkload::new(1024, 32)),
        (ModelShape::opt_175b(), OffloadWorkload::new(512, 32)),
        (ModelShape::llama3_8b(), OffloadWorkload::new(2048, 128)),
    ];
    for (m, wl) in cases {
        for space in [small_space(), small_space().with_compression()] {
            let r = search(&hw, &m, &wl, &space).unwrap();
            assert_valid(&r);
            assert_eq!(r.policy.activations.disk, 0.0, "activations on disk are off by default");
        }
    }
}

#[test]
fn lp_placement_is_optimal_against_a_grid() {
    // For fixed shapes, no placement on a 5% grid that fits may beat the LP's.
    let hw = HardwareProfile::t4_like();
    let m = ModelShape::opt_30b();
    let wl = OffloadWorkload::new(512, 32);
    let available = TierBytes::available(&hw, &TierBytes::default());
    for cpu_attention in [false, true] {
        let shape = PolicyShape {
            gpu_batch_size: 16,
            num_gpu_batches: 4,
            cpu_attention,
            overlap: true,
            compress_weights: None,
            compress_cache: None,
        };
        let (lp, lp_est) = solve_placement(&hw, &m, &wl, &shape, &available, false).unwrap().unwrap();
        assert!(lp_est.fits(&available) || lp_est.memory_overflow(&available).unwrap().1 < 1e-3 * GIB);
        let steps: Vec<f64> = (0..=20).map(|i| f64::from(i) / 20.0).collect();
        let mut checked = 0;
        for &wg in &steps {
            for &cg in &steps {
                for &hg in &[0.0, 1.0] {
                    let p = Policy::from_parts(
                        shape,
                        Placement { gpu: wg, cpu: 1.0 - wg, disk: 0.0 },
                        Placement { gpu: cg, cpu: 1.0 - cg, disk: 0.0 },
                        Placement { gpu: hg, cpu: 1.0 - hg, disk: 0.0 },
                    );
                    let e = estimate(&hw, &m, &wl, &p).unwrap();
                    if e.fits(&available) {
                        checked += 1;
                        assert!(
                            e.throughput_tokens_per_s <= lp_est.throughput_tokens_per_s * (1.0 + 1e-6),
                            "grid {:?} beats LP {:?}",
                            p.placement_vector(),
                            lp.placement_vector()
                        );
                    }
                }
            }
        }
        assert!(checked > 10);
    }
}

#[test]
fn more_memory_never_lowers_predicted_throughput() {
    let m = ModelShape::opt_30b();
    let wl = OffloadWorkload::new(512, 32);
    let space = small_space();
    let mut last = 0.0;
    for gib in [6u64, 8, 12, 16, 24, 32, 48, 80] {
        let hw = HardwareProfile { gpu_memory_bytes: gib << 30, ..HardwareProfile::t4_like() };
        let t = search(&hw, &m, &wl, &space).unwrap().estimate.throughput_tokens_per_s;
        assert!(t >= last * (1.0 - 1e-6), "GPU {gib} GiB: {t} < {last}");
        last = t;
    }
    let mut last = 0.0;
    for gib in [40u64, 64, 96, 128, 208, 400] {
        let hw = HardwareProfile { cpu_memory_bytes: gib << 30, ..HardwareProfile::t4_like() };
        let t = search(&hw, &m, &wl, &space).unwrap().estimate.throughput_tokens_per_s;
        assert!(t >= last * (1.0 - 1e-6), "CPU {gib} GiB: {t} < {last}");
        last = t;
    }
}

#[test]
fn flexgen_like_opt30b_on_t4_prefers_big_blocks_and_cpu_weights() {
    // FlexGen Table 15 (OPT-30B, 512 + 32 on a T4): 48 × 3 with wg = 20%, wc = 80%, cache on the
    // CPU. Qualitatively: a large effective batch and most weights on the CPU.
    let hw = HardwareProfile::t4_like();
    let m = ModelShape::opt_30b();
    let wl = OffloadWorkload::new(512, 32);
    let r = search(&hw, &m, &wl, &SearchSpace::default()).unwrap();
    assert_valid(&r);
    assert!(r.policy.block_size() >= 32, "block {}", r.policy.block_size());
    assert!(r.policy.weights.cpu >= 0.5, "weights {:?}", r.policy.weights);
    assert!(r.policy.cache.gpu < 0.5, "cache {:?}", r.policy.cache);
    // The GPU is full: some GPU constraint binds.
    assert!(r.binding.tight_memory.iter().any(|c| c.tier() == Tier::Gpu), "{:?}", r.binding);

    // It beats the baselines at their largest fitting batch.
    let avail = TierBytes::available(&hw, &TierBytes::default());
    let ds =
        largest_fitting_batch(&hw, &m, &wl, &avail, 512, |g| Policy::deepspeed_like(g, Tier::Cpu)).unwrap().unwrap();
    let acc_w = Placement { gpu: 0.1, cpu: 0.9, disk: 0.0 };
    let acc = largest_fitting_batch(&hw, &m, &wl, &avail, 512, |g| Policy::accelerate_like(g, acc_w)).unwrap().unwrap();
    assert!(ds.1.fits(&avail) && acc.1.fits(&avail));
    assert!(r.estimate.throughput_tokens_per_s > ds.1.throughput_tokens_per_s);
    assert!(r.estimate.throughput_tokens_per_s > acc.1.throughput_tokens_per_s);
    // One more batch would not fit.
    let over = estimate(&hw, &m, &wl, &Policy::deepspeed_like(ds.0.shape.gpu_batch_size + 1, Tier::Cpu)).unwrap();
    assert!(!over.fits(&avail));
}

#[test]
fn baseline_constructors_match_flexgen_description() {
    let ds = Policy::deepspeed_like(8, Tier::Cpu);
    assert_eq!(ds.weights.to_array(), [0.0, 1.0, 0.0]);
    assert_eq!(ds.cache.to_array(), [1.0, 0.0, 0.0]);
    assert_eq!(ds.activations.to_array(), [1.0, 0.0, 0.0]);
    assert_eq!((ds.shape.gpu_batch_size, ds.shape.num_gpu_batches, ds.shape.cpu_attention), (8, 1, false));
    assert!(ds.shape.overlap && ds.shape.compress_weights.is_none() && ds.shape.compress_cache.is_none());
    assert_eq!(Policy::deepspeed_like(2, Tier::Disk).weights.to_array(), [0.0, 0.0, 1.0]);
    let acc = Policy::accelerate_like(4, Placement { gpu: 0.3, cpu: 0.7, disk: 0.0 });
    assert_eq!(acc.weights.to_array(), [0.3, 0.7, 0.0]);
    assert_eq!(acc.cache.to_array(), [1.0, 0.0, 0.0]);
    assert!(!acc.shape.overlap && acc.shape.num_gpu_batches == 1);
    assert!(ds.validate().is_ok() && acc.validate().is_ok());
}

#[test]
fn compression_changes_the_binding_constraint_when_memory_is_tight() {
    // OPT-30B (≈ 60 GB of fp16 weights) with only 40 GiB of CPU memory: uncompressed, weights
    // spill to disk, CPU memory binds and disk reads bound decode. 4-bit weights (≈ 19 GB) fit in
    // CPU memory, so the CPU constraint is no longer what binds and disk is idle.
    let hw = HardwareProfile { cpu_memory_bytes: 40 << 30, ..HardwareProfile::t4_like() };
    let m = ModelShape::opt_30b();
    let wl = OffloadWorkload::new(512, 32);
    let plain = search(&hw, &m, &wl, &small_space()).unwrap();
    assert!(plain.policy.weights.disk > 0.0, "{:?}", plain.policy.weights);
    assert!(plain.binding.tight_memory.iter().any(|c| c.tier() == Tier::Cpu), "{:?}", plain.binding);
    assert_eq!(plain.binding.decode_bottleneck, Term::DiskToCpu);

    let space = SearchSpace { weight_compression: vec![Some(FLEXGEN_WEIGHTS)], ..small_space() };
    let comp = search(&hw, &m, &wl, &space).unwrap();
    assert_valid(&comp);
    assert!(comp.policy.weights.disk < 1e-9, "{:?}", comp.policy.weights);
    assert_ne!(comp.binding.decode_bottleneck, Term::DiskToCpu);
    assert_ne!(comp.binding.tight_memory, plain.binding.tight_memory);
    assert!(comp.estimate.throughput_tokens_per_s > plain.estimate.throughput_tokens_per_s);
}

#[test]
fn infeasible_gpu_budget_names_the_needed_bytes() {
    let hw = HardwareProfile { gpu_memory_bytes: 256 << 20, ..HardwareProfile::t4_like() };
    let m = ModelShape::opt_30b();
    let err = search(&hw, &m, &OffloadWorkload::new(512, 32), &small_space()).unwrap_err();
    match &err {
        PolicyError::InsufficientMemory { tier, needed_bytes, available_bytes, what } => {
            assert_eq!(*tier, Tier::Gpu);
            assert_close!(*available_bytes, 256.0 * 1024.0 * 1024.0);
            // At least two offloaded layers in flight: 2 · 1.23 GB.
            assert!(*needed_bytes >= 2.0 * m.layer_weight_bytes(), "{needed_bytes}");
            assert!(what.contains("one layer's working set"), "{what}");
        }
        e => panic!("unexpected {e}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("of GPU (device) memory, have 256.0 MiB"), "{msg}");
}

#[test]
fn infeasible_cpu_and_disk_budget_names_the_cpu() {
    // 60 GB of weights, 16 GiB GPU, 8 GiB CPU, 10 GiB disk: the CPU (with GPU and disk full)
    // cannot hold the rest.
    let hw = HardwareProfile { cpu_memory_bytes: 8 << 30, disk_memory_bytes: 10 << 30, ..HardwareProfile::t4_like() };
    let err = search(&hw, &ModelShape::opt_30b(), &OffloadWorkload::new(512, 32), &small_space()).unwrap_err();
    match err {
        PolicyError::InsufficientMemory { tier, needed_bytes, available_bytes, .. } => {
            assert_eq!(tier, Tier::Cpu);
            assert!(needed_bytes > available_bytes);
            assert!(needed_bytes > 20.0 * GIB, "{needed_bytes}");
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn num_prompts_bounds_the_block() {
    let wl = OffloadWorkload { num_prompts: Some(16), ..OffloadWorkload::new(512, 32) };
    let r = search(&HardwareProfile::t4_like(), &ModelShape::opt_30b(), &wl, &small_space()).unwrap();
    assert!(r.policy.block_size() <= 16);
}

#[test]
fn rounding_to_whole_layers_fits_and_costs_no_less() {
    let hw = HardwareProfile::t4_like();
    for (m, wl) in [
        (ModelShape::opt_30b(), OffloadWorkload::new(512, 32)),
        (ModelShape::opt_175b(), OffloadWorkload::new(512, 32)),
        (ModelShape::opt_6_7b(), OffloadWorkload::new(512, 32)),
    ] {
        let r = search(&hw, &m, &wl, &small_space()).unwrap();
        let rr = round_to_whole(&hw, &m, &wl, &r.policy, &TierBytes::default()).unwrap();
        let l = u64::from(m.num_layers);
        let nb = u64::from(rr.policy.shape.num_gpu_batches);
        assert_eq!(rr.weight_layers.iter().sum::<u64>(), l);
        assert_eq!(rr.cache_tensors.iter().sum::<u64>(), l * nb);
        assert_eq!(rr.activation_tensors.iter().sum::<u64>(), nb);
        assert_eq!(rr.layer_tiers.len() as u64, l);
        for t in Tier::ALL {
            let n = rr.layer_tiers.iter().filter(|x| **x == t).count() as u64;
            assert_eq!(n, rr.weight_layers[t.index()]);
        }
        assert!(rr.policy.validate().is_ok());
        assert!(rr.estimate.fits(&r.available), "{:?}", rr.estimate.peak_memory);
        assert!(
            rr.estimate.throughput_tokens_per_s <= r.estimate.throughput_tokens_per_s * (1.0 + 1e-5),
            "{} > {}",
            rr.estimate.throughput_tokens_per_s,
            r.estimate.throughput_tokens_per_s
        );
        assert!(rr.estimate.throughput_tokens_per_s > 0.5 * r.estimate.throughput_tokens_per_s);
    }
}

#[test]
fn rounding_demotes_when_the_fraction_does_not_fit() {
    // All weights on the GPU of a 30B model on a 16 GiB GPU: rounding must move layers down.
    let hw = HardwareProfile::t4_like();
    let m = ModelShape::opt_30b();
    let wl = OffloadWorkload::new(512, 32);
    let p = Policy::all_on_gpu(1);
    let rr = round_to_whole(&hw, &m, &wl, &p, &TierBytes::default()).unwrap();
    assert!(rr.weight_layers[0] < 48 && rr.weight_layers[0] > 0, "{:?}", rr.weight_layers);
    assert!(rr.estimate.fits(&TierBytes::available(&hw, &TierBytes::default())));
    // A disk too small for anything is an error, not a panic.
    let tiny =
        HardwareProfile { gpu_memory_bytes: 1 << 30, cpu_memory_bytes: 1 << 30, disk_memory_bytes: 1 << 30, ..hw };
    assert!(matches!(
        round_to_whole(&tiny, &m, &wl, &p, &TierBytes::default()),
        Err(PolicyError::InsufficientMemory { .. })
    ));
}
