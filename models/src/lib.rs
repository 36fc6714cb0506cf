//! # burn-llm-models
//!
//! OPT, LLaMA and GPT-2 for Burn 0.22, loaded from Hugging Face checkpoints (`config.json`,
//! safetensors, possibly sharded, in f32/f16/bf16) and run through one shared decoder.
//!
//! - [`config`]: HF configs per architecture, lowered to one [`DecoderSpec`].
//! - [`model`]: the decoder ([`CausalLm`]), shared by every architecture and every engine.
//! - [`language_model`]: [`LanguageModel`], what engines run: a [`CausalLm`] on one device or a
//!   model split into pipeline stages (`burn-parallel`).
//! - [`cache`]: the [`KvCache`] trait through which the model stores keys/values and attends, and
//!   the contiguous cache of the plain engine. Read its docs for how the paged (vLLM) and
//!   offloaded (FlexGen) caches plug into the same model code.
//! - [`generation`]: [`SamplingParams`], [`BeamSearchParams`], the on-device sampler, stop rules,
//!   streaming, and the plain [`Generator`].
//! - [`slicing`]: [`PrefillSlicing`], how a pipelined prefill is cut into token slices (TeraPipe).
//! - [`tokenizer`]: HF `tokenizer.json` with BOS/EOS handling and incremental detokenization.
//! - [`gguf`]: llama.cpp's GGUF files (LLaMA architecture; F32/F16/BF16/Q8_0/Q4_0/Q4_1) and
//!   their tokenizers.
//! - [`hub`]: local directories, GGUF files or hub ids.
//! - [`pypi`]: model files shipped in PyPI wheels (SmolLM2 GGUF), for machines without the hub.
//!
//! ```no_run
//! use burn::tensor::Device;
//! use burn_llm_models::{Generator, Pretrained, SamplingParams};
//!
//! let device = Device::flex();
//! let pretrained = Pretrained::load("models/opt-125m".as_ref(), &device)?;
//! let generator = Generator::from(pretrained);
//! let out = generator.generate(&["Hello".into()], &SamplingParams::greedy(20))?;
//! println!("{}", out.requests[0].text);
//! # Ok::<(), burn_llm_models::ModelError>(())
//! ```

#![warn(missing_docs)]

pub mod arch;
pub mod cache;
pub mod chat;
pub mod config;
pub mod device;
pub mod error;
pub mod generation;
pub mod gguf;
pub mod hub;
pub mod language_model;
pub mod layers;
pub mod model;
pub mod precision;
pub mod pretrained;
pub mod pypi;
pub mod slicing;
pub mod tokenizer;
pub mod weights;

/// Byte counts in messages (`units::fmt_bytes`), shared by every engine's errors and reports;
/// kept in `burn-plan`, whose planners word their errors with it and which builds without Burn.
pub use burn_plan::units;

pub use cache::{ContiguousKvCache, KvCache, KvLayout, StepInput};
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, DecoderSpec};
pub use error::{ModelError, Result};
pub use generation::{
    BeamSearchParams, Constraint, EarlyStopping, FinishReason, GenerationOutput, Generator, Prompt, PromptLogprobs,
    RequestOutput, SamplingParams, SequenceDelta, StepOutput, StreamEvent, Timing, TokenLogprob,
};
pub use language_model::{LanguageModel, MicroBatchCache, StageCache};
pub use model::CausalLm;
pub use precision::Precision;
pub use pretrained::{ModelFiles, Pretrained, PretrainedFiles};
pub use slicing::{PrefillSlicing, UniformSlices};
pub use tokenizer::Tokenizer;
pub use weights::{Checkpoint, RandomWeights};

/// The kernels' quantization types, for crates that cut, build or describe quantized projections
/// (pipeline and tensor parallelism) without depending on the kernels crate themselves.
pub use burn_llm_kernels::{GroupQuantized, QuantSpec};
