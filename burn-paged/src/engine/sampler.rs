//! Sampling for a step's rows, grouped by request: greedy rows of every request share one
//! `argmax`, greedy rows held only by a structured-output constraint included. Such a row keeps
//! that token when its mask allows it (it is then the masked argmax too) and otherwise takes the
//! argmax over its allowed tokens alone ([`masked_argmax`]), so no `[rows, vocab]` bias is built.
//! Requests with their own sampling settings (penalties included: each sequence brings its own
//! token history), parallel samples to start, best-of scoring or beam search are handled per
//! request.
//!
//! Every choice that needs no log-probability stays on the device until the end of the step, where
//! all of them are concatenated and read back at once: on a GPU each read-back waits for the
//! device queue to drain, so one per request would serialize the step on the host.

use burn::tensor::{Int, Tensor, TensorData};
use burn_llm_models::TokenLogprob;
use burn_llm_models::generation::processors::masked_argmax;
use burn_llm_models::generation::{SimpleVob, TokenCounts, chosen_logprobs, sample, sample_on_device};
use rand_chacha::ChaCha8Rng;

use super::{RequestData, log_softmax_rows, sample_rng};
use crate::error::{PagedError, Result};
use crate::memory::SeqId;
use crate::scheduler::{GroupId, ScheduledSeq, Scheduler};

/// What was drawn for one row (one sequence, or one parallel sample of a prompt).
#[derive(Debug, Clone)]
pub(crate) struct RowChoice {
    /// The sequence whose logits these are.
    pub seq: SeqId,
    /// The sampled token (unused for beam search).
    pub token: u32,
    /// Its log-probability, when the request ranks samples by it (`best_of`).
    pub logprob: f32,
    /// Top-K log-probabilities, when requested.
    pub top_logprobs: Option<Vec<TokenLogprob>>,
    /// The whole log-softmax row (beam search only).
    pub logprob_row: Vec<f32>,
    /// The random stream after this draw, for a sample that does not have its own state yet.
    pub rng: Option<ChaCha8Rng>,
}

impl RowChoice {
    fn token(seq: SeqId, token: u32) -> Self {
        Self { seq, token, logprob: 0.0, top_logprobs: None, logprob_row: Vec::new(), rng: None }
    }
}

fn index(rows: &[usize], logits: &Tensor<2>) -> Tensor<1, Int> {
    let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    Tensor::from_data(TensorData::new(ids, [rows.len()]), &logits.device())
}

fn ids_of(t: Tensor<1, Int>) -> Result<Vec<u32>> {
    let data = t.try_into_data().map_err(|e| PagedError::Device(format!("reading sampled ids back: {e:?}")))?;
    let values = data.try_into_vec_as::<i64>().map_err(|e| PagedError::Device(format!("{e:?}")))?;
    Ok(values.into_iter().map(|v| v as u32).collect())
}

/// Draws the next token(s) of every sequence in `seqs` (those the step samples); `logits` has
/// one row per entry of `seqs`, in order.
pub(crate) fn sample_groups(
    logits: Tensor<2>,
    seqs: &[&ScheduledSeq],
    scheduler: &mut Scheduler<RequestData>,
) -> Result<Vec<(GroupId, Vec<RowChoice>)>> {
    let mut groups: Vec<(GroupId, Vec<usize>)> = Vec::new();
    for (row, s) in seqs.iter().enumerate() {
        match groups.last_mut() {
            Some((g, rows)) if *g == s.group => rows.push(row),
            _ => groups.push((s.group, vec![row])),
        }
    }
    let mut out: Vec<(GroupId, Vec<usize>, Vec<RowChoice>)> = Vec::with_capacity(groups.len());
    // Per-request choices left on the device (`[width, 1]` ids), with their entry in `out`.
    let mut deferred: Vec<(usize, Tensor<2, Int>)> = Vec::new();
    let mut greedy_rows = Vec::new();
    // Greedy rows whose only logits processor is a constraint, and their token masks.
    let (mut masked_rows, mut masks) = (Vec::new(), Vec::new());
    for (group_id, rows) in &groups {
        let Some(group) = scheduler.group_mut(*group_id) else { continue };
        let data = &mut group.data;
        let p = &data.params;
        let ranked = p.best_of.is_some_and(|b| b > p.n);
        if data.beam.is_some() {
            let flat = log_softmax_rows(logits.clone().select(0, index(rows, &logits)))?;
            let vocab = flat.len() / rows.len().max(1);
            let choices = rows
                .iter()
                .zip(flat.chunks_exact(vocab.max(1)))
                .map(|(&r, row)| RowChoice { logprob_row: row.to_vec(), ..RowChoice::token(seqs[r].seq, 0) })
                .collect();
            out.push((*group_id, rows.clone(), choices));
            continue;
        }
        // An argmax over the row is all this request needs, unmasked or behind its constraint.
        let argmax_only = p.is_greedy() && p.logprobs.is_none() && !ranked && data.expanded && !p.has_penalties();
        if argmax_only && !p.has_logits_processors() {
            greedy_rows.extend(rows.iter().copied());
            out.push((*group_id, rows.clone(), Vec::new()));
            continue;
        }
        if argmax_only
            && p.logit_bias.is_empty()
            && let Some(row_masks) = row_masks(rows, seqs, data)?
        {
            masked_rows.extend(rows.iter().copied());
            masks.extend(row_masks);
            out.push((*group_id, rows.clone(), Vec::new()));
            continue;
        }
        // Per-request sampling: the rows of its sequences, or the prompt's row once per sample.
        let expanding = !data.expanded;
        let width = if expanding { group.max_seqs } else { rows.len() };
        let picked: Vec<usize> = if expanding { vec![rows[0]; width] } else { rows.clone() };
        let seq_of = |i: usize| seqs[picked[i]].seq;
        let mut rngs: Vec<ChaCha8Rng> = (0..width)
            .map(|i| match data.live.get(&seq_of(i)) {
                Some(d) if !expanding || i == 0 => d.rng.clone(),
                _ => sample_rng(&data.params, i as u64),
            })
            .collect();
        let selected = logits.clone().select(0, index(&picked, &logits));
        let mut allowed: Vec<SimpleVob> = Vec::new();
        if data.params.constraint.is_some() {
            for i in 0..width {
                let mask = match (expanding, allowed.first()) {
                    (true, Some(first)) => Some(first.clone()),
                    _ => data.live.get_mut(&seq_of(i)).map(|d| d.state.allowed_tokens()).transpose()?.flatten(),
                };
                allowed.extend(mask);
            }
        }
        let history: Vec<&TokenCounts> =
            (0..width).filter_map(|i| data.live.get(&seq_of(i)).and_then(|d| d.state.token_counts())).collect();
        // Without log-probabilities the ids stay on the device until the step's one read-back,
        // which fills in this request's tokens (left 0 here).
        let (ids, chosen_logprobs, mut tops) = if data.params.logprobs.is_none() && !ranked {
            deferred.push((out.len(), sample_on_device(selected, &data.params, &mut rngs, &history, &allowed)?));
            (Vec::new(), vec![0.0; width], None)
        } else {
            let sampled = sample(selected.clone(), &data.params, &mut rngs, &history, &allowed)?;
            let chosen_logprobs = match &sampled.logprobs {
                Some(steps) if ranked => steps.iter().map(|step| step[0].logprob).collect(),
                None if ranked => chosen_logprobs(selected, &sampled.ids)?,
                _ => vec![0.0; width],
            };
            (sampled.ids, chosen_logprobs, sampled.logprobs.map(Vec::into_iter))
        };
        let mut choices = Vec::with_capacity(width);
        for (i, rng) in rngs.into_iter().enumerate() {
            let seq = seq_of(i);
            if !expanding && let Some(d) = data.live.get_mut(&seq) {
                d.rng = rng.clone();
            }
            choices.push(RowChoice {
                seq,
                token: ids.get(i).copied().unwrap_or(0),
                logprob: chosen_logprobs[i],
                top_logprobs: tops.as_mut().and_then(Iterator::next),
                logprob_row: Vec::new(),
                rng: expanding.then_some(rng),
            });
        }
        out.push((*group_id, rows.clone(), choices));
    }
    // One read-back for the step: greedy and masked greedy rows' argmax, then each deferred
    // request.
    let mut parts: Vec<Tensor<2, Int>> = Vec::with_capacity(deferred.len() + 1);
    greedy_rows.extend(&masked_rows);
    if !greedy_rows.is_empty() {
        let all = greedy_rows.len() == logits.dims()[0];
        let rows = if all { logits.clone() } else { logits.clone().select(0, index(&greedy_rows, &logits)) };
        parts.push(burn_llm_kernels::argmax_rows(rows));
    }
    parts.extend(deferred.iter().map(|(_, ids)| ids.clone()));
    if parts.is_empty() {
        return Ok(out.into_iter().map(|(g, _, choices)| (g, choices)).collect());
    }
    let total: usize = parts.iter().map(|p| p.dims()[0]).sum();
    // Argmax and sort indices may come out in different integer types (Flex's argmax is `i64`);
    // cast only then, since not every backend implements the cast (remote workers).
    let dtype = parts[0].dtype();
    let parts = parts.into_iter().map(|p| if p.dtype() == dtype { p } else { p.cast(dtype) }).collect();
    let ids = ids_of(Tensor::cat(parts, 0).reshape([total]))?;
    let (direct, rest) = ids.split_at(greedy_rows.len());
    let mut token_of: std::collections::HashMap<usize, u32> =
        greedy_rows.iter().copied().zip(direct.iter().copied()).collect();
    // Masked rows whose unmasked argmax the constraint forbids: the argmax over their allowed
    // tokens instead.
    let (refused, refused_masks): (Vec<usize>, Vec<SimpleVob>) = masked_rows
        .iter()
        .zip(masks)
        .filter(|(r, mask)| !token_of.get(r).is_some_and(|&t| mask.is_allowed(t)))
        .map(|(&r, mask)| (r, mask))
        .unzip();
    if !refused.is_empty() {
        let chosen = masked_argmax(logits.clone().select(0, index(&refused, &logits)), &refused_masks)?;
        token_of.extend(refused.into_iter().zip(chosen));
    }
    let mut rest = rest.iter();
    for (entry, _) in &deferred {
        for choice in out[*entry].2.iter_mut() {
            choice.token = *rest.next().ok_or_else(|| PagedError::Device("fewer sampled ids than rows".into()))?;
        }
    }
    if !token_of.is_empty() {
        for (_, rows, choices) in out.iter_mut() {
            if choices.is_empty() {
                *choices =
                    rows.iter().filter_map(|r| token_of.get(r).map(|&t| RowChoice::token(seqs[*r].seq, t))).collect();
            }
        }
    }
    Ok(out.into_iter().map(|(g, _, choices)| (g, choices)).collect())
}

/// The token masks of a greedy request's `rows` when every one of its sequences has a live
/// constraint (`None` otherwise: the request is sampled on its own).
fn row_masks(rows: &[usize], seqs: &[&ScheduledSeq], data: &mut RequestData) -> Result<Option<Vec<SimpleVob>>> {
    if data.params.constraint.is_none() {
        return Ok(None);
    }
    let mut masks = Vec::with_capacity(rows.len());
    for &r in rows {
        let Some(live) = data.live.get_mut(&seqs[r].seq) else { return Ok(None) };
        match live.state.allowed_tokens()? {
            Some(mask) => masks.push(mask),
            None => return Ok(None),
        }
    }
    Ok(Some(masks))
}

/// Whether a sequence `seqs` samples from has a structured-output constraint.
pub(crate) fn constrained(seqs: &[ScheduledSeq], scheduler: &Scheduler<RequestData>) -> bool {
    seqs.iter().any(|s| s.sample && scheduler.group(s.group).is_some_and(|g| g.data.params.constraint.is_some()))
}

/// Computes the token mask of every constrained sequence `seqs` samples from, which its
/// constraint keeps until the token is committed ([`sample_groups`] then reads it). A mask that
/// fails here is computed again there, where its error is reported.
pub(crate) fn prefetch_masks(seqs: &[ScheduledSeq], scheduler: &mut Scheduler<RequestData>) {
    for s in seqs.iter().filter(|s| s.sample) {
        if let Some(group) = scheduler.group_mut(s.group)
            && group.data.params.constraint.is_some()
            && let Some(live) = group.data.live.get_mut(&s.seq)
        {
            let _ = live.state.allowed_tokens();
        }
    }
}
