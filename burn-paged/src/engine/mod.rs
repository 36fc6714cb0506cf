//! The continuous-batching engine (vLLM's `LLMEngine`): requests come and go between steps, each
//! step runs every scheduled prompt and decode token as one batch over the paged KV cache.
//!
//! Three parts, as vLLM v1 keeps the scheduler apart from the model runner:
//! - this module, the engine: requests in ([`LlmEngine::add_request`]) and out
//!   ([`LlmEngine::abort`]), and [`LlmEngine::step`], which asks the scheduler what to run, hands
//!   that to the runner, samples, and hands the rows to the outputs;
//! - [`admit`]: a request checked and laid out before it joins the scheduler;
//! - [`runner`]: the step's layout for the paged cache, the forward pass, prompt log-probabilities;
//! - [`outputs`]: sampled rows applied to their requests (parallel samples, beams), and the final
//!   outputs of a finishing group;
//! - [`drive`]: the offline loop (queue every prompt, step until all finish) this engine and
//!   [`DisaggEngine`] share;
//! - [`disagg`]: [`DisaggEngine`], prefill and decode on two devices (ExeGPT's WAA);
//! - [`virtual_engines`]: [`VirtualEngines`], several engines over one pipeline, stepping at once
//!   (vLLM's virtual engines).

mod admit;
mod config;
mod disagg;
mod drive;
mod outputs;
mod runner;
mod sampler;
mod stats;
mod virtual_engines;

use std::collections::HashMap;

use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use burn_llm_models::generation::RequestState;
use burn_llm_models::{
    CausalLm, GenerationOutput, LanguageModel, Pretrained, Prompt, PromptLogprobs, RequestOutput, SamplingParams,
    Tokenizer,
};
use rand_chacha::ChaCha8Rng;

pub use config::{EngineConfig, KvCacheMemory};
pub use disagg::{DisaggConfig, DisaggEngine};
pub use outputs::{SequenceDelta, StepOutput};
pub use stats::EngineStats;
pub use virtual_engines::VirtualEngines;

use crate::beam::BeamSearch;
use crate::cache::PagedKvCache;
use crate::error::{PagedError, Result};
use crate::memory::{BlockManager, BlockManagerConfig, Location, SeqId};
use crate::scheduler::{
    GroupId, PreemptionCost, PreemptionMode, ScheduledSeq, Scheduler, SchedulerConfig, Sequence, SequenceGroup,
};
use admit::{Checked, Checker, PromptLimits};
use runner::{ModelRunner, PromptLogprobsWanted, RunnerOutput};
use sampler::sample_groups;

/// One sequence's engine state: stop rules and text (with the request's prompt, shared between
/// its sequences), its random stream, its score.
#[derive(Debug, Clone)]
struct SeqData {
    index: usize,
    state: RequestState,
    rng: ChaCha8Rng,
    cumulative_logprob: f64,
}

/// One request's engine state. Its prompt is held by its sequences' [`RequestState`]s (the
/// text and ids) and the scheduler's [`Sequence`]s (the tokens to compute), not here.
#[derive(Debug)]
struct RequestData {
    request_id: String,
    params: SamplingParams,
    live: HashMap<SeqId, SeqData>,
    done: Vec<SeqData>,
    beam: Option<BeamSearch>,
    /// Whether the parallel samples have been forked off the prompt.
    expanded: bool,
    /// With `params.prompt_logprobs`: the prompt's log-probabilities, once computed.
    prompt_logprobs: Option<PromptLogprobs>,
    /// With `params.prompt_logprobs`: those of the prompt chunks computed so far (chunked
    /// prefill), until the last chunk completes them.
    partial_prompt_logprobs: PromptLogprobs,
}

/// vLLM's engine on Burn: a model, its paged KV cache, the block manager and the scheduler.
///
/// The model is any [`LanguageModel`]: a [`CausalLm`] on one device, or pipeline stages on several
/// (each layer's KV blocks on its stage's device). Over stages, each step's sequences are split
/// into micro-batches ([`EngineConfig::micro_batches`]) issued in pipeline order.
pub struct LlmEngine<M: LanguageModel = CausalLm> {
    runner: ModelRunner<M>,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    blocks: BlockManager,
    scheduler: Scheduler<RequestData>,
    requests: HashMap<String, GroupId>,
    next_group: GroupId,
    next_seq: SeqId,
    stats: EngineStats,
    /// Told where an offline [`LlmEngine::generate`] run is, after every step.
    progress: Option<ProgressHook>,
}

/// Where an offline [`LlmEngine::generate`] run is: what a caller needs to draw a progress bar
/// (the engine draws none).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateProgress {
    /// Requests of the run that have finished.
    pub finished: usize,
    /// Requests in the run.
    pub requests: usize,
    /// Tokens generated so far.
    pub generated_tokens: usize,
    /// Seconds since the run started.
    pub elapsed_s: f64,
}

impl GenerateProgress {
    /// Generated tokens per second so far.
    pub fn tokens_per_s(&self) -> f64 {
        self.generated_tokens as f64 / self.elapsed_s.max(1e-9)
    }
}

/// A caller's progress display for [`LlmEngine::generate`] (see [`LlmEngine::set_progress`]).
pub type ProgressHook = Box<dyn FnMut(GenerateProgress) + Send>;

impl<M: LanguageModel> std::fmt::Debug for LlmEngine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEngine").field("cache", &self.runner.cache).field("stats", &self.stats).finish()
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
        let quant = config.kv_quant_for(&layout)?;
        let block_bytes = PagedKvCache::block_bytes(&layout, config.block_size, quant);
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
            chunked_prefill: config.chunked_prefill,
        });
        let mut cache =
            PagedKvCache::placed(layout, config.block_size, device_blocks, host_blocks, model.kv_devices(), quant)?;
        let tail_bytes = PagedKvCache::tail_bytes(&layout, config.block_size);
        cache.reserve_tails(config.tail_blocks(device_blocks, tail_bytes));
        let tails = cache.num_tail_blocks();
        tracing::info!(
            blocks = device_blocks,
            block_size = config.block_size,
            block_bytes,
            tails,
            kv_quant = quant.map(|q| q.bits()),
            "paged KV cache: {device_blocks} device blocks of {} tokens, {block_bytes} bytes each ({}{})",
            config.block_size,
            quant.map_or_else(|| format!("{:?}", layout.dtype), |q| q.to_string()),
            if tails > 0 {
                format!(", keys per channel, {tails} float key tails of {tail_bytes} bytes")
            } else {
                String::new()
            },
        );
        let micro_batches = config.micro_batches.unwrap_or(model.num_stages());
        Ok(Self {
            runner: ModelRunner { model, cache, micro_batches, slicing: config.prefill_slicing.clone() },
            tokenizer,
            eos_token_ids,
            blocks,
            scheduler,
            requests: HashMap::new(),
            next_group: 0,
            next_seq: 0,
            stats: EngineStats::default(),
            progress: None,
        })
    }

    /// Reports where each later [`LlmEngine::generate`] run is to `hook` after every step (the
    /// last report of a run has `finished == requests`); `None`: no reports. The same figures go
    /// out as `tracing` debug events (target `burn_paged::progress`) either way.
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.runner.model
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
        if self.requests.contains_key(&request_id) {
            return Err(PagedError::DuplicateRequest(request_id));
        }
        let checked = self.checker().check(self.requests.len(), request_id, &prompt, params)?;
        self.enqueue(checked);
        Ok(())
    }

    /// What requests are checked against besides the model ([`admit`]).
    pub(crate) fn prompt_limits(&self) -> PromptLimits {
        PromptLimits {
            max_num_batched_tokens: self.scheduler.config().max_num_batched_tokens,
            chunks_prompts: self.scheduler.chunks_prompts(),
            device_blocks: self.blocks.total_blocks(Location::Device),
            block_size: self.blocks.block_size(),
        }
    }

    fn checker(&self) -> Checker<'_> {
        Checker {
            spec: self.runner.model.spec(),
            tokenizer: self.tokenizer.as_ref(),
            eos_token_ids: &self.eos_token_ids,
            limits: self.prompt_limits(),
        }
    }

    /// Queues a checked request (its id not in use here) for the scheduler.
    pub(crate) fn enqueue(&mut self, request: Checked) {
        let Checked { request_id, prompt_ids, state, params, beam, width } = request;
        let seq_id = self.alloc_seq();
        if params.prompt_logprobs.is_some() {
            self.blocks.set_prefix_lookup(seq_id, false);
        }
        let first = SeqData { index: 0, state, rng: sample_rng(&params, 0), cumulative_logprob: 0.0 };
        let group_id = self.next_group;
        self.next_group += 1;
        let data = RequestData {
            request_id: request_id.clone(),
            params,
            live: HashMap::from([(seq_id, first)]),
            done: Vec::new(),
            beam,
            expanded: width == 1,
            prompt_logprobs: None,
            partial_prompt_logprobs: Vec::new(),
        };
        let max_new_tokens = data.params.max_new_tokens;
        let group = SequenceGroup::new(group_id, group_id, Sequence::new(seq_id, prompt_ids), width, data);
        self.scheduler.add(group.with_max_new_tokens(max_new_tokens));
        self.requests.insert(request_id, group_id);
    }

    /// Stops a request now; returns what it had produced (finish reason `abort`), or `None` for
    /// an unknown id.
    pub fn abort(&mut self, request_id: &str) -> Option<Vec<RequestOutput>> {
        let group = *self.requests.get(request_id)?;
        self.finish_group(group, true).ok()
    }

    /// Runs one iteration: schedule, move blocks, one forward pass over every scheduled token,
    /// sample, and report what changed (each output stamped with the step's start).
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        let started = std::time::Instant::now();
        let mut outputs = self.run_step()?;
        for out in &mut outputs {
            out.step_started.get_or_insert(started);
        }
        Ok(outputs)
    }

    /// [`LlmEngine::step`] before its outputs are stamped.
    fn run_step(&mut self) -> Result<Vec<StepOutput>> {
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
                step_started: None,
            });
        }
        let cache = &mut self.runner.cache;
        cache.swap_out(&plan.swap_out)?;
        cache.swap_in(&plan.swap_in)?;
        cache.copy_blocks(&plan.copies)?;
        let blocks = &self.blocks;
        cache.drop_free_tails(|b| blocks.ref_count(Location::Device, b).is_some_and(|c| c > 0));
        if plan.seqs.is_empty() {
            return Ok(outputs);
        }
        let wanted: Vec<Option<PromptLogprobsWanted>> =
            plan.seqs.iter().map(|s| self.pending_prompt_logprobs(s)).collect();
        self.stats.record_model_step(&plan.seqs);
        // The constrained sequences' token masks are computed beside the forward pass (vLLM
        // overlaps them the same way), on another thread only when there are any.
        let constrained = sampler::constrained(&plan.seqs, &self.scheduler);
        let (runner, blocks, scheduler) = (&mut self.runner, &self.blocks, &mut self.scheduler);
        let RunnerOutput { logits, prompt_logprobs: mut parts } = if constrained {
            std::thread::scope(|scope| {
                scope.spawn(|| sampler::prefetch_masks(&plan.seqs, scheduler));
                runner.execute(&plan.seqs, blocks, &wanted)
            })?
        } else {
            runner.execute(&plan.seqs, blocks, &wanted)?
        };
        self.stats.record_usage(&self.blocks);
        let mut prompt_logprobs = HashMap::new();
        for s in &plan.seqs {
            let (Some(part), Some(g)) = (parts.remove(&s.group), self.scheduler.group_mut(s.group)) else { continue };
            let data = &mut g.data;
            if s.start == 0 {
                // The prompt's first chunk (again, after a recomputation).
                data.partial_prompt_logprobs.clear();
            }
            data.partial_prompt_logprobs.extend(part);
            if s.sample {
                let logprobs = std::mem::take(&mut data.partial_prompt_logprobs);
                data.prompt_logprobs = Some(logprobs.clone());
                prompt_logprobs.insert(s.group, logprobs);
                for seq in g.seq_ids() {
                    self.blocks.set_prefix_lookup(seq, true);
                }
            }
        }
        let Some(logits) = logits else { return Ok(outputs) };
        let sampled: Vec<&ScheduledSeq> = plan.seqs.iter().filter(|s| s.sample).collect();
        let choices = sample_groups(logits, &sampled, &mut self.scheduler)?;
        for (group, rows) in choices {
            if let Some(mut out) = self.apply(group, rows)? {
                out.prompt_logprobs = prompt_logprobs.remove(&group);
                outputs.push(out);
            }
        }
        Ok(outputs)
    }

    /// Runs every request to completion (offline batch inference), returning one entry per
    /// returned sequence: prompt order, then rank. Progress goes to the hook of
    /// [`LlmEngine::set_progress`] and to `tracing`.
    pub fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, |_, _| {})
    }

    /// Like [`LlmEngine::generate`], calling `on_step(request index, delta)` for every sequence
    /// delta.
    pub fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_delta: impl FnMut(usize, &SequenceDelta),
    ) -> Result<GenerationOutput> {
        let base = self.next_group;
        drive::generate_stream(self, base, prompts, params, on_delta)
    }

    fn alloc_seq(&mut self) -> SeqId {
        self.next_seq += 1;
        self.next_seq
    }

    /// What `s` contributes to its request's prompt log-probabilities: `Some` when the request
    /// asked for them and `s` computes prompt positions before they are complete (its whole
    /// prompt, or a chunk of it, with the next prompt token when more follow).
    fn pending_prompt_logprobs(&self, s: &ScheduledSeq) -> Option<PromptLogprobsWanted> {
        let group = self.scheduler.group(s.group)?;
        let k = group.data.params.prompt_logprobs?;
        if group.data.prompt_logprobs.is_some() || s.start >= group.prompt_len {
            return None;
        }
        let end = s.start + s.tokens.len();
        let next = match s.sample {
            true => None,
            false => group.seqs.iter().find(|q| q.id == s.seq).and_then(|q| q.tokens.get(end).copied()),
        };
        Some(PromptLogprobsWanted { k, next })
    }
}

/// The random stream of sample `index` of a request: the request's seed (or entropy) with a
/// stream per sample, so seeded parallel samples are reproducible and independent.
fn sample_rng(params: &SamplingParams, index: u64) -> ChaCha8Rng {
    let mut rng = params.rng();
    rng.set_stream(index);
    rng
}

impl<M: LanguageModel> drive::StepLoop for LlmEngine<M> {
    fn queue(&mut self, request_id: String, prompt: Prompt, params: SamplingParams) -> Result<()> {
        self.add_request(request_id, prompt, params)
    }

    fn drop_request(&mut self, request_id: &str) {
        self.abort(request_id);
    }

    fn step_once(&mut self) -> Result<Vec<StepOutput>> {
        self.step()
    }

    fn progress_hook(&mut self) -> Option<&mut ProgressHook> {
        self.progress.as_mut()
    }
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
