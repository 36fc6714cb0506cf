//! The continuous-batching engine (vLLM's `LLMEngine`): requests come and go between steps, each
//! step runs every scheduled prompt and decode token as one batch over the paged KV cache.

mod config;
mod output;
mod sampler;

use std::collections::HashMap;
use std::time::Instant;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use burn_llm_models::generation::{RequestState, prepare_prompt, token_logprobs};
use burn_llm_models::{
    CausalLm, FinishReason, GenerationOutput, LanguageModel, Pretrained, Prompt, PromptLogprobs, RequestOutput,
    SamplingParams, StepInput, Timing, Tokenizer,
};
use rand_chacha::ChaCha8Rng;

pub use config::{EngineConfig, KvCacheMemory};
pub use output::{SequenceDelta, StepOutput};

use crate::beam::{BeamRun, BeamSearch};
use crate::cache::{PagedKvCache, PagedStep};
use crate::error::{PagedError, Result};
use crate::memory::{BlockManager, BlockManagerConfig, Location, SeqId};
use crate::scheduler::{
    GroupId, PreemptionCost, PreemptionMode, ScheduledSeq, Scheduler, SchedulerConfig, Sequence, SequenceGroup,
};
use sampler::{RowChoice, sample_groups};

/// One sequence's engine state: stop rules and text, its random stream, its score.
#[derive(Debug, Clone)]
struct SeqData {
    index: usize,
    state: RequestState,
    rng: ChaCha8Rng,
    cumulative_logprob: f64,
}

/// One request's engine state.
#[derive(Debug)]
struct RequestData {
    request_id: String,
    params: SamplingParams,
    prompt: Option<String>,
    prompt_ids: Vec<u32>,
    live: HashMap<SeqId, SeqData>,
    done: Vec<SeqData>,
    beam: Option<BeamSearch>,
    /// Whether the parallel samples have been forked off the prompt.
    expanded: bool,
    /// With `params.prompt_logprobs`: the prompt's log-probabilities, once computed.
    prompt_logprobs: Option<PromptLogprobs>,
}

/// Counters over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Steps run.
    pub steps: usize,
    /// Steps that ran the model.
    pub model_steps: usize,
    /// Sequences in the batch, summed over model steps (÷ `model_steps`: average batch size).
    pub batched_seqs: usize,
    /// Tokens computed (prompt, recomputation and decode).
    pub computed_tokens: usize,
    /// Prompt tokens the prefix cache supplied.
    pub cached_tokens: usize,
    /// Tokens sampled.
    pub generated_tokens: usize,
    /// Groups preempted by swapping.
    pub swaps: usize,
    /// Groups preempted by recomputation.
    pub recomputes: usize,
    /// KV tokens stored in device blocks, summed over model steps.
    pub kv_tokens: usize,
    /// Slots of the device blocks in use, summed over model steps.
    pub kv_slots: usize,
    /// Most device blocks in use at once.
    pub peak_blocks: usize,
    /// Blocks the sequences' tables reference (a shared block counted once per table), summed
    /// over model steps: what the cache would hold without sharing.
    pub logical_blocks: usize,
    /// Distinct device blocks in use, summed over model steps.
    pub physical_blocks: usize,
}

impl EngineStats {
    /// Mean sequences per model step.
    pub fn average_batch(&self) -> f64 {
        self.batched_seqs as f64 / self.model_steps.max(1) as f64
    }

    /// KV tokens stored ÷ KV slots reserved, over all model steps (1 − internal fragmentation).
    pub fn kv_utilization(&self) -> f64 {
        self.kv_tokens as f64 / self.kv_slots.max(1) as f64
    }

    /// Fraction of KV memory that block sharing saved (parallel samples, beams, prefixes):
    /// `1 − physical ÷ logical` blocks over all model steps.
    pub fn sharing_saving(&self) -> f64 {
        1.0 - self.physical_blocks as f64 / self.logical_blocks.max(1) as f64
    }
}

/// vLLM's engine on Burn: a model, its paged KV cache, the block manager and the scheduler.
///
/// The model is any [`LanguageModel`]: a [`CausalLm`] on one device, or pipeline stages on several
/// (each layer's KV blocks on its stage's device). Over stages, each step's sequences are split
/// into micro-batches ([`EngineConfig::micro_batches`]) issued in pipeline order.
pub struct LlmEngine<M: LanguageModel = CausalLm> {
    model: M,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    blocks: BlockManager,
    cache: PagedKvCache,
    scheduler: Scheduler<RequestData>,
    requests: HashMap<String, GroupId>,
    next_group: GroupId,
    next_seq: SeqId,
    stats: EngineStats,
    /// Micro-batches a step is split into, at most.
    micro_batches: usize,
}

impl<M: LanguageModel> std::fmt::Debug for LlmEngine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEngine").field("cache", &self.cache).field("stats", &self.stats).finish()
    }
}

impl LlmEngine {
    /// An engine for a loaded model (with its tokenizer and stop ids).
    pub fn new(pretrained: Pretrained, config: EngineConfig) -> Result<Self> {
        Self::from_parts(pretrained.model, Some(pretrained.tokenizer), pretrained.eos_token_ids, config)
    }
}

impl<M: LanguageModel> LlmEngine<M> {
    /// An engine for a model without the [`Pretrained`] wrapper (`tokenizer` may be absent: then
    /// prompts must be token ids).
    pub fn from_parts(
        model: M,
        tokenizer: Option<Tokenizer>,
        eos_token_ids: Vec<u32>,
        config: EngineConfig,
    ) -> Result<Self> {
        let layout = model.kv_layout();
        let spec = model.spec();
        if config.block_size == 0 || config.max_num_seqs == 0 {
            return Err(PagedError::Config("block_size and max_num_seqs must be at least 1".into()));
        }
        config.scheduling.validate().map_err(PagedError::Config)?;
        if config.micro_batches == Some(0) {
            return Err(PagedError::Config("micro_batches must be at least 1".into()));
        }
        let block_bytes = PagedKvCache::block_bytes(&layout, config.block_size);
        let (device_blocks, budget) = config.device_blocks_for(&model)?;
        let needed = spec.max_positions.div_ceil(config.block_size);
        // A byte budget must hold one sequence of full context length (as vLLM requires); an
        // explicit block count is taken as given (tiny pools force preemption in tests).
        let explicit = matches!(config.kv_cache_memory, KvCacheMemory::Blocks(_));
        if device_blocks == 0 || (!explicit && device_blocks < needed) {
            return Err(PagedError::KvBudget {
                budget_bytes: budget,
                blocks: device_blocks,
                block_size: config.block_size,
                block_bytes,
                max_model_len: spec.max_positions,
                needed,
            });
        }
        let host_blocks = config.host_blocks(block_bytes);
        let blocks = BlockManager::new(
            BlockManagerConfig::new(device_blocks, host_blocks)
                .with_block_size(config.block_size)
                .with_prefix_caching(config.enable_prefix_caching),
        )?;
        let max_num_batched_tokens = config.max_num_batched_tokens.unwrap_or(spec.max_positions.max(2048));
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens,
            preemption: config.preemption,
            cost: default_cost(block_bytes, &model),
            watermark_blocks: device_blocks / 100,
            scheduling: config.scheduling,
            max_model_len: spec.max_positions,
        });
        let cache = PagedKvCache::placed(layout, config.block_size, device_blocks, host_blocks, model.kv_devices())?;
        let micro_batches = config.micro_batches.unwrap_or(model.num_stages());
        Ok(Self {
            micro_batches,
            model,
            tokenizer,
            eos_token_ids,
            blocks,
            cache,
            scheduler,
            requests: HashMap::new(),
            next_group: 0,
            next_seq: 0,
            stats: EngineStats::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The block manager (for inspection: block counts, sharing).
    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Requests in each scheduler queue: (waiting, running, swapped).
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        self.scheduler.queue_lengths()
    }

    /// Whether any request is in flight.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.scheduler.is_empty()
    }

    /// Queues a request. Errors (duplicate id, bad parameters, a prompt that can never fit) leave
    /// the engine unchanged.
    pub fn add_request(&mut self, request_id: impl Into<String>, prompt: Prompt, params: SamplingParams) -> Result<()> {
        let request_id = request_id.into();
        let spec = self.model.spec().clone();
        params.validate(spec.vocab_size)?;
        if self.requests.contains_key(&request_id) {
            return Err(PagedError::DuplicateRequest(request_id));
        }
        let (prompt_text, prompt_ids) =
            prepare_prompt(self.requests.len(), &prompt, self.tokenizer.as_ref(), spec.vocab_size, spec.max_positions)?;
        let max = self.scheduler.config().max_num_batched_tokens;
        if prompt_ids.len() > max {
            return Err(PagedError::PromptTooLong { request: request_id, len: prompt_ids.len(), max });
        }
        let width = params.width();
        let beam = match &params.beam {
            Some(b) => {
                let room = (spec.max_positions + 1).saturating_sub(prompt_ids.len()).max(1);
                let mut eos_token_ids = if params.ignore_eos { Vec::new() } else { self.eos_token_ids.clone() };
                eos_token_ids.extend(&params.stop_token_ids);
                let run =
                    BeamRun { num_return: params.n, max_new_tokens: params.max_new_tokens.min(room), eos_token_ids };
                Some(BeamSearch::new(*b, run, prompt_ids.len())?)
            }
            None => None,
        };
        let seq_id = self.alloc_seq();
        if params.prompt_logprobs.is_some() {
            self.blocks.set_prefix_lookup(seq_id, false);
        }
        let first = SeqData {
            index: 0,
            state: RequestState::new(prompt_text.clone(), prompt_ids.clone(), &params, spec.max_positions),
            rng: sample_rng(&params, 0),
            cumulative_logprob: 0.0,
        };
        let group_id = self.next_group;
        self.next_group += 1;
        let data = RequestData {
            request_id: request_id.clone(),
            params,
            prompt: prompt_text,
            prompt_ids: prompt_ids.clone(),
            live: HashMap::from([(seq_id, first)]),
            done: Vec::new(),
            beam,
            expanded: width == 1,
            prompt_logprobs: None,
        };
        let max_new_tokens = data.params.max_new_tokens;
        let group = SequenceGroup::new(group_id, group_id, Sequence::new(seq_id, prompt_ids), width, data);
        self.scheduler.add(group.with_max_new_tokens(max_new_tokens));
        self.requests.insert(request_id, group_id);
        Ok(())
    }

    /// Stops a request now; returns what it had produced (finish reason `abort`), or `None` for
    /// an unknown id.
    pub fn abort(&mut self, request_id: &str) -> Option<Vec<RequestOutput>> {
        let group = *self.requests.get(request_id)?;
        self.finish_group(group, true).ok()
    }

    /// Runs one iteration: schedule, move blocks, one forward pass over every scheduled token,
    /// sample, and report what changed.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        let _span = tracing::debug_span!("step", engine = "paged", step = self.stats.steps).entered();
        let plan = self.scheduler.schedule(&mut self.blocks);
        self.stats.steps += 1;
        for &(_, mode) in &plan.preempted {
            match mode {
                PreemptionMode::Swap => self.stats.swaps += 1,
                _ => self.stats.recomputes += 1,
            }
        }
        let mut outputs = Vec::new();
        for &group in &plan.rejected {
            let request_id = self.scheduler.group(group).map(|g| g.data.request_id.clone()).unwrap_or_default();
            let finished = self.finish_group(group, true)?;
            outputs.push(StepOutput {
                request_id,
                sequences: Vec::new(),
                finished: Some(finished),
                prompt_logprobs: None,
            });
        }
        self.cache.swap_out(&plan.swap_out)?;
        self.cache.swap_in(&plan.swap_in)?;
        self.cache.copy_blocks(&plan.copies)?;
        if plan.seqs.is_empty() {
            return Ok(outputs);
        }
        let (logits, mut prompt_logprobs) = self.forward(&plan.seqs)?;
        self.record_usage();
        for (&group, logprobs) in &prompt_logprobs {
            if let Some(g) = self.scheduler.group_mut(group) {
                g.data.prompt_logprobs = Some(logprobs.clone());
                for seq in g.seq_ids() {
                    self.blocks.set_prefix_lookup(seq, true);
                }
            }
        }
        let choices = sample_groups(logits, &plan.seqs, &mut self.scheduler)?;
        for (group, rows) in choices {
            if let Some(mut out) = self.apply(group, rows)? {
                out.prompt_logprobs = prompt_logprobs.remove(&group);
                outputs.push(out);
            }
        }
        Ok(outputs)
    }

    /// Runs every request to completion (offline batch inference) with a progress bar, returning
    /// one entry per returned sequence: prompt order, then rank.
    pub fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, |_, _| {})
    }

    /// Like [`LlmEngine::generate`], calling `on_step(request index, delta)` for every sequence
    /// delta.
    pub fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        mut on_delta: impl FnMut(usize, &SequenceDelta),
    ) -> Result<GenerationOutput> {
        let started = Instant::now();
        let base = self.next_group;
        let ids: Vec<String> = (0..prompts.len()).map(|i| format!("generate-{base}-{i}")).collect();
        for (id, prompt) in ids.iter().zip(prompts) {
            if let Err(e) = self.add_request(id.clone(), prompt.clone(), params.clone()) {
                for id in &ids {
                    self.abort(id);
                }
                return Err(e);
            }
        }
        let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
        let bar = indicatif::ProgressBar::new(prompts.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} requests · {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut timing = Timing::default();
        let mut results: Vec<Option<Vec<RequestOutput>>> = vec![None; prompts.len()];
        let mut generated = 0usize;
        let mut first_token = None;
        while results.iter().any(Option::is_none) {
            let outputs = self.step()?;
            for out in outputs {
                let Some(&i) = index.get(out.request_id.as_str()) else { continue };
                for delta in &out.sequences {
                    generated += delta.token_ids.len();
                    on_delta(i, delta);
                }
                if let Some(done) = out.finished {
                    if out.sequences.is_empty() {
                        generated += done.iter().map(|o| o.generated_ids.len()).sum::<usize>();
                    }
                    results[i] = Some(done);
                    bar.inc(1);
                }
            }
            timing.decode_steps += usize::from(first_token.is_some());
            if first_token.is_none() && generated > 0 {
                first_token = Some(started.elapsed().as_secs_f64());
            }
            let elapsed = started.elapsed().as_secs_f64();
            bar.set_message(format!("{:.1} tokens/s", generated as f64 / elapsed.max(1e-9)));
        }
        bar.finish_and_clear();
        let total = started.elapsed().as_secs_f64();
        timing.prefill_s = first_token.unwrap_or(total);
        timing.decode_s = total - timing.prefill_s;
        let requests: Vec<RequestOutput> = results.into_iter().flatten().flatten().collect();
        timing.generated_tokens = requests.iter().map(|r| r.generated_ids.len()).sum();
        timing.prompt_tokens = requests.iter().map(|r| r.prompt_ids.len()).sum();
        Ok(GenerationOutput { requests, timing })
    }

    fn alloc_seq(&mut self) -> SeqId {
        self.next_seq += 1;
        self.next_seq
    }

    /// One forward pass over the step's tokens: the scheduled sequences split into at most
    /// `micro_batches` micro-batches, each flattened into one row and run through the stages in
    /// pipeline order; returns the logits of each scheduled sequence's last token, `[rows, vocab]`,
    /// and the prompt log-probabilities of the groups that asked for them and whose whole prompt
    /// ran in this step.
    fn forward(&mut self, seqs: &[ScheduledSeq]) -> Result<(Tensor<2>, HashMap<GroupId, PromptLogprobs>)> {
        let parts = self.micro_batches.clamp(1, seqs.len());
        let (per, extra) = (seqs.len() / parts, seqs.len() % parts);
        let mut chunks = Vec::with_capacity(parts);
        let mut start = 0;
        for i in 0..parts {
            let len = per + usize::from(i < extra);
            chunks.push(&seqs[start..start + len]);
            start += len;
        }
        let (steps, inputs): (Vec<PagedStep>, Vec<(StepInput, Vec<i64>)>) =
            chunks.iter().map(|chunk| self.lay_out(chunk)).unzip();
        self.stats.model_steps += 1;
        self.stats.batched_seqs += seqs.len();
        self.stats.computed_tokens += steps.iter().map(|s| s.slots.len()).sum::<usize>();
        self.stats.cached_tokens += seqs.iter().map(|s| s.cached_tokens).sum::<usize>();
        self.cache.begin_micro_batches(&steps)?;
        let (inputs, lasts): (Vec<StepInput>, Vec<Vec<i64>>) = inputs.into_iter().unzip();
        let states = if inputs.len() == 1 {
            vec![self.model.forward(&inputs[0], &mut self.cache)]
        } else {
            self.model.forward_micro_batches(&inputs, &mut self.cache)
        };
        let mut prompt_logprobs = HashMap::new();
        let mut logits = Vec::with_capacity(states.len());
        for ((states, last), chunk) in states.into_iter().zip(lasts).zip(&chunks) {
            let [_, n, embed] = states.dims();
            let states = states.reshape([n, embed]);
            let mut column = 0;
            for s in chunk.iter() {
                if let Some(k) = self.pending_prompt_logprobs(s) {
                    let logprobs = match s.tokens.len() {
                        0 | 1 => vec![None],
                        len => self.prompt_logprobs(
                            states.clone().slice([column..column + len - 1, 0..embed]),
                            &s.tokens,
                            k,
                        )?,
                    };
                    prompt_logprobs.insert(s.group, logprobs);
                }
                column += s.tokens.len();
            }
            let count = last.len();
            let rows = Tensor::<1, Int>::from_data(TensorData::new(last, [count]), &states.device());
            logits.push(self.model.logits(states.select(0, rows)));
        }
        let logits = if logits.len() == 1 {
            logits.into_iter().next().expect("one micro-batch")
        } else {
            Tensor::cat(logits, 0)
        };
        Ok((logits, prompt_logprobs))
    }

    /// `Some(k)` when `s` runs its group's whole prompt for the first time and the request asked
    /// for `k` prompt log-probabilities (prompts of one token have none to compute beyond `None`).
    fn pending_prompt_logprobs(&self, s: &ScheduledSeq) -> Option<usize> {
        let data = &self.scheduler.group(s.group)?.data;
        let k = data.params.prompt_logprobs?;
        let whole = s.start == 0 && s.tokens.len() == data.prompt_ids.len();
        (whole && data.prompt_logprobs.is_none()).then_some(k)
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
    fn lay_out(&self, seqs: &[ScheduledSeq]) -> (PagedStep, (StepInput, Vec<i64>)) {
        let mut step = PagedStep::default();
        let (mut tokens, mut positions, mut last) = (Vec::new(), Vec::new(), Vec::new());
        let tables: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| {
                let table = self.blocks.block_table(s.seq).unwrap_or_default();
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

    /// KV tokens stored against slots reserved in device blocks (shared blocks counted once).
    fn record_usage(&mut self) {
        let bs = self.blocks.block_size();
        let mut fill: HashMap<u32, usize> = HashMap::new();
        for seq in self.blocks.sequences().collect::<Vec<_>>() {
            let Some(table) = self.blocks.table(seq) else { continue };
            if table.tier() != Location::Device {
                continue;
            }
            let n = table.num_tokens();
            self.stats.logical_blocks += table.num_blocks();
            for (i, b) in table.blocks().iter().enumerate() {
                let f = (n - (i * bs).min(n)).min(bs);
                let entry = fill.entry(b.0).or_default();
                *entry = (*entry).max(f);
            }
        }
        self.stats.kv_tokens += fill.values().sum::<usize>();
        self.stats.kv_slots += fill.len() * bs;
        self.stats.physical_blocks += fill.len();
        self.stats.peak_blocks = self.stats.peak_blocks.max(self.blocks.used_blocks(Location::Device));
    }

    /// Applies one group's sampled rows: tokens, forks (parallel samples, beams), finishes.
    fn apply(&mut self, group_id: GroupId, rows: Vec<RowChoice>) -> Result<Option<StepOutput>> {
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
        Ok(Some(StepOutput { request_id, sequences: deltas, finished, prompt_logprobs: None }))
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
        Ok(Some(StepOutput { request_id, sequences: Vec::new(), finished, prompt_logprobs: None }))
    }

    /// Removes a group and builds its final outputs, best first (`abort`: live sequences are cut
    /// short with finish reason `abort`).
    fn finish_group(&mut self, group_id: GroupId, abort: bool) -> Result<Vec<RequestOutput>> {
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
                        prompt: data.prompt.clone(),
                        prompt_ids: data.prompt_ids.clone(),
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

/// The random stream of sample `index` of a request: the request's seed (or entropy) with a
/// stream per sample, so seeded parallel samples are reproducible and independent.
fn sample_rng(params: &SamplingParams, index: u64) -> ChaCha8Rng {
    let mut rng = params.rng();
    rng.set_stream(index);
    rng
}

/// Preemption costs before anything is measured: a block moves at ~10 GB/s each way plus 20 µs
/// per copy; a token costs its share of two FLOPs per weight at ~50 GFLOP/s.
fn default_cost(block_bytes: usize, model: &impl LanguageModel) -> PreemptionCost {
    let params = model.decode_weight_bytes() as f64 / 4.0;
    PreemptionCost {
        swap_s_per_block: 2.0 * (block_bytes as f64 / 10e9 + 20e-6),
        recompute_s_per_token: 2.0 * params / 50e9,
    }
}

/// Log-softmax of rows, to the host (beam search ranks every continuation).
pub(crate) fn log_softmax_rows(logits: Tensor<2>) -> Result<Vec<f32>> {
    let data = log_softmax(logits, 1)
        .try_into_data()
        .map_err(|e| PagedError::Device(format!("reading log-probabilities back: {e:?}")))?;
    data.try_into_vec_as::<f32>().map_err(|e| PagedError::Device(format!("{e:?}")))
}
