//! Parallel execution over several Burn devices, and a profiler of a model's costs on one.
//!
//! - Execution (feature `runtime`, on by default): [`pipeline`] ([`pipeline::PipelineLm`], stages
//!   of decoder layers on their own devices, run by the plain and paged engines) and [`tensor`]
//!   (`TensorParallelLayer`, one decoder layer split Megatron-style over several devices), both
//!   over [`block`]'s `LayerBlock`.
//! - [`profiler`] (feature `profiler`, on by default): measures a model's costs on a Burn device.
//! - The planners that decide how a model is split and scheduled are in `burn-plan` (pure
//!   functions over JSON cost inputs, no Burn): [`pipeline::PipelinePlan::auto`] and
//!   `--prefill-slices auto` ask them, and the [`profiler`] measures the
//!   [`Profile`](burn_plan::profile::Profile) they read.
//!
//! ## Profiler (feature `profiler`, on by default)
//!
//! `profiler` measures the [`Profile`](burn_plan::profile::Profile) the planners read, on a real Burn device:
//! `cargo run --release --example plan -- profile --model DIR_OR_GGUF | --synthetic NAME
//! --device flex|wgpu|vulkan|cuda|metal --out FILE.json [--grid small|full] [--quiet]`. It builds
//! the model with random weights and one decoder layer (every layer has the same shape) and
//! times, after a warm-up, as the median of a few runs between device synchronisations:
//!
//! | what | grid (`small` / `full`) | written as |
//! | --- | --- | --- |
//! | prefill of a layer, no context | batch 1, 2 / 1, 4, 16 × tokens 1, 8, 32 / 1, 16, 64, 256, 1024 | `prefill.base_ms[b][t]` (table) |
//! | prefill after `j` tokens of context | batch 1, tokens as above × context 16, 48 / 64, 256, 1024 | `prefill.context_ms`: TeraPipe's `t_ctx(i, j) = a0 + a1·i + a2·j + a3·i·j`, non-negative least squares |
//! | one decode step of a layer | batch 1, 4 / 1, 8, 32, 64 × context 0, 32, 96 / 0, 256, 1024, 2048 | `decode.ms[b][c]` (table) |
//! | embedding, LM head (final norm + logits) | the prefill tokens / the decode batches | `embedding`, `lm_head`: `ms_per_token` (slope through the origin) and `weight_bytes` |
//! | bytes | — | `weight_bytes_per_layer` (projections as stored), `kv_bytes_per_token_per_layer` (`f32` K and V) |
//! | serving-engine steps, timed by the caller ([`profiler::cli::run_with_engine`]) | [`profiler::EngineStepGrid`] | `engine_step`: per-step overhead beyond the tables, non-negative least squares (optional) |
//!
//! Points beyond the model's positions are dropped; `tensor_parallel` is left empty (one device).
//! The output is a [`Profile`](burn_plan::profile::Profile) file that `slices`, `schedule` and the others take.

#[cfg(feature = "runtime")]
pub mod block;
pub mod pipeline;
#[cfg(feature = "profiler")]
pub mod profiler;
#[cfg(feature = "runtime")]
pub mod tensor;
