//! Tests of the policy search: hand-computed cost-model cases, LP invariants, FlexGen-like
//! sanity checks, baselines, rounding, profile files and thread selection.

use super::*;

const GIB: f64 = (1u64 << 30) as f64;

/// Relative closeness.
fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
}

macro_rules! assert_close {
    ($a:expr, $b:expr) => {
        assert_close!($a, $b, 1e-12)
    };
    ($a:expr, $b:expr, $rel:expr) => {{
        let (a, b) = ($a as f64, $b as f64);
        assert!(close(a, b, $rel), "{} = {a} but expected {} = {b}", stringify!($a), stringify!($b));
    }};
}

/// Round-number hardware for hand computation: no rooflines, so the terms are the paper's.
fn hand_hw() -> HardwareProfile {
    HardwareProfile {
        name: "hand".into(),
        gpu_memory_bytes: 16 << 30,
        cpu_memory_bytes: 64 << 30,
        disk_memory_bytes: 1 << 40,
        cpu_to_gpu_bandwidth: 1e10,
        gpu_to_cpu_bandwidth: 1e10,
        disk_to_cpu_bandwidth: 1e9,
        cpu_to_disk_bandwidth: 1e9,
        gpu_matmul_flops: 1e13,
        gpu_bmm_flops: 1e12,
        cpu_flops: 1e11,
        gpu_memory_bandwidth: None,
        cpu_attention_bandwidth: None,
        gpu_quantize_bandwidth: 1e11,
        gpu_matmul_flops_by_rows: Vec::new(),
        gpu_dequantize_bandwidth: 1e11,
        cpu_quantize_bandwidth: 1e9,
    }
}

/// A 2-layer paper-OPT: h1 = 1024, h2 = 4096, nh = 16, fp16, no biases.
fn hand_model() -> ModelShape {
    ModelShape::paper_opt(2, 1024, 4096, 16)
}

/// s = 128, n = 8 (so s + n/2 = 132, n − 1 = 7, s + n = 136).
fn hand_wl() -> OffloadWorkload {
    OffloadWorkload::new(128, 8)
}

#[test]
fn model_sizes_match_flexgen_for_opt() {
    let m = hand_model();
    // 8h1² + 4h1h2 = 8·1024² + 4·1024·4096 = 8 388 608 + 16 777 216 = 25 165 824 bytes.
    assert_close!(m.layer_weight_bytes(), 25_165_824.0);
    // KV: 4h1 = 4096 bytes per token; activation: 2h1 = 2048 bytes per token.
    assert_close!(m.kv_bytes_per_token(), 4096.0);
    assert_close!(m.activation_bytes_per_token(), 2048.0);
    // Linear FLOPs per token = 8h1² + 4h1h2 (numerically equal to the fp16 bytes).
    assert_close!(m.linear_flops_per_token(), 25_165_824.0);
}

#[test]
fn llama_shapes_are_gqa_and_gated_aware() {
    let l2 = ModelShape::llama2_7b();
    let l3 = ModelShape::llama3_8b();
    // LLaMA-2-7B: 4·4096² + 3·4096·11008 = 67 108 864 + 135 266 304 matrix parameters per layer.
    assert_close!(l2.matrix_params_per_layer(), 202_375_168.0);
    // 32 layers + 2 embeddings of 32000·4096 ≈ 6.74 B parameters.
    let total = l2.params_per_layer() * 32.0 + l2.embedding_bytes() / 2.0;
    assert!((6.7e9..6.8e9).contains(&total), "{total}");
    // GQA: K and V projections are 4096 → 1024, and the cache is 4× smaller.
    assert_close!(l3.kv_bytes_per_token(), 2.0 * 1024.0 * 2.0);
    assert_close!(l2.kv_bytes_per_token(), 4.0 * l3.kv_bytes_per_token());
    assert_close!(l3.matrix_params_per_layer(), 2.0 * 4096.0 * 4096.0 + 2.0 * 4096.0 * 1024.0 + 3.0 * 4096.0 * 14336.0);
}

#[test]
fn hand_case_all_on_gpu() {
    let (hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    let p = Policy::all_on_gpu(4); // gbs = 4, one GPU batch → bls = 4
    let e = estimate(&hw, &m, &wl, &p).unwrap();

    // Prefill: every I/O term is 0 (nothing off the GPU).
    // comp^p = bls·(8s·h1² + 4s·h1·h2)/mm_flops + 4·bls·s²·h1/bmm_flops
    //        = 4·128·25 165 824 / 1e13 + 4·4·128²·1024 / 1e12
    //        = 12 884 901 888 / 1e13 + 268 435 456 / 1e12
    //        = 1.2884901888e-3 + 2.68435456e-4 = 1.556925644800e-3 s
    let t_pre = 1.2884901888e-3 + 2.68435456e-4;
    assert_eq!(e.prefill_terms.terms()[..4], [0.0; 4]);
    assert_close!(e.prefill_terms.compute, t_pre);
    assert_close!(e.t_prefill_layer, t_pre);
    // Decode: comp^g = bls·(8h1² + 4h1h2)/mm_flops + 4·cg·bls·(s + n/2)·h1/bmm_flops
    //        = 4·25 165 824 / 1e13 + 4·4·132·1024 / 1e12 = 1.00663296e-5 + 2.162688e-6
    let t_gen = 1.00663296e-5 + 2.162688e-6;
    assert_close!(e.t_decode_layer, t_gen);
    assert_eq!(e.decode_terms.bottleneck(), Term::Compute);
    // T = T_pre·l + T_gen·(n−1)·l = 2·t_pre + 14·t_gen; throughput = bls·n / T = 32 / T.
    let t = 2.0 * t_pre + 14.0 * t_gen;
    assert_close!(e.total_latency, t);
    assert_close!(e.throughput_tokens_per_s, 32.0 / t);

    // GPU prefill peak: home = wg·W·l + hg·2s·h1·bls + 4(s+n)·h1·cg·bls·l
    //   = 25 165 824·2 + 2·128·1024·4 + 4·136·1024·4·2 = 50 331 648 + 1 048 576 + 4 456 448
    // working = max(qkv 8·gbs·s·h1 = 4 194 304, att1 = att2 = gbs·(4s·h1 + 2nh·s²) = 4 194 304,
    //   embed 4·gbs·s·h1 = 2 097 152, mlp1 = mlp2 = 2·gbs·s·(h1+h2) = 5 242 880) = 5 242 880
    assert_close!(e.peak_memory.prefill.gpu, 50_331_648.0 + 1_048_576.0 + 4_456_448.0 + 5_242_880.0);
    // GPU decode peak: home = 50 331 648 + 2·h1·bls (8 192) + 4 456 448; working =
    //   max(qkv 8·gbs·h1 = 32 768, att1 = att2 = gbs·(2h1 + 2(s+n)h1 + 2nh(s+n)) = 4·284 928 =
    //   1 139 712, embed 16 384, mlp 2·gbs·(h1+h2) = 40 960) = 1 139 712
    assert_close!(e.peak_memory.decode.gpu, 50_331_648.0 + 8_192.0 + 4_456_448.0 + 1_139_712.0);
    // CPU: nothing at home; decode keeps FlexGen's 2h1·gbs staging term = 8 192; disk empty.
    assert_close!(e.peak_memory.prefill.cpu, 0.0);
    assert_close!(e.peak_memory.decode.cpu, 8_192.0);
    assert_close!(e.peak_memory.decode.disk, 0.0);
}

#[test]
fn hand_case_weights_and_cache_on_cpu_with_cpu_attention() {
    let (hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    let p = Policy {
        weights: Placement::all_on(Tier::Cpu),
        cache: Placement::all_on(Tier::Cpu),
        activations: Placement::all_on(Tier::Gpu),
        shape: PolicyShape {
            gpu_batch_size: 4,
            num_gpu_batches: 2, // bls = 8
            cpu_attention: true,
            overlap: true,
            compress_weights: None,
            compress_cache: None,
        },
    };
    let e = estimate(&hw, &m, &wl, &p).unwrap();

    // Prefill:
    // ctog^p = (wc+wd)·W / ctog = 25 165 824 / 1e10 = 2.5165824e-3
    // gtoc^p = (cc+cd)·4(s+1)·h1·bls / gtoc = 129·4096·8 / 1e10 = 4.227072e-4
    // comp^p = 8·128·25 165 824 / 1e13 + 4·8·128²·1024 / 1e12 = 2.5769803776e-3 + 5.36870912e-4
    let comp_p = 2.5769803776e-3 + 5.36870912e-4;
    assert_close!(e.prefill_terms.cpu_to_gpu, 2.5165824e-3);
    assert_close!(e.prefill_terms.gpu_to_cpu, 4.227072e-4);
    assert_close!(e.prefill_terms.disk_to_cpu, 0.0);
    assert_close!(e.prefill_terms.cpu_to_disk, 0.0);
    assert_close!(e.prefill_terms.compute, comp_p);
    assert_close!(e.t_prefill_layer, comp_p); // max of the five: compute
    assert_eq!(e.prefill_terms.bottleneck(), Term::Compute);

    // Decode:
    // ctog^g = (W + delegation: attention output (cc+cd)·bls·h1·2 = 16 384) / 1e10
    //        = 25 182 208 / 1e10 = 2.5182208e-3
    // gtoc^g = delegation: new q, k, v to the CPU (cc+cd)·bls·3h1·2 = 49 152 → 4.9152e-6
    // comp^g = bls·W_flops/mm + (cc+cd)·4·bls·(s+n/2)·h1 / cpu_flops
    //        = 8·25 165 824 / 1e13 + 4·8·132·1024 / 1e11 = 2.01326592e-5 + 4.325376e-5
    assert_close!(e.decode_terms.cpu_to_gpu, 2.5182208e-3);
    assert_close!(e.decode_terms.gpu_to_cpu, 4.9152e-6);
    assert_close!(e.decode_terms.compute, 2.01326592e-5 + 4.325376e-5);
    assert_close!(e.t_decode_layer, 2.5182208e-3);
    assert_eq!(e.decode_terms.bottleneck(), Term::CpuToGpu);
    // T = 2·comp_p + 14·2.5182208e-3; 64 tokens per block.
    let t = 2.0 * comp_p + 14.0 * 2.5182208e-3;
    assert_close!(e.total_latency, t);
    assert_close!(e.throughput_tokens_per_s, 64.0 / t);

    // GPU prefill: home hg·2s·h1·bls = 2 097 152; working 2(1−wg)·W = 50 331 648 + max(...)
    //   where the largest is mlp1 = 2·gbs·s·(h1+h2) = 5 242 880.
    assert_close!(e.peak_memory.prefill.gpu, 2_097_152.0 + 50_331_648.0 + 5_242_880.0);
    // GPU decode: home 2h1·bls = 16 384; working 50 331 648 + max(qkv 32 768, att·cg = 0,
    //   embed 16 384, mlp 40 960) = 40 960.
    assert_close!(e.peak_memory.decode.gpu, 16_384.0 + 50_331_648.0 + 40_960.0);
    // CPU prefill: home wc·W·l + 4(s+n)h1·cc·bls·l = 50 331 648 + 136·4096·8·2 (8 912 896);
    //   working (1−wg)·W = 25 165 824.
    assert_close!(e.peak_memory.prefill.cpu, 50_331_648.0 + 8_912_896.0 + 25_165_824.0);
    // CPU decode: home 59 244 544; working 2nh(s+n)·gbs = 2·16·136·4 = 17 408 (scores) +
    //   2h1·gbs = 8 192.
    assert_close!(e.peak_memory.decode.cpu, 59_244_544.0 + 17_408.0 + 8_192.0);
    assert_close!(e.peak_memory.decode.disk, 0.0);
}

#[test]
fn no_overlap_sums_the_terms() {
    let (hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    let mut p = Policy::deepspeed_like(4, Tier::Cpu);
    let with = estimate(&hw, &m, &wl, &p).unwrap();
    p.shape.overlap = false;
    let without = estimate(&hw, &m, &wl, &p).unwrap();
    assert_close!(without.t_decode_layer, with.decode_terms.terms().iter().sum::<f64>());
    assert_close!(with.t_decode_layer, with.decode_terms.terms().iter().copied().fold(0.0, f64::max));
    assert!(without.throughput_tokens_per_s < with.throughput_tokens_per_s);
}

#[test]
fn compression_shrinks_bytes_and_adds_lm_offload_terms() {
    let (hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    let (cw, cc) = (FLEXGEN_WEIGHTS, FLEXGEN_CACHE);
    // 4/8 + 8/64 = 0.625 bytes per value.
    assert_close!(cw.bytes_per_value(), 0.625);
    let base = Policy {
        weights: Placement::all_on(Tier::Cpu),
        cache: Placement::all_on(Tier::Cpu),
        activations: Placement::all_on(Tier::Gpu),
        shape: PolicyShape {
            gpu_batch_size: 4,
            num_gpu_batches: 1,
            cpu_attention: false,
            overlap: true,
            compress_weights: None,
            compress_cache: None,
        },
    };
    let comp =
        Policy { shape: PolicyShape { compress_weights: Some(cw), compress_cache: Some(cc), ..base.shape }, ..base };
    let e = estimate(&hw, &m, &wl, &comp).unwrap();
    // Decode ctog = (W_q + s̄·K_q·bls)/ctog + W_full/deq + s̄·K_full·bls/deq with
    // W_q = 12 582 912·0.625 = 7 864 320, K_q = 2·1024·0.625 = 1 280, s̄ = 132, bls = 4.
    let ctog = (7_864_320.0 + 132.0 * 1280.0 * 4.0) / 1e10 + 25_165_824.0 / 1e11 + 132.0 * 4096.0 * 4.0 / 1e11;
    assert_close!(e.decode_terms.cpu_to_gpu, ctog);
    // gtoc = new entries K_q·bls / gtoc + quantization K_full·bls / q.
    assert_close!(e.decode_terms.gpu_to_cpu, 1280.0 * 4.0 / 1e10 + 4096.0 * 4.0 / 1e11);
    // Prefill cache quantization (s+1)·K_full·bls / q is serial (LM-Offload Eq. 5).
    assert_close!(e.prefill_terms.serial, 129.0 * 4096.0 * 4.0 / 1e11);
    // One-time weight quantization on the CPU: l·W_full / cpu_q.
    assert_close!(e.init_time, 2.0 * 25_165_824.0 / 1e9);
    // CPU home shrinks accordingly: wc·W_q·l + cc·(s+n)·K_q·bls·l (+ staging (1−wg)·W_q).
    assert_close!(e.peak_memory.prefill.cpu, 2.0 * 7_864_320.0 + 136.0 * 1280.0 * 4.0 * 2.0 + 7_864_320.0);

    // With CPU attention the cache never crosses PCIe: cache compression changes nothing.
    let cpu_att = Policy { shape: PolicyShape { cpu_attention: true, ..base.shape }, ..base };
    let a = estimate(&hw, &m, &wl, &cpu_att).unwrap();
    let b =
        estimate(&hw, &m, &wl, &Policy { shape: PolicyShape { compress_cache: Some(cc), ..cpu_att.shape }, ..cpu_att })
            .unwrap();
    assert_eq!(a, b);
}

#[test]
fn gpu_roofline_makes_small_decode_batches_weight_bound() {
    let (mut hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    hw.gpu_memory_bandwidth = Some(1e11);
    let e = estimate(&hw, &m, &wl, &Policy::all_on_gpu(1)).unwrap();
    // Decode matmuls read W = 25 165 824 bytes at 1e11 B/s (2.5e-4 s) instead of
    // 25 165 824 FLOPs at 1e13 (2.5e-6 s); attention reads (s+n/2)·K = 132·4096 bytes.
    let att = (4.0 * 132.0 * 1024.0 / 1e12_f64).max(132.0 * 4096.0 / 1e11);
    assert_close!(e.decode_terms.compute, 25_165_824.0 / 1e11 + att);
}

#[test]
fn invalid_inputs_are_errors_not_panics() {
    let (hw, m, wl) = (hand_hw(), hand_model(), hand_wl());
    let mut p = Policy::all_on_gpu(4);
    p.weights = Placement { gpu: 0.5, cpu: 0.4, disk: 0.0 };
    assert!(matches!(estimate(&hw, &m, &wl, &p), Err(PolicyError::InvalidPolicy(_))));
    p.weights = Placement { gpu: 1.5, cpu: -0.5, disk: 0.0 };
    assert!(matches!(estimate(&hw, &m, &wl, &p), Err(PolicyError::InvalidPolicy(_))));
    p.weights = Placement { gpu: f64::NAN, cpu: 0.0, disk: 1.0 };
    assert!(matches!(estimate(&hw, &m, &wl, &p), Err(PolicyError::InvalidPolicy(_))));
    assert!(estimate(&hw, &m, &wl, &Policy::all_on_gpu(0)).is_err());
    let mut bad_c = Policy::all_on_gpu(1);
    bad_c.shape.compress_weights = Some(FLEXGEN_CACHE);
    assert!(matches!(estimate(&hw, &m, &wl, &bad_c), Err(PolicyError::InvalidPolicy(e)) if e.contains("axis 1")));
    assert!(estimate(&hw, &m, &OffloadWorkload::new(128, 0), &Policy::all_on_gpu(1)).is_err());
    assert!(estimate(&hw, &m, &OffloadWorkload::new(0, 8), &Policy::all_on_gpu(1)).is_err());
    let mut bad_m = m.clone();
    bad_m.num_kv_heads = 5;
    assert!(matches!(estimate(&hw, &bad_m, &wl, &Policy::all_on_gpu(1)), Err(PolicyError::InvalidModel(_))));
    let mut bad_hw = hw.clone();
    bad_hw.cpu_to_gpu_bandwidth = 0.0;
    assert!(matches!(estimate(&bad_hw, &m, &wl, &Policy::all_on_gpu(1)), Err(PolicyError::Profile(_))));
    let empty = SearchSpace { gpu_batch_sizes: vec![], ..SearchSpace::default() };
    assert!(matches!(search(&hw, &m, &wl, &empty), Err(PolicyError::InvalidSearchSpace(_))));
}

// ------------------------------------------------------------------ search

/// Small space for the invariant sweeps.
fn small_space() -> SearchSpace {
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

// ------------------------------------------------------------------ serde / files

#[test]
fn profile_json_round_trip_and_clear_errors() {
    let dir = std::env::temp_dir().join(format!("burn-offload-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t4.json");
    let hw = HardwareProfile::t4_like();
    hw.save_json(&path).unwrap();
    assert_eq!(HardwareProfile::load_json(&path).unwrap(), hw);

    let missing = HardwareProfile::load_json(dir.join("nope.json")).unwrap_err();
    assert!(matches!(missing, ProfileError::Io { .. }), "{missing}");
    assert!(missing.to_string().contains("nope.json"));

    std::fs::write(&path, "{ \"gpu_memory_bytes\": 1 }").unwrap();
    let parse = HardwareProfile::load_json(&path).unwrap_err();
    assert!(matches!(parse, ProfileError::Parse { .. }), "{parse}");
    assert!(parse.to_string().contains("missing field"), "{parse}");

    let mut v: serde_json::Value = serde_json::from_str(&hw.to_json_string().unwrap()).unwrap();
    v["pcie_speed"] = serde_json::json!(3);
    std::fs::write(&path, v.to_string()).unwrap();
    let unknown = HardwareProfile::load_json(&path).unwrap_err();
    assert!(unknown.to_string().contains("unknown field"), "{unknown}");

    let bad = HardwareProfile { disk_to_cpu_bandwidth: -1.0, ..hw };
    let err = HardwareProfile::from_json_str(&serde_json::to_string(&bad).unwrap()).unwrap_err();
    assert!(matches!(err, ProfileError::Invalid { field: "disk_to_cpu_bandwidth", .. }), "{err}");
    assert!(bad.save_json(&path).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn policy_and_results_serialize() {
    let r =
        search(&HardwareProfile::t4_like(), &ModelShape::opt_6_7b(), &OffloadWorkload::new(256, 32), &small_space())
            .unwrap();
    let json = serde_json::to_string(&r).unwrap();
    let back: SearchResult = serde_json::from_str(&json).unwrap();
    // serde_json's default float parsing may differ in the last bit.
    assert_eq!(back.policy.shape, r.policy.shape);
    for (a, b) in back.policy.placement_vector().iter().zip(r.policy.placement_vector()) {
        assert_close!(*a, b, 1e-15);
    }
    assert_eq!(back.binding.tight_memory, r.binding.tight_memory);
    let p: Policy =
        serde_json::from_str(&serde_json::to_string(&Policy::deepspeed_like(4, Tier::Cpu)).unwrap()).unwrap();
    assert_eq!(p, Policy::deepspeed_like(4, Tier::Cpu));
    let m: ModelShape = serde_json::from_str(&serde_json::to_string(&ModelShape::llama3_8b()).unwrap()).unwrap();
    assert_eq!(m, ModelShape::llama3_8b());
}

// ------------------------------------------------------------------ threads

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

/// Compression settings serialize as `{"bits", "group_size"}` (the shape of policy files before
/// they held `QuantSpec`s), come back along their kind's axis, and are checked when read.
#[test]
fn compression_serializes_as_bits_and_group_size() {
    let mut policy = Policy::all_on_gpu(1);
    (policy.shape.compress_weights, policy.shape.compress_cache) = (Some(FLEXGEN_WEIGHTS), Some(FLEXGEN_CACHE));
    let shape = policy.shape;
    let json = serde_json::to_string(&policy).unwrap();
    assert!(
        json.ends_with(r#""compress_weights":{"bits":4,"group_size":64},"compress_cache":{"bits":4,"group_size":64}}"#),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), policy);
    assert_eq!(serde_json::from_str::<PolicyShape>(&serde_json::to_string(&shape).unwrap()).unwrap(), shape);
    let uncompressed = serde_json::to_string(&Policy::all_on_gpu(1)).unwrap();
    assert!(uncompressed.ends_with(r#""compress_weights":null,"compress_cache":null}"#), "{uncompressed}");
    let space = SearchSpace::default().with_compression();
    let json = serde_json::to_string(&space).unwrap();
    assert!(json.contains(r#""cache_compression":[null,{"bits":4,"group_size":64}]"#), "{json}");
    assert_eq!(serde_json::from_str::<SearchSpace>(&json).unwrap(), space);

    let three_bits = json.replacen(r#"{"bits":4"#, r#"{"bits":3"#, 1);
    let err = serde_json::from_str::<SearchSpace>(&three_bits).unwrap_err().to_string();
    assert!(err.contains("3-bit"), "{err}");
    let bad_group = serde_json::to_string(&policy).unwrap().replacen(r#""group_size":64"#, r#""group_size":6"#, 1);
    assert!(serde_json::from_str::<Policy>(&bad_group).unwrap_err().to_string().contains("group size 6"));
}
