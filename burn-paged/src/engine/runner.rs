//! The model runner (vLLM v1's `GPUModelRunner`): given what the scheduler chose for a step, it
//! lays the tokens out for the paged cache, runs the model over them and returns the logits of
//! the last token of each sequence the step samples, with the prompt log-probabilities asked
//! for. It knows the block tables and the model, never the requests: what to sample, and what a
//! row means for its request, is the engine's business.
//!
//! Micro-batches: over pipeline stages a step's sequences are split into
//! [`ModelRunner::micro_batches`] contiguous parts issued in pipeline order; with a
//! [`PrefillSlicing`] (TeraPipe), each sequence's prompt tokens are further cut into slices, each
//! a micro-batch of its own, in order, so that stage `s + 1` runs slice `i` while stage `s` runs
//! slice `i + 1`. Slice `i + 1` attends over slice `i`'s keys, which the same stage cached when
//! it ran slice `i`. Schedule order is kept throughout, so a sequence that maps prefix-cache
//! blocks written earlier in the same step runs after the sequence writing them.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::{Int, Tensor, TensorData};
use burn_llm_models::generation::token_logprobs;
use burn_llm_models::{LanguageModel, PrefillSlicing, PromptLogprobs, StepInput};

use crate::cache::{PagedKvCache, PagedStep};
use crate::error::{PagedError, Result};
use crate::memory::BlockManager;
use crate::scheduler::{GroupId, ScheduledSeq};

/// Prompt log-probabilities wanted for one scheduled sequence's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PromptLogprobsWanted {
    /// Top log-probabilities per position.
    pub k: usize,
    /// The prompt token after this chunk, when the chunk does not end the prompt: its
    /// log-probability comes from the chunk's last position.
    pub next: Option<u32>,
}

/// What one forward pass produced.
pub(super) struct RunnerOutput {
    /// Logits of the last token of each sequence with [`ScheduledSeq::sample`], `[rows, vocab]`,
    /// in schedule order; `None` when the step samples nothing (only prompt chunks ran).
    pub logits: Option<Tensor<2>>,
    /// The prompt log-probabilities of this step's tokens for the groups that asked (see
    /// [`ModelRunner::execute`]): a chunk starting at position 0 begins with `None`.
    pub prompt_logprobs: HashMap<GroupId, PromptLogprobs>,
}

/// The model, its paged KV cache, and how a step is split into micro-batches.
pub(super) struct ModelRunner<M: LanguageModel> {
    pub model: M,
    pub cache: PagedKvCache,
    /// Micro-batches a step's sequences are split into, at most (before prefill slicing).
    pub micro_batches: usize,
    /// How prompt tokens are sliced through pipeline stages (used only over several stages).
    pub slicing: Option<Arc<dyn PrefillSlicing>>,
}

/// Tokens `range` of scheduled sequence `seq` (an index into the step's sequences).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Piece {
    seq: usize,
    range: Range<usize>,
}

impl<M: LanguageModel> ModelRunner<M> {
    /// One forward pass over the step's tokens, in micro-batches (see the module docs), each
    /// flattened into one row. `wanted[i]` asks for the prompt log-probabilities of `seqs[i]`'s
    /// tokens.
    pub fn execute(
        &mut self,
        seqs: &[ScheduledSeq],
        blocks: &BlockManager,
        wanted: &[Option<PromptLogprobsWanted>],
    ) -> Result<RunnerOutput> {
        let batches = self.plan_micro_batches(seqs)?;
        let (steps, inputs): (Vec<PagedStep>, Vec<(StepInput, Vec<i64>)>) =
            batches.iter().map(|pieces| self.lay_out(pieces, seqs, blocks)).unzip();
        self.cache.begin_micro_batches(&steps)?;
        let (inputs, lasts): (Vec<StepInput>, Vec<Vec<i64>>) = inputs.into_iter().unzip();
        let states = if inputs.len() == 1 {
            vec![self.model.forward(&inputs[0], &mut self.cache)?]
        } else {
            self.model.forward_micro_batches(&inputs, &mut self.cache)?
        };
        self.cache.end_step();
        // Each sequence's rows whose prompt log-probabilities are wanted, gathered over pieces.
        let mut logprob_rows: HashMap<usize, Vec<Tensor<2>>> = HashMap::new();
        let mut logits = Vec::with_capacity(states.len());
        for ((states, last), pieces) in states.into_iter().zip(lasts).zip(&batches) {
            let [_, n, embed] = states.dims();
            let states = states.reshape([n, embed]);
            let mut column = 0;
            for piece in pieces {
                let len = piece.range.len();
                if wanted.get(piece.seq).copied().flatten().is_some() {
                    logprob_rows
                        .entry(piece.seq)
                        .or_default()
                        .push(states.clone().slice([column..column + len, 0..embed]));
                }
                column += len;
            }
            if last.is_empty() {
                continue;
            }
            let count = last.len();
            let rows = Tensor::<1, Int>::from_data(TensorData::new(last, [count]), &states.device());
            logits.push(self.model.logits(states.select(0, rows)));
        }
        let mut by_group = HashMap::new();
        for (i, parts) in logprob_rows {
            let (s, Some(w)) = (&seqs[i], wanted[i]) else { continue };
            let rows = if parts.len() == 1 { parts.into_iter().next() } else { Some(Tensor::cat(parts, 0)) };
            let Some(rows) = rows else { continue };
            by_group.insert(s.group, self.prompt_logprobs(rows, s, w)?);
        }
        let logits = match logits.len() {
            0 => None,
            1 => logits.pop(),
            _ => Some(Tensor::cat(logits, 0)),
        };
        Ok(RunnerOutput { logits, prompt_logprobs: by_group })
    }

    /// The step's micro-batches: the sequences split into at most `micro_batches` contiguous
    /// parts; over several stages with a slicing, a sequence's prompt tokens (more than one)
    /// become one micro-batch per slice, in place, the part's other sequences staying together
    /// around them.
    fn plan_micro_batches(&self, seqs: &[ScheduledSeq]) -> Result<Vec<Vec<Piece>>> {
        let parts = self.micro_batches.clamp(1, seqs.len().max(1));
        let (per, extra) = (seqs.len() / parts, seqs.len() % parts);
        let slicing = self.slicing.as_ref().filter(|_| self.model.num_stages() > 1);
        let mut batches = Vec::new();
        let mut start = 0;
        for part in 0..parts {
            let end = start + per + usize::from(part < extra);
            let mut current = Vec::new();
            for (i, s) in seqs.iter().enumerate().take(end).skip(start) {
                let len = s.tokens.len();
                let slices = match slicing {
                    Some(slicing) if len > 1 => checked_slices(slicing.slices(len, s.start), len)?,
                    _ => vec![len],
                };
                if slices.len() == 1 {
                    current.push(Piece { seq: i, range: 0..len });
                    continue;
                }
                if !current.is_empty() {
                    batches.push(std::mem::take(&mut current));
                }
                let mut at = 0;
                for slice in slices {
                    batches.push(vec![Piece { seq: i, range: at..at + slice }]);
                    at += slice;
                }
            }
            if !current.is_empty() {
                batches.push(current);
            }
            start = end;
        }
        Ok(batches)
    }

    /// The prompt log-probabilities of `s`'s tokens from their final hidden states `rows`
    /// `[s.tokens.len(), embed]`: each position's log-probability of the next prompt token (the
    /// chunk's own, then `wanted.next`), `None` first when the chunk starts the prompt. A bounded
    /// number of rows at a time (the logits of a long prompt over a large vocabulary would not
    /// fit at once).
    fn prompt_logprobs(
        &self,
        rows: Tensor<2>,
        s: &ScheduledSeq,
        wanted: PromptLogprobsWanted,
    ) -> Result<PromptLogprobs> {
        const ROWS_PER_PASS: usize = 256;
        let [_, embed] = rows.dims();
        let targets: Vec<u32> = s.tokens.iter().skip(1).copied().chain(wanted.next).collect();
        let mut out: PromptLogprobs = Vec::with_capacity(targets.len() + 1);
        if s.start == 0 {
            out.push(None);
        }
        for start in (0..targets.len()).step_by(ROWS_PER_PASS) {
            let end = (start + ROWS_PER_PASS).min(targets.len());
            let logits = self.model.logits(rows.clone().slice([start..end, 0..embed]));
            out.extend(token_logprobs(logits, &targets[start..end], wanted.k)?.into_iter().map(Some));
        }
        Ok(out)
    }

    /// The layout of one micro-batch: its slots and block tables for the cache, its tokens and
    /// positions flattened into one row for the model, and the column of the last token of each
    /// sequence it completes and samples.
    fn lay_out(
        &self,
        pieces: &[Piece],
        seqs: &[ScheduledSeq],
        blocks: &BlockManager,
    ) -> (PagedStep, (StepInput, Vec<i64>)) {
        let mut step = PagedStep::default();
        let (mut tokens, mut positions, mut last) = (Vec::new(), Vec::new(), Vec::new());
        let tables: Vec<Vec<u32>> = pieces
            .iter()
            .map(|p| {
                let table = blocks.block_table(seqs[p.seq].seq).unwrap_or_default();
                table.iter().map(|b| b.0).collect()
            })
            .collect();
        step.max_blocks = tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
        for (row, piece) in pieces.iter().enumerate() {
            let s = &seqs[piece.seq];
            for i in piece.range.clone() {
                tokens.push(s.tokens[i] as i64);
                positions.push((s.start + i) as i64);
                step.slots.push(s.slots[i] as u32);
                step.query_seq.push(row as u32);
                step.context_lens.push((s.start + i + 1) as u32);
            }
            if s.sample && piece.range.end == s.tokens.len() {
                last.push((tokens.len() - 1) as i64);
            }
            let mut table = tables[row].clone();
            table.resize(step.max_blocks, 0);
            step.block_tables.extend(table);
        }
        let n = tokens.len();
        let max_position = positions.iter().copied().max().unwrap_or(0) as usize;
        let device = self.model.device();
        let input = StepInput {
            tokens: Tensor::<2, Int>::from_data(TensorData::new(tokens, [1, n]), &device),
            positions: Tensor::<2, Int>::from_data(TensorData::new(positions, [1, n]), &device),
            max_position,
            last: vec![Some(n.saturating_sub(1))],
        };
        (step, (input, last))
    }
}

/// `slices` if they cut `len` tokens into pieces of at least one token; an error naming the
/// slicing otherwise (a bug in the slicing, not in the request).
fn checked_slices(slices: Vec<usize>, len: usize) -> Result<Vec<usize>> {
    if slices.iter().all(|&s| s > 0) && slices.iter().sum::<usize>() == len {
        return Ok(slices);
    }
    Err(PagedError::Internal(format!("the prefill slicing cut {len} tokens into {slices:?}")))
}
