//! The one interface every engine offers ([`Engine`]): the CLI, the benchmarks and the server
//! drive the plain engine ([`Generator`]), the paged engine ([`LlmEngine`], vLLM) and the
//! offloading engine ([`OffloadEngine`], FlexGen) through it and nothing else.
//!
//! Two levels:
//! - **Offline**: [`Engine::generate_stream`] takes prompts and one [`SamplingParams`] (which
//!   carries `n`, `best_of` and beam search, as vLLM's does), calls back per token, and returns
//!   the outputs with a [`RunReport`] of what ran (timing, memory, policy or scheduler counters).
//! - **Step-level** (engines whose [`Capabilities::step_level`] is set): [`Engine::add_request`],
//!   [`Engine::step`] (incremental [`StepOutput`]s), [`Engine::abort`]. A server runs an engine
//!   this way; the others answer [`EngineError::Unsupported`].
//!
//! An engine that cannot honour a request's settings (several sequences per prompt on the plain
//! or offloading engine) returns an error naming the setting, never a silently different result.

use burn_llm_models::{
    DecoderSpec, GenerationOutput, Generator, LanguageModel, ModelError, Prompt, RequestOutput, SamplingParams,
    StepOutput, StreamEvent, Timing, Tokenizer,
};
use burn_offload::{MemoryReport, OffloadEngine, OffloadError, OffloadReport};
use burn_paged::memory::Location;
use burn_paged::{DisaggEngine, EngineStats, LlmEngine, PagedError, VirtualEngines};
use serde::Serialize;

/// What can go wrong in an engine: each engine's own error, passed through unchanged (its message
/// says what happened and what to do), or a request for something the engine does not do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading, tokenizing, sampling or running the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The paged engine refused or failed (KV budget, bad request, ...).
    #[error(transparent)]
    Paged(#[from] PagedError),
    /// The offloading engine refused or failed (no policy fits, disk tier, ...).
    #[error(transparent)]
    Offload(#[from] OffloadError),
    /// A worker the model runs on died or stalled (see [`crate::device::WatchedEngine`]).
    #[error(transparent)]
    Worker(#[from] crate::device::WorkerError),
    /// The engine does not offer this operation.
    #[error("the {engine} engine cannot {what}: {hint}")]
    Unsupported {
        /// The engine's name.
        engine: &'static str,
        /// What was asked for.
        what: &'static str,
        /// What to use instead.
        hint: &'static str,
    },
}

/// Result of an engine call.
pub type EngineResult<T> = std::result::Result<T, EngineError>;

/// What an engine can do beyond offline generation of one sequence per prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Tokens reach the callback as they are sampled (not all at the end of a block).
    pub streams_tokens: bool,
    /// Several sequences per prompt: `n`, `best_of`, beam search.
    pub multiple_sequences: bool,
    /// `add_request` / `step` / `abort`.
    pub step_level: bool,
}

/// The engine-specific part of a [`RunReport`].
#[derive(Debug, Clone)]
pub enum EngineDetails {
    /// The plain engine: nothing beyond timing.
    Plain,
    /// The paged engine's scheduler and KV-cache counters over the engine's life.
    Paged(EngineStats),
    /// The offloading engine's policy, its prediction and what was measured.
    Offload(OffloadReport),
}

/// What an engine ran: the same shape for every engine.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The engine's name.
    pub engine: &'static str,
    /// Wall-clock time and token counts of the call.
    pub timing: Timing,
    /// Peak memory per tier, where the engine measures it.
    pub memory: Option<MemoryReport>,
    /// Policy, predictions or scheduler counters.
    pub details: EngineDetails,
}

impl RunReport {
    /// The configuration that ran, as the CLI's `--json` prints it (`policy`): the offloading
    /// policy with its predicted and measured throughput; `None` for engines without a policy.
    pub fn policy_json(&self) -> Option<serde_json::Value> {
        match &self.details {
            EngineDetails::Offload(r) => Some(serde_json::json!({
                "policy": r.policy,
                "predicted_tokens_per_s": r.predicted_tokens_per_s,
                "measured_tokens_per_s": r.measured_tokens_per_s,
                "effective_batch": r.effective_batch,
            })),
            _ => None,
        }
    }

    /// The cost model's predicted throughput, for engines that predict one.
    pub fn predicted_tokens_per_s(&self) -> Option<f64> {
        match &self.details {
            EngineDetails::Offload(r) => Some(r.predicted_tokens_per_s),
            _ => None,
        }
    }
}

/// What a scheduling engine holds right now: its queues and its KV-cache pool (the server's
/// `/metrics` gauges, vLLM's `num_requests_*` and cache usage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EngineLoad {
    /// Requests queued and not yet scheduled.
    pub waiting: usize,
    /// Requests in the running batch.
    pub running: usize,
    /// Requests preempted to host memory.
    pub swapped: usize,
    /// Device KV blocks in use.
    pub kv_blocks_used: usize,
    /// Device KV blocks in the pool.
    pub kv_blocks_total: usize,
}

/// Outputs of an offline call and what ran.
#[derive(Debug, Clone)]
pub struct Generation {
    /// One entry per returned sequence: prompt order, then rank.
    pub output: GenerationOutput,
    /// What ran.
    pub report: RunReport,
}

/// A text-generation engine.
pub trait Engine {
    /// Short name shown in outputs and benchmark reports (`plain`, `paged`, `offload`).
    fn name(&self) -> &'static str;

    /// The model's shape.
    fn spec(&self) -> &DecoderSpec;

    /// What the engine can do.
    fn capabilities(&self) -> Capabilities;

    /// One line on how the engine is configured (empty when there is nothing beyond its name).
    fn describe(&self) -> String {
        String::new()
    }

    /// Generates for every prompt, calling `on_token` as tokens are produced (per sequence, with
    /// the text that became visible).
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation>;

    /// Generates for every prompt.
    fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> EngineResult<Generation> {
        self.generate_stream(prompts, params, &mut |_| {})
    }

    /// Queues a request to run on later [`step`](Engine::step)s.
    fn add_request(&mut self, request_id: &str, prompt: Prompt, params: SamplingParams) -> EngineResult<()> {
        let _ = (request_id, prompt, params);
        Err(no_steps(self.name()))
    }

    /// Runs one iteration over the queued requests and reports what changed.
    fn step(&mut self) -> EngineResult<Vec<StepOutput>> {
        Err(no_steps(self.name()))
    }

    /// Stops a request now; returns what it had produced, or `None` for an unknown id.
    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        let _ = request_id;
        Err(no_steps(self.name()))
    }

    /// Whether any queued request has not finished.
    fn has_unfinished_requests(&self) -> bool {
        false
    }

    /// Queues and KV pool now, for engines that schedule requests step by step.
    fn load(&self) -> Option<EngineLoad> {
        None
    }

    /// The model's tokenizer, when it has one (the server tokenizes and renders chats with it).
    fn tokenizer(&self) -> Option<&Tokenizer> {
        None
    }

    /// Counters of what the engine has run so far, in the shape of a report over `timing`.
    fn report(&self, timing: Timing) -> RunReport {
        RunReport { engine: self.name(), timing, memory: None, details: EngineDetails::Plain }
    }

    /// Which devices run which layers and the bytes handed between them so far, for engines
    /// whose model is split over several devices (`None` on one device).
    fn placement(&self) -> Option<String> {
        None
    }

    /// The split as a structured plan (stages, their layers and devices, and what a planner
    /// predicted), for `--json`; `None` on one device.
    fn placement_plan(&self) -> Option<serde_json::Value> {
        None
    }
}

/// [`Engine::placement`] of an engine over `model`.
fn placement_of(model: &impl LanguageModel) -> Option<String> {
    let summary = model.placement_summary()?;
    let moved = burn_llm_models::units::fmt_bytes(model.stage_transfer_bytes());
    Some(format!("{summary}, {moved} handed between stages"))
}

/// The error step-level calls answer on engines without them.
fn no_steps(engine: &'static str) -> EngineError {
    EngineError::Unsupported {
        engine,
        what: "run requests step by step (add_request / step / abort)",
        hint: "use the paged engine (--engine paged)",
    }
}

impl<M: LanguageModel + 'static> Engine for Generator<M> {
    fn name(&self) -> &'static str {
        "plain"
    }

    fn spec(&self) -> &DecoderSpec {
        self.model().spec()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { streams_tokens: true, multiple_sequences: false, step_level: false }
    }

    fn tokenizer(&self) -> Option<&Tokenizer> {
        Generator::tokenizer(self)
    }

    fn placement(&self) -> Option<String> {
        placement_of(self.model())
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        self.model().placement_plan()
    }

    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation> {
        let output = Generator::generate_stream(self, prompts, params, on_token)?;
        let report = Engine::report(self, output.timing);
        Ok(Generation { output, report })
    }
}

/// The `Engine` methods the paged engines share: `$engine` has the paged engine's inherent
/// methods of the same names (`generate_stream`, `add_request`, `step`, `tokenizer`, …).
macro_rules! paged_engine_methods {
    ($engine:ident) => {
        fn name(&self) -> &'static str {
            "paged"
        }

        fn spec(&self) -> &DecoderSpec {
            self.model().spec()
        }

        fn capabilities(&self) -> Capabilities {
            Capabilities { streams_tokens: true, multiple_sequences: true, step_level: true }
        }

        fn generate_stream(
            &mut self,
            prompts: &[Prompt],
            params: &SamplingParams,
            on_token: &mut dyn FnMut(StreamEvent<'_>),
        ) -> EngineResult<Generation> {
            let output = $engine::generate_stream(self, prompts, params, |request, delta| {
                delta.events(request).for_each(&mut *on_token);
            })?;
            let report = Engine::report(self, output.timing);
            Ok(Generation { output, report })
        }

        fn add_request(&mut self, request_id: &str, prompt: Prompt, params: SamplingParams) -> EngineResult<()> {
            Ok($engine::add_request(self, request_id, prompt, params)?)
        }

        fn step(&mut self) -> EngineResult<Vec<StepOutput>> {
            Ok($engine::step(self)?)
        }

        fn has_unfinished_requests(&self) -> bool {
            $engine::has_unfinished_requests(self)
        }

        fn tokenizer(&self) -> Option<&Tokenizer> {
            $engine::tokenizer(self)
        }

        fn report(&self, timing: Timing) -> RunReport {
            RunReport { engine: "paged", timing, memory: None, details: EngineDetails::Paged(self.stats()) }
        }
    };
}

impl<M: LanguageModel + 'static> Engine for LlmEngine<M> {
    paged_engine_methods!(LlmEngine);

    fn placement(&self) -> Option<String> {
        placement_of(self.model())
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        self.model().placement_plan()
    }

    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        Ok(LlmEngine::abort(self, request_id))
    }

    fn load(&self) -> Option<EngineLoad> {
        let (waiting, running, swapped) = self.queue_lengths();
        let blocks = self.block_manager();
        Some(EngineLoad {
            waiting,
            running,
            swapped,
            kv_blocks_used: blocks.used_blocks(Location::Device),
            kv_blocks_total: blocks.total_blocks(Location::Device),
        })
    }
}

/// The paged engine over `model` with `config`, or `count` virtual engines over it
/// ([`VirtualEngines`]: each with `config`, the KV pool and swap space divided between them)
/// when `count` is above 1.
pub fn paged_engines<M: LanguageModel + Sync + 'static>(
    model: M,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    config: burn_paged::EngineConfig,
    count: usize,
) -> Result<Box<dyn Engine>, PagedError> {
    Ok(if count > 1 {
        Box::new(VirtualEngines::new(model, tokenizer, eos_token_ids, config, count)?)
    } else {
        Box::new(LlmEngine::from_parts(model, tokenizer, eos_token_ids, config)?)
    })
}

/// vLLM's virtual engines over one pipeline: reported as the paged engine they are, their
/// counters and pools added up.
impl<M: LanguageModel + Sync + 'static> Engine for VirtualEngines<M> {
    paged_engine_methods!(VirtualEngines);

    fn describe(&self) -> String {
        format!("{} virtual engines over the pipeline, stepping at once", self.count())
    }

    fn placement(&self) -> Option<String> {
        placement_of(self.model())
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        self.model().placement_plan()
    }

    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        Ok(VirtualEngines::abort(self, request_id)?)
    }

    fn load(&self) -> Option<EngineLoad> {
        let (waiting, running, swapped) = self.queue_lengths();
        let (kv_blocks_used, kv_blocks_total) = self.kv_blocks();
        Some(EngineLoad { waiting, running, swapped, kv_blocks_used, kv_blocks_total })
    }
}

/// ExeGPT's WAA over two devices: reported as the paged engine it is made of, its counters
/// those of both devices with the KV moved between them.
impl<M: LanguageModel + 'static> Engine for DisaggEngine<M> {
    paged_engine_methods!(DisaggEngine);

    fn describe(&self) -> String {
        let stats = self.stats();
        format!(
            "prefill and decode disaggregated (ExeGPT WAA): {} requests' KV moved between the devices, {}",
            stats.kv_transfers,
            burn_llm_models::units::fmt_bytes(stats.kv_transfer_bytes)
        )
    }

    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        Ok(DisaggEngine::abort(self, request_id)?)
    }

    fn load(&self) -> Option<EngineLoad> {
        let (waiting, running, swapped) = self.queue_lengths();
        let (prefill, decode) = self.block_managers();
        Some(EngineLoad {
            waiting,
            running,
            swapped,
            kv_blocks_used: prefill.used_blocks(Location::Device) + decode.used_blocks(Location::Device),
            kv_blocks_total: prefill.total_blocks(Location::Device) + decode.total_blocks(Location::Device),
        })
    }
}

impl Engine for OffloadEngine {
    fn name(&self) -> &'static str {
        "offload"
    }

    fn spec(&self) -> &DecoderSpec {
        OffloadEngine::spec(self)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { streams_tokens: false, multiple_sequences: false, step_level: false }
    }

    fn describe(&self) -> String {
        let p = self.policy();
        format!(
            "policy: gbs {} × {} batches, weights {:.0}/{:.0}/{:.0}% gpu/cpu/disk, cache {:.0}/{:.0}/{:.0}%, cpu attention {}, overlap {}, compressed weights {}, cache {} · predicted {:.2} tokens/s",
            p.shape.gpu_batch_size,
            p.shape.num_gpu_batches,
            100.0 * p.weights.gpu,
            100.0 * p.weights.cpu,
            100.0 * p.weights.disk,
            100.0 * p.cache.gpu,
            100.0 * p.cache.cpu,
            100.0 * p.cache.disk,
            p.shape.cpu_attention,
            p.shape.overlap,
            p.shape.compress_weights.is_some(),
            p.shape.compress_cache.is_some(),
            self.estimate().throughput_tokens_per_s,
        )
    }

    /// Runs whole blocks; tokens are reported per request once its block has finished.
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation> {
        params.require_single_sequence("offload")?;
        let (output, run) = OffloadEngine::generate(self, prompts, params)?;
        for (request, r) in output.requests.iter().enumerate() {
            let n = r.generated_ids.len();
            for (i, &token) in r.generated_ids.iter().enumerate() {
                let last = i + 1 == n;
                on_token(StreamEvent {
                    request,
                    sequence: 0,
                    token,
                    text: if last { &r.text } else { "" },
                    finished: last,
                });
            }
        }
        let memory = run.memory;
        let report = RunReport {
            engine: "offload",
            timing: output.timing,
            memory: Some(memory),
            details: EngineDetails::Offload(run),
        };
        Ok(Generation { output, report })
    }
}
