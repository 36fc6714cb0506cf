//! The Burn profiler on the tiny LLaMA fixture (flex, small grid): the profile has the grid's
//! shape and the model's sizes, is sane, round-trips through serde, and the planners accept it;
//! the `plan profile` command line writes it and answers bad input with a JSON error. No
//! assertion depends on absolute times.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use burn::tensor::Device;
use burn_llm_models::DecoderSpec;
use burn_parallel::profiler::{self, ProfileGrid};
use burn_plan::profile::Profile;
use burn_plan::schedule::{self, ScheduleInput};
use burn_plan::slices::{self, SlicesInput};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama")
}

/// Serialises the tests that time things, so that one profile is not measured while another
/// test loads the CPU.
static TIMING: Mutex<()> = Mutex::new(());

/// One progress report: points done, points in all, the point being measured.
type Report = (usize, usize, Option<String>);

/// The fixture's profile, measured once for every test of the binary, with the progress reports
/// it made.
fn measured_with_reports() -> &'static (Profile, Vec<Report>) {
    static PROFILE: OnceLock<(Profile, Vec<Report>)> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
        let spec = DecoderSpec::from_dir(&fixture()).unwrap();
        let grid = ProfileGrid { repeats: 5, ..ProfileGrid::small() };
        let mut reports = Vec::new();
        let mut hook = |p: profiler::ProfileProgress<'_>| reports.push((p.done, p.total, p.point.map(String::from)));
        let profile = profiler::profile(&spec, &Device::flex(), &grid, Some(&mut hook)).unwrap();
        (profile, reports)
    })
}

/// The fixture's profile, measured once for every test of the binary.
fn measured() -> &'static Profile {
    &measured_with_reports().0
}

#[test]
fn progress_is_reported_for_every_point_then_once_at_the_end() {
    let reports = &measured_with_reports().1;
    let (done, total, point) = reports.last().expect("at least the final report");
    assert_eq!((done, point), (total, &None), "the final report says every point is done");
    let starts: Vec<_> = reports[..reports.len() - 1].iter().collect();
    assert_eq!(starts.len(), *total, "one report as each point starts");
    for (i, (done, _, point)) in starts.iter().enumerate() {
        assert_eq!(*done, i, "points done before point {i}");
        assert!(point.is_some());
    }
}

#[test]
fn profile_has_the_grid_shape_and_the_model_sizes() {
    let p = measured();
    let grid = ProfileGrid::small();
    let axis = |v: &[usize]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    assert_eq!(p.version, burn_plan::profile::PROFILE_VERSION);
    assert_eq!(p.layers, 2);
    assert_eq!(p.prefill.batch, axis(&grid.prefill_batch));
    assert_eq!(p.prefill.tokens, axis(&grid.prefill_tokens));
    assert_eq!(p.decode.batch, axis(&grid.decode_batch));
    // The fixture has 128 positions: every decode context of the small grid fits.
    assert_eq!(p.decode.context, axis(&grid.decode_context));
    let shape = |t: &[Vec<f64>]| t.iter().map(Vec::len).collect::<Vec<_>>();
    let rows = |n: usize, width: usize| vec![width; n];
    let (prefill, decode) = (&grid.prefill_batch, &grid.decode_batch);
    assert_eq!(shape(&p.prefill.base_ms), rows(prefill.len(), grid.prefill_tokens.len()));
    assert_eq!(shape(&p.decode.ms), rows(decode.len(), grid.decode_context.len()));
    // hidden 64, 4 heads × 16, 2 KV heads, MLP 128 (gated), vocab 384, untied head; f32.
    let projections = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3;
    assert_eq!(p.weight_bytes_per_layer, projections * 4);
    assert_eq!(p.kv_bytes_per_token_per_layer, 2 * 2 * 16 * 4);
    assert_eq!(p.embedding.weight_bytes, 384 * 64 * 4);
    assert_eq!(p.lm_head.weight_bytes, 384 * 64 * 4);
    assert!(p.tensor_parallel.is_empty());
    p.cost_model("profile").unwrap();
}

#[test]
fn profile_times_are_positive_and_more_work_is_never_much_cheaper() {
    let p = measured();
    let times = p.prefill.base_ms.iter().chain(&p.decode.ms).flatten();
    for &t in times.chain([&p.embedding.ms_per_token, &p.lm_head.ms_per_token]) {
        assert!(t.is_finite() && t >= 0.0, "{t}");
    }
    assert!(p.prefill.base_ms.iter().flatten().all(|&t| t > 0.0));
    assert!(p.prefill.context_ms.iter().all(|&a| a.is_finite() && a >= 0.0));
    // 32 tokens against 1, batch 4 with 96 tokens of context against batch 1 with none: far more
    // work, so never less than half the time, however noisy the machine.
    for row in &p.prefill.base_ms {
        assert!(row[row.len() - 1] >= 0.5 * row[0], "{row:?}");
    }
    let (first, last) = (&p.decode.ms[0], &p.decode.ms[p.decode.ms.len() - 1]);
    assert!(last[last.len() - 1] >= 0.5 * first[0], "{:?}", p.decode.ms);
}

/// Same JSON tree, numbers equal to the last bit or two (serde_json's default float parsing may
/// be one ulp off).
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-14 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn profile_round_trips_through_serde() {
    let p = measured();
    let text = serde_json::to_string(p).unwrap();
    let back: Profile = serde_json::from_str(&text).unwrap();
    let (a, b) = (serde_json::to_value(p).unwrap(), serde_json::to_value(&back).unwrap());
    assert!(same_json(&a, &b), "{a}\n{b}");
    assert_eq!(back.prefill.batch, p.prefill.batch);
    assert_eq!(back.weight_bytes_per_layer, p.weight_bytes_per_layer);
}

#[test]
fn profile_feeds_the_slices_and_schedule_planners() {
    let p = measured();
    let sliced =
        slices::plan(&SlicesInput { seq_len: 64, stages: 2, profile: Some(p.clone()), ..SlicesInput::default() })
            .unwrap();
    assert_eq!(sliced.slices.iter().sum::<usize>(), 64);
    assert!(sliced.latency_ms > 0.0);
    let input: ScheduleInput = serde_json::from_value(serde_json::json!({
        "profile": p,
        "input_lengths": {"truncated_normal": {"mean": 32, "std": 8, "max": 64, "count": 50, "seed": 1}},
        "output_lengths": {"truncated_normal": {"mean": 16, "std": 4, "max": 32, "count": 50, "seed": 2}},
        "devices": 1,
        "device_memory_bytes": 1_000_000_000u64,
        "latency_bound_s": 1000.0,
        "max_encode_batch": 8,
    }))
    .unwrap();
    let planned = schedule::plan(&input).unwrap();
    let planned = serde_json::to_value(planned).unwrap();
    assert!(planned["throughput_qps"].as_f64().unwrap() > 0.0, "{planned}");
}

fn run_cli(args: &[&str]) -> (serde_json::Value, i32) {
    run_cli_with(args, None)
}

fn run_cli_with(args: &[&str], engine: Option<profiler::cli::EngineTimer<'_>>) -> (serde_json::Value, i32) {
    let argv = ["plan", "profile"].iter().chain(args).map(|s| s.to_string());
    let device = |name: &str| match name {
        "flex" => Ok(Device::flex()),
        other => Err(format!("unknown device `{other}`")),
    };
    let (text, code) = profiler::cli::run_with_engine(argv, device, engine, None);
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (json, code)
}

/// `plan profile` with an engine timer (the `plan` example passes the paged engine's) writes
/// the timed steps as `engine_step_ms` tables and fits `engine_step` to them, handing the timer
/// the model's shape and the grid; `--no-engine-step` leaves both out, and a failing timer is a
/// JSON error.
#[test]
fn profile_cli_records_the_engine_timer_steps() {
    use burn_parallel::profiler::EngineStepGrid;
    use burn_parallel::profiler::fit::{StepKind, StepSample};

    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("burn-parallel-profile-engine-{}.json", std::process::id()));
    let out_arg = out.to_str().unwrap();
    let model = fixture();
    let model = model.to_str().unwrap();
    // A step that jumps from batch 1 to batch 2 (as a CPU matmul switching kernels does).
    let timer: profiler::cli::EngineTimer<'_> =
        Box::new(move |spec: &DecoderSpec, _: &Device, grid: &EngineStepGrid| {
            assert_eq!(spec.num_layers, 2);
            assert_eq!(grid, &EngineStepGrid::small());
            let mut samples = Vec::new();
            for &batch in &grid.batch {
                for &tokens in &grid.prompt_tokens {
                    let jump = if batch > 1 { 60.0 } else { 0.0 };
                    let ms = 100.0 + jump + (batch * tokens) as f64;
                    samples.push(StepSample { kind: StepKind::Prefill, batch, tokens, context: 0, ms, run: 0 });
                    let ms = 30.0 + jump + batch as f64;
                    samples.push(StepSample {
                        kind: StepKind::Decode,
                        batch,
                        tokens: 1,
                        context: tokens + 1,
                        ms,
                        run: 0,
                    });
                }
            }
            Ok(samples)
        });
    let (json, code) = run_cli_with(&["--model", model, "--device", "flex", "--out", out_arg, "--quiet"], Some(timer));
    assert_eq!(code, 0, "{json}");
    let written: Profile = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let table = written.engine_step_ms.clone().expect("engine_step_ms");
    assert_eq!((table.decode.batch, table.decode.context), (vec![1.0, 2.0, 4.0], vec![9.0, 33.0]));
    assert_eq!(table.decode.ms, vec![vec![31.0, 31.0], vec![92.0, 92.0], vec![94.0, 94.0]]);
    assert_eq!(table.prefill.tokens, vec![8.0, 32.0]);
    assert_eq!(table.prefill.ms[1], vec![176.0, 224.0]);
    assert!(written.engine_step.is_some());
    // The planner reads the measured steps as they are: batch 2 costs three times batch 1.
    let cost = written.cost_model("profile").unwrap();
    assert!((cost.decode_step_ms(1.0, 9.0) - 31.0).abs() < 1e-9);
    assert!((cost.decode_step_ms(2.0, 9.0) - 92.0).abs() < 1e-9);
    assert!((cost.decode_step_ms(3.0, 21.0) - 93.0).abs() < 1e-9);

    let unused: profiler::cli::EngineTimer<'_> =
        Box::new(|_: &DecoderSpec, _: &Device, _: &EngineStepGrid| Err("must not run".into()));
    let args = ["--model", model, "--device", "flex", "--out", out_arg, "--quiet", "--no-engine-step"];
    let (json, code) = run_cli_with(&args, Some(unused));
    assert_eq!(code, 0, "{json}");
    let written: Profile = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((written.engine_step, written.engine_step_ms), (None, None));
    let _ = std::fs::remove_file(&out);

    let failing: profiler::cli::EngineTimer<'_> =
        Box::new(|_: &DecoderSpec, _: &Device, _: &EngineStepGrid| Err("the engine broke".into()));
    let (json, code) =
        run_cli_with(&["--model", model, "--device", "flex", "--out", out_arg, "--quiet"], Some(failing));
    assert_eq!(code, 2, "{json}");
    assert!(json["error"].as_str().is_some_and(|e| e.contains("the engine broke")), "{json}");
    assert!(!out.exists());
}

#[test]
fn profile_cli_writes_the_profile_and_rejects_bad_input_with_exit_2() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("burn-parallel-profile-{}.json", std::process::id()));
    let out_arg = out.to_str().unwrap();
    let model = fixture();
    let model = model.to_str().unwrap();
    let (json, code) = run_cli(&["--model", model, "--device", "flex", "--out", out_arg, "--quiet"]);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["layers"], 2);
    let written: Profile = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(written.model.as_deref(), Some("llama"));
    assert_eq!(written.device.as_deref(), Some("flex"));
    written.cost_model("profile").unwrap();

    let bad: [&[&str]; 5] = [
        &["--model", "/nonexistent/model", "--device", "flex", "--out", out_arg],
        &["--model", model, "--device", "tpu", "--out", out_arg],
        &["--synthetic", "gpt5", "--device", "flex", "--out", out_arg],
        &["--device", "flex", "--out", out_arg],
        &["--model", model, "--device", "flex", "--out", out_arg, "--grid", "huge"],
    ];
    for args in bad {
        let (json, code) = run_cli(args);
        assert_eq!(code, 2, "{args:?}: {json}");
        assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{json}");
    }
    assert!(!out.exists());
}
