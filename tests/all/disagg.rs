//! ExeGPT's WAA over two devices ([`DisaggEngine`]): prefill on one device, decode on another,
//! each request's KV blocks moved between their pools. Greedy outputs equal plain generation's
//! with a roomy decode pool and with pools so small that the decode device preempts by swapping
//! and by recomputation; a decode device without room makes arrivals wait and loses nothing; the
//! planner's WAA and two-stage RRA plans run through `--schedule exegpt --devices a,b`.

use burn::tensor::Device;
use burn_llm::Generator;
use burn_llm::cli::{ExampleDefaults, GenerateArgs, run_with};
use burn_llm::models::{Pretrained, Prompt, SamplingParams};
use burn_llm::paged::{DisaggConfig, DisaggEngine, EngineConfig, PagedError, PreemptionMode};
use burn_llm::spec::EngineKind;
use clap::Parser;

use crate::common::{FIXTURES, fixture};
use crate::paged::{config, mixed_prompts, one_by_one, pools};
use crate::remote::{TOKEN, Worker};

/// A WAA engine for fixture `name` with both replicas on Flex (two devices of one backend: the
/// hand-off's `to_device` is then a copy between two pools, its bookkeeping the same).
fn waa(name: &str, config: DisaggConfig) -> DisaggEngine<burn_llm::CausalLm> {
    let load = || Pretrained::load(&fixture(name), &Device::flex()).unwrap();
    DisaggEngine::new(load(), load(), config).unwrap()
}

/// A roomy prefill pool with `decode` on the decode device, `B_E = 3`, `B_D = 16`.
fn split(decode: EngineConfig) -> DisaggConfig {
    split_with(decode, 3)
}

/// [`split`] with `B_E = encode_batch`.
fn split_with(decode: EngineConfig, encode_batch: usize) -> DisaggConfig {
    let roomy = config(256, decode.block_size, PreemptionMode::Auto).kv_cache_memory;
    let DisaggConfig { prefill, decode } = DisaggConfig::waa(decode, encode_batch, 16);
    DisaggConfig { prefill: EngineConfig { kv_cache_memory: roomy, ..prefill }, decode }
}

#[test]
fn waa_greedy_equals_plain_generation_with_and_without_preemption() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(14) };
    for name in FIXTURES {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = one_by_one(&plain, &prompts, &params);
        for (label, cfg) in pools(&prompts, &expected) {
            let what = format!("{name}, {label} decode pool");
            let mut engine = waa(name, split(cfg));
            let out = engine.generate(&prompts, &params).unwrap();
            let got: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
            assert_eq!(got, expected, "{what}");
            let stats = engine.stats();
            match label {
                "swap" => assert!(stats.swaps > 0, "{what}: no swap happened"),
                "recompute" => assert!(stats.recomputes > 0, "{what}: no recomputation happened"),
                _ => assert_eq!(stats.swaps + stats.recomputes, 0, "{what}"),
            }
            // Every request generates 14 tokens, so every one moved to the decode device.
            assert_eq!(stats.kv_transfers, prompts.len(), "{what}");
            assert!(stats.kv_transfer_bytes > 0 && stats.kv_transfer_s > 0.0, "{what}: {stats:?}");
            assert!(stats.prefill_busy_s > 0.0 && stats.decode_busy_s > 0.0, "{what}: {stats:?}");
            // The prefill device never decodes: it computed the prompts and sampled each once.
            let prefill = engine.prefill_engine().stats();
            assert_eq!(prefill.generated_tokens, prompts.len(), "{what}");
            let (p, d) = engine.block_managers();
            assert!(p.all_blocks_free() && d.all_blocks_free(), "{what}: blocks leaked");
        }
    }
}

/// A decode pool that holds about one request at a time: the others wait, prefilled, until there
/// is room; nothing is lost, and the outputs are plain generation's.
#[test]
fn arrivals_wait_for_room_on_the_decode_device() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
    let name = "llama";
    let prompts: Vec<Prompt> = mixed_prompts(name).into_iter().filter(|p| matches!(p, Prompt::Ids(_))).collect();
    let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
    let expected = one_by_one(&plain, &prompts, &params);
    let longest = prompts.iter().map(|p| if let Prompt::Ids(ids) = p { ids.len() } else { 0 }).max().unwrap();
    // Room for the longest request and its output, and for no second request beside it.
    let blocks = (longest + 10).div_ceil(4);
    let decode = config(blocks, 4, PreemptionMode::Swap);
    // Every prompt is prefilled in the first step, so that how long the prefill device takes
    // beside the decode device (which depends on the machine's load) cannot let the decode
    // device drain its requests before the arrivals pile up.
    let mut engine = waa(name, split_with(decode, prompts.len()));
    let ids: Vec<String> = (0..prompts.len()).map(|i| format!("r{i}")).collect();
    for (id, p) in ids.iter().zip(&prompts) {
        engine.add_request(id.clone(), p.clone(), params.clone()).unwrap();
    }
    let mut got = vec![Vec::new(); prompts.len()];
    // Steps that ended with every prompt prefilled and arrivals still waiting: waiting for room,
    // not for the next step's admission (which every arrival waits for once).
    let (mut most_decoding, mut waited) = (0, 0);
    while engine.has_unfinished_requests() {
        for out in engine.step().unwrap() {
            let i: usize = out.request_id[1..].parse().unwrap();
            if let Some(done) = out.finished {
                got[i] = done[0].generated_ids.clone();
            }
        }
        let (_, decoding, _) = engine.decode_engine().queue_lengths();
        most_decoding = most_decoding.max(decoding);
        if engine.arrivals_waiting() > 0 && !engine.prefill_engine().has_unfinished_requests() {
            waited += 1;
        }
    }
    assert_eq!(got, expected);
    assert!(most_decoding < prompts.len(), "the decode pool holds few requests ({most_decoding})");
    assert!(waited > 1, "prefilled requests should have waited for room on the decode device ({waited} steps)");
    assert_eq!(engine.stats().kv_transfers, prompts.len());
    let (p, d) = engine.block_managers();
    assert!(p.all_blocks_free() && d.all_blocks_free(), "blocks leaked");
}

/// An aborted request comes back with what it had generated wherever it is (or had finished), and
/// the two pools end empty; replicas of one model must share a block size.
#[test]
fn aborts_and_bad_configurations() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let mut engine = waa("gpt2", split(config(64, 4, PreemptionMode::Auto)));
    for i in 0..6 {
        engine.add_request(format!("r{i}"), Prompt::Ids(vec![5 + i, 7, 9]), params.clone()).unwrap();
    }
    let err = engine.add_request("r0", Prompt::Ids(vec![1]), params.clone()).unwrap_err();
    assert!(matches!(err, PagedError::DuplicateRequest(_)), "{err}");
    // The decode device steps for as long as each prefill step lasts, so how far a request has
    // got after two steps depends on timing: one that already finished is reported by its step.
    let mut finished = std::collections::HashSet::new();
    for _ in 0..2 {
        let outputs = engine.step().unwrap();
        finished.extend(outputs.into_iter().filter(|o| o.finished.is_some()).map(|o| o.request_id));
    }
    for i in 0..6 {
        let id = format!("r{i}");
        match engine.abort(&id).unwrap() {
            Some(out) => assert_eq!(out.len(), 1, "{id}"),
            None => assert!(finished.contains(&id), "{id} was neither running nor finished"),
        }
    }
    assert!(!engine.has_unfinished_requests());
    let (p, d) = engine.block_managers();
    assert!(p.all_blocks_free() && d.all_blocks_free());

    let mut bad = split(config(64, 4, PreemptionMode::Auto));
    bad.decode.block_size = 8;
    let load = || Pretrained::load(&fixture("gpt2"), &Device::flex()).unwrap();
    let err = DisaggEngine::new(load(), load(), bad).unwrap_err().to_string();
    assert!(err.contains("one block size"), "{err}");
}

/// A saved plan (the planner's output shape) with `strategy` over two devices.
fn plan_json(strategy: &str) -> String {
    let (encode, decode, stages, iterations) = if strategy == "rra" { (2, 2, 2, "3") } else { (1, 1, 1, "null") };
    format!(
        r#"{{"strategy":"{strategy}","encode_batch":3,"decode_batch":5,"decode_iterations":{iterations},
        "decoder_micro_batches":{stages},"tensor_parallel_degree":1,"tensor_parallel_stages":0,
        "encode_devices":{encode},"decode_devices":{decode},"pipeline_stages":{stages},"throughput_qps":1.0,
        "latency_s":1.0,"latency_percentile":99.0,"step_variation":{{"prefill":0.0,"decode":0.0}},
        "latency_output_tokens":8,"latency_bound_s":2.0,"search":"branch-and-bound","simulations":1}}"#
    )
}

/// `--schedule exegpt --plan FILE --devices flex,flex` (and flex beside a worker process) runs a
/// WAA plan disaggregated and an RRA plan as a two-stage pipeline, each printing the same greedy
/// text as the plain engine.
#[test]
fn cli_runs_waa_and_two_stage_rra_plans() {
    let dir = std::env::temp_dir().join(format!("burn-llm-waa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |flags: &[&str]| generate(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
    let (plain, _) = run(&["--device", "flex"]);
    // Decoding on a one-thread worker process: the KV blocks cross a real process boundary.
    let worker = Worker::start_with("flex", &["--threads", "1"]);
    let flex_and_worker = format!("flex,{}", worker.url);
    for devices in ["flex,flex", flex_and_worker.as_str()] {
        for (strategy, said) in [("waa-c", "ExeGPT WaaC schedule"), ("rra", "ExeGPT RRA schedule over 2 stage(s)")] {
            let path = dir.join(format!("{strategy}.json"));
            std::fs::write(&path, plan_json(strategy)).unwrap();
            let mut flags = vec![
                "--engine",
                "paged",
                "--schedule",
                "exegpt",
                "--plan",
                path.to_str().unwrap(),
                "--devices",
                devices,
            ];
            if devices != "flex,flex" {
                flags.extend(["--worker-token", TOKEN]);
            }
            let (text, log) = run(&flags);
            assert_eq!(generated(&text), generated(&plain), "{strategy} on {devices}");
            assert!(log.contains(said), "{strategy} on {devices}: {log}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A saved RRA plan priced on a split (`"stage_layers"`) runs that split, and says so;
/// `--stage-layers` that agrees with it is taken, one that disagrees, or `auto` (which plans the
/// split with the schedule), is an error saying what to do, as is `--device-memory` (a flag of
/// the devices' own stage planning).
#[test]
fn a_saved_rra_plan_runs_its_own_split() {
    let dir = std::env::temp_dir().join(format!("burn-llm-rra-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = plan_json("rra").replacen("\"pipeline_stages\":2,", "\"pipeline_stages\":2,\"stage_layers\":[1,1],", 1);
    let path = dir.join("rra-split.json");
    std::fs::write(&path, plan).unwrap();
    let run = |extra: &[&str]| {
        let mut flags = vec!["--engine", "paged", "--schedule", "exegpt", "--devices", "flex,flex"];
        flags.extend(["--plan", path.to_str().unwrap()]);
        flags.extend_from_slice(extra);
        generate(&flags)
    };
    let (plain, _) = generate(&["--device", "flex"]).unwrap();
    for extra in [&[][..], &["--stage-layers", "0-0,1-1"][..]] {
        let (text, log) = run(extra).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        assert_eq!(generated(&text), generated(&plain), "{extra:?}");
        assert!(log.contains("over 2 stage(s) of 1 | 1 layers"), "{extra:?}: {log}");
    }
    let error = run(&["--stage-layers", "0-1"]).unwrap_err();
    assert!(error.contains("stage"), "{error}");
    let error = run(&["--stage-layers", "auto"]).unwrap_err();
    assert!(error.contains("--latency-bound-s"), "auto with a saved plan: {error}");
    // The split comes from the ExeGPT profile: the devices' own caps are not used, so not taken.
    let error = run(&["--stage-layers", "auto", "--device-memory", "1000000000,1000000000"]).unwrap_err();
    assert!(error.contains("--device-memory") && error.contains("ExeGPT profile"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Greedy text of the llama fixture after "Hello there" (8 tokens) with `flags`, and the log.
fn generate(flags: &[&str]) -> Result<(String, String), String> {
    let model = fixture("llama");
    let mut argv = vec!["x", "--model", model.to_str().unwrap(), "--max-new-tokens", "8", "--prompt", "Hello there"];
    argv.extend_from_slice(flags);
    let args = GenerateArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
    let defaults =
        ExampleDefaults { name: "test_generate", model: "unused", engine: EngineKind::Plain, fallback: None };
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with(&args, defaults, &mut out, &mut log).map_err(|e| e.to_string())?;
    Ok((String::from_utf8(out).unwrap(), String::from_utf8(log).unwrap()))
}

/// The printed text without the summary line after it (which differs by engine and run).
fn generated(text: &str) -> &str {
    text.trim_end().rsplit_once('\n').map_or(text, |(generated, _)| generated)
}

/// `plan_for` over two devices plans among the strategies it is given: WAA alone (as `bench
/// schedule --strategies waa-c,waa-m` runs it), RRA alone. WAA's decoder holds `B_E·(S̄_D − 1)`
/// queries, so outputs longer than the engine's seats leave it no plan, and the error says why;
/// WAA alone on one device is the planner's error too, naming the fix.
#[test]
fn plan_for_chooses_among_the_strategies_it_is_given() {
    use burn_llm::plan::profile::Profile;
    use burn_llm::plan::schedule::Strategy;
    use burn_llm::schedule::{ScheduleWorkload, plan_for};

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/burn-plan/inputs/smollm2-flex-profile.json");
    let profile: Profile = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let workload = |output| ScheduleWorkload {
        prompt_lens: vec![24; 16],
        output_lens: vec![output; 16],
        kv_tokens: 4096,
        max_num_seqs: 8,
    };
    let short = workload(4);
    let plan = |devices, strategies: Option<&[Strategy]>| {
        plan_for(profile.clone(), &short, 1e6, devices, 0.0, None, strategies)
    };
    let both_waa = [Strategy::WaaC, Strategy::WaaM];
    let waa = plan(2, Some(&both_waa)).unwrap();
    assert!(matches!(waa.strategy, Strategy::WaaC | Strategy::WaaM), "{waa:?}");
    assert_eq!((waa.encode_devices, waa.decode_devices), (1, 1), "{waa:?}");
    assert_eq!(plan(2, Some(&[Strategy::Rra])).unwrap().strategy, Strategy::Rra);
    assert_eq!(plan(1, None).unwrap().strategy, Strategy::Rra);
    let error = plan(1, Some(&[Strategy::WaaC])).unwrap_err().to_string();
    assert!(error.contains("WAA needs at least 2") && error.contains("rra"), "{error}");
    let long = workload(48);
    let error = plan_for(profile.clone(), &long, 1e6, 2, 0.0, None, Some(&both_waa)).unwrap_err().to_string();
    assert!(error.contains("WAA decodes B_E·(S̄_D − 1) = 47") && error.contains("max_decode_batch 8"), "{error}");
    assert_eq!(plan_for(profile, &long, 1e6, 2, 0.0, None, None).unwrap().strategy, Strategy::Rra);
}
