//! Sampling penalties, applied to the logits before temperature, top-k and top-p, exactly as vLLM's
//! `apply_penalties` does (and, for the repetition penalty, HF transformers'
//! `RepetitionPenaltyLogitsProcessor`):
//!
//! 1. **repetition** (HF/CTRL): every token of the prompt or the generated text has its logit
//!    divided by the penalty when positive, multiplied by it otherwise;
//! 2. **frequency** (OpenAI): `frequency_penalty × count` is subtracted, `count` being the token's
//!    occurrences in the generated text;
//! 3. **presence** (OpenAI): `presence_penalty` is subtracted once from every token that occurs in
//!    the generated text.
//!
//! Each sequence keeps its [`TokenCounts`] up to date as it generates (one map update per token),
//! so a step never recounts a history. On the device only the touched entries move: the logits of
//! the tokens a row has seen are gathered, penalized and scattered back, so a step costs
//! `O(batch × distinct tokens seen)`, not `O(batch × vocabulary)`.

use std::collections::{HashMap, HashSet};

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};

use super::sampling::SamplingParams;
use crate::error::{ModelError, Result};

/// One sequence's token history as the penalties see it: which tokens its prompt holds and how
/// often each token occurs in its generated text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenCounts {
    prompt: HashSet<u32>,
    output: HashMap<u32, u32>,
}

impl TokenCounts {
    /// The history of a sequence that has generated nothing yet.
    pub fn new(prompt: &[u32]) -> Self {
        Self { prompt: prompt.iter().copied().collect(), output: HashMap::new() }
    }

    /// Records one generated token.
    pub fn push(&mut self, id: u32) {
        *self.output.entry(id).or_default() += 1;
    }

    /// Occurrences of `id` in the generated text.
    pub fn output_count(&self, id: u32) -> u32 {
        self.output.get(&id).copied().unwrap_or(0)
    }

    /// Whether `id` is in the prompt.
    pub fn in_prompt(&self, id: u32) -> bool {
        self.prompt.contains(&id)
    }

    /// Every token the penalties touch for this sequence (prompt ∪ output when the repetition
    /// penalty is on, the output alone otherwise), with its output count.
    fn touched(&self, repetition: bool) -> Vec<(u32, u32)> {
        let mut ids: Vec<(u32, u32)> = self.output.iter().map(|(&id, &n)| (id, n)).collect();
        if repetition {
            ids.extend(self.prompt.iter().filter(|id| !self.output.contains_key(id)).map(|&id| (id, 0)));
        }
        ids
    }
}

impl SamplingParams {
    /// Whether any penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repetition_penalty != 1.0
    }
}

/// The logits after `params`' penalties, row `b` penalized by `history[b]`; `logits` unchanged when
/// every penalty is off. `history` must hold one entry per row then.
pub fn apply_penalties(logits: Tensor<2>, params: &SamplingParams, history: &[&TokenCounts]) -> Result<Tensor<2>> {
    if !params.has_penalties() {
        return Ok(logits);
    }
    let [batch, vocab] = logits.dims();
    if history.len() != batch {
        return Err(ModelError::InvalidSampling(format!(
            "penalties need the token history of each of the {batch} rows, got {}",
            history.len()
        )));
    }
    let repetition = params.repetition_penalty != 1.0;
    let touched: Vec<Vec<(u32, u32)>> = history.iter().map(|h| h.touched(repetition)).collect();
    let width = touched.iter().map(Vec::len).max().unwrap_or(0);
    if width == 0 {
        return Ok(logits);
    }
    // Per entry: the token, the repetition factor, the frequency and the presence terms. A row with
    // fewer entries repeats its first one (an identical write) or, when it has none, writes token
    // 0 back unchanged.
    let size = batch * width;
    let (mut ids, mut factors) = (Vec::with_capacity(size), Vec::with_capacity(size));
    let (mut frequency, mut presence) = (Vec::with_capacity(size), Vec::with_capacity(size));
    for row in &touched {
        let entry = |&(id, count): &(u32, u32)| {
            let factor = if repetition { params.repetition_penalty } else { 1.0 };
            let present = if count > 0 { params.presence_penalty } else { 0.0 };
            (id as i64, factor, params.frequency_penalty * count as f32, present)
        };
        let pad = row.first().map_or((0, 1.0, 0.0, 0.0), entry);
        for i in 0..width {
            let (id, factor, by_count, present) = row.get(i).map_or(pad, entry);
            if id as usize >= vocab {
                return Err(ModelError::InvalidSampling(format!("token {id} is outside the vocabulary of {vocab}")));
            }
            ids.push(id);
            factors.push(factor);
            frequency.push(by_count);
            presence.push(present);
        }
    }
    let device = logits.device();
    let float = |values: Vec<f32>| Tensor::<2>::from_data(TensorData::new(values, [batch, width]), &device);
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [batch, width]), &device);
    let (factors, frequency, presence) = (float(factors), float(frequency), float(presence));
    // vLLM's order of operations: repetition, then frequency, then presence.
    let seen = logits.clone().gather(1, ids.clone());
    let positive = seen.clone().greater_elem(0.0);
    let repeated = (seen.clone() * factors.clone()).mask_where(positive, seen / factors);
    Ok(logits.scatter(1, ids, repeated - frequency - presence, IndexingUpdateOp::Assign))
}
