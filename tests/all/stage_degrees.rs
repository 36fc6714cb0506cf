//! Pipelines whose stages have different tensor-parallel degrees (`--tensor-parallel-size 2,1`,
//! and the per-stage degree that `--stage-layers auto --tensor-parallel-size auto` plans): the
//! plain and the paged engine (with micro-batches on threaded stages, and under preemption by swap
//! and by recomputation) give the same greedy tokens as one device for the three fixtures, on
//! three flex devices and on flex beside another device; the CLI runs the planned degrees and
//! reports them; bad lists are errors before any work.

use burn::tensor::Device;
use burn_llm::GenerationOutput;
use burn_llm::models::{Generator, LanguageModel, Pretrained, PretrainedFiles, SamplingParams};
use burn_llm::paged::{EngineConfig, LlmEngine};
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};

use crate::common::{devices, fixture};
use crate::paged::{assert_pool_behaviour, mixed_prompts, one_by_one, pools};
use crate::parallel::{cli, text};

fn ids(out: &GenerationOutput) -> Vec<Vec<u32>> {
    out.requests.iter().map(|r| r.generated_ids.clone()).collect()
}

/// Three devices: flex three times, and flex with another device under test as rank 1 of the
/// two-rank stage when one is compiled in.
fn device_sets() -> Vec<(String, Vec<Device>)> {
    let mut sets = vec![("flex,flex,flex".to_string(), vec![Device::flex(); 3])];
    if let Some((name, other)) = devices().into_iter().find(|(n, _)| *n != "flex") {
        sets.push((format!("flex,{name},flex"), vec![Device::flex(), other, Device::flex()]));
    }
    sets
}

/// The fixture `name` in two stages of `degrees` on `devices` (stage 0 on the first
/// `degrees[0]` of them).
fn mixed(name: &str, degrees: [usize; 2], devices: &[Device]) -> (PipelineLm, PretrainedFiles) {
    let files = PretrainedFiles::open(&fixture(name)).unwrap();
    let layout = StageLayout::even(files.spec.num_layers, 2).unwrap();
    let plan = PipelinePlan::with_degrees(layout, degrees.to_vec(), devices.to_vec()).unwrap();
    assert_eq!(plan.tensor_parallel(), None, "{degrees:?} is not one degree");
    (PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &plan, None).unwrap(), files)
}

/// Stages of degree 2 and 1 (and 1 and 2) equal one device on both engines; the placement names
/// each stage's devices and the degrees.
#[test]
fn mixed_degrees_equal_one_device_on_both_engines() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    for name in ["opt", "llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = one_by_one(&plain, &prompts, &params);
        for (label, devices) in device_sets() {
            for degrees in [[2, 1], [1, 2]] {
                let what = format!("{name}, degrees {degrees:?} on {label}");
                let (model, files) = mixed(name, degrees, &devices);
                assert_eq!(model.degrees(), degrees.to_vec(), "{what}");
                let placement = model.placement_summary().unwrap();
                assert!(
                    placement.contains(&format!("tensor-parallel degrees {},{}", degrees[0], degrees[1])),
                    "{placement}"
                );
                let joined = if degrees[0] == 2 { "stage 0: layers 0-0 on " } else { "stage 1: layers 1-1 on " };
                assert!(placement.contains(joined) && placement.contains('+'), "{what}: {placement}");
                // Every rank's heads are in the cache exactly once.
                let single = model.spec().num_kv_heads;
                let heads = |d: usize| (single / d).max(1) * d;
                let layout = model.kv_layout();
                assert_eq!(layout.num_layers * layout.num_kv_heads, heads(degrees[0]) + heads(degrees[1]), "{what}");
                assert_eq!(model.kv_devices().len(), layout.num_layers, "{what}");
                let generator = Generator::new(model, Some(files.tokenizer), files.eos_token_ids);
                let got: Vec<Vec<u32>> = prompts
                    .iter()
                    .map(|p| ids(&generator.generate(std::slice::from_ref(p), &params).unwrap()).remove(0))
                    .collect();
                assert_eq!(got, expected, "{what}: plain engine");
                // Micro-batches run the stages on threads of their own over per-stage views of
                // the paged cache.
                let [roomy, swap, recompute] = pools(&prompts, &expected);
                for ((pool, cfg), micro_batches) in
                    [(roomy.clone(), None), (roomy, Some(3)), (swap, Some(2)), (recompute, None)]
                {
                    let what = format!("{what}, {pool} pool, micro-batches {micro_batches:?}");
                    let (model, files) = mixed(name, degrees, &devices);
                    let cfg = EngineConfig { micro_batches, ..cfg };
                    let mut engine =
                        LlmEngine::from_parts(model, Some(files.tokenizer), files.eos_token_ids, cfg).unwrap();
                    assert_eq!(ids(&engine.generate(&prompts, &params).unwrap()), expected, "{what}");
                    assert_pool_behaviour(pool, engine.stats(), engine.block_manager().all_blocks_free(), &what);
                }
            }
        }
    }
}

/// `--tensor-parallel-size 2,1` through the CLI on both engines: the text of one device, and the
/// `--json` plan gives each stage's devices and degree.
#[test]
fn per_stage_degrees_through_the_cli() {
    let single = text(&cli(&["--device", "flex"]).unwrap());
    for engine in ["plain", "paged"] {
        for degrees in ["2,1", "1,2"] {
            let flags = ["--engine", engine, "--devices", "flex,flex,flex", "--tensor-parallel-size", degrees];
            let out = cli(&flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            assert_eq!(text(&out), single, "{flags:?}");
            assert!(out.contains(&format!("tensor-parallel degrees {degrees} per stage")), "{out}");
            let json: serde_json::Value =
                serde_json::from_str(cli(&[&flags[..], &["--json"][..]].concat()).unwrap().trim())
                    .unwrap_or_else(|e| panic!("{flags:?} --json: {e}"));
            let stages = json["plan"]["stages"].as_array().unwrap_or_else(|| panic!("{json}"));
            let got: Vec<String> = stages.iter().map(|s| s["degree"].to_string()).collect();
            assert_eq!(got.join(","), degrees, "{json}");
            let ranks: Vec<usize> = stages.iter().map(|s| s["devices"].as_array().map_or(0, Vec::len)).collect();
            assert_eq!(ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(","), degrees, "{json}");
            assert!(json["plan"]["tensor_parallel"].is_null(), "{json}");
        }
    }
}

/// Bad per-stage degrees are errors naming the problem, before anything loads.
#[test]
fn bad_per_stage_degrees_are_errors() {
    let cases: [(&[&str], &str); 6] = [
        (&["--tensor-parallel-size", "2,1", "--devices", "flex,flex"], "list exactly 3"),
        (
            &["--tensor-parallel-size", "2,1", "--devices", "flex,flex,flex", "--pipeline-parallel-size", "1"],
            "2 tensor-parallel degrees given for 1 pipeline stages",
        ),
        (&["--tensor-parallel-size", "1,1,1"], "3 pipeline stages for a model of 2 layers"),
        (&["--tensor-parallel-size", "3,1", "--devices", "flex,flex,flex,flex"], "degree 3 does not divide"),
        (&["--tensor-parallel-size", "2,0", "--devices", "flex,flex"], "at least 1"),
        (&["--tensor-parallel-size", "2,x"], "one number per stage"),
    ];
    for (flags, expected) in cases {
        let err = cli(flags).expect_err(&format!("{flags:?} must fail"));
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
    let err =
        cli(&["--devices", "flex,flex,flex", "--stage-layers", "auto", "--tensor-parallel-size", "2,1"]).unwrap_err();
    assert!(err.contains("--tensor-parallel-size") && err.contains("auto"), "{err}");
}

/// `--tensor-parallel-size auto` over three flex devices: the GPT-2 fixture's two layers cannot
/// fill three one-device stages and its 4 heads do not split 3 ways, so the planner must choose a
/// group of two beside a single device; the pipeline runs those degrees (the `--json` plan and
/// the placement agree with the printed plan) and the text is one device's, on both engines.
#[test]
fn planned_per_stage_degrees_run_as_planned() {
    let dir = std::env::temp_dir().join(format!("burn-llm-stage-degrees-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let single = text(&cli(&["--device", "flex"]).unwrap());
    for engine in ["plain", "paged"] {
        let flags = [
            "--engine",
            engine,
            "--devices",
            "flex,flex,flex",
            "--stage-layers",
            "auto",
            "--tensor-parallel-size",
            "auto",
            "--stage-profile-dir",
            dir.to_str().unwrap(),
        ];
        let out = cli(&flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        assert_eq!(text(&out), single, "{engine}");
        let json: serde_json::Value =
            serde_json::from_str(cli(&[&flags[..], &["--json"][..]].concat()).unwrap().trim()).unwrap();
        let plan = &json["plan"];
        let degrees: Vec<u64> =
            plan["stages"].as_array().unwrap().iter().map(|s| s["degree"].as_u64().unwrap()).collect();
        assert!(degrees == [2, 1] || degrees == [1, 2], "{engine}: {plan}");
        let predicted: Vec<u64> =
            plan["predicted"]["stages"].as_array().unwrap().iter().map(|s| s["degree"].as_u64().unwrap()).collect();
        assert_eq!(predicted, degrees, "{engine}: the pipeline runs what was planned: {plan}");
        let placement = json["placement"].as_str().unwrap_or_default();
        assert!(placement.contains(&format!("tensor-parallel degrees {},{}", degrees[0], degrees[1])), "{placement}");
        assert!(placement.contains("auto stages") && placement.contains("(degree 2)"), "{placement}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
