//! The `Engine` trait: every engine behind one `Box<dyn Engine>`, with the same outputs for the
//! same request, step-level calls where the engine has them, and clear errors where it does not.

use burn::tensor::Device;
use burn_llm::offload::policy::Policy;
use burn_llm::paged::PreemptionMode;
use burn_llm::{BeamSearchParams, Engine, EngineDetails, EngineError, Generator, Pretrained, Prompt, SamplingParams};

use crate::common::{fixture, reference};

fn engines(name: &str) -> Vec<Box<dyn Engine>> {
    let device = Device::flex();
    vec![
        Box::new(Generator::from(Pretrained::load(&fixture(name), &device).unwrap())),
        Box::new(crate::paged::engine(name, &device, crate::paged::config(64, 4, PreemptionMode::Auto))),
        Box::new(crate::offload::engine(name, &device, Policy::all_on_gpu(2), "engine-trait")),
    ]
}

/// The same greedy request gives HF's tokens on every engine, streamed events add up to the
/// outputs, and each engine reports what ran in the shape its kind fills.
#[test]
fn every_engine_gives_the_same_greedy_tokens_through_the_trait() {
    let reference = reference("llama");
    let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Ids(p.input_ids.clone())).collect();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(4) };
    for mut engine in engines("llama") {
        let mut streamed = vec![Vec::new(); prompts.len()];
        let generation = engine.generate_stream(&prompts, &params, &mut |e| streamed[e.request].push(e.token)).unwrap();
        for (i, (out, r)) in generation.output.requests.iter().zip(&reference.prompts).enumerate() {
            assert_eq!(out.generated_ids, r.greedy_ids[..4], "{} prompt {i}", engine.name());
            assert_eq!(streamed[i], out.generated_ids, "{} prompt {i}: streamed tokens", engine.name());
        }
        let report = &generation.report;
        assert_eq!(report.engine, engine.name());
        assert_eq!(report.timing.generated_tokens, 4 * prompts.len());
        match (engine.name(), &report.details) {
            ("plain", EngineDetails::Plain) => assert!(report.memory.is_none() && report.policy_json().is_none()),
            ("paged", EngineDetails::Paged(stats)) => assert!(stats.generated_tokens >= 4 * prompts.len()),
            ("offload", EngineDetails::Offload(run)) => {
                assert!(report.memory.is_some_and(|m| m.gpu_peak_bytes > 0));
                assert_eq!(report.policy_json().unwrap()["effective_batch"], run.effective_batch);
            }
            (name, details) => panic!("{name} reported {details:?}"),
        }
    }
}

/// Engines that return one sequence per prompt reject `n`, `best_of` and beam search, and
/// step-level calls, with errors that name the paged engine; the paged engine runs all of them.
#[test]
fn settings_an_engine_cannot_honour_are_errors() {
    let prompt = [Prompt::Ids(vec![2, 10, 11])];
    let n2 = SamplingParams { n: 2, temperature: 1.0, seed: Some(1), ..SamplingParams::greedy(3) };
    let beam = SamplingParams { beam: Some(BeamSearchParams::new(2)), ..SamplingParams::greedy(3) };
    for mut engine in engines("gpt2") {
        let caps = engine.capabilities();
        for params in [&n2, &beam] {
            let result = engine.generate(&prompt, params);
            if caps.multiple_sequences {
                assert_eq!(result.unwrap().output.requests.len(), params.n, "{}", engine.name());
            } else {
                let err = result.unwrap_err().to_string();
                assert!(err.contains(engine.name()) && err.contains("--engine paged"), "{err}");
            }
        }
        let added = engine.add_request("r", prompt[0].clone(), SamplingParams::greedy(3));
        if caps.step_level {
            added.unwrap();
            assert!(engine.has_unfinished_requests());
            let mut finished = None;
            while engine.has_unfinished_requests() {
                for out in engine.step().unwrap() {
                    finished = finished.or(out.finished);
                }
            }
            assert_eq!(finished.unwrap()[0].generated_ids.len(), 3);
            assert!(engine.abort("r").unwrap().is_none(), "a finished request is gone");
        } else {
            assert!(matches!(added, Err(EngineError::Unsupported { .. })), "{}", engine.name());
            assert!(matches!(engine.step(), Err(EngineError::Unsupported { .. })));
            assert!(!engine.has_unfinished_requests());
        }
    }
}

/// Engine errors pass through the facade unchanged: a KV-budget error reads as one, not as a
/// device error.
#[test]
fn engine_errors_are_transparent() {
    let mut paged = crate::paged::engine("gpt2", &Device::flex(), crate::paged::config(64, 4, PreemptionMode::Auto));
    let too_long = Prompt::Ids(vec![1; 10_000]);
    let err = Engine::generate(&mut paged, &[too_long], &SamplingParams::greedy(2)).unwrap_err();
    assert!(matches!(err, EngineError::Paged(_) | EngineError::Model(_)), "{err:?}");
    assert!(!err.to_string().contains("device error"), "{err}");
    let bad = SamplingParams { top_p: 0.0, ..SamplingParams::greedy(2) };
    let err = Engine::generate(&mut paged, &[Prompt::Ids(vec![2])], &bad).unwrap_err();
    assert!(err.to_string().contains("top_p"), "{err}");
}
