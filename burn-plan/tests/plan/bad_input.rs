//! Bad input to every planner through the library and the JSON entry point, and the sample inputs.

use burn_plan::json::{self, Overrides, Planner};
use burn_plan::placement::{self, Arrivals, ModelRef};
use burn_plan::profile::{PROFILE_VERSION, Profile};
use burn_plan::schedule::{LengthDistribution, ScheduleInput};
use burn_plan::slices::{self, SlicesInput};
use burn_plan::stages::{self, StagesError, StagesInput};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::close;
use super::placement::{arrivals, input, model};
use super::profiles::{engine_table, profile};
use super::schedule::schedule_input;
use super::slices::slices_input;

#[test]
fn plan_bad_input_is_an_error_not_a_panic() {
    let base = StagesInput { layer_latency_ms: vec![1.0, 2.0], stages: 1, ..StagesInput::default() };
    for bad in [
        StagesInput { layer_latency_ms: vec![f64::NAN, 1.0], ..base.clone() },
        StagesInput { layer_latency_ms: vec![-1.0, 1.0], ..base.clone() },
        StagesInput { layer_latency_ms: vec![], ..base.clone() },
        StagesInput { stages: 3, ..base.clone() },
        StagesInput {
            layer_memory_bytes: Some(vec![u64::MAX, u64::MAX]),
            stage_memory_bytes: Some(u64::MAX),
            ..base.clone()
        },
        StagesInput { layer_memory_bytes: Some(vec![1]), stage_memory_bytes: Some(1), ..base.clone() },
    ] {
        assert!(stages::plan(&bad).is_err(), "{bad:?}");
    }
    // Sizes past what the planners can allocate are errors, not aborts.
    let huge = StagesInput { layer_latency_ms: vec![1.0; 4096], stages: 4096, ..base.clone() };
    assert!(matches!(stages::plan(&huge), Err(StagesError::TooLarge { .. })));
    let many = StagesInput { layer_latency_ms: vec![1.0; 5000], ..base.clone() };
    assert!(stages::plan(&many).is_err());
    let batch = SlicesInput {
        seq_len: 4096,
        stages: 2,
        batch: Some(4096),
        profile: Some(profile(&mut ChaCha8Rng::seed_from_u64(1))),
        ..SlicesInput::default()
    };
    assert!(slices::plan_batch(&batch).is_err());
    // The batch extension is its own function.
    assert!(slices::plan(&SlicesInput { batch: Some(1), ..slices_input(vec![vec![Some(1.0)]], 1, 1, None) }).is_err());
    let workload = arrivals(vec![Arrivals { model: ModelRef::Index(0), rate: 1e9, cv: 1.0 }], 1e9, None);
    let flood = input(vec![model("a", 1, 1.0, 1.0)], 1, 1 << 30, workload);
    assert!(placement::plan(&flood).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(1.0)]], 2, 1, None)).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(f64::INFINITY)]], 1, 1, None)).is_err());
    assert!(slices::plan(&slices_input(vec![vec![Some(1.0)]], 1, 0, None)).is_err());
}

/// A version-1 profile's engine steps were timed with one prompt repeated in each batch (the prefix
/// cache computed it once): read without them, refused with them; unknown versions are refused.
#[test]
fn profiles_of_the_old_engine_timing_are_measured_again() {
    let rng = &mut ChaCha8Rng::seed_from_u64(3);
    let current = Profile { engine_step_ms: Some(engine_table(rng)), ..profile(rng) };
    assert_eq!(current.version, PROFILE_VERSION);
    assert!(current.cost_model("profile").is_ok());
    let old = Profile { version: 1, ..current.clone() };
    let err = old.cost_model("profile").unwrap_err();
    assert_eq!(err.field, "profile.engine_step_ms");
    assert!(err.problem.contains("measured again"), "{err:?}");
    assert!(Profile { engine_step_ms: None, ..old }.cost_model("profile").is_ok());
    let err = Profile { version: PROFILE_VERSION + 1, ..current }.cost_model("profile").unwrap_err();
    assert_eq!(err.field, "profile.version");
}

/// Runs `planner` on `text` through [`json::run`], as the command line does after reading its
/// file: the output as JSON, or the error message.
pub(super) fn run_json(planner: Planner, text: &str, overrides: Overrides) -> Result<serde_json::Value, String> {
    let out = json::run(planner, text, overrides)?;
    Ok(serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}")))
}

#[test]
fn plan_json_gives_one_json_object_or_an_error_message() {
    let out = run_json(Planner::Stages, r#"{"layer_latency_ms": [1, 2, 3, 4], "stages": 2}"#, Overrides::default());
    let out = out.unwrap();
    assert_eq!(out["stages"], serde_json::json!([[0, 3], [3, 4]]));
    assert_eq!(out["bottleneck_ms"], 6.0);
    let out = run_json(
        Planner::Slices,
        r#"{"seq_len": 2, "stages": 2, "t_fwd_ms": [[1, 1], [3, null]]}"#,
        Overrides::default(),
    );
    assert_eq!(out.unwrap()["slices"], serde_json::json!([1, 1]));
    let none = Overrides::default();
    let exhaustive = Overrides { exhaustive: true, ..none };
    let replication = Overrides { baseline: Some(placement::Baseline::Replication), ..none };
    for (planner, text, overrides) in [
        (Planner::Stages, r#"{"stages": 2}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1, -2], "stages": 1}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [NaN], "stages": 1}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [], "stages": 1}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1], "stages": 18446744073709551616}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1e400], "stages": 1}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1], "stages": 2}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1], "stages": 1, "typo": 1}"#, none),
        (Planner::Stages, r#"{"layer_latency_ms": [1], "stages": 1}"#, exhaustive),
        (Planner::Slices, r#"{"seq_len": 3, "stages": 1, "t_fwd_ms": [[1]]}"#, none),
        (Planner::Slices, r#"{"seq_len": 100000, "stages": 1, "t_fwd_ms": []}"#, none),
        (Planner::Slices, r#"{"seq_len": 2, "stages": 2, "t_fwd_ms": [[1, 1], [3, null]]}"#, replication),
        (
            Planner::Placement,
            r#"{"models": [], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "a"]]}}"#,
            none,
        ),
        (
            Planner::Placement,
            r#"{"models": [{"name": "a", "layer_latency_ms": [1], "layer_memory_bytes": [10], "slo_s": 1}], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "a"]]}}"#,
            replication,
        ),
        (
            Planner::Placement,
            r#"{"models": [{"name": "a", "layer_latency_ms": [1], "layer_memory_bytes": [1], "slo_s": 1}], "devices": 1, "device_memory_bytes": 1, "workload": {"trace": [[0, "nope"]]}}"#,
            none,
        ),
        (Planner::Schedule, r#"{"devices": 1}"#, none),
    ] {
        let err = run_json(planner, text, overrides).expect_err(text);
        assert!(!err.trim().is_empty(), "{planner:?} {text}");
    }
    // The error object a command line prints.
    let printed: serde_json::Value = serde_json::from_str(&json::error_json(" no such file \n")).unwrap();
    assert_eq!(printed, serde_json::json!({ "error": "no such file" }));
}

#[test]
fn plan_json_schedule_exhaustive_and_placement_baseline_overrides() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let input = ScheduleInput {
        devices: 2,
        device_memory_bytes: 1 << 20,
        max_encode_batch: Some(8),
        ..schedule_input(
            profile(&mut rng),
            LengthDistribution::Trace(vec![16, 24, 32]),
            LengthDistribution::Histogram(vec![(4, 1.0), (8, 1.0)]),
        )
    };
    let json = serde_json::to_string(&input).unwrap();
    let bnb = run_json(Planner::Schedule, &json, Overrides::default()).unwrap();
    let all = run_json(Planner::Schedule, &json, Overrides { exhaustive: true, ..Overrides::default() }).unwrap();
    assert_eq!(all["search"], "exhaustive");
    assert!(close(bnb["throughput_qps"].as_f64().unwrap(), all["throughput_qps"].as_f64().unwrap()));
    let placement = r#"{"models": [{"name": "a", "layer_latency_ms": [100, 100], "layer_memory_bytes": [1, 1], "slo_s": 1}],
        "devices": 2, "device_memory_bytes": 2, "workload": {"arrivals": [{"model": "a", "rate": 2, "cv": 2}], "duration_s": 20, "seed": 3}}"#;
    let replication = Overrides { baseline: Some(placement::Baseline::Replication), ..Overrides::default() };
    let out = run_json(Planner::Placement, placement, replication).unwrap();
    assert_eq!(out["baseline"], "replication");
    assert_eq!(out["latencies_s"].as_array().unwrap().len(), out["models"][0]["requests"].as_u64().unwrap() as usize);
}

#[test]
fn plan_sample_inputs_all_plan() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("inputs");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let planners = [
            ("stages", Planner::Stages),
            ("slices", Planner::Slices),
            ("placement", Planner::Placement),
            ("schedule", Planner::Schedule),
        ];
        let Some((_, planner)) = planners.into_iter().find(|(p, _)| name.starts_with(p)) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let out = run_json(planner, &text, Overrides::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.is_object());
        ran += 1;
    }
    assert!(ran >= 9, "ran {ran} sample inputs");
    // The profile on its own is a valid profile.
    let text = std::fs::read_to_string(dir.join("profile.json")).unwrap();
    let profile: Profile = serde_json::from_str(&text).unwrap();
    assert!(profile.cost_model("profile").is_ok());
}
