//! [`Precise`]: an engine that runs at its own matmul precision. The CPU kernels read the precision
//! of the calling thread ([`with_matmul_precision`]), so wrapping every call of the engine makes
//! `--exact-matmul` a property of the engine built, not of the process: two engines in one process
//! (a server's, a test's) each compute as their own spec says.

use burn_llm_kernels::{MatmulPrecision, with_matmul_precision};
use burn_llm_models::{DecoderSpec, Prompt, RequestOutput, SamplingParams, StepOutput, StreamEvent, Timing, Tokenizer};

use crate::engine::{Capabilities, Engine, EngineLoad, EngineResult, Generation, RunReport};

/// An engine whose every call runs at `precision`.
pub struct Precise {
    inner: Box<dyn Engine>,
    precision: MatmulPrecision,
}

impl Precise {
    /// `inner`, run at `precision`.
    pub fn new(inner: Box<dyn Engine>, precision: MatmulPrecision) -> Self {
        Self { inner, precision }
    }
}

impl Engine for Precise {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn spec(&self) -> &DecoderSpec {
        self.inner.spec()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation> {
        with_matmul_precision(self.precision, || self.inner.generate_stream(prompts, params, on_token))
    }

    fn add_request(&mut self, request_id: &str, prompt: Prompt, params: SamplingParams) -> EngineResult<()> {
        self.inner.add_request(request_id, prompt, params)
    }

    fn step(&mut self) -> EngineResult<Vec<StepOutput>> {
        with_matmul_precision(self.precision, || self.inner.step())
    }

    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        self.inner.abort(request_id)
    }

    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }

    fn load(&self) -> Option<EngineLoad> {
        self.inner.load()
    }

    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.inner.tokenizer()
    }

    fn report(&self, timing: Timing) -> RunReport {
        self.inner.report(timing)
    }

    fn placement(&self) -> Option<String> {
        self.inner.placement()
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        self.inner.placement_plan()
    }
}
