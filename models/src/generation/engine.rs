//! The plain engine: a static batch of requests run to completion on a [`ContiguousKvCache`], over
//! any [`LanguageModel`] (a [`CausalLm`] on one device, or pipeline stages on several: each cache
//! layer then lives on its stage's device).

use std::time::Instant;

use super::events::StreamEvent;
use burn_llm_kernels::QuantSpec;

use super::request::{GenerationOutput, Prompt, RequestState, Timing, histories, prepare_prompt, record_sampled};
use super::sampling::{SamplingParams, sample};
use crate::cache::ContiguousKvCache;
use crate::error::Result;
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
        let spec = self.model.spec();
        params.validate(spec.vocab_size)?;
        params.require_single_sequence("plain")?;
        let tokenizer = self.tokenizer.as_ref();
        let mut requests = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (text, ids) = prepare_prompt(i, p, tokenizer, spec.vocab_size, spec.max_positions)?;
                Ok(RequestState::new(text, ids, params, spec.max_positions))
            })
            .collect::<Result<Vec<_>>>()?;
        if requests.is_empty() {
            return Ok(GenerationOutput { requests: Vec::new(), timing: Timing::default() });
        }
        let longest_prompt = requests.iter().map(|r| r.prompt_ids().len()).max().unwrap_or(0);
        let longest_budget = requests.iter().map(RequestState::budget).max().unwrap_or(1);
        let (layout, capacity) = (self.model.kv_layout(), longest_prompt + longest_budget - 1);
        let mut cache = ContiguousKvCache::placed(
            layout,
            requests.len(),
            capacity,
            &self.model.device(),
            self.model.kv_devices(),
            self.kv_quant,
        )?;
        let mut rngs: Vec<_> = requests.iter().map(|_| params.rng()).collect();
        let mut timing =
            Timing { prompt_tokens: requests.iter().map(|r| r.prompt_ids().len()).sum(), ..Timing::default() };

        let started = Instant::now();
        let mut new_tokens: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt_ids().to_vec()).collect();
        let mut first = true;
        while requests.iter().any(|r| !r.is_finished()) {
            let _span = tracing::debug_span!("step", engine = "plain", step = timing.decode_steps, first).entered();
            let slices: Vec<&[u32]> = new_tokens.iter().map(Vec::as_slice).collect();
            let step = cache.begin_step(&slices)?;
            let logits = self.model.forward_last_logits(&step, &mut cache)?;
            let sampled = sample(logits, params, &mut rngs, &histories(&requests))?;
            timing.generated_tokens += record_sampled(
                &mut requests,
                &mut new_tokens,
                sampled,
                params,
                &self.eos_token_ids,
                tokenizer,
                |request, token, text, finished| on_token(StreamEvent { request, sequence: 0, token, text, finished }),
            )?;
            if first {
                timing.prefill_s = started.elapsed().as_secs_f64();
                first = false;
            } else {
                timing.decode_steps += 1;
            }
        }
        timing.decode_s = started.elapsed().as_secs_f64() - timing.prefill_s;
        Ok(GenerationOutput { requests: requests.into_iter().map(RequestState::into_output).collect(), timing })
    }
}
