//! vLLM's virtual engines over one pipeline (`--virtual-engines`): several paged engines share the
//! loaded stages, each with its share of the KV pool, stepping at once. Their greedy outputs equal
//! plain generation for mixed batches, with and without preemption; requests spread over the
//! engines and can be aborted; adding one never waits for a busy engine's step; the flag runs
//! through the CLI and every value it cannot honour is an error that says what to do.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use burn::tensor::{Device, Tensor};
use burn_llm::models::cache::{KvLayout, LayerDevices};
use burn_llm::models::model::Hidden;
use burn_llm::models::{
    DecoderSpec, FinishReason, Generator, KvCache, LanguageModel, Pretrained, SamplingParams, StepInput,
};
use burn_llm::paged::{EngineConfig, KvCacheMemory, VirtualEngines};

use crate::common::fixture;
use crate::paged::{mixed_prompts, one_by_one, pools};
use crate::parallel::{cli, pipeline, text};
use crate::remote::{TOKEN, Worker};

/// Two virtual engines over two flex stages equal plain generation for every request of a mixed
/// batch, in a roomy pool and in pools (each engine's share as small as one engine's in
/// `paged.rs`) that force preemption by swapping and by recomputation; every block comes back.
#[test]
fn virtual_engines_over_stages_equal_plain_generation() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
    let devices = [Device::flex(), Device::flex()];
    for name in ["opt", "llama", "gpt2"] {
        let prompts = mixed_prompts(name);
        let plain = Generator::from(Pretrained::load(&fixture(name), &Device::flex()).unwrap());
        let expected = one_by_one(&plain, &prompts, &params);
        for (pool, cfg) in pools(&prompts, &expected) {
            let what = format!("{name}, {pool} pool");
            let KvCacheMemory::Blocks(blocks) = cfg.kv_cache_memory else { unreachable!() };
            let cfg = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(2 * blocks), ..cfg };
            let (model, files) = pipeline(name, &devices);
            let mut engines = VirtualEngines::new(model, Some(files.tokenizer), files.eos_token_ids, cfg, 2).unwrap();
            let out = engines.generate(&prompts, &params).unwrap();
            let ids: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
            assert_eq!(ids, expected, "{what}");
            let stats = engines.stats();
            match pool {
                "swap" => assert!(stats.swaps > 0, "{what}: no swap happened"),
                "recompute" => assert!(stats.recomputes > 0, "{what}: no recomputation happened"),
                _ => assert_eq!(stats.swaps + stats.recomputes, 0, "{what}"),
            }
            assert_eq!(engines.kv_blocks(), (0, 2 * blocks), "{what}: blocks leaked or pool not shared");
            assert!(!engines.has_unfinished_requests(), "{what}");
        }
    }
}

/// Requests go to the engine with the fewest unfinished ones; nothing runs before the first step;
/// an abort stops a request wherever it is; a duplicate id is refused; the rest finish with plain
/// generation's tokens.
#[test]
fn requests_spread_over_the_engines_and_abort_where_they_run() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let (model, files) = pipeline("llama", &[Device::flex(), Device::flex()]);
    let cfg = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(128), block_size: 4, ..EngineConfig::default() };
    let mut engines = VirtualEngines::new(model, Some(files.tokenizer), files.eos_token_ids, cfg, 2).unwrap();
    let prompts: Vec<_> = mixed_prompts("llama").into_iter().skip(1).take(3).collect();
    for (i, p) in prompts.iter().enumerate() {
        engines.add_request(format!("r{i}"), p.clone(), params.clone()).unwrap();
    }
    assert_eq!(engines.unfinished(), [2, 1]);
    let err = engines.add_request("r0", prompts[0].clone(), params.clone()).unwrap_err();
    assert!(err.to_string().contains("r0"), "{err}");
    let aborted = engines.abort("r1").unwrap().expect("r1 is unfinished: nothing steps before step()");
    assert_eq!(aborted[0].finish_reason, FinishReason::Abort);
    assert!(aborted[0].generated_ids.is_empty());
    assert_eq!(engines.unfinished(), [2, 0]);
    assert!(engines.abort("r1").unwrap().is_none(), "r1 is no longer known");
    let finished = run_to_the_end(&mut engines);
    let expected = one_by_one(&llama(), &prompts, &params);
    assert_eq!(finished, [("r0".to_string(), expected[0].clone()), ("r2".to_string(), expected[2].clone())]);
    assert!(engines.step().unwrap().is_empty(), "nothing left: a step returns at once");
}

/// Steps `engines` until every request has finished: each one's id and first sequence's tokens,
/// sorted by id.
fn run_to_the_end<M: LanguageModel + Sync + 'static>(engines: &mut VirtualEngines<M>) -> Vec<(String, Vec<u32>)> {
    let mut finished = Vec::new();
    while engines.has_unfinished_requests() {
        for out in engines.step().unwrap() {
            if let Some(done) = out.finished {
                finished.push((out.request_id, done[0].generated_ids.clone()));
            }
        }
    }
    finished.sort();
    finished
}

/// The llama fixture for plain generation on one device.
fn llama() -> Generator {
    Generator::from(Pretrained::load(&fixture("llama"), &Device::flex()).unwrap())
}

/// `--virtual-engines 2` over two flex stages prints one device's text; a value the run cannot
/// honour is an error naming the flag and what to do.
#[test]
fn the_virtual_engines_flag_runs_and_bad_values_are_errors() {
    let single = cli(&["--device", "flex"]).unwrap();
    let paged = ["--engine", "paged", "--kv-cache-memory", "blocks:64"];
    let two = [&paged[..], &["--devices", "flex,flex", "--virtual-engines", "2"]].concat();
    assert_eq!(text(&cli(&two).unwrap()), text(&single));
    let cases: [(&[&str], &str); 5] = [
        (&["--devices", "flex,flex", "--virtual-engines", "2"], "applies to --engine paged"),
        (&["--engine", "paged", "--device", "flex", "--virtual-engines", "2"], "this run has one stage"),
        (&["--engine", "paged", "--devices", "flex,flex", "--virtual-engines", "0"], "must be at least 1"),
        (
            &["--engine", "paged", "--devices", "flex,flex", "--kv-cache-memory", "blocks:1", "--virtual-engines", "2"],
            "cannot be shared by 2 virtual engines",
        ),
        (
            &[
                "--engine",
                "paged",
                "--devices",
                "flex,flex",
                "--schedule",
                "exegpt",
                "--plan",
                "plan.json",
                "--virtual-engines",
                "2",
            ],
            "drop --virtual-engines, or drop --schedule exegpt",
        ),
    ];
    for (flags, expected) in cases {
        let err = cli(flags).expect_err(&format!("{flags:?} must fail"));
        assert!(err.contains(expected), "{flags:?}: {err}");
    }
}

/// Over two worker processes (devices whose turns every pipeline on them shares), two virtual
/// engines equal plain generation for a mixed batch, and `--virtual-engines 2` prints one device's
/// text.
#[test]
fn virtual_engines_over_two_workers_equal_plain_generation() {
    let (a, b) = (Worker::start("flex"), Worker::start("flex"));
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let prompts: Vec<_> = mixed_prompts("llama").into_iter().take(6).collect();
    let plain = Generator::from(Pretrained::load(&fixture("llama"), &Device::flex()).unwrap());
    let expected = one_by_one(&plain, &prompts, &params);
    let (model, files) = pipeline("llama", &[a.device(), b.device()]);
    let cfg = EngineConfig {
        kv_cache_memory: KvCacheMemory::Blocks(128),
        block_size: 4,
        max_num_seqs: 2,
        ..EngineConfig::default()
    };
    let mut engines = VirtualEngines::new(model, Some(files.tokenizer), files.eos_token_ids, cfg, 2).unwrap();
    let out = engines.generate(&prompts, &params).unwrap();
    let ids: Vec<Vec<u32>> = out.requests.iter().map(|r| r.generated_ids.clone()).collect();
    assert_eq!(ids, expected);
    assert!(engines.stats().model_steps > 0 && engines.kv_blocks().0 == 0);
    let single = cli(&["--device", "flex"]).unwrap();
    let devices = format!("{},{}", a.url, b.url);
    let flags = ["--engine", "paged", "--devices", &devices, "--virtual-engines", "2", "--worker-token", TOKEN];
    assert_eq!(text(&cli(&flags).unwrap()), text(&single));
}

/// A gate a model's forward pass waits at once it is closed, saying on `entered` that it has.
#[derive(Debug)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    entered: Mutex<Option<Sender<()>>>,
}

impl Gate {
    fn set(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.opened.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }

    fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        if !*open && let Some(entered) = self.entered.lock().unwrap().take() {
            let _ = entered.send(());
        }
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }
}

/// A model whose forward passes wait at a gate.
#[derive(Debug)]
struct Gated<M> {
    model: M,
    gate: Arc<Gate>,
}

impl<M: LanguageModel> LanguageModel for Gated<M> {
    fn spec(&self) -> &DecoderSpec {
        self.model.spec()
    }
    fn kv_layout(&self) -> KvLayout {
        self.model.kv_layout()
    }
    fn kv_devices(&self) -> LayerDevices {
        self.model.kv_devices()
    }
    fn device(&self) -> Device {
        self.model.device()
    }
    fn decode_weight_bytes(&self) -> usize {
        self.model.decode_weight_bytes()
    }
    fn num_stages(&self) -> usize {
        self.model.num_stages()
    }
    fn embed(&self, step: &StepInput) -> Hidden {
        self.gate.pass();
        self.model.embed(step)
    }
    fn run_stage(&self, stage: usize, hidden: Hidden, cache: &mut dyn KvCache) -> burn_llm::models::Result<Hidden> {
        self.model.run_stage(stage, hidden, cache)
    }
    fn finish(&self, hidden: Hidden) -> Tensor<3> {
        self.model.finish(hidden)
    }
    fn logits(&self, states: Tensor<2>) -> Tensor<2> {
        self.model.logits(states)
    }
}

/// While one engine is inside a step, a request routed to it is queued at once (it joins at that
/// engine's next step), and its tokens equal plain generation's.
#[test]
fn adding_a_request_does_not_wait_for_a_busy_engine() {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(4) };
    let (model, files) = pipeline("llama", &[Device::flex(), Device::flex()]);
    let gate = Arc::new(Gate { open: Mutex::new(true), opened: Condvar::new(), entered: Mutex::new(None) });
    let gated = Gated { model, gate: gate.clone() };
    let cfg = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(128), block_size: 4, ..EngineConfig::default() };
    let mut engines = VirtualEngines::new(gated, Some(files.tokenizer), files.eos_token_ids, cfg, 2).unwrap();
    let prompts: Vec<_> = mixed_prompts("llama").into_iter().skip(1).take(3).collect();
    let (entered, inside) = channel();
    *gate.entered.lock().unwrap() = Some(entered);
    gate.set(false);
    engines.add_request("r0", prompts[0].clone(), params.clone()).unwrap();
    assert!(engines.step().unwrap().is_empty(), "the only step is held at the gate");
    inside.recv_timeout(Duration::from_secs(60)).expect("engine 0 did not start its step");
    // Should an add wait for engine 0's step after all, the test fails instead of hanging.
    let watchdog = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(30));
            gate.set(true);
        })
    };
    engines.add_request("r1", prompts[1].clone(), params.clone()).unwrap();
    engines.add_request("r2", prompts[2].clone(), params.clone()).unwrap();
    assert!(!gate.is_open(), "an add waited for engine 0's step to end");
    assert_eq!(engines.unfinished(), [2, 1], "r2 was routed to the engine inside its step");
    gate.set(true);
    let finished = run_to_the_end(&mut engines);
    let expected = one_by_one(&llama(), &prompts, &params);
    let ids: Vec<Vec<u32>> = finished.into_iter().map(|(_, ids)| ids).collect();
    assert_eq!(ids, expected);
    drop(watchdog);
}
