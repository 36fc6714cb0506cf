//! Half precision (`--dtype f16|bf16`) against HF transformers run in the same dtype
//! (`reference.{f16,bf16}.*`, written by `scripts/make_fixtures.py --half`), through the plain,
//! paged and offloading engines.
//!
//! Tolerance: HF and burn-llm round at different points (HF rounds `q·kᵀ` and the softmax
//! output to the dtype, fuses other steps differently, and its CPU matmuls accumulate in another
//! order), so the logits of two correct half-precision implementations differ by a few roundings
//! of the largest values the network carries. We allow [`TOLERANCE_ULPS`] times the dtype's
//! epsilon (`2^-10` for f16, `2^-7` for bf16) times the largest |logit| of the fixture (≈ 7–9):
//! ≈ 0.09 for f16 and ≈ 0.7 for bf16 at a scale of 9. Measured: at most 5.1 of those units, on
//! Flex and wgpu, about what HF's own half run differs from its f32 run by. A missing cast (f16
//! scores overflowing the mask, a norm in f16) or a wrong weight is off by the logit scale itself.
//!
//! Greedy: where HF's half-precision greedy continuation equals its f32 one (its decisions
//! survive half rounding), ours must equal it token by token; a different token is allowed only at
//! a step whose HF top-1/top-2 margin is within [`TIE_ULPS`] epsilons of the logit scale (a near
//! tie that either rounding may break; everything after follows from it).

use burn::tensor::{DType, Device};
use burn_llm::Generator;
use burn_llm::models::weights::Checkpoint;
use burn_llm::models::{ContiguousKvCache, Precision, PretrainedFiles, Prompt, SamplingParams};
use burn_llm::offload::OffloadEngine;
use burn_llm::offload::policy::{Placement, Policy, PolicyShape};
use burn_llm::paged::cache::PagedKvCache;
use burn_llm::paged::{LlmEngine, PreemptionMode};

use crate::common::{FIXTURES, devices, fixture, max_abs_diff, reference_files};

/// Multiples of the dtype's epsilon times the logit scale that two half-precision
/// implementations may differ by (see the module docs).
const TOLERANCE_ULPS: f32 = 10.0;

/// Multiples of the dtype's epsilon times the logit scale under which a top-1/top-2 margin is a
/// near tie (a difference of two nearby logits carries much less error than the worst logit).
const TIE_ULPS: f32 = 4.0;

const HALF: [Precision; 2] = [Precision::F16, Precision::Bf16];

/// HF's outputs for one prompt in half precision.
struct HalfPrompt {
    input_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f32>,
    /// Whether HF's greedy ids in this dtype equal its f32 ones.
    same_as_f32: bool,
    /// `[len, vocab]` row-major, HF's half logits widened to f32.
    logits: Vec<f32>,
}

struct HalfReference {
    max_abs_logit: f32,
    prompts: Vec<HalfPrompt>,
}

fn half_reference(name: &str, precision: Precision) -> HalfReference {
    let tag = precision.name();
    let list =
        |v: &serde_json::Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let (json, prompts) = reference_files(name, &format!("reference.{tag}"), |p, logits| HalfPrompt {
        input_ids: list(&p["input_ids"]).into_iter().map(|v| v as u32).collect(),
        greedy_ids: list(&p["greedy_ids"]).into_iter().map(|v| v as u32).collect(),
        greedy_margins: list(&p["greedy_margins"]).into_iter().map(|v| v as f32).collect(),
        same_as_f32: p["same_as_f32"].as_bool().unwrap(),
        logits,
    });
    assert_eq!(json["dtype"], tag);
    HalfReference { max_abs_logit: json["max_abs_logit"].as_f64().unwrap() as f32, prompts }
}

/// The logit tolerance for `precision` on a fixture whose logits reach `scale`.
fn tolerance(precision: Precision, scale: f32) -> f32 {
    TOLERANCE_ULPS * precision.epsilon() * scale.max(1.0)
}

/// The margin under which HF's greedy choice is a near tie.
fn tie(precision: Precision, scale: f32) -> f32 {
    TIE_ULPS * precision.epsilon() * scale.max(1.0)
}

/// The half precisions `device` computes in; Flex must do both, so the tests cannot skip
/// everywhere.
fn precisions(device_name: &str, device: &Device) -> Vec<Precision> {
    let supported: Vec<Precision> = HALF.into_iter().filter(|p| device.supports_dtype(p.dtype())).collect();
    if device_name == "flex" {
        assert_eq!(supported, HALF, "Flex computes in f16 and bf16");
    }
    for p in HALF.iter().filter(|p| !supported.contains(p)) {
        eprintln!("{device_name}: no {p} support on this adapter, skipped");
    }
    supported
}

fn load(name: &str, precision: Precision, device: &Device) -> burn_llm::models::Pretrained {
    PretrainedFiles::open(&fixture(name)).unwrap().with_precision(precision).load(device).unwrap()
}

/// Checks `got` against HF's greedy ids (when HF's equal its f32 ones) token by token; a
/// different token must sit on a near tie (HF margin ≤ `tie`), and ends the comparison. Returns
/// how many tokens were equal (0 when HF's half greedy is not robust and nothing is compared).
fn assert_greedy(got: &[u32], reference: &HalfPrompt, tie: f32, what: &str) -> usize {
    assert_eq!(got.len(), reference.greedy_ids.len(), "{what}: length");
    if !reference.same_as_f32 {
        return 0;
    }
    for (t, (g, want)) in got.iter().zip(&reference.greedy_ids).enumerate() {
        if g != want {
            let margin = reference.greedy_margins[t];
            assert!(margin <= tie, "{what}: token {t} is {g}, HF's is {want} with a margin of {margin} (tie {tie})");
            eprintln!("{what}: near tie at token {t} (HF margin {margin}): {g} instead of {want}");
            return t;
        }
    }
    got.len()
}

/// Weights, cache and activations in the dtype; logits in f32 within the tolerance of HF's.
#[test]
fn half_logits_match_hf_in_the_same_dtype() {
    for (device_name, device) in devices() {
        for precision in precisions(device_name, &device) {
            for name in FIXTURES {
                let reference = half_reference(name, precision);
                let tol = tolerance(precision, reference.max_abs_logit);
                let pretrained = load(name, precision, &device);
                let model = &pretrained.model;
                assert_eq!(model.precision(), precision);
                assert_eq!(model.kv_layout().dtype, precision);
                let weight = match &model.layers[0].attn.o {
                    burn_llm::models::layers::projection::Projection::Dense(l) => l.weight.val(),
                    other => panic!("dense fixture weight expected, got {other:?}"),
                };
                assert_eq!(weight.dtype(), precision.dtype(), "{name}: weights stored in {precision}");
                let mut worst = 0f32;
                for (i, prompt) in reference.prompts.iter().enumerate() {
                    let ids = &prompt.input_ids;
                    let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
                    let step = cache.begin_step(&[ids]).unwrap();
                    let logits = model.forward_all_logits(&step, &mut cache).unwrap();
                    assert_eq!(logits.dtype(), DType::F32, "logits come back in f32");
                    let logits = logits.into_data().try_into_vec_as::<f32>().unwrap();
                    let diff = max_abs_diff(&logits, &prompt.logits);
                    assert!(diff.is_finite() && diff <= tol, "{name} {precision} on {device_name}, prompt {i}: {diff}");
                    worst = worst.max(diff);
                }
                eprintln!("{name} {precision} on {device_name}: max |Δlogit| {worst:.3e} (tolerance {tol:.3e})");
            }
        }
    }
}

/// Plain generation in half precision gives HF's half-precision greedy tokens.
#[test]
fn half_greedy_matches_hf_while_margins_allow() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) };
    for (device_name, device) in devices() {
        for precision in precisions(device_name, &device) {
            for name in FIXTURES {
                let reference = half_reference(name, precision);
                let tie = tie(precision, reference.max_abs_logit);
                let generator = Generator::from(load(name, precision, &device));
                let (mut compared, mut total) = (0, 0);
                for (i, prompt) in reference.prompts.iter().enumerate() {
                    let out = generator.generate(&[Prompt::Ids(prompt.input_ids.clone())], &params).unwrap();
                    let what = format!("{name} {precision} on {device_name}, prompt {i}");
                    compared += assert_greedy(&out.requests[0].generated_ids, prompt, tie, &what);
                    total += prompt.greedy_ids.len();
                }
                eprintln!("{name} {precision} on {device_name}: greedy equal to HF's on {compared}/{total} tokens");
                assert!(compared * 2 >= total, "{name} {precision} on {device_name}: {compared}/{total} tokens equal");
            }
        }
    }
}

/// The paged engine (pool and host swap space in the dtype, PagedAttention reading it) under
/// swap preemption, and the offloading engine with weights, KV cache and activations on the host
/// and disk tiers in the dtype, both give HF's half-precision greedy tokens.
#[test]
fn paged_and_offload_engines_run_in_half_precision() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) };
    let base = Policy::all_on_gpu(2);
    let every_tier = Policy {
        weights: Placement::from_array([1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
        cache: Placement::from_array([0.25, 0.25, 0.5]),
        activations: Placement::from_array([0.0, 0.5, 0.5]),
        shape: PolicyShape { num_gpu_batches: 2, cpu_attention: true, ..base.shape },
    };
    for (device_name, device) in devices() {
        for precision in precisions(device_name, &device) {
            for name in ["opt", "llama"] {
                let reference = half_reference(name, precision);
                let tie = tie(precision, reference.max_abs_logit);
                let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
                let check = |engine: &str, outputs: Vec<Vec<u32>>| {
                    for (i, (got, prompt)) in outputs.iter().zip(&reference.prompts).enumerate() {
                        let what = format!("{name} {precision} on {device_name}, {engine} engine, prompt {i}");
                        let equal = assert_greedy(got, prompt, tie, &what);
                        assert!(equal > 0 || !prompt.same_as_f32, "{what}: differs from the first token");
                    }
                };

                let pretrained = load(name, precision, &device);
                let layout = pretrained.model.kv_layout();
                let f32_layout = burn_llm::models::KvLayout { dtype: Precision::F32, ..layout };
                assert_eq!(
                    2 * PagedKvCache::block_bytes(&layout, 4, None),
                    PagedKvCache::block_bytes(&f32_layout, 4, None)
                );
                // A pool that holds the longest sequence and little more: the others swap out.
                let hf: Vec<Vec<u32>> = reference.prompts.iter().map(|p| p.greedy_ids.clone()).collect();
                let [_, (label, config), _] = crate::paged::pools(&prompts, &hf);
                assert_eq!(config.preemption, PreemptionMode::Swap);
                let mut paged = LlmEngine::new(pretrained, config).unwrap();
                let out = paged.generate(&prompts, &params).unwrap();
                assert!(paged.stats().swaps > 0, "{name}: the {label} pool was meant to swap");
                check("paged", out.requests.iter().map(|r| r.generated_ids.clone()).collect());

                let mut disk_bytes = Vec::new();
                for p in [Precision::F32, precision] {
                    let files = PretrainedFiles::open(&fixture(name)).unwrap().with_precision(p);
                    let tag = format!("half-{name}-{device_name}-{precision}-{p}");
                    let mut cfg = crate::offload::config(every_tier, &tag, 1 << 30);
                    cfg.workload = burn_llm::offload::policy::OffloadWorkload::new(64, 16);
                    let ckpt = Checkpoint::open(&fixture(name)).unwrap();
                    let engine =
                        OffloadEngine::new(files.spec, &ckpt, Some(files.tokenizer), vec![], cfg, &device).unwrap();
                    let (out, report) = engine.generate(&prompts, &params).unwrap();
                    disk_bytes.push(report.memory.disk_bytes);
                    if p == precision {
                        check("offload", out.requests.into_iter().map(|r| r.generated_ids).collect());
                    }
                }
                // Weights and KV on disk in 16 bits (norms stay f32): well under the f32 bytes.
                assert!(
                    (disk_bytes[1] as f64) < 0.6 * disk_bytes[0] as f64,
                    "{name} {precision}: disk tier {disk_bytes:?} bytes (f32, {precision})"
                );
            }
        }
    }
}

/// Quantized weights in half precision: the quantization kernels dequantize into the model's
/// dtype, and the logits stay as close to the dense half model's as the f32 ones do to f32.
#[test]
fn quantized_weights_dequantize_into_half() {
    let spec =
        burn_llm::models::QuantSpec::new(8, 16, burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS).unwrap();
    for (device_name, device) in devices() {
        for precision in precisions(device_name, &device) {
            let name = "llama";
            let reference = half_reference(name, precision);
            let ids = &reference.prompts[0].input_ids;
            let logits = |model: &burn_llm::models::CausalLm| {
                let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
                let step = cache.begin_step(&[ids]).unwrap();
                model.forward_all_logits(&step, &mut cache).unwrap().into_data().try_into_vec_as::<f32>().unwrap()
            };
            let dense = load(name, precision, &device).model;
            let quantized = load(name, precision, &device).model.quantize_weights(spec).unwrap();
            match &quantized.layers[0].mlp.up {
                burn_llm::models::layers::projection::Projection::Quantized(q) => {
                    assert_eq!(q.scale.val().dtype(), precision.dtype());
                    assert_eq!(q.dequantized_weight().dtype(), precision.dtype(), "dequantized into {precision}");
                }
                other => panic!("quantized projection expected, got {other:?}"),
            }
            // One decode-sized row takes the fused kernel, the prompt the dequantize-then-matmul path.
            let diff = max_abs_diff(&logits(&quantized), &logits(&dense));
            let f32_diff = max_abs_diff(
                &logits(&load(name, Precision::F32, &device).model.quantize_weights(spec).unwrap()),
                &logits(&load(name, Precision::F32, &device).model),
            );
            let tol = f32_diff + tolerance(precision, reference.max_abs_logit);
            assert!(diff <= tol, "{precision} on {device_name}: quantized vs dense {diff}, f32 {f32_diff}");
        }
    }
}

/// `--dtype` on every engine: f16 runs give HF's f16 greedy tokens for a decisive prompt; an
/// unknown name is a parse error listing the choices; a dtype the device cannot compute in is an
/// error naming it (bf16 on a wgpu adapter without it), and without `--dtype` such a GPU falls
/// back to f32 with a note.
#[test]
fn dtype_flag_selects_the_precision_of_every_engine() {
    use burn_llm::cli::{EngineKind, ExampleDefaults, GenerateArgs};
    use clap::Parser;
    let defaults =
        ExampleDefaults { name: "test_generate", model: "unused", engine: EngineKind::Plain, fallback: None };
    let model = fixture("gpt2");
    let reference = half_reference("gpt2", Precision::F16);
    let prompt = &reference.prompts[0];
    assert!(prompt.same_as_f32 && prompt.greedy_margins.iter().all(|&m| m > tie(Precision::F16, 9.0)));
    let ids = prompt.input_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let run = |extra: &[&str]| {
        let mut argv = vec!["test_generate", "--model", model.to_str().unwrap(), "--prompt-ids", &ids];
        argv.extend_from_slice(&["--max-new-tokens", "16", "--ignore-eos", "--json"]);
        argv.extend_from_slice(extra);
        let (mut out, mut log) = (Vec::new(), Vec::new());
        burn_llm::cli::run_with(&GenerateArgs::try_parse_from(argv).unwrap(), defaults, &mut out, &mut log)
            .map(|()| String::from_utf8(out).unwrap())
            .map_err(|e| e.to_string())
    };
    let generated = |json: &str| -> Vec<u32> {
        let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        serde_json::from_value(value["requests"][0]["generated_ids"].clone()).unwrap()
    };
    for engine in ["plain", "paged", "offload"] {
        let json = run(&["--device", "flex", "--dtype", "f16", "--engine", engine]).unwrap();
        assert_eq!(generated(&json), prompt.greedy_ids, "{engine} engine, --dtype f16");
    }
    let err = GenerateArgs::try_parse_from(["x", "--dtype", "f8"]).unwrap_err().to_string();
    assert!(err.contains("f32, f16, bf16"), "{err}");
    let err = run(&["--dtype", "f16", "--devices", "flex,flex"]).unwrap_err();
    assert!(err.contains("--dtype"), "{err}");
    if let Some((_, wgpu)) = devices().into_iter().find(|(name, _)| *name == "wgpu")
        && !wgpu.supports_dtype(DType::BF16)
    {
        let err = run(&["--device", "wgpu", "--dtype", "bf16"]).unwrap_err();
        assert!(err.contains("cannot compute in bf16"), "{err}");
    }
}
