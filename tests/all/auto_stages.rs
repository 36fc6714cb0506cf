//! `--stage-layers auto` through the CLI: the same greedy text as one device on the fixtures
//! (plain and paged engines, two flex devices; a flex device beside a one-thread loopback worker),
//! the plan in the summary line and in `--json`, profiles cached in `--stage-profile-dir`; and
//! the bad inputs as errors before anything loads: a device that cannot hold one layer, caps
//! that cannot hold the model, the flags it does not combine with, a worker that dies while
//! being profiled.

use std::path::PathBuf;

use burn_llm::models::DecoderSpec;

use crate::common::fixture;
use crate::parallel::{cli, text};

/// A fresh profile directory for one test.
fn profile_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-llm-auto-stages-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The profile cached in `dir` (one device profiled there).
fn cached_profile(dir: &std::path::Path) -> serde_json::Value {
    let file = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).find(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("stage-profile-") && n.ends_with(".json"))
    });
    let text = std::fs::read_to_string(file.expect("a cached profile")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["profile"].clone()
}

#[test]
fn auto_stages_generate_what_one_device_does_and_report_the_plan() {
    let dir = profile_dir("cli");
    let dir_arg = dir.to_str().unwrap();
    let single = text(&cli(&["--device", "flex"]).unwrap());
    for engine in ["plain", "paged"] {
        let mut flags = vec!["--engine", engine, "--devices", "flex,flex", "--stage-layers", "auto"];
        flags.extend_from_slice(&["--stage-profile-dir", dir_arg]);
        if engine == "paged" {
            flags.extend_from_slice(&["--kv-cache-memory", "blocks:64"]);
        }
        let out = cli(&flags).unwrap();
        assert_eq!(text(&out), single, "{engine}");
        assert!(out.contains("auto stages") && out.contains("bottleneck stage"), "{engine}: {out}");
        flags.push("--json");
        let json: serde_json::Value = serde_json::from_str(cli(&flags).unwrap().trim()).unwrap();
        let placement = json["placement"].as_str().unwrap_or_default();
        assert!(placement.contains("auto stages"), "{engine}: {json}");
        // The structured plan: the stages cover the layers in order, each on its device, with
        // the prediction's stages matching them and a bottleneck among them.
        let plan = &json["plan"];
        let stages = plan["stages"].as_array().unwrap_or_else(|| panic!("{engine}: no plan.stages in {json}"));
        assert_eq!(stages.len(), 2, "{engine}: {plan}");
        assert_eq!(stages[0]["first_layer"], 0, "{plan}");
        assert_eq!(stages[1]["first_layer"].as_u64(), stages[0]["last_layer"].as_u64().map(|l| l + 1), "{plan}");
        assert_eq!(stages[1]["last_layer"], 1, "the GPT-2 fixture has 2 layers: {plan}");
        assert_eq!(stages[0]["devices"], serde_json::json!(["flex"]), "{plan}");
        let predicted = plan["predicted"]["stages"].as_array().unwrap_or_else(|| panic!("{plan}"));
        for (p, s) in predicted.iter().zip(stages) {
            assert_eq!((&p["first_layer"], &p["last_layer"]), (&s["first_layer"], &s["last_layer"]), "{plan}");
            assert!(p["decode_step_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{plan}");
        }
        let bottleneck = plan["predicted"]["bottleneck_stage"].as_u64().unwrap_or(9) as usize;
        assert_eq!(
            plan["predicted"]["bottleneck_ms"].as_f64(),
            predicted.get(bottleneck).and_then(|p| p["request_ms"].as_f64()),
            "{plan}"
        );
    }
    // Both devices are `flex` here: one profile, measured once and then read from the cache.
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, 1, "one cached profile per (device, model, dtype)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--tensor-parallel-size auto` over four flex devices: the GPT-2 fixture's two layers cannot
/// fill four one-device stages, so the planner picks a degree of 2 or 4 (timed on the groups),
/// and the text is one device's.
#[test]
fn auto_tensor_parallel_degree_generates_what_one_device_does() {
    let dir = profile_dir("tp");
    let single = text(&cli(&["--device", "flex"]).unwrap());
    let out = cli(&[
        "--devices",
        "flex,flex,flex,flex",
        "--stage-layers",
        "auto",
        "--tensor-parallel-size",
        "auto",
        "--stage-profile-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(text(&out), single);
    assert!(out.contains("tensor-parallel") && out.contains("auto stages"), "{out}");
    let err = cli(&["--devices", "flex,flex", "--tensor-parallel-size", "auto"]).unwrap_err();
    assert!(err.contains("--stage-layers auto"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn auto_stages_refuse_memory_that_cannot_hold_the_model() {
    let dir = profile_dir("caps");
    let dir_arg = dir.to_str().unwrap();
    let auto = ["--stage-layers", "auto", "--stage-profile-dir", dir_arg];
    // A device that cannot hold one layer: named, with what it needs and the flag that fixes it.
    let err = cli(&[&["--devices", "flex,flex", "--device-memory", "1KiB,1GiB"][..], &auto].concat()).unwrap_err();
    assert!(err.contains("device 0 (`flex`)") && err.contains("--device-memory"), "{err}");
    // One device whose cap holds a layer with the embeddings and head, but not the whole model.
    let profile = cached_profile(&dir);
    let spec = DecoderSpec::from_dir(&fixture("gpt2")).unwrap();
    let number = |v: &serde_json::Value| v.as_u64().unwrap();
    let layer = number(&profile["weight_bytes_per_layer"])
        + number(&profile["kv_bytes_per_token_per_layer"]) * spec.max_positions as u64;
    let extras = number(&profile["embedding"]["weight_bytes"]) + number(&profile["lm_head"]["weight_bytes"]);
    let cap = (extras + layer).to_string();
    let err = cli(&[&["--devices", "flex", "--device-memory", &cap][..], &auto].concat()).unwrap_err();
    assert!(err.contains("add up to") && err.contains("add devices"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn auto_stages_flags_that_do_not_combine_are_errors() {
    let err = cli(&["--devices", "flex,flex", "--device-memory", "1GiB,1GiB"]).unwrap_err();
    assert!(err.contains("--device-memory") && err.contains("--stage-layers auto"), "{err}");
    let err = cli(&["--devices", "flex,flex", "--stage-layers", "auto", "--pipeline-parallel-size", "3"]).unwrap_err();
    assert!(err.contains("--pipeline-parallel-size"), "{err}");
    let err = cli(&["--devices", "flex,flex", "--stage-layers", "auto", "--device-memory", "1GiB"]).unwrap_err();
    assert!(err.contains("1 sizes for 2 devices"), "{err}");
    let err = cli(&["--devices", "flex,flex,flex,flex", "--stage-layers", "auto", "--tensor-parallel-size", "2"])
        .unwrap_err();
    assert!(err.contains("--tensor-parallel-size") && err.contains("auto"), "{err}");
}

#[cfg(feature = "remote")]
mod remote {
    use burn_llm::EngineSpec;
    use burn_llm::models::PretrainedFiles;
    use burn_llm::spec::profile_stage_device;

    use super::*;
    use crate::remote::{TOKEN, Worker};

    /// A local flex stage beside a worker limited to one thread: the same text as one device.
    #[test]
    fn auto_stages_over_flex_and_a_one_thread_worker_equal_one_device() {
        let dir = profile_dir("worker");
        let worker = Worker::start_with("flex", &["--threads", "1"]);
        let single = text(&cli(&["--device", "flex"]).unwrap());
        let devices = format!("flex,{}", worker.url);
        let out = cli(&[
            "--devices",
            &devices,
            "--stage-layers",
            "auto",
            "--stage-profile-dir",
            dir.to_str().unwrap(),
            "--worker-token",
            TOKEN,
        ])
        .unwrap();
        assert_eq!(text(&out), single);
        assert!(out.contains("auto stages"), "{out}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A worker killed before it is profiled: an error naming it, not a panic or a hang.
    #[test]
    fn a_worker_that_dies_while_profiled_is_an_error_naming_it() {
        let dir = profile_dir("dead-worker");
        let worker = Worker::start_with("flex", &["--threads", "1"]);
        let device = worker.device();
        worker.signal("-KILL");
        let model = fixture("gpt2");
        let files = PretrainedFiles::open(&model).unwrap();
        let mut spec = EngineSpec::default();
        spec.parallel.stage_profile_dir = Some(dir.clone());
        spec.parallel.worker_timeout_s = Some(20.0);
        let grid = burn_llm::parallel::profiler::ProfileGrid::stages();
        let err = profile_stage_device(&spec, &model, &files, &worker.url, &device, &grid, None, None, &mut Vec::new())
            .expect_err("profiling a dead worker must fail")
            .to_string();
        assert!(err.contains(&worker.url) && err.contains("profiled"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `--worker-timeout-s` bounds each profiling point, not the whole profile: a profile that
    /// takes several timeouts in all, each point well within one, is profiled, not reported
    /// stalled. The first points are slowed by the progress hook (0.6 × the timeout each, inside
    /// the window of the point after), so that the whole outlasts the timeout on any host.
    #[test]
    fn a_profile_longer_than_the_worker_timeout_is_not_a_stall() {
        const TIMEOUT_S: f64 = 3.0;
        const SLOWED: usize = 4;
        let worker = Worker::start_with("flex", &["--threads", "1"]);
        let device = worker.device();
        let model = fixture("gpt2");
        let files = PretrainedFiles::open(&model).unwrap();
        let dir = profile_dir("long-profile");
        let mut spec = EngineSpec::default();
        spec.parallel.stage_profile_dir = Some(dir.clone());
        spec.parallel.worker_timeout_s = Some(TIMEOUT_S);
        let points = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = points.clone();
        let progress: burn_llm::spec::SendProgress = Box::new(move |_| {
            if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < SLOWED {
                std::thread::sleep(std::time::Duration::from_secs_f64(0.6 * TIMEOUT_S));
            }
        });
        let started = std::time::Instant::now();
        let result = profile_stage_device(
            &spec,
            &model,
            &files,
            &worker.url,
            &device,
            &burn_llm::parallel::profiler::ProfileGrid::stages(),
            None,
            Some(progress),
            &mut Vec::new(),
        );
        let whole_s = started.elapsed().as_secs_f64();
        let _ = std::fs::remove_dir_all(&dir);
        result.unwrap_or_else(|e| panic!("a profile of {whole_s:.2}s under a {TIMEOUT_S}s timeout: {e}"));
        assert!(points.load(std::sync::atomic::Ordering::SeqCst) > SLOWED, "every slowed point was followed by more");
        assert!(whole_s > 2.0 * TIMEOUT_S, "the profile ({whole_s:.2}s) outlasts its timeout twice");
    }

    /// A worker killed (SIGKILL, a real process death) after its first profiling points, while
    /// the profiler is still measuring it: an error naming the worker and what to do, reporting
    /// the death (not a stall at the timeout), and no profile cached.
    #[test]
    fn a_worker_that_dies_partway_through_profiling_is_an_error_naming_it() {
        let dir = profile_dir("dies-mid-profile");
        let worker = Worker::start_with("flex", &["--threads", "1"]);
        let device = worker.device();
        let model = fixture("gpt2");
        let files = PretrainedFiles::open(&model).unwrap();
        let mut spec = EngineSpec::default();
        spec.parallel.stage_profile_dir = Some(dir.clone());
        spec.parallel.worker_timeout_s = Some(60.0);
        let grid = burn_llm::parallel::profiler::ProfileGrid::stages();
        let (pid, killed) = (worker.pid(), std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)));
        let seen = killed.clone();
        // Kills the worker as the third point starts: two points were measured on it.
        let progress: burn_llm::spec::SendProgress = Box::new(move |p| {
            if p.done == 2 && seen.swap(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                let status = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                assert!(status.is_ok_and(|s| s.success()), "kill -KILL {pid}");
            }
        });
        let err = profile_stage_device(
            &spec,
            &model,
            &files,
            &worker.url,
            &device,
            &grid,
            None,
            Some(progress),
            &mut Vec::new(),
        )
        .expect_err("profiling a worker that died must fail")
        .to_string();
        assert_eq!(killed.load(std::sync::atomic::Ordering::SeqCst), 1, "the worker was killed mid-profile");
        assert!(err.contains(&worker.url) && err.contains("profiled") && err.contains("check"), "{err}");
        // The death itself is reported, not a stall at the timeout.
        assert!(!err.contains("did not answer"), "{err}");
        let cached = std::fs::read_dir(&dir).map_or(0, |d| d.count());
        assert_eq!(cached, 0, "a profile cut off by the worker's death must not be cached");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Runs the CLI on `model` with `extra` flags, greedy; stdout on success, the error otherwise.
fn cli_on(model: &std::path::Path, extra: &[&str]) -> Result<String, String> {
    use burn_llm::cli::{ExampleDefaults, GenerateArgs, run_with};
    use clap::Parser;
    const DEFAULTS: ExampleDefaults = ExampleDefaults {
        name: "test_generate",
        model: "HuggingFaceTB/SmolLM2-135M-Instruct",
        engine: burn_llm::cli::EngineKind::Plain,
        fallback: None,
    };
    let mut argv = vec!["x", "--model", model.to_str().unwrap(), "--prompt", "The capital of France is"];
    argv.extend_from_slice(&["--max-new-tokens", "8", "--exact-matmul"]);
    argv.extend_from_slice(extra);
    let args = GenerateArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with(&args, DEFAULTS, &mut out, &mut log).map_err(|e| e.to_string())?;
    Ok(String::from_utf8(out).unwrap())
}

/// SmolLM2 (30 layers, Q4_1 blocks) on planned stages over two flex devices, with
/// `--exact-matmul`: the same greedy text as one device.
#[test]
fn smollm2_auto_stages_equal_one_device_with_exact_matmul() {
    let model = burn_llm::models::pypi::SMOLLM2_GGUF.cached_path();
    assert!(model.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", model.display());
    let dir = profile_dir("smollm2");
    let single = text(&cli_on(&model, &["--device", "flex"]).unwrap());
    let out = cli_on(
        &model,
        &["--devices", "flex,flex", "--stage-layers", "auto", "--stage-profile-dir", dir.to_str().unwrap()],
    )
    .unwrap();
    assert_eq!(text(&out), single);
    assert!(out.contains("auto stages"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
