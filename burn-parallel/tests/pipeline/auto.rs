//! `--stage-layers auto` in the library: device profiles cached per (device, model, dtype) and
//! measured again when a cache file was measured for something else; stages planned from two
//! devices of unequal speed give the slower one fewer layers, and the pipeline built on that
//! plan generates exactly what one device does; caps that cannot hold a layer are errors naming
//! the device before anything loads.

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm_models::{CausalLm, LanguageModel, RandomWeights};
use burn_parallel::pipeline::{
    AutoGroup, AutoGroups, AutoStageDevice, AutoStages, Handover, LinkProfile, PipelineError, PipelineLm, PipelinePlan,
    StageWorkload,
};
use burn_parallel::profiler::{
    DeviceProfile, Interference, ProfileGrid, ProfileIdentity, ProfileSource, ProfileWeights, TensorParallelTimes,
    device_profile, group_profile, measure_link,
};
use burn_plan::profile::Profile;

use super::{assert_same, deeper, greedy};

/// A grid that measures in well under a second on a CPU.
fn tiny_grid() -> ProfileGrid {
    ProfileGrid {
        prefill_batch: vec![1],
        prefill_tokens: vec![1, 8],
        prefill_context: vec![8],
        decode_batch: vec![1],
        decode_context: vec![0, 8],
        warmup: 0,
        repeats: 1,
    }
}

/// A fresh directory for one test's cache.
fn cache_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-parallel-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn identity(model: &str, dtype: &str) -> ProfileIdentity {
    ProfileIdentity { device: "flex (test)".into(), model: model.into(), dtype: dtype.into() }
}

fn measure(spec_name: &str, identity: &ProfileIdentity, dir: &std::path::Path) -> DeviceProfile {
    let spec = deeper(spec_name);
    let weights = ProfileWeights::<RandomWeights>::Random;
    device_profile(&spec, weights, &Device::flex(), identity, &tiny_grid(), Some(dir), None, &mut Vec::new()).unwrap()
}

#[test]
fn device_profiles_are_cached_per_identity_and_remeasured_on_a_mismatch() {
    let dir = cache_dir("profile-cache");
    let id = identity("llama-4", "f32");
    let first = measure("llama", &id, &dir);
    assert_eq!(first.source, ProfileSource::Measured);
    let path = id.cache_file(&dir, &tiny_grid());
    assert!(path.exists());
    let again = measure("llama", &id, &dir);
    assert_eq!(again.source, ProfileSource::Cached(path.clone()));
    // The same profile (JSON keeps the times to within rounding).
    assert_eq!(again.profile.weight_bytes_per_layer, first.profile.weight_bytes_per_layer);
    assert_eq!(again.profile.layers, first.profile.layers);
    let (a, b) = (&again.profile.decode.ms[0], &first.profile.decode.ms[0]);
    assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-9 * y.abs().max(1.0)), "{a:?} vs {b:?}");

    // Another dtype (or model, or device) is another file, measured anew.
    let other = measure("llama", &identity("llama-4", "q4"), &dir);
    assert_eq!(other.source, ProfileSource::Measured);
    assert_ne!(identity("llama-4", "q4").cache_file(&dir, &tiny_grid()), path);

    // A file at this identity's path that was measured for another model is measured again.
    let mut cached: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cached["identity"]["model"] = "another model".into();
    std::fs::write(&path, cached.to_string()).unwrap();
    let remeasured = measure("llama", &id, &dir);
    match &remeasured.source {
        ProfileSource::Remeasured { found, .. } => assert!(found.contains("another model"), "{found}"),
        other => panic!("a mismatched cache file was reused: {other:?}"),
    }
    assert_eq!(measure("llama", &id, &dir).source, ProfileSource::Cached(path));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `profile`'s sizes with fixed times in place of the measured ones: the planners' choices in
/// these tests must not hang on microsecond timings that a busy host reorders. A layer's prefill
/// grows with its tokens, decode is flat, the LM head costs more than the embeddings.
fn steady(measured: &Profile) -> Profile {
    let mut profile = measured.clone();
    let tokens = profile.prefill.tokens.clone();
    for row in &mut profile.prefill.base_ms {
        row.iter_mut().zip(&tokens).for_each(|(t, n)| *t = 0.01 + 0.01 * n);
    }
    profile.prefill.context_ms = [0.0; 4];
    profile.decode.ms.iter_mut().flatten().for_each(|t| *t = 0.02);
    profile.embedding.ms_per_token = 0.001;
    profile.lm_head.ms_per_token = 0.005;
    profile.call_ms = 0.0;
    profile.engine_step = None;
    profile.engine_step_ms = None;
    profile.step_variation = None;
    profile
}

/// A fixed hand-over cost, for the same reason as [`steady`].
const LINK: LinkProfile = LinkProfile { latency_ms: 0.001, ms_per_byte: 0.0 };

/// `profile` as a device `factor` times slower would measure it.
fn slowed(profile: &Profile, factor: f64) -> Profile {
    let mut slow = profile.clone();
    slow.prefill.base_ms.iter_mut().flatten().for_each(|t| *t *= factor);
    slow.prefill.context_ms.iter_mut().for_each(|t| *t *= factor);
    slow.decode.ms.iter_mut().flatten().for_each(|t| *t *= factor);
    slow
}

fn names() -> Vec<String> {
    vec!["fast".into(), "slow".into()]
}

fn auto_stages(profile: &Profile, factor: f64, caps: [u64; 2], spec_name: &str) -> AutoStages {
    let spec = deeper(spec_name);
    let link = LINK;
    let device = |name: &str, profile: Profile, memory_bytes, link_to_next| AutoStageDevice {
        name: name.into(),
        profile,
        memory_bytes,
        link_to_next,
    };
    AutoStages {
        devices: vec![
            device("fast", profile.clone(), caps[0], Some(link)),
            device("slow", slowed(profile, factor), caps[1], None),
        ],
        workload: StageWorkload { prompt_tokens: 8, output_tokens: 8 },
        kv_tokens: 32,
        handover: Handover::of(&spec),
        interference: 0.0,
    }
}

#[test]
fn auto_stages_give_a_slower_device_fewer_layers_and_equal_outputs() {
    let dir = cache_dir("auto-stages");
    for name in ["llama", "gpt2"] {
        let profile = steady(&measure(name, &identity(name, "f32"), &dir).profile);
        // The measured link is a valid cost even though the plans below use a fixed one.
        let link = measure_link(&Device::flex(), &Device::flex(), deeper(name).hidden_size, 8, 2).unwrap();
        assert!(link.latency_ms.is_finite() && link.latency_ms >= 0.0 && link.ms_per_byte >= 0.0, "{link:?}");
        let auto = auto_stages(&profile, 3.0, [u64::MAX, u64::MAX], name);
        let plan = PipelinePlan::auto(&auto, 1, vec![Device::flex(), Device::flex()], names()).unwrap();
        let stages = plan.layout().stages().to_vec();
        assert!(stages[0].len() > stages[1].len(), "{name}: {stages:?} for a device 3× slower");
        let prediction = plan.prediction().unwrap();
        assert_eq!(prediction.stages.len(), 2);
        assert!(prediction.summary().contains("bottleneck"), "{}", prediction.summary());

        let spec = deeper(name);
        let expected = greedy(&CausalLm::random(spec.clone(), &Device::flex()).unwrap());
        let pipeline = PipelineLm::from_checkpoint(spec, &RandomWeights::default(), &plan, None).unwrap();
        assert_same(&format!("{name} on auto stages {stages:?}"), &expected, &greedy(&pipeline));
        let summary = pipeline.placement_summary().unwrap_or_default();
        assert!(summary.contains("auto stages"), "{summary}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interfering_stages_leave_the_slower_device_one_layer_and_run_as_planned() {
    let dir = cache_dir("auto-interference");
    let name = "llama";
    let profile = steady(&measure(name, &identity(name, "f32"), &dir).profile);
    // A device 1.2× slower: balanced, it keeps half the layers.
    let balanced = auto_stages(&profile, 1.2, [u64::MAX, u64::MAX], name);
    let balanced = PipelinePlan::auto(&balanced, 1, vec![Device::flex(), Device::flex()], names()).unwrap();
    let layers = deeper(name).num_layers;
    assert!(balanced.layout().stages()[1].len() > 1, "{:?}", balanced.layout().stages());
    // Stages that cost more overlapped than in turn (κ > 1): the pass is cheapest with the least
    // sum, so the slower device keeps the one layer every stage needs.
    let auto = AutoStages { interference: 1.5, ..auto_stages(&profile, 1.2, [u64::MAX, u64::MAX], name) };
    let plan = PipelinePlan::auto(&auto, 1, vec![Device::flex(), Device::flex()], names()).unwrap();
    let stages = plan.layout().stages().to_vec();
    assert_eq!((stages[0].len(), stages[1].len()), (layers - 1, 1), "{stages:?}");
    let prediction = plan.prediction().unwrap();
    assert_eq!(prediction.interference, 1.5);
    let steps: Vec<f64> = prediction.stages.iter().map(|s| s.decode_step_ms).collect();
    assert_eq!(prediction.micro_batched_step_ms(8), Interference::pipelined_ms(&steps, 8, 1.5));
    assert!(prediction.summary().contains("interference κ = 1.50"), "{}", prediction.summary());

    let spec = deeper(name);
    let expected = greedy(&CausalLm::random(spec.clone(), &Device::flex()).unwrap());
    let pipeline = PipelineLm::from_checkpoint(spec, &RandomWeights::default(), &plan, None).unwrap();
    assert_same(&format!("{name} on interfering auto stages {stages:?}"), &expected, &greedy(&pipeline));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settled_stages_are_priced_at_the_interference_of_their_own_split() {
    let dir = cache_dir("auto-settle");
    let name = "llama";
    let profile = steady(&measure(name, &identity(name, "f32"), &dir).profile);
    let layers = deeper(name).num_layers;
    // Measured on equal shares, the stages interfere (κ = 1.5), so the slower device keeps one
    // layer. Measured on that split they hardly do (its stage waits more than it computes), so
    // the planner balances them again; measured on the balanced split they interfere as before.
    let auto = AutoStages { interference: 1.5, ..auto_stages(&profile, 1.2, [u64::MAX, u64::MAX], name) };
    let mut calls = Vec::new();
    let prediction = auto
        .plan_settled(|split: &[usize]| {
            calls.push(split.to_vec());
            Ok::<_, PipelineError>(if split[1] == 1 { 0.0 } else { 1.5 })
        })
        .unwrap();
    assert_eq!(calls.len(), 2, "the lopsided split, the balanced one, then the lopsided again (seen): {calls:?}");
    assert_eq!(calls[0], vec![layers - 1, 1]);
    assert!(calls[1][1] > 1, "{calls:?}");
    // Of the two, the lopsided split at its own κ = 0 has the shorter pass.
    assert_eq!(prediction.layer_counts(), vec![layers - 1, 1]);
    assert_eq!(prediction.interference, 0.0);

    // A split measured as planned is settled at once; a failed measurement is the error.
    let mut count = 0;
    let settled = auto
        .plan_settled(|_: &[usize]| {
            count += 1;
            Ok::<_, PipelineError>(1.45)
        })
        .unwrap();
    assert_eq!((count, settled.interference, settled.layer_counts()), (1, 1.45, vec![layers - 1, 1]));
    let failed = auto.plan_settled(|_: &[usize]| Err(PipelineError::Zero("a test's measurement")));
    assert!(failed.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn auto_stages_refuse_caps_that_cannot_hold_a_layer_or_the_model() {
    let dir = cache_dir("auto-caps");
    let profile = measure("llama", &identity("llama", "f32"), &dir).profile;
    let layer = profile.weight_bytes_per_layer + 32 * profile.kv_bytes_per_token_per_layer;
    let head = profile.lm_head.weight_bytes;
    let devices = || vec![Device::flex(), Device::flex()];
    let auto = |auto: &AutoStages| PipelinePlan::auto(auto, 1, devices(), names());
    // The slow device cannot hold one layer and the LM head.
    let err = auto(&auto_stages(&profile, 1.0, [u64::MAX, layer + head - 1], "llama")).unwrap_err().to_string();
    assert!(err.contains("`slow`") && err.contains("--device-memory"), "{err}");
    // Each holds its smallest stage, but not the model together (four layers of the deeper spec).
    let embed = profile.embedding.weight_bytes;
    let err = auto(&auto_stages(&profile, 1.0, [embed + layer, head + layer], "llama")).unwrap_err().to_string();
    assert!(err.contains("add up to"), "{err}");
    // A cap that forces the split: the fast device holds only its embeddings and one layer.
    let plan = auto(&auto_stages(&profile, 1.0, [embed + layer, u64::MAX], "llama")).unwrap();
    assert_eq!(plan.layout().stages()[0].len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--tensor-parallel-size auto` in the library: three devices and the group of the first two
/// as candidates; the group's layer (timed on it, here its measurement scaled) is ten times faster
/// than one device's, so the planner puts a degree-2 stage on the group beside a degree-1 stage
/// on the third device, and the pipeline built on the plan runs exactly that (stages, degrees,
/// devices) with the outputs of one device. Caps too small for that group's share are refused.
#[test]
fn planned_degrees_per_stage_run_as_planned() {
    let dir = cache_dir("auto-groups");
    for name in ["llama", "gpt2"] {
        let profile = steady(&measure(name, &identity(name, "f32"), &dir).profile);
        let spec = deeper(name);
        let link = LINK;
        let device = |name: &str, link_to_next| AutoStageDevice {
            name: name.into(),
            profile: profile.clone(),
            memory_bytes: u64::MAX,
            link_to_next,
        };
        let workload = StageWorkload { prompt_tokens: 8, output_tokens: 8 };
        let fast = TensorParallelTimes {
            prefill_ms: 0.1 * profile.prefill.base_ms[0][profile.prefill.base_ms[0].len() - 1],
            decode_ms: 0.1 * profile.decode.ms[0][0],
        };
        let auto = AutoGroups {
            devices: vec![device("a", Some(link)), device("b", Some(link)), device("c", None)],
            groups: vec![AutoGroup {
                first_device: 0,
                degree: 2,
                profile: group_profile(&profile, 2, workload.prompt_tokens, fast),
                link_to_next: Some(link),
            }],
            workload,
            kv_tokens: 32,
            handover: Handover::of(&spec),
            interference: 0.0,
        };
        let devices = vec![Device::flex(); 3];
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let plan = PipelinePlan::auto_groups(&auto, devices, names).unwrap();
        assert_eq!(plan.degrees(), &[2, 1], "{name}: {:?}", plan.prediction());
        assert_eq!(plan.stage_device_names(0), &["a".to_string(), "b".to_string()]);
        let prediction = plan.prediction().unwrap();
        assert_eq!(prediction.stages.iter().map(|s| s.degree).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(prediction.stages[0].device, "a+b");
        assert!(prediction.summary().contains("on a+b (tensor-parallel 2)"), "{}", prediction.summary());
        // Stages that slow each other down: the prediction prices their overlap with the κ planned for.
        let priced = AutoGroups { interference: 0.5, ..auto.clone() }.plan().unwrap();
        assert_eq!(priced.interference, 0.5);
        let stages = plan.layout().stages().to_vec();

        let expected = greedy(&CausalLm::random(spec.clone(), &Device::flex()).unwrap());
        let pipeline = PipelineLm::from_checkpoint(spec.clone(), &RandomWeights::default(), &plan, None).unwrap();
        assert_eq!(pipeline.degrees(), [2, 1], "{name}");
        let ran: Vec<_> = pipeline.stages().iter().map(|s| (s.layers(), s.degree(), s.name().to_string())).collect();
        assert_eq!(ran, [(stages[0].clone(), 2, "a+b".to_string()), (stages[1].clone(), 1, "c".to_string())]);
        assert_same(&format!("{name} on planned degrees {stages:?}"), &expected, &greedy(&pipeline));

        // Each device of the group holds half a layer's bytes: a cap below that share is refused.
        let layer = profile.weight_bytes_per_layer + 32 * profile.kv_bytes_per_token_per_layer;
        let mut tight = auto.clone();
        tight.devices.iter_mut().for_each(|d| d.memory_bytes = layer / 4);
        let err = PipelinePlan::auto_groups(&tight, vec![Device::flex(); 3], vec!["a".into(), "b".into(), "c".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--device-memory"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
