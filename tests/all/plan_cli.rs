//! The `plan` command line (`burn_llm::cli::plan`, behind the `plan` example): one JSON object
//! on every path, exit code 2 with `{"error": …}` for bad arguments, unreadable files and bad
//! input, and every sample input in `burn-plan/inputs/` planned.

use burn_llm::cli::plan::{EXIT_ERROR, PlanArgs, PlannerName, run, run_from};

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Writes `text` to a fresh temporary file and runs `plan PLANNER --input FILE EXTRA…` on it.
fn plan_file(planner: &str, text: &str, extra: &[&str]) -> (serde_json::Value, i32) {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("burn-llm-plan-cli-{}-{n}.json", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let mut args = vec!["plan".to_string(), planner.to_string(), "--input".into(), path.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let (out, code) = run_from(args);
    std::fs::remove_file(&path).ok();
    (json(&out), code)
}

#[test]
fn plan_cli_prints_one_json_object_and_exits_2_on_bad_arguments_or_input() {
    let stages = r#"{"layer_latency_ms": [1, 2, 3, 4], "stages": 2}"#;
    let (out, code) = plan_file("stages", stages, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["stages"], serde_json::json!([[0, 3], [3, 4]]));
    for (planner, text, extra) in [
        // Bad input, an override the planner does not take, a planner that does not exist, a
        // flag that does not exist.
        ("stages", r#"{"layer_latency_ms": [1], "stages": 1, "typo": 1}"#, &[][..]),
        ("stages", stages, &["--exhaustive"]),
        ("slices", stages, &["--baseline", "replication"]),
        ("placement", "{}", &["--baseline", "nope"]),
        ("unknown", "{}", &[]),
        ("stages", stages, &["--nope"]),
    ] {
        let (out, code) = plan_file(planner, text, extra);
        assert_eq!(code, EXIT_ERROR, "{planner} {extra:?}: {out}");
        assert!(out["error"].as_str().is_some_and(|e| !e.is_empty()), "{out}");
    }
    let (out, code) = run_from(["plan", "stages", "--input", "/nonexistent/plan.json"]);
    assert_eq!(code, EXIT_ERROR, "{out}");
    assert!(json(&out)["error"].as_str().is_some_and(|e| e.contains("/nonexistent/plan.json")), "{out}");
    // No --input.
    let (out, code) = run_from(["plan", "stages"]);
    assert_eq!(code, EXIT_ERROR, "{out}");
    assert!(json(&out)["error"].is_string());
    // Help is text, and success.
    let (out, code) = run_from(["plan", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--input"), "{out}");
}

#[test]
fn plan_cli_runs_parsed_arguments_and_every_sample_input() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("burn-plan/inputs");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let planners = [
            ("stages", PlannerName::Stages),
            ("slices", PlannerName::Slices),
            ("placement", PlannerName::Placement),
            ("schedule", PlannerName::Schedule),
        ];
        let Some((_, planner)) = planners.into_iter().find(|(p, _)| name.starts_with(p)) else {
            continue;
        };
        let args = PlanArgs { planner, input: path.clone(), exhaustive: false, baseline: None };
        let (out, code) = run(&args);
        assert_eq!(code, 0, "{name}: {out}");
        assert!(json(&out).is_object());
        ran += 1;
    }
    assert!(ran >= 9, "ran {ran} sample inputs");
    // The flags reach the planners: an exhaustive search says so, a baseline is reported.
    let schedule = dir.join("schedule.json");
    let (out, code) = run_from(["plan", "schedule", "--input", schedule.to_str().unwrap(), "--exhaustive"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["search"], "exhaustive");
    let placement = dir.join("placement.json");
    let (out, code) =
        run_from(["plan", "placement", "--input", placement.to_str().unwrap(), "--baseline", "replication"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["baseline"], "replication");
}
