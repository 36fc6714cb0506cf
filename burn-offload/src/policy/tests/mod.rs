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

mod files;
mod search;
mod threads;
