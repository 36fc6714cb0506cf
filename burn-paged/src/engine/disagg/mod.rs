//! Disaggregated prefill and decode: ExeGPT's workload-aware allocation (WAA, §4.1) on two
//! devices. One device prefills (ExeGPT's encoding) with its own model replica and KV pool, the
//! other decodes with its own; after its prefill a request's KV blocks move from the prefill pool
//! to the decode pool with Burn's `to_device`, and it decodes there to the end.
//!
//! Each device runs an [`LlmEngine`] of its own, so each keeps the whole paged machinery: the
//! prefill engine admits at most `B_E` requests a step (its `max_num_seqs`, whole prompts), the
//! decode engine runs at most `B_D` sequences (its `max_num_seqs`) with preemption by swap or
//! recomputation in its own pool (a recomputed request is prefilled again on the decode device).
//! One [`DisaggEngine::step`] is, in order:
//! 1. arrivals join the decode engine, oldest first, while it has a seat and their blocks are
//!    free beyond what its running requests need next (the watermark kept): an arrival that does
//!    not fit waits, its KV held where it was read, nothing lost;
//! 2. both engines run at once, each on its own thread: the prefill engine one step (only while
//!    fewer than `B_E` arrivals wait, so prefilled KV never piles up beyond one encode batch), the
//!    decode engine as many steps as fit in it (the devices run asynchronously, as in ExeGPT);
//! 3. the requests the prefill step sampled leave the prefill engine: their blocks are read out
//!    (still on the prefill device) and freed there.
//!
//! A request that stops at its first token finishes on the prefill device. Parallel samples and
//! beams move with one copy of the blocks per sequence (the decode pool does not share them).

mod handoff;

use std::collections::VecDeque;
use std::time::Instant;

use burn_llm_models::{GenerationOutput, LanguageModel, Pretrained, Prompt, RequestOutput, SamplingParams, Tokenizer};

use super::drive::{self, StepLoop};
use super::{EngineConfig, EngineStats, LlmEngine, ProgressHook, SequenceDelta, StepOutput};
use crate::error::{PagedError, Result};
use crate::memory::{BlockManager, SeqId};
use crate::scheduler::SchedulingPolicy;
use handoff::Handoff;

/// Where the decode engine's sequence ids start, so that the two engines never hand out the
/// same id (the prefill engine's count from 1).
const DECODE_SEQ_IDS: SeqId = SeqId::MAX / 2;

/// The two engines' settings.
#[derive(Debug, Clone)]
pub struct DisaggConfig {
    /// The prefill device's engine: its `max_num_seqs` is the encode batch `B_E`.
    pub prefill: EngineConfig,
    /// The decode device's engine: its `max_num_seqs` is the decode batch `B_D`.
    pub decode: EngineConfig,
}

impl DisaggConfig {
    /// `base` on both devices, FCFS, the prefill engine admitting at most `encode_batch` whole
    /// prompts a step and the decode engine running at most `decode_batch` sequences (a WAA
    /// plan's `B_E` and `B_D`).
    pub fn waa(base: EngineConfig, encode_batch: usize, decode_batch: usize) -> Self {
        let fcfs = EngineConfig { scheduling: SchedulingPolicy::Fcfs, ..base };
        Self {
            prefill: EngineConfig { max_num_seqs: encode_batch, chunked_prefill: false, ..fcfs.clone() },
            decode: EngineConfig { max_num_seqs: decode_batch, ..fcfs },
        }
    }
}

/// ExeGPT's WAA over two devices: a prefill engine and a decode engine (see the module docs).
pub struct DisaggEngine<M: LanguageModel> {
    prefill: LlmEngine<M>,
    decode: LlmEngine<M>,
    /// Prefilled requests waiting for room on the decode device, oldest first.
    arriving: VecDeque<Handoff>,
    /// Arrivals at which the prefill device pauses (the encode batch).
    max_arriving: usize,
    prefill_busy_s: f64,
    decode_busy_s: f64,
    progress: Option<ProgressHook>,
}

impl<M: LanguageModel> std::fmt::Debug for DisaggEngine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisaggEngine")
            .field("prefill", &self.prefill)
            .field("decode", &self.decode)
            .field("arriving", &self.arriving.len())
            .finish()
    }
}

impl DisaggEngine<burn_llm_models::CausalLm> {
    /// An engine over two loaded replicas of one model: `prefill` on the prefill device, `decode`
    /// on the decode device.
    pub fn new(prefill: Pretrained, decode: Pretrained, config: DisaggConfig) -> Result<Self> {
        Self::from_parts(prefill.model, decode.model, Some(prefill.tokenizer), prefill.eos_token_ids, config)
    }
}

impl<M: LanguageModel> DisaggEngine<M> {
    /// An engine over two replicas of one model (`tokenizer` may be absent: then prompts must be
    /// token ids). Errors when the replicas differ in shape or the two pools in block size.
    pub fn from_parts(
        prefill_model: M,
        decode_model: M,
        tokenizer: Option<Tokenizer>,
        eos_token_ids: Vec<u32>,
        config: DisaggConfig,
    ) -> Result<Self> {
        if prefill_model.spec() != decode_model.spec() || prefill_model.kv_layout() != decode_model.kv_layout() {
            return Err(PagedError::Config(
                "the prefill and decode devices must run replicas of the same model (their shapes differ)".into(),
            ));
        }
        if config.prefill.block_size != config.decode.block_size {
            return Err(PagedError::Config(format!(
                "the prefill and decode pools must use one block size (got {} and {}): KV moves between them block by block",
                config.prefill.block_size, config.decode.block_size
            )));
        }
        let max_arriving = config.prefill.max_num_seqs.max(1);
        let prefill = LlmEngine::from_parts(prefill_model, tokenizer.clone(), eos_token_ids.clone(), config.prefill)?;
        let mut decode = LlmEngine::from_parts(decode_model, tokenizer, eos_token_ids, config.decode)?;
        decode.next_seq = DECODE_SEQ_IDS;
        Ok(Self {
            prefill,
            decode,
            arriving: VecDeque::new(),
            max_arriving,
            prefill_busy_s: 0.0,
            decode_busy_s: 0.0,
            progress: None,
        })
    }

    /// Reports where each later [`DisaggEngine::generate`] run is to `hook` after every step.
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// The engine on the prefill device.
    pub fn prefill_engine(&self) -> &LlmEngine<M> {
        &self.prefill
    }

    /// The engine on the decode device.
    pub fn decode_engine(&self) -> &LlmEngine<M> {
        &self.decode
    }

    /// The decode device's model replica.
    pub fn model(&self) -> &M {
        self.decode.model()
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.prefill.tokenizer()
    }

    /// The two block managers: (prefill device, decode device).
    pub fn block_managers(&self) -> (&BlockManager, &BlockManager) {
        (self.prefill.block_manager(), self.decode.block_manager())
    }

    /// Both engines' counters as one ([`EngineStats::combined`]), with each device's busy time
    /// and the KV moved between them.
    pub fn stats(&self) -> EngineStats {
        let mut stats = EngineStats::combined(&self.prefill.stats(), &self.decode.stats());
        stats.prefill_busy_s = self.prefill_busy_s;
        stats.decode_busy_s = self.decode_busy_s;
        stats
    }

    /// Requests in each queue: (waiting: not yet prefilled, or prefilled and waiting for the
    /// decode device; running: decoding; swapped), over both devices.
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        let (pw, pr, ps) = self.prefill.queue_lengths();
        let (dw, dr, ds) = self.decode.queue_lengths();
        (pw + pr + dw + self.arriving.len(), dr, ps + ds)
    }

    /// Prefilled requests waiting for room on the decode device.
    pub fn arrivals_waiting(&self) -> usize {
        self.arriving.len()
    }

    /// Requests that have not finished.
    pub fn has_unfinished_requests(&self) -> bool {
        self.prefill.has_unfinished_requests() || !self.arriving.is_empty() || self.decode.has_unfinished_requests()
    }

    /// Queues a request on the prefill device. Errors leave the engine unchanged.
    pub fn add_request(&mut self, request_id: impl Into<String>, prompt: Prompt, params: SamplingParams) -> Result<()> {
        let request_id = request_id.into();
        if self.decode.requests.contains_key(&request_id) || self.arriving.iter().any(|h| h.request_id() == request_id)
        {
            return Err(PagedError::DuplicateRequest(request_id));
        }
        self.prefill.add_request(request_id, prompt, params)
    }

    /// Stops a request wherever it is; returns what it had produced, or `None` for an unknown id.
    pub fn abort(&mut self, request_id: &str) -> Result<Option<Vec<RequestOutput>>> {
        if let Some(out) = self.prefill.abort(request_id) {
            return Ok(Some(out));
        }
        if let Some(at) = self.arriving.iter().position(|h| h.request_id() == request_id)
            && let Some(handoff) = self.arriving.remove(at)
        {
            return self.decode.abort_arriving(handoff).map(Some);
        }
        Ok(self.decode.abort(request_id))
    }

    /// One iteration (see the module docs): arrivals join the decode device, both devices run at
    /// once (one prefill step, decode steps while it lasts), prefilled requests leave the prefill
    /// device.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        let mut outputs = self.admit_arrivals()?;
        let run_prefill = self.prefill.has_unfinished_requests() && self.arriving.len() < self.max_arriving;
        let run_decode = self.decode.has_unfinished_requests();
        let (prefill, decode) = (&mut self.prefill, &mut self.decode);
        let (prefilled, decoded) = if run_prefill && run_decode {
            std::thread::scope(|s| {
                let prefilling = s.spawn(|| timed(|| prefill.step()));
                // The devices run asynchronously (ExeGPT's WAA): the decode device keeps stepping
                // while the prefill device's step lasts.
                let decoded = decode_while(decode, || prefilling.is_finished());
                let prefilled = prefilling.join().unwrap_or_else(|_| {
                    (Err(PagedError::Internal("the prefill device's thread panicked".into())), 0.0)
                });
                (Some(prefilled), Some(decoded))
            })
        } else {
            // One device has work: no thread to start.
            (run_prefill.then(|| timed(|| prefill.step())), run_decode.then(|| timed(|| decode.step())))
        };
        if let Some((result, busy_s)) = prefilled {
            self.prefill_busy_s += busy_s;
            outputs.extend(result?);
        }
        if let Some((result, busy_s)) = decoded {
            self.decode_busy_s += busy_s;
            outputs.extend(result?);
        }
        self.arriving.extend(self.prefill.take_prefilled()?);
        Ok(outputs)
    }

    /// Moves arrivals into the decode engine while it has room, oldest first. An arrival that
    /// cannot fit even in an idle decode pool can never run: it finishes aborted, as the paged
    /// engine rejects a request larger than its pool.
    fn admit_arrivals(&mut self) -> Result<Vec<StepOutput>> {
        let mut outputs = Vec::new();
        while let Some(handoff) = self.arriving.pop_front() {
            if self.decode.has_room_for(&handoff) {
                self.decode.admit(handoff)?;
            } else if !self.decode.has_unfinished_requests() {
                let request_id = handoff.request_id().to_string();
                let finished = self.decode.abort_arriving(handoff)?;
                outputs.push(StepOutput {
                    request_id,
                    sequences: Vec::new(),
                    finished: Some(finished),
                    prompt_logprobs: None,
                    step_started: Some(Instant::now()),
                });
            } else {
                self.arriving.push_front(handoff);
                break;
            }
        }
        Ok(outputs)
    }

    /// Runs every request to completion (offline batch inference), as [`LlmEngine::generate`].
    pub fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, |_, _| {})
    }

    /// Like [`DisaggEngine::generate`], calling `on_delta(request index, delta)` for every
    /// sequence delta.
    pub fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_delta: impl FnMut(usize, &SequenceDelta),
    ) -> Result<GenerationOutput> {
        let base = self.prefill.next_group;
        drive::generate_stream(self, base, prompts, params, on_delta)
    }
}

impl<M: LanguageModel> StepLoop for DisaggEngine<M> {
    fn queue(&mut self, request_id: String, prompt: Prompt, params: SamplingParams) -> Result<()> {
        self.add_request(request_id, prompt, params)
    }

    fn drop_request(&mut self, request_id: &str) {
        // Dropping after a failed queue call: what the request had produced is of no use.
        let _ = self.abort(request_id);
    }

    fn step_once(&mut self) -> Result<Vec<StepOutput>> {
        self.step()
    }

    fn progress_hook(&mut self) -> Option<&mut ProgressHook> {
        self.progress.as_mut()
    }
}

/// Decode steps on `decode`, at least one, until `done()` or nothing is left to decode; their
/// outputs in order and the seconds they took. Stops at the first error.
fn decode_while<M: LanguageModel>(
    decode: &mut LlmEngine<M>,
    done: impl Fn() -> bool,
) -> (Result<Vec<StepOutput>>, f64) {
    let (mut outputs, mut busy_s) = (Vec::new(), 0.0);
    loop {
        let (result, s) = timed(|| decode.step());
        busy_s += s;
        match result {
            Ok(out) => outputs.extend(out),
            Err(e) => return (Err(e), busy_s),
        }
        if done() || !decode.has_unfinished_requests() {
            return (Ok(outputs), busy_s);
        }
    }
}

/// `f`'s result and the seconds it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}
