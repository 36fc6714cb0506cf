//! Where burn-llm's greedy ids first part from llama.cpp's, and how close to a tie that choice
//! was for each engine.
//!
//! Both engines quantize every activation row to 8 bits per block of 32 before each product, and
//! each lands 0.08–0.25 nats (RMS over the top 20 log-probabilities of three prompts) away from the exact model, each in
//! its own direction (accumulation order, attention and norms round differently before the
//! quantizer). Where two tokens are closer than that, the greedy ids may differ without either
//! engine being wrong. So each first difference is scored again, context alone, by both engines:
//! the margin is the log-probability of the engine's own choice minus that of the other's.

use burn_llm::Engine;
use burn_llm::models::{Prompt, SamplingParams};
use serde::Serialize;

use super::LlamaCpp;

/// Alternatives burn-llm reports per position when scoring (llama.cpp's token is looked up
/// among them).
const TOP: usize = 20;

/// One sequence's first difference.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    /// Sequence (prompt) index in the batch.
    pub sequence: usize,
    /// Generated-token position of the first difference.
    pub position: usize,
    pub burn_token: u32,
    pub llama_cpp_token: u32,
    /// burn-llm, context alone: log p(its token) − log p(llama.cpp's); `None` when llama.cpp's
    /// token is not among burn-llm's top [`TOP`].
    pub burn_margin_nats: Option<f64>,
    /// llama.cpp, context alone: log p(its token) − log p(burn-llm's).
    pub llama_cpp_margin_nats: f64,
}

/// The first difference of every sequence whose ids differ, each scored by both engines.
pub fn divergences(
    engine: &mut dyn Engine,
    llama: &mut LlamaCpp,
    prompts: &[Vec<u32>],
    ours: &[Vec<u32>],
    theirs: &[Vec<u32>],
) -> Result<Vec<Divergence>, Box<dyn std::error::Error>> {
    let mut found = Vec::new();
    let mut contexts = Vec::new();
    for (sequence, ((prompt, a), b)) in prompts.iter().zip(ours).zip(theirs).enumerate() {
        let Some(position) = super::different_token(a, b) else { continue };
        contexts.push(prompt.iter().chain(&a[..position]).copied().collect::<Vec<u32>>());
        found.push(Divergence {
            sequence,
            position,
            burn_token: a[position],
            llama_cpp_token: b[position],
            burn_margin_nats: None,
            llama_cpp_margin_nats: f64::NAN,
        });
    }
    if found.is_empty() {
        return Ok(found);
    }
    let candidates: Vec<[u32; 2]> = found.iter().map(|d| [d.llama_cpp_token, d.burn_token]).collect();
    for (d, [theirs, ours]) in found.iter_mut().zip(llama.score(&contexts, &candidates)?) {
        d.llama_cpp_margin_nats = theirs - ours;
    }
    let params = SamplingParams { ignore_eos: true, logprobs: Some(TOP), ..SamplingParams::greedy(1) };
    for (d, context) in found.iter_mut().zip(contexts) {
        let generation = engine.generate(&[Prompt::Ids(context)], &params)?;
        let entries = generation.output.requests.first().and_then(|r| r.logprobs.as_ref()).and_then(|l| l.first());
        let logprob = |id: u32| entries.and_then(|e| e.iter().find(|t| t.id == id)).map(|t| f64::from(t.logprob));
        d.burn_margin_nats = logprob(d.burn_token).zip(logprob(d.llama_cpp_token)).map(|(a, b)| a - b);
    }
    Ok(found)
}

/// `"a–b nats"` over the margins, for the report.
pub fn margin_range(values: impl Iterator<Item = Option<f64>>) -> String {
    let (mut lo, mut hi, mut outside) = (f64::INFINITY, f64::NEG_INFINITY, 0);
    for v in values {
        match v {
            Some(v) => {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            None => outside += 1,
        }
    }
    let mut text = if lo <= hi { format!("{lo:.3} to {hi:.3}") } else { "–".into() };
    if outside > 0 {
        text.push_str(&format!(" ({outside} outside the top {TOP})"));
    }
    text
}
