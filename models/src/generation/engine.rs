//! The plain engine: a static batch of requests run to completion on a [`ContiguousKvCache`], over
//! any [`LanguageModel`] (a [`CausalLm`] on one device, or pipeline stages on several: each cache
//! layer then lives on its stage's device).

use burn_llm_kernels::QuantSpec;

use super::batch::{GenerationClock, StaticBatch, prepare_requests, prompt_tokens, static_kv_capacity};
use super::events::StreamEvent;
use super::request::{GenerationOutput, Prompt, RequestState, Timing};
use super::sampling::SamplingParams;
use crate::cache::ContiguousKvCache;
use crate::error::{ModelError, Result};
use crate::language_model::LanguageModel;
use crate::model::CausalLm;
use crate::pretrained::Pretrained;
use crate::tokenizer::Tokenizer;

/// Generates text with a model on its device: prompts are prefilled together (left-padded), then
/// decoded one token per step until every request has stopped.
#[derive(Debug)]
pub struct Generator<M: LanguageModel = CausalLm> {
    model: M,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    kv_quant: Option<QuantSpec>,
}

impl From<Pretrained> for Generator {
    fn from(p: Pretrained) -> Self {
        Self::new(p.model, Some(p.tokenizer), p.eos_token_ids)
    }
}

impl<M: LanguageModel> Generator<M> {
    /// A generator over `model`; `tokenizer` is needed for text prompts and output text;
    /// `eos_token_ids` end a request unless `ignore_eos` is set.
    pub fn new(model: M, tokenizer: Option<Tokenizer>, eos_token_ids: Vec<u32>) -> Self {
        Self { model, tokenizer, eos_token_ids, kv_quant: None }
    }

    /// Stores the KV cache as group-quantized codes exactly as `spec` says, dequantized when
    /// attention reads it; checked against the model's head dimension
    /// ([`check_kv_quant`](crate::cache::check_kv_quant); [`fit_kv_quant`](crate::cache::fit_kv_quant)
    /// fits a requested group size to the heads).
    pub fn with_kv_quantization(mut self, spec: QuantSpec) -> Result<Self> {
        crate::cache::check_kv_quant(self.model.kv_layout(), spec)?;
        self.kv_quant = Some(spec);
        Ok(self)
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Ids that end a request.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Generates a continuation for every prompt.
    pub fn generate(&self, prompts: &[Prompt], params: &SamplingParams) -> Result<GenerationOutput> {
        self.generate_stream(prompts, params, |_| {})
    }

    /// Like [`Generator::generate`], calling `on_token` for every generated token as soon as it is
    /// sampled.
    pub fn generate_stream(
        &self,
        prompts: &[Prompt],
        params: &SamplingParams,
        mut on_token: impl FnMut(StreamEvent<'_>),
    ) -> Result<GenerationOutput> {
        let mut clock = GenerationClock::start();
        let spec = self.model.spec();
        params.validate(spec.vocab_size)?;
        params.require_single_sequence("plain")?;
        let tokenizer = self.tokenizer.as_ref();
        let mut requests = prepare_requests(prompts, params, tokenizer, spec, &self.eos_token_ids)?;
        if requests.is_empty() {
            return Ok(GenerationOutput { requests: Vec::new(), timing: Timing::default() });
        }
        let mut cache = ContiguousKvCache::placed(
            self.model.kv_layout(),
            requests.len(),
            static_kv_capacity(&requests),
            &self.model.device(),
            self.model.kv_devices(),
            self.kv_quant,
        )?;
        let batch = StaticBatch {
            params,
            eos_token_ids: &self.eos_token_ids,
            tokenizer,
            group_rows: requests.len(),
            engine: "plain",
            feed_on_device: !crate::device::is_host_device(&self.model.device()),
        };
        let generated = batch.run(
            &mut requests,
            &mut clock,
            |groups, fed| {
                // One group, the whole batch, over one cache.
                let mut logits = Vec::with_capacity(groups.len());
                for (rows, fed) in groups.iter().zip(fed) {
                    logits.push(match rows {
                        Some(rows) => {
                            let step = cache.begin_step(rows)?;
                            let step = match fed {
                                Some(ids) => step.with_tokens(ids.clone())?,
                                None => step,
                            };
                            Some(self.model.forward_last_logits(&step, &mut cache)?)
                        }
                        None => None,
                    });
                }
                Ok::<_, ModelError>(logits)
            },
            &mut on_token,
        )?;
        let timing = clock.finish(prompt_tokens(&requests), generated);
        Ok(GenerationOutput { requests: requests.into_iter().map(RequestState::into_output).collect(), timing })
    }
}
