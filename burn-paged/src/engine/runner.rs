//! The model runner (vLLM v1's `GPUModelRunner`): given what the scheduler chose for a step, it
//! lays the tokens out for the paged cache, runs the model over them and returns the logits of
//! each scheduled sequence's last token, with the prompt log-probabilities asked for. It knows
//! the block tables and the model, never the requests: what to sample, and what a row means for
//! its request, is the engine's business.

use std::collections::HashMap;

use burn::tensor::{Int, Tensor, TensorData};
use burn_llm_models::generation::token_logprobs;
use burn_llm_models::{LanguageModel, PromptLogprobs, StepInput};

use crate::cache::{PagedKvCache, PagedStep};
use crate::error::Result;
use crate::memory::BlockManager;
use crate::scheduler::{GroupId, ScheduledSeq};

/// What one forward pass produced.
pub(super) struct RunnerOutput {
    /// Logits of each scheduled sequence's last token, `[rows, vocab]`, in schedule order.
    pub logits: Tensor<2>,
    /// Prompt log-probabilities of the groups that asked for them (see [`ModelRunner::execute`]).
    pub prompt_logprobs: HashMap<GroupId, PromptLogprobs>,
}

/// The model, its paged KV cache, and how a step is split into micro-batches.
pub(super) struct ModelRunner<M: LanguageModel> {
    pub model: M,
    pub cache: PagedKvCache,
    /// Micro-batches a step is split into, at most.
    pub micro_batches: usize,
}

impl<M: LanguageModel> ModelRunner<M> {
    /// One forward pass over the step's tokens: the scheduled sequences split into at most
    /// `micro_batches` micro-batches, each flattened into one row and run through the stages in
    /// pipeline order. `prompt_logprobs[i]` is `Some(k)` when `seqs[i]` runs its group's whole
    /// prompt and the group asked for its `k` top prompt log-probabilities.
    pub fn execute(
        &mut self,
        seqs: &[ScheduledSeq],
        blocks: &BlockManager,
        prompt_logprobs: &[Option<usize>],
    ) -> Result<RunnerOutput> {
        let parts = self.micro_batches.clamp(1, seqs.len());
        let (per, extra) = (seqs.len() / parts, seqs.len() % parts);
        let mut chunks = Vec::with_capacity(parts);
        let mut start = 0;
        for i in 0..parts {
            let len = per + usize::from(i < extra);
            chunks.push(start..start + len);
            start += len;
        }
        let (steps, inputs): (Vec<PagedStep>, Vec<(StepInput, Vec<i64>)>) =
            chunks.iter().map(|chunk| self.lay_out(&seqs[chunk.clone()], blocks)).unzip();
        self.cache.begin_micro_batches(&steps)?;
        let (inputs, lasts): (Vec<StepInput>, Vec<Vec<i64>>) = inputs.into_iter().unzip();
        let states = if inputs.len() == 1 {
            vec![self.model.forward(&inputs[0], &mut self.cache)?]
        } else {
            self.model.forward_micro_batches(&inputs, &mut self.cache)?
        };
        let mut by_group = HashMap::new();
        let mut logits = Vec::with_capacity(states.len());
        for ((states, last), chunk) in states.into_iter().zip(lasts).zip(chunks) {
            let [_, n, embed] = states.dims();
            let states = states.reshape([n, embed]);
            let mut column = 0;
            for i in chunk {
                let s = &seqs[i];
                if let Some(k) = prompt_logprobs.get(i).copied().flatten() {
                    let logprobs = match s.tokens.len() {
                        0 | 1 => vec![None],
                        len => self.prompt_logprobs(
                            states.clone().slice([column..column + len - 1, 0..embed]),
                            &s.tokens,
                            k,
                        )?,
                    };
                    by_group.insert(s.group, logprobs);
                }
                column += s.tokens.len();
            }
            let count = last.len();
            let rows = Tensor::<1, Int>::from_data(TensorData::new(last, [count]), &states.device());
            logits.push(self.model.logits(states.select(0, rows)));
        }
        let logits = match logits.len() {
            1 => logits.remove(0),
            _ => Tensor::cat(logits, 0),
        };
        Ok(RunnerOutput { logits, prompt_logprobs: by_group })
    }

    /// The prompt log-probabilities of `tokens` from the final hidden states `rows`
    /// `[tokens.len() − 1, embed]` of every position but the last, a bounded number of rows at a
    /// time (the logits of a long prompt over a large vocabulary would not fit at once).
    fn prompt_logprobs(&self, rows: Tensor<2>, tokens: &[u32], k: usize) -> Result<PromptLogprobs> {
        const ROWS_PER_PASS: usize = 256;
        let [n, embed] = rows.dims();
        let mut out: PromptLogprobs = Vec::with_capacity(tokens.len());
        out.push(None);
        for start in (0..n).step_by(ROWS_PER_PASS) {
            let end = (start + ROWS_PER_PASS).min(n);
            let logits = self.model.logits(rows.clone().slice([start..end, 0..embed]));
            out.extend(token_logprobs(logits, &tokens[start + 1..end + 1], k)?.into_iter().map(Some));
        }
        Ok(out)
    }

    /// The layout of one micro-batch: its slots and block tables for the cache, its tokens and
    /// positions flattened into one row for the model, and the column of each sequence's last
    /// token.
    fn lay_out(&self, seqs: &[ScheduledSeq], blocks: &BlockManager) -> (PagedStep, (StepInput, Vec<i64>)) {
        let mut step = PagedStep::default();
        let (mut tokens, mut positions, mut last) = (Vec::new(), Vec::new(), Vec::new());
        let tables: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| {
                let table = blocks.block_table(s.seq).unwrap_or_default();
                table.iter().map(|b| b.0).collect()
            })
            .collect();
        step.max_blocks = tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
        for (row, s) in seqs.iter().enumerate() {
            for (i, &t) in s.tokens.iter().enumerate() {
                tokens.push(t as i64);
                positions.push((s.start + i) as i64);
                step.slots.push(s.slots[i] as u32);
                step.query_seq.push(row as u32);
                step.context_lens.push((s.start + i + 1) as u32);
            }
            last.push((tokens.len() - 1) as i64);
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
            last: vec![Some(n - 1)],
        };
        (step, (input, last))
    }
}
