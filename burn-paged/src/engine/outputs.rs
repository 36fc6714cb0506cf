//! Output assembly (vLLM's output processor): a step's sampled rows applied to their requests
//! (tokens, stop rules, forks of parallel samples and beams) and the final outputs of a finishing
//! group, best first. What each step reports is [`StepOutput`], shared by every engine and
//! defined in the models crate.

use burn_llm_models::{FinishReason, LanguageModel, RequestOutput};

pub use burn_llm_models::generation::{SequenceDelta, StepOutput};

use super::sampler::RowChoice;
use super::{LlmEngine, sample_rng};
use crate::error::{PagedError, Result};
use crate::memory::SeqId;
use crate::scheduler::{GroupId, Sequence};

impl<M: LanguageModel> LlmEngine<M> {
    /// Applies one group's sampled rows: tokens, forks (parallel samples, beams), finishes.
    pub(super) fn apply(&mut self, group_id: GroupId, rows: Vec<RowChoice>) -> Result<Option<StepOutput>> {
        let Some(group) = self.scheduler.group(group_id) else { return Ok(None) };
        let request_id = group.data.request_id.clone();
        if group.data.beam.is_some() {
            return self.apply_beam(group_id, rows);
        }
        let needs_expansion = !group.data.expanded;
        let mut deltas = Vec::new();
        if needs_expansion {
            // The prompt ran once; its sampled tokens seed every parallel sample.
            let RowChoice { seq: parent, .. } = rows[0].clone();
            let width = group.max_seqs;
            let mut children = vec![parent];
            for _ in 1..width {
                let child = self.alloc_seq();
                self.blocks.fork(parent, child)?;
                children.push(child);
            }
            let Some(group) = self.scheduler.group_mut(group_id) else { return Ok(None) };
            let (template, parent_data) = match (group.seqs.first().cloned(), group.data.live.get(&parent).cloned()) {
                (Some(t), Some(d)) => (t, d),
                _ => return Ok(None),
            };
            for (i, (&child, row)) in children.iter().zip(&rows).enumerate() {
                let rng = row.rng.clone().unwrap_or_else(|| sample_rng(&group.data.params, i as u64));
                if i == 0 {
                    if let Some(d) = group.data.live.get_mut(&child) {
                        d.rng = rng;
                    }
                    continue;
                }
                group.seqs.push(Sequence { id: child, ..template.clone() });
                let mut data = parent_data.clone();
                data.index = i;
                data.rng = rng;
                group.data.live.insert(child, data);
            }
            group.data.expanded = true;
            for (row, &child) in rows.into_iter().zip(&children) {
                deltas.push(self.push_token(group_id, child, row)?);
            }
        } else {
            for row in rows {
                let seq = row.seq;
                deltas.push(self.push_token(group_id, seq, row)?);
            }
        }
        let finished = match self.scheduler.group(group_id) {
            Some(g) if g.seqs.is_empty() => Some(self.finish_group(group_id, false)?),
            _ => None,
        };
        Ok(Some(StepOutput { request_id, sequences: deltas, finished, prompt_logprobs: None, step_started: None }))
    }

    /// Records a sampled token for one sequence and retires it when it stops.
    fn push_token(&mut self, group_id: GroupId, seq: SeqId, row: RowChoice) -> Result<SequenceDelta> {
        let tokenizer = self.tokenizer.as_ref();
        let eos = &self.eos_token_ids;
        let group = self
            .scheduler
            .group_mut(group_id)
            .ok_or_else(|| PagedError::Internal(format!("request group {group_id} vanished")))?;
        let data =
            group.data.live.get_mut(&seq).ok_or_else(|| PagedError::Internal(format!("sequence {seq:?} vanished")))?;
        data.cumulative_logprob += row.logprob as f64;
        let logprobs = row.top_logprobs.clone().map(|step| vec![step]);
        let text = data.state.push(row.token, row.top_logprobs, &group.data.params, eos, tokenizer)?;
        let finish_reason = data.state.finish_reason();
        let index = data.index;
        if let Some(s) = group.seqs.iter_mut().find(|s| s.id == seq) {
            s.tokens.push(row.token);
        }
        if finish_reason.is_some() {
            group.seqs.retain(|s| s.id != seq);
            if let Some(data) = group.data.live.remove(&seq) {
                group.data.done.push(data);
            }
            self.blocks.free(seq)?;
        }
        self.stats.generated_tokens += 1;
        Ok(SequenceDelta { index, token_ids: vec![row.token], text, logprobs, finish_reason })
    }

    /// One beam-search step: the search picks the next live beams (parent, token); parents kept by
    /// several children are forked (sharing blocks, copy-on-write on divergence), dropped ones
    /// freed.
    fn apply_beam(&mut self, group_id: GroupId, rows: Vec<RowChoice>) -> Result<Option<StepOutput>> {
        let Some(group) = self.scheduler.group_mut(group_id) else { return Ok(None) };
        let request_id = group.data.request_id.clone();
        let vocab = rows.first().map_or(0, |r| r.logprob_row.len());
        let order: Vec<SeqId> = rows.iter().map(|r| r.seq).collect();
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.logprob_row.iter().copied()).collect();
        let Some(search) = group.data.beam.as_mut() else { return Ok(None) };
        let result = search.step(&flat, vocab)?;
        self.stats.generated_tokens += result.beams.len();
        let parents: Vec<Sequence> =
            order.iter().filter_map(|id| group.seqs.iter().find(|s| s.id == *id).cloned()).collect();
        let mut used = vec![false; parents.len()];
        let mut next = Vec::with_capacity(result.beams.len());
        let mut forks = Vec::new();
        for &(parent, token) in &result.beams {
            let Some(p) = parents.get(parent) else { continue };
            let mut seq = p.clone();
            if used[parent] {
                self.next_seq += 1;
                seq.id = self.next_seq;
                forks.push((p.id, seq.id));
            }
            used[parent] = true;
            seq.tokens.push(token);
            next.push(seq);
        }
        for (parent, child) in forks {
            self.blocks.fork(parent, child)?;
        }
        for (p, kept) in parents.iter().zip(&used) {
            if !kept {
                self.blocks.free(p.id)?;
            }
        }
        let Some(group) = self.scheduler.group_mut(group_id) else { return Ok(None) };
        group.seqs = next;
        let finished =
            if result.done || group.seqs.is_empty() { Some(self.finish_group(group_id, false)?) } else { None };
        Ok(Some(StepOutput { request_id, sequences: Vec::new(), finished, prompt_logprobs: None, step_started: None }))
    }

    /// Removes a group and builds its final outputs, best first (`abort`: live sequences are cut
    /// short with finish reason `abort`).
    pub(super) fn finish_group(&mut self, group_id: GroupId, abort: bool) -> Result<Vec<RequestOutput>> {
        let group = self
            .scheduler
            .remove(group_id, &mut self.blocks)
            .ok_or_else(|| PagedError::Internal(format!("unknown request group {group_id}")))?;
        for seq in group.seq_ids() {
            self.blocks.set_prefix_lookup(seq, true);
        }
        let mut data = group.data;
        self.requests.remove(&data.request_id);
        if let Some(search) = data.beam.take() {
            let tokenizer = self.tokenizer.as_ref();
            let eos = &self.eos_token_ids;
            let n = data.params.n;
            // The beams' outputs take the prompt from the request's first sequence, the one
            // place it is held.
            let first = data
                .live
                .values()
                .chain(&data.done)
                .next()
                .ok_or_else(|| PagedError::Internal(format!("request group {group_id} has no sequence state")))?;
            return search
                .finish()
                .into_iter()
                .take(n)
                .map(|h| {
                    let text = match tokenizer {
                        Some(t) => t.decode(&h.tokens)?,
                        None => String::new(),
                    };
                    let stopped =
                        h.tokens.last().is_some_and(|t| eos.contains(t) || data.params.stop_token_ids.contains(t));
                    Ok(RequestOutput {
                        generated_ids: h.tokens,
                        text,
                        finish_reason: if abort {
                            FinishReason::Abort
                        } else if stopped {
                            FinishReason::Stop
                        } else {
                            FinishReason::Length
                        },
                        logprobs: None,
                        prompt_logprobs: data.prompt_logprobs.clone(),
                        ..first.state.clone().into_output()
                    })
                })
                .collect::<std::result::Result<Vec<_>, burn_llm_models::ModelError>>()
                .map_err(PagedError::from);
        }
        let tokenizer = self.tokenizer.as_ref();
        for (_, mut seq) in data.live.drain() {
            seq.state.abort(tokenizer)?;
            data.done.push(seq);
        }
        let mut done = data.done;
        done.sort_by_key(|s| s.index);
        if data.params.best_of.is_some_and(|b| b > data.params.n) {
            done.sort_by(|a, b| b.cumulative_logprob.total_cmp(&a.cumulative_logprob));
        }
        let prompt_logprobs = data.prompt_logprobs;
        Ok(done
            .into_iter()
            .take(data.params.n)
            .map(|s| RequestOutput { prompt_logprobs: prompt_logprobs.clone(), ..s.state.into_output() })
            .collect())
    }
}
