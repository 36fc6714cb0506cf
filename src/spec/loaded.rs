//! [`EngineSpec::init_model`]: the plain or paged engine over a model already in memory (random
//! weights in the benches, a model a library user built), with the same checks as a model loaded
//! from files.

use std::error::Error;
use std::io::Write;

use burn_llm_models::{CausalLm, Generator, Tokenizer};
use burn_paged::{EngineConfig, LlmEngine};

use super::{EngineKind, EngineSpec, Purpose, SpecError};
use crate::engine::Engine;

impl EngineSpec {
    /// Validates the spec for `purpose`, then builds its plain or paged engine over `model` (with
    /// `tokenizer`, if any, and its end-of-sequence ids). The model's device and precision are
    /// the ones it was built with: a `device` or `dtype` that differs is an error, as are the
    /// settings that need the model's files (the offloading engine, parallelism, an ExeGPT plan
    /// made at start-up).
    pub fn init_model(
        &self,
        model: CausalLm,
        tokenizer: Option<Tokenizer>,
        eos_token_ids: Vec<u32>,
        purpose: Purpose<'_>,
        log: &mut dyn Write,
    ) -> Result<Box<dyn Engine>, Box<dyn Error>> {
        let kind = self.kind();
        self.validate(kind, purpose)?;
        self.check_loaded(kind, &model)?;
        let model = match self.weight_quant()? {
            Some(spec) => model.quantize_weights(spec)?,
            None => model,
        };
        let model = super::build::fuse_on_gpu(model);
        let engine: Box<dyn Engine> = match kind {
            EngineKind::Paged => {
                let scheduling = match self.planless_policy() {
                    Some(policy) => policy,
                    None => self.saved_plan(log)?,
                };
                let config = EngineConfig { scheduling, ..self.engine_config() };
                Box::new(LlmEngine::from_parts(model, tokenizer, eos_token_ids, config)?)
            }
            _ => Box::new(self.plain_generator(Generator::new(model, tokenizer, eos_token_ids))?),
        };
        Ok(self.with_precision(engine))
    }

    /// What a model in memory cannot do: be placed by the offloading engine or split over
    /// devices, move to another device or precision, or be profiled for a plan at start-up.
    fn check_loaded(&self, kind: EngineKind, model: &CausalLm) -> Result<(), SpecError> {
        let needs_files = |flag: &str, what: &str| {
            SpecError::new(
                flag,
                format!("{what} needs the model's files"),
                "build with EngineSpec::init from its directory",
            )
        };
        if kind == EngineKind::Offload {
            return Err(needs_files("--engine offload", "placing weights across tiers"));
        }
        if self.parallel.is_set() {
            return Err(needs_files("--devices", "loading each stage's layers onto its device"));
        }
        if self.paged.latency_bound_s.is_some() {
            return Err(needs_files("--latency-bound-s", "profiling and planning at start-up"));
        }
        if let Some(dtype) = self.dtype.filter(|&d| d != model.precision()) {
            return Err(SpecError::new(
                "--dtype",
                format!("asks for {dtype}, and the model was built in {}", model.precision()),
                "build the model in that precision, or drop --dtype",
            ));
        }
        if let Some(choice) = self.device {
            let device = choice.device().map_err(|e| SpecError::new("--device", e.to_string(), "use another"))?;
            if device != model.device() {
                return Err(SpecError::new(
                    "--device",
                    format!("names {}, and the model is on {:?}", choice.name(), model.device()),
                    "build the model on that device, or drop --device",
                ));
            }
        }
        Ok(())
    }
}
