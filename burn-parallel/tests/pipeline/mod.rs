//! Pipeline parallelism against single-device execution: greedy tokens identical and logits
//! within 1e-4 for the OPT, LLaMA (GQA) and GPT-2 fixtures at PP=2 (their checkpoints have two
//! layers) and PP=3 (the same architectures, four layers of seeded random weights), built from a
//! checkpoint and from a loaded model, dense and `--quantize`d, on flex devices in one process and
//! on flex + wgpu mixed; and every bad layout, device list and degree as an error.

use std::path::PathBuf;

use burn::tensor::{Device, Tensor};
use burn_llm_models::cache::{ContiguousKvCache, LayerDevices};
use burn_llm_models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, Checkpoint, DecoderSpec, LanguageModel, QuantSpec, RandomWeights};
use burn_parallel::pipeline::{PipelineError, PipelineLm, PipelinePlan, StageLayout};

#[cfg(feature = "flex")]
mod sliced;

/// Prompts of two lengths, run as one left-padded batch.
const PROMPTS: [&[u32]; 2] = [&[5, 17, 42, 9, 3, 77, 12], &[8, 2, 31]];
/// Decode steps after the prefill.
const STEPS: usize = 5;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// Device sets for `stages` stages: every stage on flex, and (unless `BURN_LLM_TEST_WGPU=0` or
/// wgpu is not compiled in) stages alternating between flex and wgpu.
fn device_sets(stages: usize) -> Vec<(&'static str, Vec<Device>)> {
    #[cfg_attr(not(feature = "wgpu"), allow(unused_mut))] // pushed to when wgpu is compiled in
    let mut sets = vec![("flex", vec![Device::flex(); stages])];
    let wgpu_wanted = std::env::var("BURN_LLM_TEST_WGPU").map(|v| v != "0").unwrap_or(true);
    #[cfg(feature = "wgpu")]
    if wgpu_wanted {
        let wgpu = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        let mixed = (0..stages).map(|s| if s % 2 == 0 { Device::flex() } else { wgpu.clone() }).collect();
        sets.push(("flex+wgpu", mixed));
    }
    let _ = wgpu_wanted;
    sets
}

fn to_vec(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

/// Greedy continuation of [`PROMPTS`] as one batch: the tokens and the last-token logits of every
/// step, through the model's placed contiguous cache (what the plain engine does).
fn greedy(model: &impl LanguageModel) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let layout = model.kv_layout();
    let capacity = PROMPTS.iter().map(|p| p.len()).max().unwrap() + STEPS + 1;
    let mut cache =
        ContiguousKvCache::placed(layout, PROMPTS.len(), capacity, &model.device(), model.kv_devices(), None).unwrap();
    let vocab = model.spec().vocab_size;
    let mut new: Vec<Vec<u32>> = PROMPTS.iter().map(|p| p.to_vec()).collect();
    let (mut tokens, mut logits) = (vec![Vec::new(); PROMPTS.len()], Vec::new());
    for _ in 0..=STEPS {
        let slices: Vec<&[u32]> = new.iter().map(Vec::as_slice).collect();
        let step = cache.begin_step(&slices).unwrap();
        let rows = to_vec(model.forward_last_logits(&step, &mut cache).unwrap());
        for (b, row) in rows.chunks_exact(vocab).enumerate() {
            let best = row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best });
            tokens[b].push(best as u32);
            new[b] = vec![best as u32];
        }
        logits.push(rows);
    }
    (tokens, logits)
}

fn assert_same(what: &str, expected: &(Vec<Vec<u32>>, Vec<Vec<f32>>), got: &(Vec<Vec<u32>>, Vec<Vec<f32>>)) {
    assert_eq!(got.0, expected.0, "{what}: greedy tokens");
    let diff = expected.1.iter().flatten().zip(got.1.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(diff <= 1e-4, "{what}: logits differ by {diff}");
}

fn plan(layout: StageLayout, devices: Vec<Device>) -> PipelinePlan {
    PipelinePlan::new(layout, 1, devices).unwrap()
}

/// The fixtures' architectures: OPT (tied, learned positions), LLaMA (4 query heads over 2 KV
/// heads, untied head, rotary), GPT-2 (fused QKV, tied).
const ARCHES: [&str; 3] = ["opt", "llama", "gpt2"];

#[test]
fn llama_fixture_is_grouped_query_attention() {
    let spec = DecoderSpec::from_dir(&fixture("llama")).unwrap();
    assert!(spec.num_kv_heads < spec.num_heads, "{} KV heads for {} heads", spec.num_kv_heads, spec.num_heads);
}

/// PP=2 over the fixtures' checkpoints: loaded per stage from the checkpoint, and split from a
/// loaded model, equal single-device execution; the cache layers sit on their stages' devices
/// and bytes are handed between stages.
#[test]
fn two_stages_equal_one_device_on_the_fixtures() {
    for name in ARCHES {
        let dir = fixture(name);
        let spec = DecoderSpec::from_dir(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let expected = greedy(&CausalLm::from_checkpoint(spec.clone(), &ckpt, &Device::flex()).unwrap());
        for (label, devices) in device_sets(2) {
            let plan = plan(StageLayout::even(spec.num_layers, 2).unwrap(), devices.clone());
            let pipeline = PipelineLm::from_checkpoint(spec.clone(), &ckpt, &plan, None).unwrap();
            assert_eq!(pipeline.kv_devices(), LayerDevices::new(&devices), "{name} on {label}");
            assert_same(&format!("{name} PP=2 from the checkpoint on {label}"), &expected, &greedy(&pipeline));
            assert!(pipeline.stage_transfer_bytes() > 0, "{name} on {label}: nothing handed between stages");
            let loaded = CausalLm::from_checkpoint(spec.clone(), &ckpt, &Device::flex()).unwrap();
            let split = PipelineLm::from_model(loaded, &plan).unwrap();
            assert_same(&format!("{name} PP=2 from a loaded model on {label}"), &expected, &greedy(&split));
        }
    }
}

/// Four layers of the fixtures' shapes with seeded random weights.
fn deeper(name: &str) -> DecoderSpec {
    let mut spec = DecoderSpec::from_dir(&fixture(name)).unwrap();
    spec.num_layers = 4;
    spec
}

/// PP=3 (an even split and an uneven `--stage-layers`) equals one device, dense and with 4-bit
/// weights (quantized while loading each stage, as `--quantize` does, against the whole model
/// quantized on one device).
#[test]
fn three_stages_equal_one_device_dense_and_quantized() {
    let source = RandomWeights::default();
    let quant = QuantSpec::new(4, 16, WEIGHT_QUANT_AXIS).unwrap();
    for name in ARCHES {
        let spec = deeper(name);
        let single = CausalLm::random(spec.clone(), &Device::flex()).unwrap();
        let expected = greedy(&single);
        let expected_q = greedy(&single.quantize_weights(quant).unwrap());
        for (label, devices) in device_sets(3) {
            for layout in [StageLayout::even(4, 3).unwrap(), StageLayout::parse("0,1-2,3", 4).unwrap()] {
                let what = format!("{name} PP=3 {layout} on {label}");
                let plan = plan(layout, devices.clone());
                let pipeline = PipelineLm::from_checkpoint(spec.clone(), &source, &plan, None).unwrap();
                assert_same(&what, &expected, &greedy(&pipeline));
                let quantized = PipelineLm::from_checkpoint(spec.clone(), &source, &plan, Some(quant)).unwrap();
                assert_same(&format!("{what}, w4"), &expected_q, &greedy(&quantized));
            }
        }
    }
}

/// Stages of different tensor-parallel degrees (2 beside 1, and 1, 2, 1 over four devices;
/// uneven layer splits) equal one device, from the checkpoint and from a loaded model, on flex
/// devices and on flex + wgpu: the cache holds each rank's heads in units of the heads every
/// rank's share divides into ([`burn_parallel::pipeline::KvMap`]).
#[test]
fn stages_of_different_degrees_equal_one_device() {
    let source = RandomWeights::default();
    for name in ARCHES {
        let spec = deeper(name);
        let expected = greedy(&CausalLm::random(spec.clone(), &Device::flex()).unwrap());
        for (label, devices) in device_sets(4) {
            for (layout, degrees) in [("0-2,3", vec![2, 1]), ("0,1-3", vec![1, 2]), ("0,1-2,3", vec![1, 2, 1])] {
                let what = format!("{name}, layers {layout} at degrees {degrees:?} on {label}");
                let ranks: usize = degrees.iter().sum();
                let layout = StageLayout::parse(layout, 4).unwrap();
                let plan = PipelinePlan::with_degrees(layout, degrees.clone(), devices[..ranks].to_vec()).unwrap();
                assert_eq!(plan.tensor_parallel(), None, "{what}");
                let pipeline = PipelineLm::from_checkpoint(spec.clone(), &source, &plan, None).unwrap();
                assert_eq!(pipeline.degrees(), degrees, "{what}");
                let kv = pipeline.kv_layout();
                assert_eq!(pipeline.kv_devices().len(), kv.num_layers, "{what}");
                assert_same(&format!("{what}, from the checkpoint"), &expected, &greedy(&pipeline));
                let loaded = CausalLm::random(spec.clone(), &Device::flex()).unwrap();
                let split = PipelineLm::from_model(loaded, &plan).unwrap();
                assert_same(&format!("{what}, from a loaded model"), &expected, &greedy(&split));
            }
        }
    }
}

/// The bytes handed between stages are the residual stream (and rotary angles) of every token
/// crossing every boundary: `(stages − 1) × tokens × hidden × 4` for OPT.
#[test]
fn bytes_between_stages_are_counted() {
    let spec = deeper("opt");
    let plan = plan(StageLayout::even(4, 3).unwrap(), vec![Device::flex(); 3]);
    let pipeline = PipelineLm::from_checkpoint(spec.clone(), &RandomWeights::default(), &plan, None).unwrap();
    greedy(&pipeline);
    let width = PROMPTS.iter().map(|p| p.len()).max().unwrap();
    let tokens = PROMPTS.len() * (width + STEPS);
    assert_eq!(pipeline.stage_transfer_bytes(), (2 * tokens * spec.hidden_size * 4) as u64);
    let summary = pipeline.placement_summary().unwrap();
    assert!(summary.contains("3 pipeline stages") && summary.contains("layers 2-2"), "{summary}");
}

/// Bad splits are errors before any weight is read: a layout for another depth, a
/// tensor-parallel degree that does not divide the heads, device lists of the wrong length.
#[test]
fn bad_plans_are_errors() {
    let spec = DecoderSpec::from_dir(&fixture("opt")).unwrap();
    let source = RandomWeights::default();
    let err = |r: Result<PipelineLm, PipelineError>| r.unwrap_err().to_string();
    let three = plan(StageLayout::even(3, 3).unwrap(), vec![Device::flex(); 3]);
    assert!(err(PipelineLm::from_checkpoint(spec.clone(), &source, &three, None)).contains("the model has 2 layers"));
    let model = CausalLm::random(spec.clone(), &Device::flex()).unwrap();
    assert!(err(PipelineLm::from_model(model, &three)).contains("the model has 2 layers"));
    let tp = PipelinePlan::new(StageLayout::even(2, 2).unwrap(), 3, vec![Device::flex(); 6]).unwrap();
    let message = err(PipelineLm::from_checkpoint(spec.clone(), &source, &tp, None));
    assert!(message.contains("degree 3 does not divide"), "{message}");
    let few = PipelinePlan::new(StageLayout::even(2, 2).unwrap(), 2, vec![Device::flex(); 3]).unwrap_err();
    assert!(few.to_string().contains("3 devices given for 2 pipeline stages × 2"), "{few}");
    // Per-stage degrees: one per stage, one device per rank, each dividing the heads, checked
    // before any weight is read.
    let two = || StageLayout::even(2, 2).unwrap();
    let short = PipelinePlan::with_degrees(two(), vec![2], vec![Device::flex(); 2]).unwrap_err();
    assert!(short.to_string().contains("1 tensor-parallel degrees given for 2 pipeline stages"), "{short}");
    let few = PipelinePlan::with_degrees(two(), vec![2, 1], vec![Device::flex(); 2]).unwrap_err();
    assert!(few.to_string().contains("list exactly 3"), "{few}");
    let three = PipelinePlan::with_degrees(two(), vec![1, 3], vec![Device::flex(); 4]).unwrap();
    assert!(three.check(&spec).unwrap_err().to_string().contains("degree 3 does not divide"));
    assert!(err(PipelineLm::from_checkpoint(spec.clone(), &source, &three, None)).contains("degree 3 does not divide"));
    assert!(StageLayout::even(2, 3).unwrap_err().to_string().contains("3 pipeline stages for a model of 2 layers"));
    // A checkpoint missing a layer's tensor is an error naming it, not a panic.
    struct Missing;
    impl TensorSource for Missing {
        fn read_f32(&self, name: &str, expected: &[usize]) -> burn_llm_models::Result<Vec<f32>> {
            if name.contains("layers.1.") {
                return Err(burn_llm_models::ModelError::MissingTensor { name: name.into(), dir: "test".into() });
            }
            RandomWeights::default().read_f32(name, expected)
        }
    }
    let two = plan(StageLayout::even(2, 2).unwrap(), vec![Device::flex(); 2]);
    assert!(err(PipelineLm::from_checkpoint(spec, &Missing, &two, None)).contains("layers.1."));
}

#[cfg(feature = "flex")]
mod auto;
