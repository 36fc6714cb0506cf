//! # burn-llm
//!
//! Pure-Rust LLM inference on [Burn](https://burn.dev): OPT, LLaMA and GPT-2 from Hugging Face
//! checkpoints, one generation API, and (in the member crates) paged serving, offloading, and
//! parallel execution and planning.
//!
//! This facade re-exports the member crates and owns what they share at the top: device
//! selection, the [`Engine`] trait every engine implements and the command-line front end of the
//! examples. The OpenAI-compatible server is its own crate, `burn-llm-server`, on top of this one.
//!
//! | crate | what it holds |
//! |---|---|
//! | [`models`] (`burn-llm-models`) | configs, safetensors and GGUF loading, the shared decoder, KV-cache trait, sampling, plain generation |
//! | [`kernels`] (`burn-llm-kernels`) | group-wise 4/8-bit quantization and fused dequantize-matmul, paged-attention kernels: CubeCL kernels with Flex twins |
//! | [`offload`] (`burn-offload`) | FlexGen: weights and KV cache across device, host and disk, LP policy search, CPU attention, compression |
//! | [`paged`] (`burn-paged`) | vLLM: block manager, PagedAttention KV cache, continuous-batching engine, parallel sampling, beam search |
//! | [`parallel`] (`burn-parallel`) | pipeline stages and tensor parallelism over several devices, and the model profiler |
//! | [`plan`] (`burn-plan`) | the planners, without Burn: Alpa/AlpaServe stages, TeraPipe slices, AlpaServe placement over its simulator, ExeGPT schedules over its XSimulator |

pub mod cli;
pub mod device;
pub mod engine;
pub mod schedule;
pub mod spec;

pub use burn_llm_kernels as kernels;
pub use burn_llm_models as models;
pub use burn_llm_models::{
    BeamSearchParams, CausalLm, EarlyStopping, FinishReason, GenerationOutput, Generator, ModelError, Pretrained,
    Prompt, RequestOutput, SamplingParams, SequenceDelta, StepOutput, StreamEvent, Timing, TokenLogprob,
};
pub use burn_offload as offload;
/// Peak memory per tier during a run, where the engine measures it (the offloading engine).
pub use burn_offload::MemoryReport;
pub use burn_paged as paged;
pub use burn_parallel as parallel;
pub use burn_plan as plan;
pub use device::DeviceChoice;
pub use engine::{Capabilities, Engine, EngineDetails, EngineError, EngineLoad, Generation, RunReport};
pub use spec::{EngineKind, EngineSpec, Purpose, SpecError};
