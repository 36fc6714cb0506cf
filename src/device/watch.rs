//! Bounded waits on engines whose model lives on workers.
//!
//! What Burn 0.22's remote client does when a worker goes away (read in `burn-remote-0.22.1`):
//!
//! - **The worker dies** (process killed, machine down, connection reset): the session's
//!   response task sees the stream close and fails every pending and later request
//!   (`client/service.rs`, `spawn_response_demux` → `Responder::disconnect`); ops sent after that
//!   are dropped with a warning (`client/service/writer.rs`). A read then returns
//!   `ExecutionError`, which `Tensor::into_data` — what the models call — turns into a **panic**
//!   on the reading thread.
//! - **The worker stalls** (stopped, overloaded, a network path that drops packets without a
//!   reset): nothing times out in Burn; the next read or sync **blocks forever**.
//!
//! [`WatchedEngine`] turns both into an [`EngineError::Worker`](crate::EngineError::Worker)
//! naming the workers: the engine lives on a thread of its own, every call is a message to it,
//! panics there are caught, and the caller waits at most `timeout` for each sign of progress
//! (the engine built, a streamed token, the call's result). After a failure the engine is
//! closed: the engine thread may still be blocked on the dead worker, and the model's state on
//! it is lost, so later calls fail at once with [`WorkerError::Closed`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use burn_llm_models::{DecoderSpec, Prompt, RequestOutput, SamplingParams, StepOutput, StreamEvent, Timing, Tokenizer};

use crate::engine::{Capabilities, Engine, EngineError, EngineLoad, EngineResult, Generation, RunReport};

/// A worker failed or went silent while an engine used it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerError {
    /// No answer within the timeout.
    #[error(
        "worker {workers} did not answer within {timeout_s}s while {what}: it is stalled, overloaded or cut off; check it and start the run again"
    )]
    Stalled {
        /// The workers the engine runs on.
        workers: String,
        /// What the engine was doing.
        what: &'static str,
        /// The timeout, in seconds.
        timeout_s: f64,
    },
    /// The connection broke (the worker died) or the engine failed on it.
    #[error("worker {workers} failed while {what}: {reason}; check that it is still running and start the run again")]
    Failed {
        /// The workers the engine runs on.
        workers: String,
        /// What the engine was doing.
        what: &'static str,
        /// What Burn reported.
        reason: String,
    },
    /// An earlier failure closed this engine.
    #[error("the engine on worker {workers} was closed by an earlier failure; build a new one")]
    Closed {
        /// The workers the engine runs on.
        workers: String,
    },
}

pub(crate) use burn_llm_models::error::panic_message;

/// Work for the engine thread.
type Job = Box<dyn FnOnce(&mut dyn Engine) + Send>;

/// What the engine thread sends back during one call.
enum Reply<R> {
    /// A streamed token (owned copy of a [`StreamEvent`]).
    Token { request: usize, sequence: usize, token: u32, text: String, finished: bool },
    /// The call returned.
    Done(R),
    /// The call panicked.
    Panicked(String),
}

/// An [`Engine`] built and run on a thread of its own, so that a worker that dies or stalls
/// becomes an error after a bounded wait instead of a panic or a hang (see the
/// [module docs](self)). Wraps any engine; the CLI and servers use it for models on workers.
pub struct WatchedEngine {
    name: &'static str,
    spec: DecoderSpec,
    capabilities: Capabilities,
    description: String,
    tokenizer: Option<Tokenizer>,
    workers: String,
    timeout: Duration,
    jobs: Sender<Job>,
    closed: AtomicBool,
}

impl WatchedEngine {
    /// Runs `build` on a new engine thread and waits for it at most `timeout`. `workers` names
    /// the workers in errors (`ws://a:3001, ws://b:3001`); `timeout` is the longest the engine
    /// may go without a sign of progress: building (which uploads the weights), one streamed
    /// token, or one call's result.
    pub fn spawn<F>(workers: impl Into<String>, timeout: Duration, build: F) -> EngineResult<Self>
    where
        F: FnOnce() -> Result<Box<dyn Engine>, String> + Send + 'static,
    {
        let workers = workers.into();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new().name("burn-llm-watched-engine".into()).spawn(move || {
            let mut engine = match catch_unwind(AssertUnwindSafe(build)) {
                Ok(Ok(engine)) => engine,
                Ok(Err(err)) => {
                    let _ = ready_tx.send(Err(Ok(err)));
                    return;
                }
                Err(panic) => {
                    let _ = ready_tx.send(Err(Err(panic_message(panic))));
                    return;
                }
            };
            let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
            let meta = (engine.name(), engine.spec().clone(), engine.capabilities(), engine.describe());
            let meta = (meta, engine.tokenizer().cloned());
            if ready_tx.send(Ok((meta, jobs_tx))).is_err() {
                return;
            }
            for job in jobs_rx {
                job(engine.as_mut());
            }
        });
        if let Err(err) = thread {
            return Err(
                WorkerError::Failed { workers, what: "starting the engine thread", reason: err.to_string() }.into()
            );
        }
        let what = "loading the model";
        match ready_rx.recv_timeout(timeout) {
            Ok(Ok((((name, spec, capabilities, description), tokenizer), jobs))) => Ok(Self {
                name,
                spec,
                capabilities,
                description,
                tokenizer,
                workers,
                timeout,
                jobs,
                closed: AtomicBool::new(false),
            }),
            Ok(Err(Ok(reason) | Err(reason))) => Err(WorkerError::Failed { workers, what, reason }.into()),
            Err(RecvTimeoutError::Timeout) => {
                Err(WorkerError::Stalled { workers, what, timeout_s: timeout.as_secs_f64() }.into())
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(WorkerError::Failed { workers, what, reason: "the engine thread ended".into() }.into())
            }
        }
    }

    /// The workers named in errors.
    pub fn workers(&self) -> &str {
        &self.workers
    }

    /// Runs `f` on the engine thread, forwarding streamed tokens to `on_token`, and waits at
    /// most the timeout for each reply. Any failure closes the engine.
    fn call<R: Send + 'static>(
        &self,
        what: &'static str,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
        f: impl FnOnce(&mut dyn Engine, &mut dyn FnMut(StreamEvent<'_>)) -> R + Send + 'static,
    ) -> Result<R, WorkerError> {
        let workers = || self.workers.clone();
        if self.closed.load(Ordering::Acquire) {
            return Err(WorkerError::Closed { workers: workers() });
        }
        let (tx, rx): (Sender<Reply<R>>, Receiver<Reply<R>>) = mpsc::channel();
        let job: Job = Box::new(move |engine: &mut dyn Engine| {
            let events = tx.clone();
            let mut forward = move |e: StreamEvent<'_>| {
                let token = Reply::Token {
                    request: e.request,
                    sequence: e.sequence,
                    token: e.token,
                    text: e.text.to_owned(),
                    finished: e.finished,
                };
                let _ = events.send(token);
            };
            let reply = match catch_unwind(AssertUnwindSafe(|| f(engine, &mut forward))) {
                Ok(r) => Reply::Done(r),
                Err(panic) => Reply::Panicked(panic_message(panic)),
            };
            let _ = tx.send(reply);
        });
        let failed = |reason: String| {
            self.closed.store(true, Ordering::Release);
            WorkerError::Failed { workers: workers(), what, reason }
        };
        if self.jobs.send(job).is_err() {
            return Err(failed("the engine thread ended".into()));
        }
        loop {
            match rx.recv_timeout(self.timeout) {
                Ok(Reply::Token { request, sequence, token, text, finished }) => {
                    on_token(StreamEvent { request, sequence, token, text: &text, finished })
                }
                Ok(Reply::Done(r)) => return Ok(r),
                Ok(Reply::Panicked(reason)) => return Err(failed(reason)),
                Err(RecvTimeoutError::Timeout) => {
                    self.closed.store(true, Ordering::Release);
                    return Err(WorkerError::Stalled {
                        workers: workers(),
                        what,
                        timeout_s: self.timeout.as_secs_f64(),
                    });
                }
                Err(RecvTimeoutError::Disconnected) => return Err(failed("the engine thread ended".into())),
            }
        }
    }
}

impl WatchedEngine {
    /// [`Self::call`] for an engine operation: an error the engine reports from the device (a
    /// read-back that failed because the worker went away) is the worker's failure too, and
    /// closes the engine like a panic does.
    fn call_engine<T: Send + 'static>(
        &self,
        what: &'static str,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
        f: impl FnOnce(&mut dyn Engine, &mut dyn FnMut(StreamEvent<'_>)) -> EngineResult<T> + Send + 'static,
    ) -> EngineResult<T> {
        match self.call(what, on_token, f)? {
            Err(err) if is_device_error(&err) => {
                self.closed.store(true, Ordering::Release);
                Err(WorkerError::Failed { workers: self.workers.clone(), what, reason: err.to_string() }.into())
            }
            result => result,
        }
    }
}

/// Whether an engine error came from the device (Burn could not run or read back a tensor).
fn is_device_error(err: &EngineError) -> bool {
    use burn_llm_models::ModelError;
    let model = |e: &ModelError| matches!(e, ModelError::Device(_));
    match err {
        EngineError::Model(e) => model(e),
        EngineError::Paged(burn_paged::PagedError::Device(_)) => true,
        EngineError::Paged(burn_paged::PagedError::Model(e)) => model(e),
        EngineError::Offload(burn_offload::OffloadError::Model(e)) => model(e),
        _ => false,
    }
}

impl Engine for WatchedEngine {
    fn name(&self) -> &'static str {
        self.name
    }

    fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn describe(&self) -> String {
        let on = format!("on worker {}", self.workers);
        if self.description.is_empty() { on } else { format!("{} · {on}", self.description) }
    }

    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation> {
        let (prompts, params) = (prompts.to_vec(), params.clone());
        self.call_engine("generating", on_token, move |engine, forward| {
            engine.generate_stream(&prompts, &params, forward)
        })
    }

    fn add_request(&mut self, request_id: &str, prompt: Prompt, params: SamplingParams) -> EngineResult<()> {
        let id = request_id.to_owned();
        self.call_engine("adding a request", &mut |_| {}, move |engine, _| engine.add_request(&id, prompt, params))
    }

    fn step(&mut self) -> EngineResult<Vec<StepOutput>> {
        self.call_engine("running a step", &mut |_| {}, |engine, _| engine.step())
    }

    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        let id = request_id.to_owned();
        self.call_engine("aborting a request", &mut |_| {}, move |engine, _| engine.abort(&id))
    }

    /// `false` once the engine is closed: nothing it holds can finish any more.
    fn has_unfinished_requests(&self) -> bool {
        self.call("checking for unfinished requests", &mut |_| {}, |engine, _| engine.has_unfinished_requests())
            .unwrap_or(false)
    }

    /// The queues and KV pool, or `None` once the engine is closed.
    fn load(&self) -> Option<EngineLoad> {
        self.call("reading the load", &mut |_| {}, |engine, _| engine.load()).ok().flatten()
    }

    /// The wrapped engine's tokenizer (a copy taken when it was built).
    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The engine's placement (stages, devices, bytes moved), or `None` once it is closed.
    fn placement(&self) -> Option<String> {
        self.call("reading the placement", &mut |_| {}, |engine, _| engine.placement()).ok().flatten()
    }

    /// The engine's structured plan, or `None` once it is closed.
    fn placement_plan(&self) -> Option<serde_json::Value> {
        self.call("reading the plan", &mut |_| {}, |engine, _| engine.placement_plan()).ok().flatten()
    }

    /// The engine's own report, or the plain one once the engine is closed.
    fn report(&self, timing: Timing) -> RunReport {
        let plain = RunReport { engine: self.name, timing, memory: None, details: crate::engine::EngineDetails::Plain };
        self.call("reporting", &mut |_| {}, move |engine, _| engine.report(timing)).unwrap_or(plain)
    }
}
