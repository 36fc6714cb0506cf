//! Driving a step-level engine for the benchmark: requests added at given points of the run, each
//! token's wall-clock arrival recorded, so that time to first token, inter-token latency and
//! throughput all come from one trace.

use std::collections::HashMap;
use std::time::Instant;

use burn_llm::Engine;
use burn_llm::models::{Prompt, SamplingParams};
use rand::Rng;

/// One request of a run.
#[derive(Debug, Clone)]
pub struct Request {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Tokens it generates (EOS ignored).
    pub output: usize,
    /// Added before the step numbered this (counting every `step()` call from 0).
    pub at_step: usize,
}

/// What one request measured.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Its prompt length.
    pub prompt_len: usize,
    /// Seconds from the run's start to when it was added.
    pub added_s: f64,
    /// Seconds from the run's start to each of its tokens (in order).
    pub tokens_s: Vec<f64>,
}

impl Timeline {
    /// Seconds from being added to its first token.
    pub fn ttft_s(&self) -> Option<f64> {
        self.tokens_s.first().map(|t| t - self.added_s)
    }

    /// Seconds between its consecutive tokens.
    pub fn inter_token_s(&self) -> impl Iterator<Item = f64> + '_ {
        self.tokens_s.windows(2).map(|w| w[1] - w[0])
    }
}

/// A whole run: every request's timeline (in the order given) and the wall time.
#[derive(Debug, Clone)]
pub struct Trace {
    pub requests: Vec<Timeline>,
    pub seconds: f64,
    /// Wall time of every step, in order.
    pub steps_s: Vec<f64>,
}

impl Trace {
    /// Generated tokens in all.
    pub fn output_tokens(&self) -> usize {
        self.requests.iter().map(|r| r.tokens_s.len()).sum()
    }
}

/// Runs `requests` on `engine` to completion, adding each before its step; greedy, EOS ignored.
/// Fails when a request generates another number of tokens than it asks for.
pub fn run(engine: &mut dyn Engine, requests: &[Request]) -> Result<Trace, Box<dyn std::error::Error>> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| requests[i].at_step);
    let mut pending = order.into_iter().peekable();
    let mut timelines: Vec<Timeline> = requests
        .iter()
        .map(|r| Timeline { prompt_len: r.prompt.len(), added_s: 0.0, tokens_s: Vec::with_capacity(r.output) })
        .collect();
    let ids: HashMap<String, usize> = (0..requests.len()).map(|i| (i.to_string(), i)).collect();
    let started = Instant::now();
    let mut steps_s = Vec::new();
    let mut step = 0;
    loop {
        while let Some(&i) = pending.peek().filter(|&&i| requests[i].at_step <= step) {
            let r = &requests[i];
            let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(r.output) };
            timelines[i].added_s = started.elapsed().as_secs_f64();
            engine.add_request(&i.to_string(), Prompt::Ids(r.prompt.clone()), params)?;
            pending.next();
        }
        if !engine.has_unfinished_requests() {
            if pending.peek().is_none() {
                break;
            }
            // Nothing runs until the next arrival: it arrives now.
            step = pending.peek().map_or(step, |&i| requests[i].at_step);
            continue;
        }
        let before = Instant::now();
        let outputs = engine.step()?;
        let now = started.elapsed().as_secs_f64();
        steps_s.push(before.elapsed().as_secs_f64());
        for out in outputs {
            let Some(&i) = ids.get(&out.request_id) else { continue };
            for delta in &out.sequences {
                timelines[i].tokens_s.extend(std::iter::repeat_n(now, delta.token_ids.len()));
            }
        }
        step += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    for (i, (t, r)) in timelines.iter().zip(requests).enumerate() {
        if t.tokens_s.len() != r.output {
            return Err(format!("request {i} generated {} tokens, it asks for {}", t.tokens_s.len(), r.output).into());
        }
    }
    Ok(Trace { requests: timelines, seconds, steps_s })
}

/// `len` random token ids in `3..vocab` (clear of the usual special ids).
pub fn random_prompt(len: usize, vocab: usize, rng: &mut impl Rng) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(3..vocab as u32)).collect()
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    crate::report::percentile(values, 50.0)
}
