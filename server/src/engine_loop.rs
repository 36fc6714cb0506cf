//! The engine's own thread: it owns the [`Engine`], takes requests and aborts from the async
//! front end over a channel, runs `step()` while anything is in flight (batching every client's
//! requests as vLLM does), and sends each request's [`StepOutput`]s back on the request's own
//! channel. A request whose receiver is gone (the client hung up) is aborted at once, so its KV
//! blocks go back to the pool before the next step.
//!
//! Each served model has its own loop on its own thread; errors name the model. An engine that
//! panics, or whose worker dies, is *down*: its requests fail with a message naming the model,
//! later ones get 503, and the other models' loops go on serving.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use burn_llm_models::{DecoderSpec, FinishReason, Prompt, SamplingParams, StepOutput, Timing, Tokenizer};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::admission::{SloGate, Taken};
use super::errors::{ApiError, ApiResult};
use super::metrics::Metrics;
use burn_llm::engine::{Engine, EngineDetails, EngineError, EngineLoad};
use burn_llm_models::error::panic_message;

/// What the front end learns about the model when the engine has been built.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The engine's name (`paged`).
    pub engine: &'static str,
    /// The model's shape (context length, vocabulary).
    pub spec: DecoderSpec,
    /// The tokenizer, when the model has one.
    pub tokenizer: Option<Tokenizer>,
    /// Which devices run which layers (and the planned stages' prediction), for models split
    /// over several devices.
    pub placement: Option<String>,
}

/// A message to the engine thread.
enum Command {
    Add(Box<Admission>),
    Abort(String),
    Stop,
}

/// One engine request of an HTTP request (a completion request with several prompts makes
/// several).
struct Admission {
    request_id: String,
    tag: usize,
    prompt: Vec<u32>,
    params: SamplingParams,
    events: UnboundedSender<Tagged>,
    arrived: Instant,
}

/// What the engine thread reports about one engine request, tagged with its prompt's index in
/// the HTTP request.
#[derive(Debug)]
pub struct Tagged {
    /// Index of the prompt within the HTTP request.
    pub tag: usize,
    /// What happened.
    pub event: EngineEvent,
}

/// What happened to an engine request.
#[derive(Debug)]
pub enum EngineEvent {
    /// Queued.
    Accepted,
    /// Refused by the engine (its message says why).
    Rejected(String),
    /// New tokens, and the final outputs once finished.
    Step(StepOutput),
    /// The engine failed while running it, or is shutting down.
    Failed(String),
}

/// Why a model's engine no longer serves, once it does not (shared by its loop and handle).
#[derive(Debug, Clone, Default)]
struct Down(Arc<Mutex<Option<String>>>);

impl Down {
    fn reason(&self) -> Option<String> {
        self.0.lock().ok().and_then(|d| d.clone())
    }

    fn set(&self, reason: String) {
        if let Ok(mut down) = self.0.lock() {
            *down = Some(reason);
        }
    }
}

/// The front end's handle on the engine thread.
pub struct EngineHandle {
    /// The served model's name (in every error about it).
    pub name: String,
    commands: Sender<Command>,
    down: Down,
    /// Engine requests sent and not yet started (the `--max-waiting` count).
    pending: Arc<AtomicUsize>,
    /// Engine requests sent whose runs are still open (waiting, running or being streamed): the
    /// load replicas are chosen by.
    outstanding: Arc<AtomicUsize>,
    next_id: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// `--admission slo`: the model's admission on this replica's group.
    gate: Option<SloGate>,
    /// Its count of requests the gate rejected.
    slo_rejections: prometheus::IntCounter,
    /// The model being served.
    pub info: ModelInfo,
}

/// How an engine is made: on the engine thread, which then owns it (engines need not be `Send`).
pub type EngineBuilder = Box<dyn FnOnce() -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> + Send>;

impl EngineHandle {
    /// Starts the engine thread of model `name`, builds the engine there, and waits until it is
    /// ready. Fails with the builder's error (causes included), or when the engine cannot run
    /// requests step by step.
    pub fn spawn(name: &str, build: EngineBuilder, metrics: Metrics) -> Result<Self, String> {
        let (commands, rx) = mpsc::channel();
        let down = Down::default();
        let loop_down = down.clone();
        let loop_name = name.to_string();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<ModelInfo, String>>();
        let pending = Arc::new(AtomicUsize::new(0));
        let loop_pending = pending.clone();
        let slo_rejections = metrics.slo_rejections.clone();
        let thread = std::thread::Builder::new()
            .name(format!("burn-llm-engine-{name}"))
            .spawn(move || {
                let engine = match build() {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready_tx.send(Err(error_chain(e.as_ref())));
                        return;
                    }
                };
                if !engine.capabilities().step_level {
                    let message = format!(
                        "the {} engine cannot serve requests (it has no add_request / step / abort): use --engine paged",
                        engine.name()
                    );
                    let _ = ready_tx.send(Err(message));
                    return;
                }
                let info = ModelInfo {
                    engine: engine.name(),
                    spec: engine.spec().clone(),
                    tokenizer: engine.tokenizer().cloned(),
                    placement: engine.placement(),
                };
                if ready_tx.send(Ok(info)).is_err() {
                    return;
                }
                let (down, up) = (loop_down.clone(), metrics.up.clone());
                let state = EngineLoop {
                    name: loop_name,
                    engine,
                    metrics,
                    pending: loop_pending,
                    live: HashMap::new(),
                    preemptions: 0,
                    cache_hits: 0,
                    queried: 0,
                    down: loop_down,
                };
                // A panic outside a step (the step's own are caught there) ends the loop: the model
                // is down, and its requests' channels close with it.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| state.run(rx))) {
                    down.set(format!("its engine thread panicked: {}", panic_message(panic)));
                    up.set(0);
                }
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        let info = match ready_rx.recv() {
            Ok(result) => result?,
            Err(_) => return Err("the engine thread stopped while building the engine".into()),
        };
        Ok(Self {
            name: name.to_string(),
            commands,
            down,
            pending,
            outstanding: Arc::new(AtomicUsize::new(0)),
            next_id: AtomicU64::new(0),
            thread: Mutex::new(Some(thread)),
            gate: None,
            slo_rejections,
            info,
        })
    }

    /// The handle with its requests admitted by `gate` (`--admission slo`).
    pub fn with_gate(mut self, gate: SloGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Sends one engine request per prompt (all with `params`), sharing one event channel, after
    /// checking that at most `max_waiting` engine requests would then wait to start (else 503)
    /// and, with a gate (`--admission slo`), that they would meet the model's SLO (else 503).
    /// A model that is down answers 503 naming it.
    pub fn submit(&self, prompts: Vec<Vec<u32>>, params: &SamplingParams, max_waiting: usize) -> ApiResult<Run> {
        if let Some(reason) = self.down() {
            return Err(ApiError::unavailable(self.down_message(&reason)));
        }
        let k = prompts.len();
        if self.pending.fetch_add(k, Ordering::SeqCst) + k > max_waiting {
            self.pending.fetch_sub(k, Ordering::SeqCst);
            return Err(ApiError::unavailable(format!(
                "too many requests waiting for model `{}` (the server's --max-waiting is {max_waiting}): retry later",
                self.name
            )));
        }
        let taken = match self.gate.as_ref().map(|gate| gate.admit(&self.name, k)).transpose() {
            Ok(taken) => taken,
            Err(e) => {
                self.pending.fetch_sub(k, Ordering::SeqCst);
                self.slo_rejections.inc();
                return Err(e);
            }
        };
        let (events, rx) = unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let arrived = Instant::now();
        self.outstanding.fetch_add(k, Ordering::SeqCst);
        let mut guard = AbortGuard {
            ids: Vec::with_capacity(k),
            commands: self.commands.clone(),
            outstanding: (self.outstanding.clone(), k),
        };
        for (tag, prompt) in prompts.into_iter().enumerate() {
            let request_id = format!("req-{id}-{tag}");
            guard.ids.push(request_id.clone());
            let admission = Box::new(Admission {
                request_id,
                tag,
                prompt,
                params: params.clone(),
                events: events.clone(),
                arrived,
            });
            if self.commands.send(Command::Add(admission)).is_err() {
                self.pending.fetch_sub(k - tag, Ordering::SeqCst);
                return Err(ApiError::unavailable(match self.down() {
                    Some(reason) => self.down_message(&reason),
                    None => format!("the engine of model `{}` has stopped: the server is shutting down", self.name),
                }));
            }
        }
        Ok(Run { events: rx, buffered: VecDeque::new(), guard, count: k, _taken: taken })
    }

    /// Engine requests whose runs are still open (see [`Run`]).
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Why the model no longer serves, once its engine is down.
    pub fn down(&self) -> Option<String> {
        self.down.reason()
    }

    /// The 503 message of a model that is down.
    fn down_message(&self, reason: &str) -> String {
        format!(
            "model `{}` is down ({reason}); the server's other models still serve: restart the server to load it again",
            self.name
        )
    }

    /// Stops the engine thread (aborting what still runs) and waits for it.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// An error with its causes, one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

/// Aborts an HTTP request's engine requests when dropped (the client went away, or the handler
/// returned early); aborting a finished request does nothing.
struct AbortGuard {
    ids: Vec<String>,
    commands: Sender<Command>,
    /// The handle's count of open engine requests, and what this run added to it.
    outstanding: (Arc<AtomicUsize>, usize),
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.outstanding.0.fetch_sub(self.outstanding.1, Ordering::SeqCst);
        for id in self.ids.drain(..) {
            let _ = self.commands.send(Command::Abort(id));
        }
    }
}

/// The engine requests of one HTTP request, as the front end sees them.
pub struct Run {
    events: UnboundedReceiver<Tagged>,
    buffered: VecDeque<Tagged>,
    guard: AbortGuard,
    count: usize,
    /// `--admission slo`: reports to the group's clocks when the run ends (dropped).
    _taken: Option<Taken>,
}

impl Run {
    /// Waits until every engine request is queued; the first refusal becomes a 400 (the others
    /// are aborted when the run is dropped).
    pub async fn accepted(&mut self) -> ApiResult<()> {
        let mut accepted = 0;
        while accepted < self.count {
            let Some(tagged) = self.events.recv().await else {
                return Err(ApiError::unavailable("the engine has stopped: the server is shutting down"));
            };
            match tagged.event {
                EngineEvent::Accepted => accepted += 1,
                EngineEvent::Rejected(message) => return Err(ApiError::bad_request(message, None)),
                EngineEvent::Failed(message) => return Err(ApiError::internal(message)),
                EngineEvent::Step(_) => self.buffered.push_back(tagged),
            }
        }
        Ok(())
    }

    /// The next event, `None` once the engine thread has dropped every sender (all finished).
    pub async fn next(&mut self) -> Option<Tagged> {
        match self.buffered.pop_front() {
            Some(t) => Some(t),
            None => self.events.recv().await,
        }
    }

    /// Engine requests in this run (one per prompt).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the run has no engine request.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The engine request ids (for logs and tests).
    pub fn request_ids(&self) -> &[String] {
        &self.guard.ids
    }
}

/// An engine request in flight, as the loop tracks it.
struct Live {
    tag: usize,
    events: UnboundedSender<Tagged>,
    arrived: Instant,
    started: bool,
    last_token: Option<Instant>,
}

/// The loop's state.
struct EngineLoop {
    name: String,
    engine: Box<dyn Engine>,
    down: Down,
    metrics: Metrics,
    pending: Arc<AtomicUsize>,
    live: HashMap<String, Live>,
    preemptions: usize,
    /// The paged engine's prefix-cache hits counted so far (its `cached_tokens`).
    cache_hits: usize,
    /// Prompt tokens admitted since the last [`EngineLoop::publish`] (prefix-cache queries, once
    /// the engine is known to be paged).
    queried: usize,
}

impl EngineLoop {
    /// Takes commands (blocking while idle), steps while anything runs, until stopped or every
    /// sender is gone; then aborts what is left.
    fn run(mut self, commands: Receiver<Command>) {
        'serve: loop {
            let first = if self.engine.has_unfinished_requests() {
                match commands.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match commands.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            };
            for command in first.into_iter().chain(std::iter::from_fn(|| commands.try_recv().ok())) {
                match command {
                    Command::Add(admission) => self.admit(*admission),
                    Command::Abort(id) => self.abort(&id),
                    Command::Stop => break 'serve,
                }
            }
            if !self.is_down() && self.engine.has_unfinished_requests() {
                self.step();
            } else {
                self.publish();
            }
        }
        self.fail_all("the server is shutting down");
        self.publish();
    }

    fn admit(&mut self, a: Admission) {
        if let Some(reason) = self.down.reason() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            let message = format!("model `{}` is down: {reason}", self.name);
            let _ = a.events.send(Tagged { tag: a.tag, event: EngineEvent::Failed(message) });
            return;
        }
        let prompt_len = a.prompt.len();
        match self.engine.add_request(&a.request_id, Prompt::Ids(a.prompt), a.params) {
            Ok(()) => {
                self.metrics.prompt_tokens.inc_by(prompt_len as u64);
                self.queried += prompt_len;
                let live = Live { tag: a.tag, events: a.events, arrived: a.arrived, started: false, last_token: None };
                let listening = live.events.send(Tagged { tag: a.tag, event: EngineEvent::Accepted }).is_ok();
                self.live.insert(a.request_id.clone(), live);
                if !listening {
                    self.abort(&a.request_id);
                }
            }
            Err(e) => {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                let _ = a.events.send(Tagged { tag: a.tag, event: EngineEvent::Rejected(error_chain(&e)) });
            }
        }
    }

    /// Aborts a request (its blocks are freed now) and forgets it. A down engine is not touched.
    fn abort(&mut self, id: &str) {
        if let Some(live) = self.live.remove(id) {
            if !self.is_down() {
                // The engine knows every live id; an abort cannot fail on the paged engine.
                let _ = self.engine.abort(id);
            }
            self.retire(&live, FinishReason::Abort);
        }
    }

    fn is_down(&self) -> bool {
        self.down.reason().is_some()
    }

    /// Marks the engine down (it is never stepped again) and fails every live request.
    fn go_down(&mut self, reason: String) {
        self.down.set(reason.clone());
        self.metrics.up.set(0);
        self.metrics.set_load(&EngineLoad::default());
        self.fail_all(&format!("model `{}` is down: {reason}", self.name));
    }

    /// Sends `message` to every live request and aborts it.
    fn fail_all(&mut self, message: &str) {
        let ids: Vec<String> = self.live.keys().cloned().collect();
        for id in ids {
            if let Some(live) = self.live.get(&id) {
                let _ = live.events.send(Tagged { tag: live.tag, event: EngineEvent::Failed(message.to_string()) });
            }
            self.abort(&id);
        }
    }

    /// Bookkeeping of a request that ends, however it ends (`reason`: its best sequence's).
    fn retire(&self, live: &Live, reason: FinishReason) {
        if !live.started {
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
        self.metrics.request_finished(reason);
        self.metrics.e2e.observe(live.arrived.elapsed().as_secs_f64());
    }

    /// One engine step, then the gauges. An error fails the live requests (the engine goes on
    /// with later ones); a worker's failure or a panic leaves the engine unusable, so the model
    /// goes down. The gauges are published before the step's outputs are delivered (and a
    /// finished request is counted before its last output is sent), so a client that reads
    /// `/metrics` once its response has ended sees that response counted.
    fn step(&mut self) {
        let outputs = match catch_unwind(AssertUnwindSafe(|| self.engine.step())) {
            Ok(Ok(outputs)) => outputs,
            Ok(Err(e @ EngineError::Worker(_))) => {
                self.go_down(error_chain(&e));
                Vec::new()
            }
            Ok(Err(e)) => {
                self.fail_all(&format!("model `{}`: the engine failed: {}", self.name, error_chain(&e)));
                Vec::new()
            }
            Err(panic) => {
                self.go_down(format!("its engine panicked: {}", panic_message(panic)));
                Vec::new()
            }
        };
        self.publish();
        outputs.into_iter().for_each(|out| self.deliver(out));
    }

    /// Hands one request's step output to its client, with the latency metrics.
    fn deliver(&mut self, out: StepOutput) {
        let Some(live) = self.live.get_mut(&out.request_id) else { return };
        let now = Instant::now();
        let tokens: usize = out.sequences.iter().map(|d| d.token_ids.len()).sum();
        if !live.started && (tokens > 0 || out.finished.is_some()) {
            live.started = true;
            self.pending.fetch_sub(1, Ordering::SeqCst);
            if tokens > 0 {
                self.metrics.ttft.observe((now - live.arrived).as_secs_f64());
            }
        }
        if tokens > 0 {
            if let Some(last) = live.last_token {
                self.metrics.tpot.observe((now - last).as_secs_f64());
            }
            live.last_token = Some(now);
            self.metrics.generation_tokens.inc_by(tokens as u64);
        }
        if out.finished.is_some() {
            let Some(live) = self.live.remove(&out.request_id) else { return };
            let reason =
                out.finished.as_deref().and_then(<[_]>::first).map_or(FinishReason::Abort, |o| o.finish_reason);
            self.retire(&live, reason);
            let event = match out.finished.as_deref().and_then(|f| outgrew_kv(f, || self.engine.load())) {
                Some(message) => EngineEvent::Failed(format!("request {}: {message}", out.request_id)),
                None => EngineEvent::Step(out),
            };
            let _ = live.events.send(Tagged { tag: live.tag, event });
            return;
        }
        let id = out.request_id.clone();
        if live.events.send(Tagged { tag: live.tag, event: EngineEvent::Step(out) }).is_err() {
            self.abort(&id);
        }
    }

    /// Updates the gauges and the preemption and prefix-cache counters (a paged engine's: the
    /// others have neither).
    fn publish(&mut self) {
        if self.is_down() {
            return;
        }
        if let Some(load) = self.engine.load() {
            self.metrics.set_load(&load);
        }
        let queried = std::mem::take(&mut self.queried);
        if let EngineDetails::Paged(stats) = self.engine.report(Timing::default()).details {
            let total = stats.swaps + stats.recomputes;
            self.metrics.preemptions.inc_by(total.saturating_sub(self.preemptions) as u64);
            self.preemptions = total;
            self.metrics.prefix_cache_queries.inc_by(queried as u64);
            self.metrics.prefix_cache_hits.inc_by(stats.cached_tokens.saturating_sub(self.cache_hits) as u64);
            self.cache_hits = stats.cached_tokens;
        }
    }
}

/// Why a request the engine finished aborted could not be served, or `None` when none of its
/// outputs was aborted. The server's own aborts forget the request before the engine answers, so
/// an abort delivered by a step is the engine's: its sequences outgrew the whole KV pool (the
/// paged scheduler, or a disaggregated decode pool, finishes them so), and the partial text with
/// `finish_reason: "abort"` would not say why.
/// The engine's `load` (for the pool's size) is read only then.
fn outgrew_kv(
    finished: &[burn_llm_models::RequestOutput],
    load: impl FnOnce() -> Option<EngineLoad>,
) -> Option<String> {
    let aborted = finished.iter().filter(|o| o.finish_reason == FinishReason::Abort);
    let generated = aborted.map(|o| o.generated_ids.len()).max()?;
    let pool = load().map_or_else(String::new, |l| format!(" ({} blocks)", l.kv_blocks_total));
    Some(format!(
        "after {generated} generated tokens its sequences need more KV blocks than the engine's whole device \
         pool{pool} holds, so it cannot finish: raise --kv-cache-memory (virtual engines each get an even share of \
         it), or ask for fewer tokens (max_tokens)"
    ))
}
