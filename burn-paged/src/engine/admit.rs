//! A request checked and laid out before it joins an engine's scheduler: its sampling
//! parameters, its prompt (tokenized, within the context and the step's token budget), its beam
//! search and its stop rules. The check needs only the model's shape, the tokenizer and the
//! engine's limits, none of its state, so [`super::VirtualEngines`] checks a request in front of
//! its engines and hands it to one without waiting for that engine's step to end.

use burn_llm_models::generation::{RequestState, prepare_prompt};
use burn_llm_models::{DecoderSpec, Prompt, SamplingParams, Tokenizer};

use crate::beam::{BeamRun, BeamSearch};
use crate::error::{PagedError, Result};

/// What a request is checked against besides the model: the tokens one step may run, whether
/// longer prompts are prefilled in chunks, and the device pool its prompt's KV blocks must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PromptLimits {
    pub max_num_batched_tokens: usize,
    pub chunks_prompts: bool,
    /// Blocks in the engine's device pool (its share, under virtual engines).
    pub device_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
}

/// The model and tokens a request is checked against.
pub(crate) struct Checker<'a> {
    pub spec: &'a DecoderSpec,
    pub tokenizer: Option<&'a Tokenizer>,
    pub eos_token_ids: &'a [u32],
    pub limits: PromptLimits,
}

/// A request that passed [`Checker::check`], ready for [`super::LlmEngine::enqueue`].
#[derive(Debug)]
pub(crate) struct Checked {
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    /// The first sequence's stop rules and text.
    pub state: RequestState,
    pub params: SamplingParams,
    pub beam: Option<BeamSearch>,
    /// Sequences the request runs at once (`n`, `best_of` or the beam width).
    pub width: usize,
}

impl Checker<'_> {
    /// Checks request `index` (named in an empty prompt's error) and lays it out; the error names
    /// what is wrong.
    pub fn check(&self, index: usize, request_id: String, prompt: &Prompt, params: SamplingParams) -> Result<Checked> {
        let spec = self.spec;
        params.validate(spec.vocab_size)?;
        let (prompt_text, prompt_ids) =
            prepare_prompt(index, prompt, self.tokenizer, spec.vocab_size, spec.max_positions)?;
        let max = self.limits.max_num_batched_tokens;
        if prompt_ids.len() > max && !self.limits.chunks_prompts {
            return Err(PagedError::PromptTooLong { request: request_id, len: prompt_ids.len(), max });
        }
        // The scheduler would only finish it aborted at its first step: a prompt's blocks must all
        // be on the device at once, and no preemption frees more than the whole pool.
        let needed = prompt_ids.len().div_ceil(self.limits.block_size.max(1));
        if needed > self.limits.device_blocks {
            return Err(PagedError::PromptExceedsKvPool {
                request: request_id,
                len: prompt_ids.len(),
                needed,
                block_size: self.limits.block_size,
                blocks: self.limits.device_blocks,
            });
        }
        let width = params.width();
        if width > max {
            return Err(PagedError::TooWideForStep { request: request_id, width, max });
        }
        let beam = match &params.beam {
            Some(b) => {
                let room = (spec.max_positions + 1).saturating_sub(prompt_ids.len()).max(1);
                let mut eos_token_ids = if params.ignore_eos { Vec::new() } else { self.eos_token_ids.to_vec() };
                eos_token_ids.extend(&params.stop_token_ids);
                let run =
                    BeamRun { num_return: params.n, max_new_tokens: params.max_new_tokens.min(room), eos_token_ids };
                Some(BeamSearch::new(*b, run, prompt_ids.len())?)
            }
            None => None,
        };
        let state = RequestState::constrained(
            prompt_text,
            prompt_ids.clone(),
            &params,
            spec.max_positions,
            self.tokenizer,
            (spec.vocab_size, self.eos_token_ids),
        )?;
        Ok(Checked { request_id, prompt_ids, state, params, beam, width })
    }
}
