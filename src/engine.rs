//! The interface every engine offers: give it prompts and sampling parameters, get one output per
//! prompt. The plain engine is [`Generator`]; the paged (vLLM) and offloading (FlexGen) engines of
//! the member crates implement the same trait, so the CLI and the benchmarks drive any of them.

use burn_llm_models::{GenerationOutput, Generator, ModelError, Prompt, Result, SamplingParams, StreamEvent};
use burn_offload::{OffloadEngine, OffloadError};
use burn_paged::{LlmEngine, PagedError, RequestParams};

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

impl Engine for LlmEngine {
    fn name(&self) -> &'static str {
        "paged"
    }

    /// One sequence per prompt; streamed events carry each token as it is sampled.
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationOutput> {
        let request = RequestParams::from(params.clone());
        let out = LlmEngine::generate_stream(self, prompts, &request, |request, delta| {
            for &token in &delta.token_ids {
                on_token(StreamEvent { request, token, text: &delta.text, finished: delta.finish_reason.is_some() });
            }
        });
        out.map_err(|e| match e {
            PagedError::Model(m) => m,
            other => ModelError::Device(other.to_string()),
        })
    }
}

impl Engine for OffloadEngine {
    fn name(&self) -> &'static str {
        "offload"
    }

    /// Runs whole blocks; tokens are reported per request once its block has finished.
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationOutput> {
        let (out, _) = OffloadEngine::generate(self, prompts, params).map_err(|e| match e {
            OffloadError::Model(m) => m,
            other => ModelError::Device(other.to_string()),
        })?;
        for (request, r) in out.requests.iter().enumerate() {
            let n = r.generated_ids.len();
            for (i, &token) in r.generated_ids.iter().enumerate() {
                let text = if i + 1 == n { r.text.as_str() } else { "" };
                on_token(StreamEvent { request, token, text, finished: i + 1 == n });
            }
        }
        Ok(out)
    }
}
