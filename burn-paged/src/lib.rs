//! # burn-paged
//!
//! vLLM (Kwon et al., SOSP '23; thesis ch. 5) on Burn: the KV cache lives in fixed-size blocks
//! mapped through per-sequence block tables, so memory is committed a block at a time, blocks are
//! shared between sequences (parallel samples, beam candidates, common prefixes) with reference
//! counts and copy-on-write, and an iteration-level scheduler batches requests continuously,
//! preempting by swap or recomputation when blocks run out.
//!
//! - [`memory`]: block pools, block tables and the block manager (bookkeeping only).
//! - [`scheduler`]: iteration-level batching, FCFS or ExeGPT's phased RRA schedule, preemption by
//!   swap or recomputation.
//! - [`cache`]: the paged KV cache the models attend through (reshape-and-cache, PagedAttention).
//! - [`beam`]: beam-search bookkeeping equal to Hugging Face's `generate(num_beams=…)`.
//! - [`LlmEngine`]: `add_request` / `step` / `abort`, and offline `generate`.
//! - [`DisaggEngine`]: ExeGPT's workload-aware allocation (WAA) over two devices, prefill on one
//!   and decode on the other, each request's KV blocks moved between their pools (`to_device`)
//!   after its prefill.

#![warn(missing_docs)]

pub mod beam;
pub mod cache;
mod engine;
pub mod error;
pub mod memory;
pub mod scheduler;

pub use engine::{
    DisaggConfig, DisaggEngine, EngineConfig, EngineStats, GenerateProgress, KvCacheMemory, LlmEngine, ProgressHook,
    SequenceDelta, StepOutput, VirtualEngines,
};
pub use error::{PagedError, Result};
pub use scheduler::{KvReservation, PreemptionMode, SchedulingPolicy};
