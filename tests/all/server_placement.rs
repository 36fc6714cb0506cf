//! `serve --placement`: models placed on groups of the `--devices` pool by hand (`manual:`), by
//! AlpaServe's planner on start-up profiles (`auto`) and as whole replicas (`replicate`); each
//! model answering as the CLI does wherever it runs; the placement and its predicted SLO
//! attainment on `/health`; bad placements and workloads as errors before anything loads; a
//! worker dying under one group while the other group keeps serving.

use std::path::PathBuf;

use burn_llm_server::launch::ServeArgs;
use serde_json::{Value, json};

use crate::common::fixture;
use crate::loopback_client;
use crate::server::{Running, cli_json, post};

const PROMPT: &str = "Hello, my name is";

fn path(name: &str) -> String {
    fixture(name).to_str().unwrap().to_string()
}

/// A scratch directory of this test (profiles, workload files).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-llm-placement-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `body` as the workload file of scratch directory `dir`; returns its path.
fn workload_file(dir: &std::path::Path, body: Value) -> String {
    let path = dir.join("workload.json");
    std::fs::write(&path, body.to_string()).unwrap();
    path.display().to_string()
}

/// `serve` flags for both fixtures as `gpt2` and `llama`, with `extra`.
fn argv(extra: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> =
        ["serve", "--model", &path("gpt2"), "--model", &path("llama"), "--kv-cache-memory", "blocks:32"]
            .map(String::from)
            .to_vec();
    argv.extend(extra.iter().map(|s| s.to_string()));
    argv
}

/// Starts the server these flags describe, as the `serve` example does.
fn start(argv: &[String]) -> Running {
    let args = ServeArgs::try_parse_from(argv).unwrap();
    let server = args.start_server(args.server_config().unwrap(), &mut std::io::sink()).unwrap();
    Running::serve(server)
}

/// The error starting these flags gives (nothing is served).
fn start_error(argv: &[String]) -> String {
    let args = match ServeArgs::try_parse_from(argv) {
        Ok(args) => args,
        Err(e) => return e.to_string(),
    };
    match args.start_server(args.server_config().unwrap(), &mut std::io::sink()) {
        Ok(_) => panic!("{argv:?} started"),
        Err(e) => e.to_string(),
    }
}

fn greedy(model: &str) -> Value {
    json!({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
}

/// Each model's greedy text equals the CLI's on the same fixture.
fn answers_as_the_cli(server: &Running) -> Value {
    let cli = |m: &str| cli_json(&fixture(m), &["--prompt", PROMPT]);
    let expected = [("gpt2", cli("gpt2")), ("llama", cli("llama"))];
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        for (name, cli) in &expected {
            // Two at once, so that a model with replicas runs one on each.
            let body = greedy(name);
            let (a, b) = tokio::join!(post(&client, &url, &body, None), post(&client, &url, &body, None));
            for (status, r) in [a, b] {
                assert_eq!(status, 200, "{name}: {r}");
                assert_eq!(r["choices"][0]["text"], cli["requests"][0]["text"], "{name}");
            }
        }
        let health = client.get(server.url("/health")).send().await.unwrap();
        assert_eq!(health.status().as_u16(), 200);
        health.json::<Value>().await.unwrap()
    })
}

/// The models `/health` shows on each group.
fn group_models(health: &Value) -> Vec<Vec<String>> {
    health["placement"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["models"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap().to_string()).collect())
        .collect()
}

#[test]
fn a_manual_placement_runs_each_model_on_its_group_as_the_cli_does() {
    let dir = scratch("manual");
    let profiles = dir.join("profiles").display().to_string();
    let server = start(&argv(&[
        "--devices",
        "flex,flex",
        "--stage-profile-dir",
        &profiles,
        "--placement",
        "manual:gpt2=0,1;llama=1|0",
    ]));
    let health = answers_as_the_cli(&server);
    let placement = &health["placement"];
    assert_eq!(placement["mode"], "manual");
    assert_eq!(group_models(&health), [vec!["gpt2"], vec!["llama"], vec!["llama"]]);
    // gpt2 is a two-stage pipeline (one layer per device); llama has a replica on each device.
    assert_eq!(placement["groups"][0]["pipeline_stages"], 2);
    assert_eq!(placement["groups"][0]["models"][0]["stages"], json!([[0, 1], [1, 2]]));
    assert!(placement.get("predicted_slo_attainment").is_none(), "no workload, no prediction");
    assert_eq!(server_replicas(&server, "llama"), 2);
    server.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Replicas of `model` (from the start-up line's count in `/v1/models`' order).
fn server_replicas(server: &Running, model: &str) -> usize {
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let health = client.get(server.url("/health")).send().await.unwrap().json::<Value>().await.unwrap();
        health["placement"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["models"].as_array().unwrap().iter().any(|m| m["model"] == model))
            .count()
    })
}

#[test]
fn auto_and_replicate_plan_on_profiles_and_predict_the_workload() {
    let dir = scratch("auto");
    let workload = workload_file(
        &dir,
        json!({"duration_s": 30, "seed": 1, "models": [
            {"model": "gpt2", "rate": 2, "cv": 3, "slo_s": 5, "prompt_tokens": 8, "max_tokens": 8},
            {"model": "llama", "rate": 1, "cv": 1, "slo_s": 5}]}),
    );
    let profiles = dir.join("profiles").display().to_string();
    let profiles = profiles.as_str();
    for mode in ["auto", "replicate"] {
        let server = start(&argv(&[
            "--devices",
            "flex,flex",
            "--placement",
            mode,
            "--workload",
            &workload,
            "--stage-profile-dir",
            profiles,
        ]));
        let health = answers_as_the_cli(&server);
        let placement = &health["placement"];
        assert_eq!(placement["mode"], mode);
        let predicted = placement["predicted_slo_attainment"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&predicted), "{placement}");
        let per_model = placement["predicted_models"].as_array().unwrap();
        assert_eq!(per_model.len(), 2, "{placement}");
        assert!(per_model.iter().all(|m| m["requests"].as_u64().unwrap() > 0), "{placement}");
        // Two devices: how much they slow each other down was measured and priced.
        let kappa = placement["interference"].as_f64().unwrap();
        assert!(kappa.is_finite() && kappa >= 0.0, "{placement}");
        let groups = group_models(&health);
        for name in ["gpt2", "llama"] {
            assert!(groups.iter().any(|g| g.iter().any(|m| m == name)), "{name} is placed: {placement}");
        }
        // Each model with traffic was timed on one device, which prices the one-device groups;
        // `auto` may pipeline, so each was also timed running as a two-stage pipeline, which
        // prices the two-stage groups; replication has none to price.
        let measured = placement["measured_pipelines"].as_array().cloned().unwrap_or_default();
        let timed = |stages: u64| measured.iter().filter(|m| m["pipeline"]["stages"] == stages).count();
        for m in &measured {
            let p = &m["pipeline"];
            assert!(p["latency_ms"].as_f64().unwrap() > 0.0 && p["interval_ms"].as_f64().unwrap() >= 0.0);
        }
        assert_eq!(timed(1), 2, "{placement}");
        if mode == "replicate" {
            let one_device = placement["groups"].as_array().unwrap().iter().all(|g| g["pipeline_stages"] == 1);
            assert!(one_device, "replication has no model parallelism: {placement}");
            assert_eq!(measured.len(), 2, "{placement}");
        } else {
            assert_eq!((timed(2), measured.len()), (2, 4), "{placement}");
        }
        server.shutdown();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_placements_and_workloads_are_clear_errors_before_serving() {
    let dir = scratch("bad");
    let write = |name: &str, body: Value| {
        let path = dir.join(name);
        std::fs::write(&path, body.to_string()).unwrap();
        path.display().to_string()
    };
    let unknown = write("unknown.json", json!({"models": [{"model": "gpt9", "rate": 1, "cv": 1, "slo_s": 1}]}));
    let negative = write("negative.json", json!({"models": [{"model": "gpt2", "rate": -1, "cv": 1, "slo_s": 1}]}));
    let negative_cv = write("cv.json", json!({"models": [{"model": "gpt2", "rate": 1, "cv": -2, "slo_s": 1}]}));
    let garbled = write("garbled.json", json!({"models": [{"model": "gpt2", "rate": "fast"}]}));
    let profiles = dir.join("profiles").display().to_string();
    let pool = ["--devices", "flex,flex", "--stage-profile-dir", &profiles];
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (vec!["--devices", "flex,flex", "--placement", "manual:gpt2=0;llama"], &["--placement manual", "no `=`"]),
        (vec!["--devices", "flex,flex", "--placement", "manual:gpt2=0"], &["does not place `llama`"]),
        (vec!["--devices", "flex,flex", "--placement", "manual:gpt2=0;llama=2"], &["device 2", "lists 2"]),
        (vec!["--devices", "flex,flex", "--placement", "manual:gpt2=0;llama=1;opt=0"], &["`opt`, which is not served"]),
        (vec!["--placement", "auto", "--device", "flex"], &["--devices pool"]),
        (vec!["--devices", "flex,flex", "--placement", "auto"], &["needs --workload"]),
        (vec!["--device", "flex", "--workload", &unknown], &["--workload is read by --placement"]),
        (
            [&pool[..], &["--placement", "auto", "--workload", &unknown]].concat(),
            &["`gpt9` is not served", "`gpt2`, `llama`"],
        ),
        ([&pool[..], &["--placement", "auto", "--workload", &negative]].concat(), &["models[0].rate", "-1"]),
        ([&pool[..], &["--placement", "auto", "--workload", &negative_cv]].concat(), &["models[0].cv", "-2"]),
        ([&pool[..], &["--placement", "auto", "--workload", &garbled]].concat(), &["--workload", "rate"]),
        (
            [&pool[..], &["--placement", "replicate", "--model-engine-args", "llama=--stage-layers 0-0,1-1"]].concat(),
            &["model `llama`", "--stage-layers conflicts with --placement"],
        ),
        (
            [&pool[..], &["--placement", "replicate", "--device-memory", "2000,2000"]].concat(),
            &["fits on no device group", "--device-memory"],
        ),
        (
            [&pool[..], &["--placement", "manual:gpt2=0;llama=0", "--device-memory", "2000,2000"]].concat(),
            &["device 0 (flex)", "more than its 2000 bytes"],
        ),
        (
            [&pool[..], &["--placement", "replicate", "--device-memory", "1GiB"]].concat(),
            &["1 sizes for the 2 --devices"],
        ),
    ];
    for (extra, words) in cases {
        let err = start_error(&argv(&extra));
        for w in words {
            assert!(err.contains(w), "{extra:?}: `{w}` not in: {err}");
        }
    }
    for extra in
        [&["--admission", "slo"][..], &[&pool[..], &["--placement", "replicate", "--admission", "slo"]].concat()]
    {
        let err = start_error(&argv(extra));
        assert!(err.contains("--admission slo") && err.contains("add --placement and --workload"), "{err}");
    }
    let err = start_error(&argv(&["--admission", "late"]));
    assert!(err.contains("'late'") && err.contains("all") && err.contains("slo"), "{err}");
    let err = start_error(&argv(&["--placement", "spread"]));
    assert!(err.contains("auto, replicate or manual"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--admission slo`: a model whose SLO no request can meet has every request rejected at arrival
/// (503 `slo_unattainable`, counted per model), predicted so at start-up, while a model whose SLO
/// every request meets serves as the CLI does.
#[test]
fn slo_admission_rejects_at_arrival_what_the_placement_predicts_late() {
    let dir = scratch("admission");
    let workload = workload_file(
        &dir,
        json!({"duration_s": 10, "seed": 2, "models": [
            {"model": "gpt2", "rate": 2, "cv": 1, "slo_s": 1e-6, "prompt_tokens": 8, "max_tokens": 8},
            {"model": "llama", "rate": 2, "cv": 1, "slo_s": 1e6, "prompt_tokens": 8, "max_tokens": 8}]}),
    );
    let profiles = dir.join("profiles").display().to_string();
    let server = start(&argv(&[
        "--devices",
        "flex,flex",
        "--placement",
        "replicate",
        "--workload",
        &workload,
        "--stage-profile-dir",
        &profiles,
        "--admission",
        "slo",
    ]));
    let cli = cli_json(&fixture("llama"), &["--prompt", PROMPT]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        for _ in 0..3 {
            let (status, body) = post(&client, &url, &greedy("gpt2"), None).await;
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["error"]["code"], "slo_unattainable", "{body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("model `gpt2`") && message.contains("past its SLO"), "{message}");
            let (status, body) = post(&client, &url, &greedy("llama"), None).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["choices"][0]["text"], cli["requests"][0]["text"]);
        }
        let health = client.get(server.url("/health")).send().await.unwrap().json::<Value>().await.unwrap();
        let placement = &health["placement"];
        assert_eq!(placement["admission"], "slo", "{placement}");
        // The prediction rejects gpt2's requests too, and serves llama's within their SLO.
        let per_model = placement["predicted_models"].as_array().unwrap();
        let attained = |m: &str| per_model.iter().find(|p| p["model"] == m).unwrap()["slo_attainment"].as_f64();
        assert_eq!((attained("gpt2"), attained("llama")), (Some(0.0), Some(1.0)), "{placement}");
        let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("burn_llm:requests_rejected_slo_total{model=\"gpt2\"} 3"), "{metrics}");
        assert!(metrics.contains("burn_llm:requests_rejected_slo_total{model=\"llama\"} 0"), "{metrics}");
    });
    server.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two real workers, one model on each: killing one worker fails its model's requests naming the
/// model and the worker, and the other group keeps serving.
#[cfg(feature = "remote")]
#[test]
fn a_dead_worker_under_one_group_leaves_the_other_group_serving() {
    use crate::remote::{TOKEN, Worker};
    let (w0, w1) = (Worker::start_with("flex", &["--threads", "1"]), Worker::start_with("flex", &["--threads", "1"]));
    let pool = format!("{},{}", w0.url, w1.url);
    let server = start(&argv(&[
        "--devices",
        &pool,
        "--worker-token",
        TOKEN,
        "--worker-timeout-s",
        "20",
        "--placement",
        "manual:gpt2=0;llama=1",
    ]));
    let health = answers_as_the_cli(&server);
    assert_eq!(health["placement"]["groups"][1]["devices"], json!([w1.url]));
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let (_, before) = post(&client, &url, &greedy("gpt2"), None).await;
        w1.signal("-KILL");
        let (status, r) = post(&client, &url, &greedy("llama"), None).await;
        assert!(status == 500 || status == 503, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains("model `llama`") && message.contains(&w1.url), "{message}");
        let (status, r) = post(&client, &url, &greedy("gpt2"), None).await;
        assert_eq!((status, &r["choices"][0]["text"]), (200, &before["choices"][0]["text"]), "{r}");
        let health = client.get(server.url("/health")).send().await.unwrap().json::<Value>().await.unwrap();
        assert_eq!(health["models"]["gpt2"], "ok", "{health}");
    });
    server.shutdown();
}

/// `serve` of the gpt2 fixture over `flex,flex` with a KV pool of `kv`, a workload of 8-token
/// prompts generating 4 tokens, and `extra` flags.
fn gpt2_args(dir: &std::path::Path, kv: &str, extra: &[&str]) -> ServeArgs {
    let workload = workload_file(
        dir,
        json!({"duration_s": 10, "seed": 1, "models": [
            {"model": "gpt2", "rate": 1, "cv": 1, "slo_s": 5, "prompt_tokens": 8, "max_tokens": 4}]}),
    );
    let profiles = dir.join("profiles").display().to_string();
    let argv: Vec<String> = ["serve", "--model", &path("gpt2"), "--kv-cache-memory", kv]
        .into_iter()
        .chain(["--devices", "flex,flex", "--workload", &workload, "--stage-profile-dir", &profiles])
        .chain(extra.iter().copied())
        .map(String::from)
        .collect();
    ServeArgs::try_parse_from(&argv).unwrap()
}

/// The placement of `gpt2` alone under `extra` flags, with a workload of 8-token prompts, profiles
/// kept in `dir`: the start-up log and the placement.
fn placed_gpt2(dir: &std::path::Path, extra: &[&str]) -> (String, burn_llm_server::placement::ServingPlacement) {
    let args = gpt2_args(dir, "blocks:32", extra);
    let mut log = Vec::new();
    let (_, placement) = args.placed_entries(&mut log).unwrap();
    (String::from_utf8_lossy(&log).into_owned(), placement.unwrap())
}

/// A KV pool that holds the workload's prompt but not its tokens cuts the timed requests short: the
/// placement refuses to price on them, naming the pool, instead of timing less work than it serves.
#[test]
fn a_kv_pool_too_small_for_the_workloads_requests_is_an_error_not_a_fast_timing() {
    let dir = scratch("short");
    // 8 prompt tokens fill both blocks of 4; the first generated token finds none left.
    let args = gpt2_args(&dir, "blocks:2", &["--block-size", "4", "--placement", "replicate"]);
    let err = match args.placed_entries(&mut Vec::new()) {
        Ok(_) => panic!("a pool too small for the requests was placed"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("after 1 of its 4 tokens") && err.contains("--kv-cache-memory"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The devices' interference is timed as the server serves, one request on a replica on each
/// device alone and at once, where the model fits a device whole; a model that fits none falls
/// back to a pass through a few layers on each device.
#[test]
fn interference_is_timed_on_replicas_or_over_layers_when_the_model_fits_no_device() {
    let dir = scratch("interference");
    let (log, placement) = placed_gpt2(&dir, &["--placement", "replicate"]);
    assert!(log.contains("a replica on each of flex, flex: one request alone"), "{log}");
    let kappa = placement.input.as_ref().and_then(|i| i.interference).unwrap();
    assert!(kappa.is_finite() && kappa >= 0.0, "{log}");
    // Devices that hold half of the model but not all of it: the pipeline fits, a replica does not.
    let bytes: u64 = placement.input.as_ref().unwrap().models[0].layer_memory_bytes.iter().sum();
    let cap = format!("{0},{0}", bytes - 1);
    let (log, placement) = placed_gpt2(&dir, &["--placement", "manual:gpt2=0,1", "--device-memory", &cap]);
    assert!(!log.contains("a replica on each of"), "{log}");
    assert!(log.contains("over a few layers (the model fits no device whole)"), "{log}");
    assert!(placement.input.as_ref().and_then(|i| i.interference).is_some_and(|k| k >= 0.0), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model on a two-stage group prefills in the chunk size that prefilled its prompt fastest over
/// two devices at start-up, and the pipeline is timed so; a model whose flags give the chunks
/// keeps them, untried.
#[test]
fn two_stage_groups_prefill_in_the_chunks_timed_fastest_unless_the_flags_choose() {
    let dir = scratch("chunks");
    // The pipeline's steps counted in its timing: one engine, one sequence at a time.
    let one_at_a_time = ["--placement", "manual:gpt2=0,1", "--max-num-seqs", "1"];
    let timed_chunks = |placement: &burn_llm_server::placement::ServingPlacement| {
        let model = &placement.input.as_ref().unwrap().models[0];
        let pipeline = model.measured_pipelines.iter().find(|p| p.stages == 2).unwrap();
        pipeline.steps.as_ref().unwrap().prefill_chunks
    };
    let (log, placement) = placed_gpt2(&dir, &one_at_a_time);
    assert!(log.contains("`gpt2`'s prefill of 8 tokens over flex → flex: whole "), "{log}");
    let health = placement.to_json();
    match placement.chunk_tokens.as_slice() {
        [] => {
            assert!(log.contains("it prefills whole prompts on 2-stage groups"), "{log}");
            assert_eq!(timed_chunks(&placement), 1, "{log}");
            assert!(health.get("chunk_tokens").is_none(), "{health}");
        }
        [chosen] => {
            let chunk = chosen.tokens;
            assert_eq!((chosen.model.as_str(), chosen.stages), ("gpt2", 2));
            assert!(chunk < 8, "{log}");
            assert!(log.contains(&format!("it prefills in chunks of {chunk} tokens on 2-stage groups")), "{log}");
            assert!(log.contains(&format!("prefilling in chunks of {chunk} tokens")), "{log}");
            assert_eq!(timed_chunks(&placement), 8usize.div_ceil(chunk), "{log}");
            assert_eq!(health["chunk_tokens"], json!([{"model": "gpt2", "stages": 2, "tokens": chunk}]), "{health}");
        }
        other => panic!("one model placed, chunks for {other:?}"),
    }
    // Chunks given by the model's flags: nothing tried, the pipeline timed in them.
    let (log, placement) = placed_gpt2(&dir, &[&one_at_a_time[..], &["--max-num-batched-tokens", "3"]].concat());
    assert!(!log.contains("'s prefill of"), "{log}");
    assert!(placement.chunk_tokens.is_empty());
    assert_eq!(timed_chunks(&placement), 3, "{log}");
    // An engine batching 8 sequences keeps a budget of at least 8 tokens a step: an 8-token
    // prompt stays whole, untried.
    let (log, placement) = placed_gpt2(&dir, &["--placement", "manual:gpt2=0,1", "--max-num-seqs", "8"]);
    assert!(log.contains("`gpt2` prefills whole prompts of 8 tokens on 2-stage groups"), "{log}");
    assert!(log.contains("--max-num-seqs 8") && !log.contains("'s prefill of"), "{log}");
    assert!(placement.chunk_tokens.is_empty());
    // Replication has no group of several stages to choose for.
    let (log, placement) = placed_gpt2(&dir, &["--placement", "replicate"]);
    assert!(!log.contains("'s prefill of") && placement.chunk_tokens.is_empty(), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A group of three stages is timed over three devices and prefills in the chunks chosen for three
/// stages, as a two-stage group is over two; the model answers as the CLI does, in the chosen
/// chunks and in chunks its flags give.
#[test]
fn three_stage_groups_are_timed_and_chunked_over_three_devices_and_answer_as_the_cli() {
    let dir = scratch("three-stages");
    let workload = workload_file(
        &dir,
        json!({"duration_s": 10, "seed": 1, "models": [
            {"model": "gemma3", "rate": 1, "cv": 1, "slo_s": 5, "prompt_tokens": 8, "max_tokens": 4}]}),
    );
    let profiles = dir.join("profiles").display().to_string();
    let serve = |extra: &[&str]| {
        let argv: Vec<String> = ["serve", "--model", &path("gemma3"), "--kv-cache-memory", "blocks:32"]
            .into_iter()
            .chain(["--devices", "flex,flex,flex", "--workload", &workload, "--stage-profile-dir", &profiles])
            .chain(["--placement", "manual:gemma3=0,1,2", "--max-num-seqs", "1"])
            .chain(extra.iter().copied())
            .map(String::from)
            .collect();
        let args = ServeArgs::try_parse_from(&argv).unwrap();
        let mut log = Vec::new();
        let server = args.start_server(args.server_config().unwrap(), &mut log).unwrap();
        (Running::serve(server), String::from_utf8_lossy(&log).into_owned())
    };
    let cli = cli_json(&fixture("gemma3"), &["--prompt", PROMPT]);
    let answers = |server: &Running| {
        server.runtime.block_on(async {
            let client = loopback_client::client();
            let (status, r) = post(&client, &server.url("/v1/completions"), &greedy("gemma3"), None).await;
            assert_eq!(status, 200, "{r}");
            assert_eq!(r["choices"][0]["text"], cli["requests"][0]["text"]);
            client.get(server.url("/health")).send().await.unwrap().json::<Value>().await.unwrap()
        })
    };
    let (server, log) = serve(&[]);
    let health = answers(&server);
    server.shutdown();
    let placement = &health["placement"];
    assert_eq!(placement["groups"][0]["pipeline_stages"], 3, "{health}");
    assert_eq!(placement["groups"][0]["models"][0]["stages"], json!([[0, 1], [1, 2], [2, 3]]));
    // Only the group size the manual placement runs is timed.
    assert!(log.contains("`gemma3`'s prefill of 8 tokens over flex → flex → flex: whole "), "{log}");
    assert!(log.contains("`gemma3` as a pipeline over flex → flex → flex (8 prompt tokens, 4 generated)"), "{log}");
    assert!(!log.contains("over flex → flex ("), "{log}");
    let timed: Vec<&Value> =
        placement["measured_pipelines"].as_array().unwrap().iter().map(|p| &p["pipeline"]).collect();
    assert_eq!(timed.iter().map(|p| p["stages"].as_u64().unwrap()).collect::<Vec<_>>(), [3], "{health}");
    let chunks = timed[0]["steps"]["prefill_chunks"].as_u64().unwrap_or(1);
    match placement.get("chunk_tokens") {
        None => {
            assert!(log.contains("it prefills whole prompts on 3-stage groups"), "{log}");
            assert_eq!(chunks, 1, "{health}");
        }
        Some(chosen) => {
            assert_eq!(chosen[0]["model"], "gemma3");
            assert_eq!(chosen[0]["stages"], 3, "{health}");
            let tokens = chosen[0]["tokens"].as_u64().unwrap();
            assert!(log.contains(&format!("it prefills in chunks of {tokens} tokens on 3-stage groups")), "{log}");
            assert!(log.contains(&format!("as a 3-stage pipeline, prefilling in chunks of {tokens} tokens")), "{log}");
            assert_eq!(chunks, 8u64.div_ceil(tokens), "{health}");
        }
    }
    // Chunks the model's flags give follow each other through the three stages, untried.
    let (server, log) = serve(&["--max-num-batched-tokens", "2"]);
    let health = answers(&server);
    server.shutdown();
    assert!(!log.contains("'s prefill of") && health["placement"].get("chunk_tokens").is_none(), "{log}");
    assert_eq!(health["placement"]["measured_pipelines"][0]["pipeline"]["steps"]["prefill_chunks"], 4, "{health}");
    std::fs::remove_dir_all(&dir).unwrap();
}
