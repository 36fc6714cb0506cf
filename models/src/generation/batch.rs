//! The static-batch run that the plain and the offloading engines share: every prompt prepared
//! and started at once, prefilled together (left-padded), then decoded one token per step until
//! every request has stopped. An engine gives only its forward pass: one model call over one KV
//! cache, or a layer schedule over several (the offloading engine's GPU batches).
//!
//! Also here: the one way every engine measures a call ([`GenerationClock`] → [`Timing`]).

use std::time::Instant;

use burn::tensor::Tensor;

use super::events::StreamEvent;
use super::request::{Prompt, RequestState, Timing, histories, prepare_prompt, record_sampled};
use super::sampling::{SamplingParams, sample};
use crate::config::DecoderSpec;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Tokenizes and checks every prompt against the model, and starts a request for each (its
/// constraint, if any, compiled for outputs ending at `eos_token_ids`).
pub fn prepare_requests(
    prompts: &[Prompt],
    params: &SamplingParams,
    tokenizer: Option<&Tokenizer>,
    spec: &DecoderSpec,
    eos_token_ids: &[u32],
) -> Result<Vec<RequestState>> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (text, ids) = prepare_prompt(i, p, tokenizer, spec.vocab_size, spec.max_positions)?;
            RequestState::constrained(
                text,
                ids,
                params,
                spec.max_positions,
                tokenizer,
                (spec.vocab_size, eos_token_ids),
            )
        })
        .collect()
}

/// KV slots per sequence that a static batch of `requests` writes: the first step writes the
/// longest prompt (shorter ones left-padded to it), each later step one slot, and the run lasts
/// as many steps as the longest budget. The token sampled by the last step is never fed back, so
/// the total is `longest prompt + longest budget − 1`, at most the model's context
/// ([`RequestState::budget`] caps the budget there).
pub fn static_kv_capacity(requests: &[RequestState]) -> usize {
    let longest_prompt = requests.iter().map(|r| r.prompt_ids().len()).max().unwrap_or(0);
    let longest_budget = requests.iter().map(RequestState::budget).max().unwrap_or(1);
    longest_prompt + longest_budget.max(1) - 1
}

/// Prompt tokens of a batch of requests.
pub fn prompt_tokens(requests: &[RequestState]) -> usize {
    requests.iter().map(|r| r.prompt_ids().len()).sum()
}

/// Times a generation call as [`Timing`] means it for every engine: started when the call
/// starts; prefill ends when the first token is sampled (time to first token), decode is the
/// rest, and every step after the one that sampled the first token is a decode step.
#[derive(Debug, Clone, Copy)]
pub struct GenerationClock {
    started: Instant,
    first_token_s: Option<f64>,
    decode_steps: usize,
}

impl GenerationClock {
    /// Starts timing now (call it first thing in the call).
    pub fn start() -> Self {
        Self { started: Instant::now(), first_token_s: None, decode_steps: 0 }
    }

    /// Seconds since the start.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Marks the end of a step that sampled `tokens` tokens.
    pub fn step(&mut self, tokens: usize) {
        if self.first_token_s.is_some() {
            self.decode_steps += 1;
        } else if tokens > 0 {
            self.first_token_s = Some(self.elapsed_s());
        }
    }

    /// The call's timing, now.
    pub fn finish(&self, prompt_tokens: usize, generated_tokens: usize) -> Timing {
        let total = self.elapsed_s();
        let prefill_s = self.first_token_s.unwrap_or(total);
        Timing {
            prefill_s,
            decode_s: total - prefill_s,
            prompt_tokens,
            generated_tokens,
            decode_steps: self.decode_steps,
        }
    }
}

/// One static-batch run: how its requests sample and stop, and how its rows split into groups
/// that each run as one forward over one KV cache.
#[derive(Debug, Clone, Copy)]
pub struct StaticBatch<'a> {
    /// Sampling and stopping of every request.
    pub params: &'a SamplingParams,
    /// Ids that end a request unless `ignore_eos` is set.
    pub eos_token_ids: &'a [u32],
    /// Decodes the output text (none: no text, no stop strings).
    pub tokenizer: Option<&'a Tokenizer>,
    /// Rows per group (at least one); the last group may be shorter.
    pub group_rows: usize,
    /// The engine's name, for the step spans.
    pub engine: &'static str,
}

/// One step's new tokens per group: for each row of the group, the tokens it adds (its prompt at
/// the first step, its last sampled token later, nothing once it has finished); `None` for a
/// group whose rows have all finished, which sits the step out.
pub type GroupTokens<'t> = [Option<Vec<&'t [u32]>>];

impl StaticBatch<'_> {
    /// Runs `requests` to completion. Each step, `forward` lays out every running group's new
    /// tokens on its KV cache and returns each group's last-token logits, `[rows, vocab]` (`None`
    /// for a group that sat out); each row then samples with its own random stream and records
    /// its token (stop rules applied), `on_token` seeing it (request indices within
    /// `requests`). `clock` marks every step. Returns the number of tokens generated.
    pub fn run<E: From<ModelError>>(
        &self,
        requests: &mut [RequestState],
        clock: &mut GenerationClock,
        mut forward: impl FnMut(&GroupTokens<'_>) -> std::result::Result<Vec<Option<Tensor<2>>>, E>,
        mut on_token: impl FnMut(StreamEvent<'_>),
    ) -> std::result::Result<usize, E> {
        let group_rows = self.group_rows.max(1);
        let mut rngs: Vec<_> = requests.iter().map(|_| self.params.rng()).collect();
        let mut new_tokens: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt_ids().to_vec()).collect();
        let (mut generated, mut step) = (0, 0);
        while requests.iter().any(|r| !r.is_finished()) {
            let _span = tracing::debug_span!("step", engine = self.engine, step, first = step == 0).entered();
            let groups: Vec<Option<Vec<&[u32]>>> = new_tokens
                .chunks(group_rows)
                .map(|rows| rows.iter().any(|t| !t.is_empty()).then(|| rows.iter().map(Vec::as_slice).collect()))
                .collect();
            let logits = forward(&groups)?;
            drop(groups);
            let mut sampled_now = 0;
            for (k, logits) in logits.into_iter().enumerate() {
                let Some(logits) = logits else { continue };
                let rows = k * group_rows..((k + 1) * group_rows).min(requests.len());
                let allowed = requests[rows.clone()]
                    .iter_mut()
                    .filter_map(|r| r.allowed_tokens().transpose())
                    .collect::<Result<Vec<_>>>()?;
                let sampled = sample(
                    logits,
                    self.params,
                    &mut rngs[rows.clone()],
                    &histories(&requests[rows.clone()]),
                    &allowed,
                )?;
                sampled_now += record_sampled(
                    &mut requests[rows.clone()],
                    &mut new_tokens[rows.clone()],
                    sampled,
                    self.params,
                    self.eos_token_ids,
                    self.tokenizer,
                    |i, token, text, finished| {
                        on_token(StreamEvent { request: rows.start + i, sequence: 0, token, text, finished })
                    },
                )?;
            }
            generated += sampled_now;
            clock.step(sampled_now);
            step += 1;
        }
        Ok(generated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_longest_prompt_plus_longest_budget_minus_one() {
        let params = SamplingParams::greedy(4);
        let requests =
            [RequestState::new(None, vec![1; 3], &params, 64), RequestState::new(None, vec![1; 5], &params, 64)];
        // 5 prompt slots, then one per later step: tokens 1..=3 are fed back, token 4 is not.
        assert_eq!(static_kv_capacity(&requests), 5 + 4 - 1);
        // Capped by the context: a 5-token prompt in a 6-position model generates 2 tokens.
        let capped = [RequestState::new(None, vec![1; 5], &params, 6)];
        assert_eq!(static_kv_capacity(&capped), 6);
        assert_eq!(static_kv_capacity(&[]), 0);
    }

    #[test]
    fn clock_ends_prefill_at_the_first_token() {
        let mut clock = GenerationClock::start();
        clock.step(0); // a step that sampled nothing (a prompt chunk) is still prefill
        clock.step(2);
        clock.step(2);
        clock.step(1);
        let timing = clock.finish(7, 5);
        assert_eq!((timing.decode_steps, timing.prompt_tokens, timing.generated_tokens), (2, 7, 5));
        assert!(timing.prefill_s >= 0.0 && timing.decode_s >= 0.0);
    }
}
