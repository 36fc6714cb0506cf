//! Sampling parameters and the on-device sampler.
//!
//! vLLM's order of logits processors: the structured-output mask and `logit_bias`
//! ([`super::processors`]), the penalties ([`super::penalties`]), then temperature, `min_p`,
//! top-k and top-p are applied to the
//! logits on the device (sort, truncate, softmax, cumulative sum); the draw itself compares one
//! uniform number per sequence against the cumulative distribution, also on the device. Only the
//! chosen ids (and, when asked, the log-probabilities) come back to the host, never a logit
//! vector.
//!
//! Log-probabilities are those of the model's raw distribution (a log-softmax of the logits before
//! penalties, temperature and filtering), as vLLM reports them by default (V1's
//! `logprobs_mode = "raw_logprobs"`; vLLM V0 reported them after penalties and temperature).

use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use llguidance::toktrie::SimpleVob;

use super::beam::BeamSearchParams;
use super::constraint::Constraint;
use super::penalties::{TokenCounts, apply_penalties};
use super::processors::{add_biases, apply_min_p};
use crate::error::{ModelError, Result};

/// How to pick tokens, how many sequences to return and when to stop, per request (vLLM's
/// `SamplingParams`, which also carries `n`, `best_of` and beam search). Every engine takes these;
/// an engine that cannot honour a setting (the plain and offloading engines return one sequence
/// per prompt) rejects it with an error instead of ignoring it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p`; `1` keeps all.
    pub top_p: f32,
    /// Seed of the request's random stream; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Token ids that end the request (kept in the output ids).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the request (cut from the output text).
    pub stop: Vec<String>,
    /// Keep going after the model's EOS token.
    pub ignore_eos: bool,
    /// Return, for every generated step, the sampled token's log-probability and the top-K.
    pub logprobs: Option<usize>,
    /// Return, for every prompt token after the first, its log-probability given the tokens
    /// before it and the top-K alternatives (vLLM's `prompt_logprobs`; `Some(0)` gives the
    /// prompt tokens' own log-probabilities only). Engines that run it compute the whole prompt
    /// (no prefix-cache hits), as vLLM does.
    pub prompt_logprobs: Option<usize>,
    /// Sequences returned per prompt.
    pub n: usize,
    /// Sequences generated per prompt (≥ `n`), of which the `n` with the highest cumulative
    /// log-probability are returned. `None` means `n`.
    pub best_of: Option<usize>,
    /// Beam search instead of sampling; returns the `n` best beams.
    pub beam: Option<BeamSearchParams>,
    /// OpenAI's presence penalty, in [-2, 2]: subtracted once from the logit of every token that
    /// already appears in the generated text. `0` disables it.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: subtracted from a token's logit once per time it
    /// appears in the generated text. `0` disables it.
    pub frequency_penalty: f32,
    /// HF/CTRL repetition penalty, > 0: the logit of every token in the prompt or the generated
    /// text is divided by it when positive and multiplied by it when negative. `1` disables it.
    pub repetition_penalty: f32,
    /// vLLM's `min_p`, in [0, 1]: tokens less likely than `min_p` × the most likely token's
    /// probability (after temperature) are removed. `0` disables it.
    pub min_p: f32,
    /// OpenAI's `logit_bias`: added to these tokens' logits (in [-100, 100]) before sampling.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Structured output: what the generated text must match (see [`super::constraint`]).
    pub constraint: Option<Constraint>,
}

impl Default for SamplingParams {
    /// Greedy decoding of up to 16 tokens, stopping at EOS.
    fn default() -> Self {
        Self {
            max_new_tokens: 16,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            n: 1,
            best_of: None,
            beam: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            logit_bias: BTreeMap::new(),
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of `max_new_tokens` tokens.
    pub fn greedy(max_new_tokens: usize) -> Self {
        Self { max_new_tokens, ..Self::default() }
    }

    /// Sequences the request runs at once (its seats in a batch): the beam width, else `best_of`,
    /// else `n`.
    pub fn width(&self) -> usize {
        match &self.beam {
            Some(b) => b.width,
            None => self.best_of.unwrap_or(self.n),
        }
    }

    /// Whether the request asks for exactly one sequence, sampled (no `n`, `best_of` or beam).
    pub fn is_single_sequence(&self) -> bool {
        self.n == 1 && self.best_of.is_none_or(|b| b == 1) && self.beam.is_none()
    }

    /// For engines that return one sampled sequence per prompt and no prompt log-probabilities: an
    /// error naming `engine` when the request asks for parallel sampling, beam search or
    /// `prompt_logprobs`.
    pub fn require_single_sequence(&self, engine: &str) -> Result<()> {
        if self.is_single_sequence() && self.prompt_logprobs.is_none() {
            return Ok(());
        }
        let what = if self.beam.is_some() {
            "beam search"
        } else if self.prompt_logprobs.is_some() {
            "prompt log-probabilities (prompt_logprobs / echo with logprobs)"
        } else {
            "several sequences per prompt (n / best_of)"
        };
        Err(ModelError::InvalidSampling(format!(
            "the {engine} engine returns one sampled sequence per prompt and cannot run {what}: use the paged engine (--engine paged)"
        )))
    }

    /// Whether a step's logits are changed before sampling by a per-token rule (`logit_bias` or a
    /// constraint), so that greedy rows cannot share a plain argmax.
    pub fn has_logits_processors(&self) -> bool {
        !self.logit_bias.is_empty() || self.constraint.is_some()
    }

    /// Whether tokens are chosen by argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Rejects settings that have no meaning.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        let fail = |m: String| Err(ModelError::InvalidSampling(m));
        if self.max_new_tokens == 0 {
            return fail("max_new_tokens must be at least 1".into());
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return fail(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return fail(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if let Some(k) = self.logprobs.filter(|&k| k == 0 || k > vocab_size) {
            return fail(format!("logprobs must be between 1 and the vocabulary size {vocab_size}, got {k}"));
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > vocab_size) {
            return fail(format!("prompt_logprobs must be at most the vocabulary size {vocab_size}, got {k}"));
        }
        for (name, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                return fail(format!("{name} must be in [-2, 2], got {value}"));
            }
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return fail(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return fail(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        for (&id, &bias) in &self.logit_bias {
            if id as usize >= vocab_size {
                return fail(format!("logit_bias: {id} is not a token id of this model (vocabulary of {vocab_size})"));
            }
            if !(-100.0..=100.0).contains(&bias) {
                return fail(format!("logit_bias: the bias of token {id} must be in [-100, 100], got {bias}"));
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return fail("stop strings must not be empty".into());
        }
        if self.n == 0 {
            return fail("n must be at least 1".into());
        }
        if let Some(best_of) = self.best_of.filter(|&b| b < self.n) {
            return fail(format!("best_of ({best_of}) must be at least n ({})", self.n));
        }
        if let Some(beam) = &self.beam {
            beam.validate()?;
            if self.n > beam.width {
                return fail(format!("n ({}) cannot exceed the beam width ({})", self.n, beam.width));
            }
            if !self.is_greedy() {
                return fail("beam search is deterministic: use temperature 0".into());
            }
            if self.best_of.is_some() {
                return fail("best_of does not apply to beam search (the beam width does)".into());
            }
            if self.constraint.is_some() {
                return fail("structured outputs do not apply to beam search: drop the constraint or sample".into());
            }
            if self.has_penalties() {
                return fail(
                    "presence, frequency and repetition penalties do not apply to beam search (as in vLLM, whose beam search takes no penalties): drop them or sample".into(),
                );
            }
        }
        Ok(())
    }

    /// A fresh random stream for one request.
    pub fn rng(&self) -> ChaCha8Rng {
        match self.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        }
    }
}

/// One entry of a top-K log-probability list.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// Token id.
    pub id: u32,
    /// Natural-log probability under the model (before penalties, temperature and filtering).
    pub logprob: f32,
}

/// Per prompt token: `None` for the first (nothing precedes it), then the token's log-probability
/// given the tokens before it, followed by the top-K alternatives (`K + 1` entries, as for
/// generated tokens).
pub type PromptLogprobs = Vec<Option<Vec<TokenLogprob>>>;

/// What the sampler picked for each sequence of a step.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// One id per row.
    pub ids: Vec<u32>,
    /// With `SamplingParams::logprobs = Some(k)`, per row: the sampled token's log-probability
    /// first, then the `k` most likely tokens (`k + 1` entries; the sampled token may appear
    /// twice).
    pub logprobs: Option<Vec<Vec<TokenLogprob>>>,
}

/// The distribution that sampling draws from, after temperature, top-k and top-p: `probs[b, j]`
/// is the (unnormalized, filtered) probability of token `ids[b, j]`, sorted by decreasing
/// probability; removed tokens have probability 0 or are cut off the end.
pub fn filtered_distribution(
    logits: Tensor<2>,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
) -> (Tensor<2>, Tensor<2, Int>) {
    let [batch, vocab] = logits.dims();
    let (sorted, mut ids) = (logits / temperature).sort_descending_with_indices(1);
    let mut sorted = apply_min_p(sorted, min_p);
    if top_k > 0 && top_k < vocab {
        sorted = sorted.slice([0..batch, 0..top_k]);
        ids = ids.slice([0..batch, 0..top_k]);
    }
    let probs = softmax(sorted, 1);
    if top_p >= 1.0 {
        return (probs, ids);
    }
    let mass_before = probs.clone().cumsum(1) - probs.clone();
    let keep = mass_before.lower_elem(top_p);
    (probs * keep.float(), ids)
}

/// Picks one token per row of `logits` (`[batch, vocab]`), with `rngs[b]` the stream of row `b`,
/// `history[b]` its token history for the penalties (may be empty when every penalty is off) and
/// `allowed[b]` the tokens its constraint allows (empty when the request has none).
pub fn sample(
    logits: Tensor<2>,
    params: &SamplingParams,
    rngs: &mut [ChaCha8Rng],
    history: &[&TokenCounts],
    allowed: &[SimpleVob],
) -> Result<Sampled> {
    let raw = params.logprobs.map(|_| logits.clone());
    let chosen = sample_on_device(logits, params, rngs, history, allowed)?;
    let logprobs = match (raw, params.logprobs) {
        (Some(raw), Some(k)) => Some(step_logprobs(raw, chosen.clone(), k)?),
        _ => None,
    };
    Ok(Sampled { ids: read_ids(chosen)?, logprobs })
}

/// [`sample`]'s choice left on the device (`[batch, 1]` ids) and without log-probabilities, so
/// that an engine can gather every request's choice of a step and read them back at once.
pub fn sample_on_device(
    logits: Tensor<2>,
    params: &SamplingParams,
    rngs: &mut [ChaCha8Rng],
    history: &[&TokenCounts],
    allowed: &[SimpleVob],
) -> Result<Tensor<2, Int>> {
    let [batch, _] = logits.dims();
    let device = logits.device();
    let logits = add_biases(logits, params, allowed)?;
    let logits = apply_penalties(logits, params, history)?;
    Ok(if params.is_greedy() {
        burn_llm_kernels::argmax_rows(logits)
    } else {
        let (probs, ids) = filtered_distribution(logits, params.temperature, params.top_k, params.top_p, params.min_p);
        let n = probs.dims()[1];
        let cdf = probs.cumsum(1);
        let total = cdf.clone().slice([0..batch, n - 1..n]);
        let uniforms: Vec<f32> = rngs.iter_mut().map(|rng| rng.random::<f32>()).collect();
        let u = Tensor::<2>::from_data(TensorData::new(uniforms, [batch, 1]), &device);
        let target = (u * total).expand([batch, n]);
        let below = cdf.lower(target).int().sum_dim(1).clamp_max((n - 1) as i64);
        ids.gather(1, below)
    })
}

/// Per row of `logits` `[rows, vocab]`: the raw log-probability of `tokens[b]`, then the top `k`
/// (`k + 1` entries): what [`PromptLogprobs`] holds for each prompt token after the first, when
/// `logits` are the rows of the positions before them.
pub fn token_logprobs(logits: Tensor<2>, tokens: &[u32], k: usize) -> Result<Vec<Vec<TokenLogprob>>> {
    let ids = id_column(tokens, &logits.device());
    step_logprobs(logits, ids, k)
}

/// Per row: the log-probability of `chosen[b]` (`[batch, 1]`), then the top `k`.
fn step_logprobs(logits: Tensor<2>, chosen: Tensor<2, Int>, k: usize) -> Result<Vec<Vec<TokenLogprob>>> {
    let [batch, _] = logits.dims();
    let logprobs = log_softmax(logits, 1);
    let picked = read_floats(logprobs.clone().gather(1, chosen.clone()))?;
    let chosen = read_ids(chosen)?;
    let (values, ids) = if k == 0 {
        (Vec::new(), Vec::new())
    } else {
        let (values, ids) = logprobs.topk_with_indices(k, 1);
        (read_floats(values)?, read_ids(ids)?)
    };
    Ok((0..batch)
        .map(|b| {
            std::iter::once(TokenLogprob { id: chosen[b], logprob: picked[b] })
                .chain((0..k).map(|j| TokenLogprob { id: ids[b * k + j], logprob: values[b * k + j] }))
                .collect()
        })
        .collect())
}

/// The raw log-probability of `chosen[b]` in row `b` of `logits` (ranking samples by cumulative
/// log-probability, as `best_of` does).
pub fn chosen_logprobs(logits: Tensor<2>, chosen: &[u32]) -> Result<Vec<f32>> {
    let ids = id_column(chosen, &logits.device());
    read_floats(log_softmax(logits, 1).gather(1, ids))
}

/// Token ids as a `[n, 1]` column on `device` (what `gather` along the vocabulary takes).
fn id_column(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let column: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(column, [ids.len(), 1]), device)
}

pub(crate) fn read_floats<const D: usize>(values: Tensor<D>) -> Result<Vec<f32>> {
    let data = values.try_into_data().map_err(|e| ModelError::Device(format!("reading results back: {e:?}")))?;
    data.try_into_vec_as::<f32>().map_err(|e| ModelError::Device(format!("{e:?}")))
}

/// Reads an int tensor back as token ids.
pub(crate) fn read_ids<const D: usize>(ids: Tensor<D, Int>) -> Result<Vec<u32>> {
    ids_of(ids.try_into_data().map_err(|e| ModelError::Device(format!("reading sampled ids back: {e:?}")))?)
}

/// Token ids held by `data`, an int tensor's contents read back from its device.
pub(crate) fn ids_of(data: TensorData) -> Result<Vec<u32>> {
    let values = data.try_into_vec_as::<i64>().map_err(|e| ModelError::Device(format!("{e:?}")))?;
    Ok(values.into_iter().map(|v| v as u32).collect())
}
