//! The offline loop every step-level engine of this crate shares: queue every prompt, step until
//! each request has finished, report progress, gather the outputs in prompt order.

use std::collections::HashMap;

use burn_llm_models::generation::GenerationClock;
use burn_llm_models::{GenerationOutput, Prompt, RequestOutput, SamplingParams};

use super::{GenerateProgress, ProgressHook, SequenceDelta, StepOutput};
use crate::error::Result;

/// What the loop needs of an engine.
pub(crate) trait StepLoop {
    /// Queues a request.
    fn queue(&mut self, request_id: String, prompt: Prompt, params: SamplingParams) -> Result<()>;
    /// Drops a request (after a failed queue call).
    fn drop_request(&mut self, request_id: &str);
    /// One iteration.
    fn step_once(&mut self) -> Result<Vec<StepOutput>>;
    /// The caller's progress hook, if any.
    fn progress_hook(&mut self) -> Option<&mut ProgressHook>;
}

/// Runs `prompts` to completion on `engine` with request ids `generate-{base}-{i}`, calling
/// `on_delta(request index, delta)` for every sequence delta.
pub(crate) fn generate_stream<E: StepLoop>(
    engine: &mut E,
    base: u64,
    prompts: &[Prompt],
    params: &SamplingParams,
    mut on_delta: impl FnMut(usize, &SequenceDelta),
) -> Result<GenerationOutput> {
    let mut clock = GenerationClock::start();
    let ids: Vec<String> = (0..prompts.len()).map(|i| format!("generate-{base}-{i}")).collect();
    for (id, prompt) in ids.iter().zip(prompts) {
        if let Err(e) = engine.queue(id.clone(), prompt.clone(), params.clone()) {
            for id in &ids {
                engine.drop_request(id);
            }
            return Err(e);
        }
    }
    let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
    let mut results: Vec<Option<Vec<RequestOutput>>> = vec![None; prompts.len()];
    let (mut generated, mut finished) = (0usize, 0usize);
    while results.iter().any(Option::is_none) {
        let outputs = engine.step_once()?;
        let before = generated;
        for out in outputs {
            let Some(&i) = index.get(out.request_id.as_str()) else { continue };
            for delta in &out.sequences {
                generated += delta.token_ids.len();
                on_delta(i, delta);
            }
            if let Some(done) = out.finished {
                if out.sequences.is_empty() {
                    generated += done.iter().map(|o| o.generated_ids.len()).sum::<usize>();
                }
                results[i] = Some(done);
                finished += 1;
            }
        }
        clock.step(generated - before);
        let progress = GenerateProgress {
            finished,
            requests: prompts.len(),
            generated_tokens: generated,
            elapsed_s: clock.elapsed_s(),
        };
        tracing::debug!(target: "burn_paged::progress", finished, requests = prompts.len(), generated_tokens = generated, elapsed_s = progress.elapsed_s, "generate");
        if let Some(hook) = engine.progress_hook() {
            hook(progress);
        }
    }
    let requests: Vec<RequestOutput> = results.into_iter().flatten().flatten().collect();
    let generated_tokens = requests.iter().map(|r| r.generated_ids.len()).sum();
    let timing = clock.finish(requests.iter().map(|r| r.prompt_ids.len()).sum(), generated_tokens);
    Ok(GenerationOutput { requests, timing })
}
