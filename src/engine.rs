//! The interface every engine offers: give it prompts and sampling parameters, get one output per
//! prompt. The plain engine is [`Generator`]; the paged (vLLM) and offloading (FlexGen) engines of
//! the member crates implement the same trait, so the CLI and the benchmarks drive any of them.

use burn_llm_models::{GenerationOutput, Generator, Prompt, Result, SamplingParams, StreamEvent};

/// A text-generation engine.
pub trait Engine {
    /// Short name shown in outputs and benchmark reports.
    fn name(&self) -> &'static str;

    /// Generates a continuation for every prompt, calling `on_token` as tokens are produced.
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationOutput>;

    /// Generates a continuation for every prompt.
    fn generate(&mut self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, &mut |_| {})
    }
}

impl Engine for Generator {
    fn name(&self) -> &'static str {
        "plain"
    }

    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationOutput> {
        Generator::generate_stream(self, prompts, params, on_token)
    }
}
