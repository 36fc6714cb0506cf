//! vLLM's virtual engines: several [`LlmEngine`]s over one pipeline-parallel model, each with its
//! own scheduler and its share of the KV pool, each stepping on a thread of its own, so that one
//! engine's step runs on the later stages while another's runs on the earlier ones.
//!
//! One engine's step goes through every stage and returns only when the last stage is done: it
//! samples from the logits before it can schedule the next step. Alone, it leaves stage `s` idle
//! while the step is on the other stages, and a request that arrives during a step waits for the
//! whole of it. With `P` virtual engines over `P` stages (vLLM runs `pipeline_parallel_size` of
//! them), up to `P` steps are in flight: the pipeline of AlpaServe's simulator and of ExeGPT's
//! FCFS baseline, where a stage takes the next request as soon as it has passed on the last.
//!
//! - A request goes to the engine with the fewest unfinished requests (the first on a tie), as
//!   vLLM adds it to the virtual engine with the fewest unfinished sequence groups, and stays there.
//!   It is checked here, in front ([`super::admit`]), so that adding it never waits for the end of
//!   that engine's step (a whole prefill through every stage): the engine takes it between steps.
//! - The KV pool and swap space are split evenly between the engines (vLLM divides the blocks by
//!   the pipeline size): each admits and preempts in its own share.
//! - Each engine thread takes requests and aborts between its steps, and steps from the first
//!   [`VirtualEngines::step`] after a request reached it until it has no unfinished request (so
//!   requests queued together start together, as in one engine, and runs are reproducible);
//!   [`VirtualEngines::step`] waits for the next step any engine finishes and returns what it (and
//!   any other finished meanwhile) reported.
//! - A request's tokens do not depend on which engine runs it: the engines share the weights and
//!   each step computes its own sequences.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use burn_llm_models::{GenerationOutput, LanguageModel, Prompt, RequestOutput, SamplingParams, Tokenizer};

use super::StepOutput;
use super::admit::{Checked, Checker};
use super::drive::{self, StepLoop};
use super::{EngineConfig, EngineStats, KvCacheMemory, LlmEngine, ProgressHook, PromptLimits, SequenceDelta};
use crate::error::{PagedError, Result};
use crate::memory::Location;

/// The longest [`VirtualEngines::step`] waits for an engine's step before it returns nothing.
pub const STEP_WAIT: Duration = Duration::from_millis(5);

/// A message to one engine's thread.
enum Command {
    /// A checked request, to queue before the next step.
    Add(Box<Checked>),
    Abort {
        request_id: String,
        reply: Sender<Option<Vec<RequestOutput>>>,
    },
    /// Step while there are unfinished requests.
    Run,
}

/// What an engine's thread reports after each step.
struct Report {
    engine: usize,
    outputs: Result<Vec<StepOutput>>,
    state: EngineState,
}

/// One engine's counters and queues after its last step or command.
#[derive(Debug, Clone, Copy)]
struct EngineState {
    stats: EngineStats,
    queues: (usize, usize, usize),
    blocks_used: usize,
    blocks_total: usize,
}

impl EngineState {
    fn of<M: LanguageModel>(engine: &LlmEngine<M>) -> Self {
        let blocks = engine.block_manager();
        Self {
            stats: engine.stats(),
            queues: engine.queue_lengths(),
            blocks_used: blocks.used_blocks(Location::Device),
            blocks_total: blocks.total_blocks(Location::Device),
        }
    }
}

/// One engine's thread, from the front's side.
struct Handle {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    state: EngineState,
}

/// `P` paged engines over one model, stepping at once (see the [module docs](self)).
pub struct VirtualEngines<M: LanguageModel + Sync + 'static> {
    model: Arc<M>,
    tokenizer: Option<Tokenizer>,
    engines: Vec<Handle>,
    eos_token_ids: Vec<u32>,
    /// The engines' limits on a request (the same config for each).
    limits: PromptLimits,
    reports: Receiver<Report>,
    /// The engine of each unfinished request.
    routes: HashMap<String, usize>,
    next_generate: u64,
    progress: Option<ProgressHook>,
}

impl<M: LanguageModel + Sync + 'static> std::fmt::Debug for VirtualEngines<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualEngines").field("engines", &self.engines.len()).field("stats", &self.stats()).finish()
    }
}

impl<M: LanguageModel + Sync + 'static> VirtualEngines<M> {
    /// `count` engines over `model`, each built on its own thread with `config`'s KV pool and swap
    /// space divided by `count` ([`share`]). Fails, with nothing left running, when `count` is 0 or
    /// an engine cannot be built (its error, naming its share of the pool).
    pub fn new(
        model: M,
        tokenizer: Option<Tokenizer>,
        eos_token_ids: Vec<u32>,
        config: EngineConfig,
        count: usize,
    ) -> Result<Self> {
        let config = share(config, count)?;
        let model = Arc::new(model);
        let (report_tx, reports) = channel();
        let mut engines = Vec::with_capacity(count);
        let mut limits = None;
        for index in 0..count {
            let (commands, inbox) = channel();
            let (built_tx, built) = channel();
            let (model, tokenizer, eos, config, reports) =
                (Arc::clone(&model), tokenizer.clone(), eos_token_ids.clone(), config.clone(), report_tx.clone());
            let thread = std::thread::Builder::new()
                .name(format!("burn-llm-engine{index}"))
                .spawn(move || match LlmEngine::from_parts(model, tokenizer, eos, config) {
                    Ok(engine) => {
                        let _ = built_tx.send(Ok((EngineState::of(&engine), engine.prompt_limits())));
                        run(index, engine, inbox, reports);
                    }
                    Err(e) => {
                        let _ = built_tx.send(Err(e));
                    }
                })
                .map_err(|e| PagedError::Device(format!("starting virtual engine {index}'s thread: {e}")))?;
            // An engine that failed to build has ended its thread; those built so far end as
            // `engines` is dropped.
            let (state, engine_limits) = built.recv().unwrap_or_else(|_| {
                Err(PagedError::Internal(format!("virtual engine {index} stopped while it was being built")))
            })?;
            limits = Some(engine_limits);
            engines.push(Handle { commands, thread: Some(thread), state });
        }
        let limits = limits.ok_or_else(|| PagedError::Config("virtual engines: give at least 1".into()))?;
        Ok(Self {
            model,
            tokenizer,
            engines,
            eos_token_ids,
            limits,
            reports,
            routes: HashMap::new(),
            next_generate: 0,
            progress: None,
        })
    }

    /// The shared model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// How many engines there are.
    pub fn count(&self) -> usize {
        self.engines.len()
    }

    /// The engines' counters added up (as of each one's last step).
    pub fn stats(&self) -> EngineStats {
        self.engines.iter().fold(EngineStats::default(), |sum, e| {
            let s = e.state.stats;
            EngineStats { steps: sum.steps + s.steps, ..EngineStats::combined(&sum, &s) }
        })
    }

    /// Requests in each queue over all engines: (waiting, running, swapped).
    pub fn queue_lengths(&self) -> (usize, usize, usize) {
        self.engines
            .iter()
            .fold((0, 0, 0), |(w, r, s), e| (w + e.state.queues.0, r + e.state.queues.1, s + e.state.queues.2))
    }

    /// Device KV blocks in use and in all over the engines' pools.
    pub fn kv_blocks(&self) -> (usize, usize) {
        self.engines.iter().fold((0, 0), |(u, t), e| (u + e.state.blocks_used, t + e.state.blocks_total))
    }

    /// Unfinished requests on each engine, in engine order.
    pub fn unfinished(&self) -> Vec<usize> {
        let mut load = vec![0usize; self.engines.len()];
        self.routes.values().for_each(|&e| load[e] += 1);
        load
    }

    /// Whether any request is unfinished.
    pub fn has_unfinished_requests(&self) -> bool {
        !self.routes.is_empty()
    }

    /// Reports where each later [`VirtualEngines::generate`] run is to `hook` after every step.
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// Queues a request on the engine with the fewest unfinished requests, without waiting for
    /// that engine's step to end. Errors are an engine's (a duplicate id over all engines, bad
    /// parameters, a prompt that can never fit), and leave every engine unchanged.
    pub fn add_request(&mut self, request_id: impl Into<String>, prompt: Prompt, params: SamplingParams) -> Result<()> {
        let request_id = request_id.into();
        if self.routes.contains_key(&request_id) {
            return Err(PagedError::DuplicateRequest(request_id));
        }
        let checker = Checker {
            spec: self.model.spec(),
            tokenizer: self.tokenizer.as_ref(),
            eos_token_ids: &self.eos_token_ids,
            limits: self.limits,
        };
        let checked = checker.check(self.routes.len(), request_id.clone(), &prompt, params)?;
        let load = self.unfinished();
        let engine = (0..load.len()).min_by_key(|&e| load[e]).unwrap_or(0);
        self.send(engine, Command::Add(Box::new(checked)))?;
        self.routes.insert(request_id, engine);
        Ok(())
    }

    /// Stops a request now; returns what it had produced, or `None` for an unknown or finished id.
    pub fn abort(&mut self, request_id: &str) -> Result<Option<Vec<RequestOutput>>> {
        let Some(engine) = self.routes.remove(request_id) else { return Ok(None) };
        let (reply, answer) = channel();
        self.send(engine, Command::Abort { request_id: request_id.to_string(), reply })?;
        answer.recv().map_err(|_| stopped(engine))
    }

    /// Waits for the next step any engine finishes, and returns its outputs with those of any
    /// other step finished meanwhile: nothing, at once, when no request is unfinished, and nothing
    /// after [`STEP_WAIT`] without a finished step, so that a caller that also takes new requests
    /// (the server's engine loop) hands them over while the engines run. An engine whose step
    /// failed reports its error here, and has stopped.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        if self.routes.is_empty() {
            return Ok(Vec::new());
        }
        for (engine, unfinished) in self.unfinished().into_iter().enumerate() {
            if unfinished > 0 {
                // An engine whose thread has ended reports nothing more; its error came earlier.
                let _ = self.engines[engine].commands.send(Command::Run);
            }
        }
        let first = match self.reports.recv_timeout(STEP_WAIT) {
            Ok(report) => report,
            Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PagedError::Internal("every virtual engine has stopped".into()));
            }
        };
        let mut outputs = Vec::new();
        let mut failed = None;
        for report in std::iter::once(first).chain(std::iter::from_fn(|| self.reports.try_recv().ok())) {
            self.engines[report.engine].state = report.state;
            match report.outputs {
                Ok(step) => outputs.extend(step),
                Err(e) => {
                    // Its thread has ended: its requests are lost, not unfinished.
                    self.routes.retain(|_, engine| *engine != report.engine);
                    failed.get_or_insert(e);
                }
            }
        }
        for out in &outputs {
            if out.finished.is_some() {
                self.routes.remove(&out.request_id);
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(outputs),
        }
    }

    /// Runs every request to completion (offline batch inference); see [`LlmEngine::generate`].
    pub fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, |_, _| {})
    }

    /// Like [`VirtualEngines::generate`], calling `on_delta(request index, delta)` for every
    /// sequence delta.
    pub fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_delta: impl FnMut(usize, &SequenceDelta),
    ) -> Result<GenerationOutput> {
        let base = self.next_generate;
        self.next_generate += 1;
        drive::generate_stream(self, base, prompts, params, on_delta)
    }

    fn send(&self, engine: usize, command: Command) -> Result<()> {
        self.engines[engine].commands.send(command).map_err(|_| stopped(engine))
    }
}

impl Drop for Handle {
    /// Closes the command channel, which ends the thread after the step it is in, and waits.
    fn drop(&mut self) {
        let (commands, _) = channel();
        drop(std::mem::replace(&mut self.commands, commands));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<M: LanguageModel + Sync + 'static> StepLoop for VirtualEngines<M> {
    fn queue(&mut self, request_id: String, prompt: Prompt, params: SamplingParams) -> Result<()> {
        self.add_request(request_id, prompt, params)
    }

    fn drop_request(&mut self, request_id: &str) {
        let _ = self.abort(request_id);
    }

    fn step_once(&mut self) -> Result<Vec<StepOutput>> {
        self.step()
    }

    fn progress_hook(&mut self) -> Option<&mut ProgressHook> {
        self.progress.as_mut()
    }
}

/// One engine's thread: its commands between steps, a step whenever it runs (from a
/// [`Command::Run`] until it has no unfinished request; waiting for a command otherwise), each
/// step's outputs to the front. Ends when the front hangs up or a step fails.
fn run<M: LanguageModel>(index: usize, mut engine: LlmEngine<M>, inbox: Receiver<Command>, reports: Sender<Report>) {
    let mut running = false;
    loop {
        running &= engine.has_unfinished_requests();
        let command = match running {
            true => match inbox.try_recv() {
                Ok(c) => Some(c),
                Err(std::sync::mpsc::TryRecvError::Empty) => None,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return,
            },
            false => match inbox.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            },
        };
        if let Some(command) = command {
            match command {
                Command::Add(checked) => engine.enqueue(*checked),
                Command::Abort { request_id, reply } => {
                    let _ = reply.send(engine.abort(&request_id));
                }
                Command::Run => running = true,
            }
            continue;
        }
        let outputs = engine.step();
        let failed = outputs.is_err();
        if reports.send(Report { engine: index, outputs, state: EngineState::of(&engine) }).is_err() || failed {
            return;
        }
    }
}

/// `config` for one of `count` engines: the KV pool (blocks, bytes or fraction) and the swap
/// space divided evenly. An error when `count` is 0 or the pool has fewer blocks than engines.
pub fn share(config: EngineConfig, count: usize) -> Result<EngineConfig> {
    if count == 0 {
        return Err(PagedError::Config("virtual engines: give at least 1".into()));
    }
    let kv_cache_memory = match config.kv_cache_memory {
        KvCacheMemory::Blocks(n) if n < count => {
            return Err(PagedError::Config(format!(
                "--kv-cache-memory blocks:{n} cannot be shared by {count} virtual engines: give at least {count} blocks, or fewer virtual engines"
            )));
        }
        KvCacheMemory::Blocks(n) => KvCacheMemory::Blocks(n / count),
        KvCacheMemory::Bytes(b) => KvCacheMemory::Bytes(b / count as u64),
        KvCacheMemory::Fraction(f) => KvCacheMemory::Fraction(f / count as f64),
    };
    Ok(EngineConfig { kv_cache_memory, swap_space: config.swap_space / count as u64, ..config })
}

/// The error of an engine whose thread has ended (after its failed step, reported then).
fn stopped(engine: usize) -> PagedError {
    PagedError::Device(format!("virtual engine {engine} has stopped after an earlier error; restart the engine"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_and_swap_space_are_divided_evenly() {
        let base =
            EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(65), swap_space: 1 << 20, ..Default::default() };
        let one = share(base.clone(), 2).unwrap();
        assert_eq!(one.kv_cache_memory, KvCacheMemory::Blocks(32));
        assert_eq!(one.swap_space, 1 << 19);
        let bytes = EngineConfig { kv_cache_memory: KvCacheMemory::Bytes(900), ..base.clone() };
        assert_eq!(share(bytes, 3).unwrap().kv_cache_memory, KvCacheMemory::Bytes(300));
        let fraction = EngineConfig { kv_cache_memory: KvCacheMemory::Fraction(0.5), ..base.clone() };
        assert_eq!(share(fraction, 2).unwrap().kv_cache_memory, KvCacheMemory::Fraction(0.25));
    }

    #[test]
    fn too_few_blocks_or_no_engines_are_errors() {
        let base = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(1), ..Default::default() };
        let message = share(base.clone(), 2).unwrap_err().to_string();
        assert!(message.contains("blocks:1") && message.contains("2 virtual engines"), "{message}");
        assert!(share(base, 0).is_err());
    }
}
