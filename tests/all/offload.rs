//! The offloading engine (`burn-offload`): greedy outputs identical to plain generation for every
//! exact policy, on every device; budgets enforced; a corrupted disk tier detected.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::Generator;
use burn_llm::models::weights::Checkpoint;
use burn_llm::models::{DecoderSpec, Pretrained, Prompt, SamplingParams};
use burn_llm::offload::policy::{HardwareProfile, OffloadWorkload, Placement, Policy, PolicyShape};
use burn_llm::offload::{OffloadConfig, OffloadEngine, OffloadError, PolicyChoice};

use crate::common::{FIXTURES, devices, fixture, reference};

/// The offload directory of test `tag`, under the system temp dir.
fn offload_dir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("burn-llm-offload-test-{}-{tag}", std::process::id()))
}

pub fn config(policy: Policy, tag: &str, gpu_mem: u64) -> OffloadConfig {
    let dir = offload_dir(tag);
    let _ = std::fs::remove_dir_all(&dir);
    OffloadConfig {
        gpu_mem,
        cpu_mem: 1 << 30,
        offload_dir: dir,
        policy: PolicyChoice::Fixed(policy),
        hardware: HardwareProfile::t4_like(),
        workload: OffloadWorkload::new(64, 12),
        host: Device::flex(),
        attention_sparsity: None,
        threads: None,
    }
}

pub fn engine(name: &str, device: &Device, policy: Policy, tag: &str) -> OffloadEngine {
    let dir = fixture(name);
    let pretrained = Pretrained::load(&dir, &Device::flex()).unwrap();
    let spec = DecoderSpec::from_dir(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    OffloadEngine::new(
        spec,
        &ckpt,
        Some(pretrained.tokenizer),
        pretrained.eos_token_ids,
        config(policy, tag, 1 << 30),
        device,
    )
    .unwrap()
}

/// The exact policies of the issue: everything on the device; weights on disk; weights and KV on
/// the host with CPU attention; KV cache on disk; activations parked on the host or disk; every
/// tier at once; each with overlap on and off; two GPU batches of two per block, or three of one.
fn exact_policies() -> Vec<(&'static str, Policy)> {
    let device = Policy::all_on_gpu(2);
    let base = Policy { shape: PolicyShape { num_gpu_batches: 2, ..device.shape }, ..device };
    let disk = Policy { weights: Placement::from_array([0.0, 0.0, 1.0]), ..base };
    let cpu_attention = |p: Policy, on: bool| Policy { shape: PolicyShape { cpu_attention: on, ..p.shape }, ..p };
    let host = cpu_attention(
        Policy {
            weights: Placement::from_array([0.0, 1.0, 0.0]),
            cache: Placement::from_array([0.0, 1.0, 0.0]),
            ..base
        },
        true,
    );
    let host_gpu_attention = cpu_attention(host, false);
    let cache_disk = cpu_attention(Policy { cache: Placement::from_array([0.0, 0.0, 1.0]), ..base }, true);
    let cache_disk_gpu_attention = cpu_attention(cache_disk, false);
    let activations_host = Policy { activations: Placement::from_array([0.0, 1.0, 0.0]), ..base };
    let three = Policy { shape: PolicyShape { gpu_batch_size: 1, num_gpu_batches: 3, ..base.shape }, ..base };
    let everywhere = Policy {
        weights: Placement::from_array([1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
        cache: Placement::from_array([0.25, 0.25, 0.5]),
        activations: Placement::from_array([1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
        ..cpu_attention(three, true)
    };
    let activations_disk = Policy { activations: Placement::from_array([0.0, 0.0, 1.0]), ..three };
    let mut out = Vec::new();
    for (name, p) in [
        ("device", base),
        ("disk", disk),
        ("host+cpu-attn", host),
        ("host+gpu-attn", host_gpu_attention),
        ("cache-disk+cpu-attn", cache_disk),
        ("cache-disk+gpu-attn", cache_disk_gpu_attention),
        ("activations-host", activations_host),
        ("activations-disk", activations_disk),
        ("every-tier", everywhere),
    ] {
        out.push((name, p));
        out.push((name, Policy { shape: PolicyShape { overlap: false, ..p.shape }, ..p }));
    }
    out
}

#[test]
fn greedy_equals_plain_generation_for_exact_policies() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
            let plain = Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
            let expected: Vec<Vec<u32>> =
                plain.generate(&prompts, &params).unwrap().requests.into_iter().map(|r| r.generated_ids).collect();
            for (i, (label, policy)) in exact_policies().into_iter().enumerate() {
                let e = engine(name, &device, policy, &format!("{name}-{device_name}-{i}"));
                let (out, report) = e.generate(&prompts, &params).unwrap();
                let got: Vec<Vec<u32>> = out.requests.into_iter().map(|r| r.generated_ids).collect();
                assert_eq!(got, expected, "{name} on {device_name}, policy {label} (overlap {})", policy.shape.overlap);
                assert_eq!(
                    report.effective_batch,
                    (policy.shape.gpu_batch_size * policy.shape.num_gpu_batches) as usize
                );
                if label.contains("disk") || label == "every-tier" {
                    assert!(report.memory.disk_bytes > 0, "{label}: nothing was written to the offload directory");
                }
                if label == "every-tier" {
                    use burn_llm::offload::policy::Tier;
                    let tensors = e.spec().num_layers * 3;
                    let on_disk = tensors - (tensors as f64 * 0.5).round() as usize;
                    assert_eq!(e.cache_tiers().iter().filter(|t| **t == Tier::Disk).count(), on_disk);
                    assert_eq!(e.activation_tiers(), &[Tier::Gpu, Tier::Cpu, Tier::Disk]);
                }
            }
        }
    }
}

/// A device budget smaller than one layer's working set is an error that says how much is
/// needed; the host budget is enforced too.
#[test]
fn budgets_are_enforced() {
    let dir = fixture("llama");
    let pretrained = Pretrained::load(&dir, &Device::flex()).unwrap();
    let spec = DecoderSpec::from_dir(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let all_gpu = Policy::all_on_gpu(2);
    let err = OffloadEngine::new(spec.clone(), &ckpt, None, vec![], config(all_gpu, "tiny", 4096), &Device::flex())
        .unwrap_err();
    assert!(matches!(err, OffloadError::Store(_)), "{err}");
    assert!(err.to_string().contains("GPU"), "{err}");

    let host = Policy { weights: Placement::from_array([0.0, 1.0, 0.0]), ..all_gpu };
    let mut cfg = config(host, "tiny-host", 1 << 30);
    cfg.cpu_mem = 1024;
    let err = OffloadEngine::new(spec, &ckpt, Some(pretrained.tokenizer), vec![], cfg, &Device::flex()).unwrap_err();
    assert!(err.to_string().contains("CPU"), "{err}");
}

/// A weight file of the disk tier that is corrupted after placement is detected when the layer is
/// read, as an error.
#[test]
fn corrupted_disk_tier_is_an_error() {
    let name = "gpt2";
    let disk = Policy { weights: Placement::from_array([0.0, 0.0, 1.0]), ..Policy::all_on_gpu(1) };
    let tag = "corrupt";
    let e = engine(name, &Device::flex(), disk, tag);
    let dir = offload_dir(tag);
    let mut flipped = 0;
    for entry in walk(&dir) {
        let mut bytes = std::fs::read(&entry).unwrap();
        if bytes.len() > 64 {
            let at = bytes.len() - 5;
            bytes[at] ^= 0x40;
            std::fs::write(&entry, bytes).unwrap();
            flipped += 1;
        }
    }
    assert!(flipped > 0);
    let err = e.generate(&[Prompt::Ids(vec![5, 6, 7])], &SamplingParams::greedy(2)).unwrap_err();
    assert!(err.to_string().to_lowercase().contains("checksum") || err.to_string().contains("corrupt"), "{err}");
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Compressed policies run exactly the quantization of the kernels crate: 4-bit weights (and a
/// 4-bit KV cache with attention on the device) give the same greedy tokens as plain generation
/// with the same layers quantized and the same cache quantization. The cache is stored in the
/// groups the policy (and so the cost model) names: smaller groups take more bytes, and groups
/// that do not tile a head are an error, not silently replaced.
#[test]
fn compressed_policies_equal_quantized_plain_generation() {
    use burn_llm::kernels::QuantSpec;
    use burn_llm::models::cache::KV_QUANT_AXIS;
    use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;

    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let weights = QuantSpec::new(4, 32, WEIGHT_QUANT_AXIS).unwrap();
    // The fixtures' heads hold 16 values.
    let cache = |group| QuantSpec::new(4, group, KV_QUANT_AXIS).unwrap();
    for name in FIXTURES {
        let reference = reference(name);
        let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
        let mut pretrained = Pretrained::load(&fixture(name), &Device::flex()).unwrap();
        let layers = std::mem::take(&mut pretrained.model.layers);
        pretrained.model.layers = layers.into_iter().map(|l| l.quantized(weights).unwrap()).collect();
        let plain = Generator::from(pretrained).with_kv_quantization(cache(16)).unwrap();
        let expected: Vec<Vec<u32>> =
            plain.generate(&prompts, &params).unwrap().requests.into_iter().map(|r| r.generated_ids).collect();
        let device = Policy::all_on_gpu(2);
        let policy = Policy {
            weights: Placement::from_array([0.5, 0.5, 0.0]),
            shape: PolicyShape {
                num_gpu_batches: 2,
                compress_weights: Some(weights),
                compress_cache: Some(cache(16)),
                ..device.shape
            },
            ..device
        };
        // Compressed weights and cache on disk too: the disk tier stores the 4-bit codes.
        let on_disk = Policy {
            weights: Placement::from_array([0.0, 0.5, 0.5]),
            cache: Placement::from_array([0.0, 0.5, 0.5]),
            ..policy
        };
        for (label, p) in [
            ("device+host", policy),
            ("host+disk", on_disk),
            ("host+disk, no overlap", Policy { shape: PolicyShape { overlap: false, ..on_disk.shape }, ..on_disk }),
        ] {
            let e = engine(name, &Device::flex(), p, &format!("compressed-{name}-{}", label.len()));
            let (out, _) = e.generate(&prompts, &params).unwrap();
            let got: Vec<Vec<u32>> = out.requests.into_iter().map(|r| r.generated_ids).collect();
            assert_eq!(got, expected, "{name}, {label}");
        }
        // Weights alone on disk: the codes take well under half the bytes of f32 weights.
        let weights_on_disk = |compress| Policy {
            weights: Placement::from_array([0.0, 0.0, 1.0]),
            shape: PolicyShape { compress_weights: compress, compress_cache: None, ..policy.shape },
            ..policy
        };
        let bytes = |p: Policy, tag: &str| {
            engine(name, &Device::flex(), p, tag).generate(&prompts, &params).unwrap().1.memory.disk_bytes
        };
        let (packed, dense) = (bytes(weights_on_disk(Some(weights)), "packed"), bytes(weights_on_disk(None), "dense"));
        assert!(packed * 5 < dense * 2, "{name}: {packed} bytes of codes vs {dense} of f32");
        // The cache alone on disk, in the policy's groups: 4-bit codes with a scale and a minimum
        // per 8 values take 1.5 bytes a value, per 16 values 1 byte.
        let cache_on_disk = |group| Policy {
            cache: Placement::from_array([0.0, 0.0, 1.0]),
            shape: PolicyShape { compress_weights: None, compress_cache: Some(cache(group)), ..policy.shape },
            ..policy
        };
        let (g8, g16) = (bytes(cache_on_disk(8), "cache-g8"), bytes(cache_on_disk(16), "cache-g16"));
        assert!(g8 > g16, "{name}: groups of 8 take {g8} bytes on disk, of 16 {g16}");
        let untiled = engine(name, &Device::flex(), cache_on_disk(32), "cache-g32")
            .generate(&prompts, &params)
            .unwrap_err()
            .to_string();
        assert!(untiled.contains("group size 32"), "{untiled}");
    }
}

/// Top-K sparse attention: keeping every key is dense attention (same greedy tokens); keeping few
/// keys runs and changes the attention (the scores it drops are gone), and a bad fraction is an
/// error.
#[test]
fn sparse_attention_keeps_the_top_keys() {
    use burn::tensor::{Tensor, TensorData};
    use burn_llm::models::cache::attention;
    use burn_llm::offload::cache::sparse::sparse_attention;

    let device = Device::flex();
    // One query, four keys with scores 4, 1, 3, 2 (q = 1, k = score); values one-hot.
    let q = Tensor::<4>::from_data(TensorData::new(vec![1f32], [1, 1, 1, 1]), &device);
    let k = Tensor::<4>::from_data(TensorData::new(vec![4f32, 1.0, 3.0, 2.0], [1, 1, 4, 1]), &device);
    let v = Tensor::<4>::from_data(TensorData::new(vec![1f32, 10.0, 100.0, 1000.0], [1, 1, 4, 1]), &device);
    let bias = Tensor::<4>::zeros([1, 1, 1, 4], &device);
    let dense =
        attention(q.clone(), k.clone(), v.clone(), bias.clone(), 1.0).into_data().try_into_vec_as::<f32>().unwrap()[0];
    let all = sparse_attention(q.clone(), k.clone(), v.clone(), bias.clone(), 1.0, Some(4))
        .into_data()
        .try_into_vec_as::<f32>()
        .unwrap()[0];
    // Top-K of every key is dense attention (the dense path may run the fused Flex loop, which
    // rounds differently from Burn's ops).
    assert!((dense - all).abs() <= 1e-5 * dense.abs(), "{dense} vs {all}");
    let top2 = sparse_attention(q, k, v, bias, 1.0, Some(2)).into_data().try_into_vec_as::<f32>().unwrap()[0];
    let (e4, e3) = (4f32.exp(), 3f32.exp());
    let expected = (e4 * 1.0 + e3 * 100.0) / (e4 + e3);
    assert!((top2 - expected).abs() < 1e-3 * expected, "{top2} vs {expected}");

    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let prompts = [Prompt::Ids(reference("llama").prompts[2].input_ids.clone())];
    let dense_policy = Policy::all_on_gpu(1);
    let baseline = engine("llama", &device, dense_policy, "sparse-dense").generate(&prompts, &params).unwrap().0;
    let dir = fixture("llama");
    let spec = DecoderSpec::from_dir(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    for (fraction, tag) in [(1.0f32, "sparse-1"), (0.1, "sparse-0.1")] {
        let mut cfg = config(dense_policy, tag, 1 << 30);
        cfg.attention_sparsity = Some(fraction);
        let e = OffloadEngine::new(spec.clone(), &ckpt, None, vec![], cfg, &device).unwrap();
        let out = e.generate(&prompts, &params).unwrap().0;
        if fraction == 1.0 {
            assert_eq!(out.requests[0].generated_ids, baseline.requests[0].generated_ids);
        }
        assert_eq!(out.requests[0].generated_ids.len(), 6);
    }
    let mut cfg = config(dense_policy, "sparse-bad", 1 << 30);
    cfg.attention_sparsity = Some(0.0);
    let err = OffloadEngine::new(spec, &ckpt, None, vec![], cfg, &device).unwrap_err();
    assert!(err.to_string().contains("sparsity"), "{err}");
}

/// Thread control (LM-Offload Algorithm 3): the one-time profile gives a plan within the
/// machine's threads, and running compute and loads in the planned pools changes no token.
#[test]
fn thread_control_plans_and_keeps_outputs() {
    use burn_llm::offload::policy::choose_threads;
    use burn_llm::offload::profiler::profile_threads;

    let device = Device::flex();
    let dir = offload_dir("threads-profile");
    let profile = profile_threads(&device, &dir, 2, 64, 1 << 20).unwrap();
    let plan = choose_threads(&profile).unwrap();
    assert!(plan.intra_op_compute >= 1 && plan.intra_op_compute <= profile.max_threads);
    assert_eq!(plan.io_threads.len(), 1);

    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let reference = reference("opt");
    let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
    let device_only = Policy::all_on_gpu(2);
    let policy = Policy {
        weights: Placement::from_array([0.0, 0.5, 0.5]),
        shape: PolicyShape { num_gpu_batches: 2, ..device_only.shape },
        ..device_only
    };
    let plain = engine("opt", &device, policy, "threads-plain").generate(&prompts, &params).unwrap().0;
    let fixture_dir = fixture("opt");
    let spec = DecoderSpec::from_dir(&fixture_dir).unwrap();
    let ckpt = Checkpoint::open(&fixture_dir).unwrap();
    let mut cfg = config(policy, "threads-planned", 1 << 30);
    cfg.threads = Some(plan);
    let planned =
        OffloadEngine::new(spec, &ckpt, None, vec![], cfg, &device).unwrap().generate(&prompts, &params).unwrap().0;
    let ids = |o: &burn_llm::GenerationOutput| o.requests.iter().map(|r| r.generated_ids.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&planned), ids(&plain));
}

/// Weights offloaded to the host occupy the device one layer at a time without overlap, and two
/// (the running layer and the prefetched one) with it.
#[test]
fn device_holds_one_offloaded_layer_without_overlap_and_two_with() {
    use burn_llm::models::CausalLm;

    let name = "opt";
    let spec = DecoderSpec::from_dir(&fixture(name)).unwrap();
    let ckpt = Checkpoint::open(&fixture(name)).unwrap();
    let layer_bytes = CausalLm::load_layer(&spec, &ckpt, 0, &Device::flex()).unwrap().weight_bytes() as u64;
    let host = Policy { weights: Placement::from_array([0.0, 1.0, 0.0]), ..Policy::all_on_gpu(2) };
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(3) };
    let prompts = [Prompt::Ids(vec![5, 6, 7]), Prompt::Ids(vec![8, 9])];
    let peak = |overlap: bool| {
        let e = engine(
            name,
            &Device::flex(),
            Policy { shape: PolicyShape { overlap, ..host.shape }, ..host },
            &format!("peak-{overlap}"),
        );
        e.generate(&prompts, &params).unwrap().1.memory.gpu_peak_bytes
    };
    let (sequential, overlapped) = (peak(false), peak(true));
    assert_eq!(overlapped - sequential, layer_bytes, "peaks {sequential} and {overlapped}, layer {layer_bytes}");
}
