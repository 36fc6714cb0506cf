//! Parallel execution, a profiler, and the planners that decide how a model is split and
//! scheduled.
//!
//! - Execution (feature `runtime`, on by default): [`pipeline`] ([`pipeline::PipelineLm`], stages
//!   of decoder layers on their own devices, run by the plain and paged engines) and [`tensor`]
//!   (`TensorParallelLayer`, one decoder layer split Megatron-style over several devices), both
//!   over [`block`]'s `LayerBlock`.
//! - [`profiler`] (feature `profiler`, on by default): measures a model's costs on a Burn device.
//! - Planners ([`plan`]), from measured costs. Each is a pure function from a serde input to a
//!   serde output, with `thiserror` errors naming the bad field; none runs a Burn tensor op (the
//!   schedule planner's replay shares only the paged engine's admission rule,
//!   [`burn_llm_models::admission`]).
//!
//! The example `plan` runs the planners from JSON files:
//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]` prints one JSON object (`{"error": "…"}` and exit
//! code 2 on bad or infeasible input). Sample inputs are in `burn-parallel/inputs/`.
//!
//! | planner | paper | input → output |
//! | --- | --- | --- |
//! | [`plan::stages`] | Alpa inter-op DP (thesis §3.5.2), AlpaServe's max-stage DP (§4.4.1) | `{"layer_latency_ms": [f64; L], "stages": S}` + optional `"layer_memory_bytes": [u64; L]`, `"stage_memory_bytes"`, `"tensor_parallel": {"devices", "degrees": [{"degree", "layer_latency_ms"}]}`, or heterogeneous `"devices": [{"name", "layer_latency_ms", "memory_bytes", "link_ms"}; S]` with `"first_stage"`/`"last_stage": {"latency_ms", "memory_bytes"}` → `{"stages": [[start, end]; S], "stage_latency_ms": [f64; S], "bottleneck_ms"}` (+ `"tensor_parallel_degrees"`, `"stage_memory_bytes"`) |
//! | [`plan::slices`] | TeraPipe Algorithm 1 (§2.3.3), batch knapsack (§2.3.4) | `{"seq_len": L, "stages": K, "t_fwd_ms": [[f64; L]; L]}` or `"profile"` instead of the table, optional `"epsilon_ms"`, `"unit_tokens"` → `{"slices": [l_1, …], "latency_ms": T}`; with `"batch": B` and `"t_fwd_ms_by_batch"` → `{"micro_batches": [{"batch", "slices", "latency_ms"}], "latency_ms"}` |
//! | [`plan::placement`] | AlpaServe Algorithms 3–4 (§4.4.2) on the simulator (§4.5) | `{"models": [{"name", "layer_latency_ms", "layer_memory_bytes", "slo_s"}], "devices", "device_memory_bytes", "workload": {"trace": [[time_s, model]]} or {"arrivals": [{"model", "rate", "cv"}], "duration_s", "seed"}}` → `{"groups": [{"devices", "pipeline_stages", "tensor_parallel", "models"}], "slo_attainment", "models", "latencies_s"}` |
//! | [`plan::schedule`] | ExeGPT RRA/WAA (§4), branch-and-bound (§5), XSimulator (§6) | `{"profile", "input_lengths", "output_lengths", "devices", "device_memory_bytes", "latency_bound_s"}` → `{"strategy", "encode_batch", "decode_batch", "decode_iterations", "decoder_micro_batches", "tensor_parallel_degree", …, "throughput_qps", "latency_s", "latency_percentile"}` |
//!
//! Shared pieces: [`plan::sim`], the discrete-event pipeline simulator whose semantics are part
//! of the interface; [`plan::profile`], the cost profile a Burn profiler writes and the planners
//! read; [`plan::cli`], the command line behind the example.
//!
//! ## Profiler (feature `profiler`, on by default)
//!
//! `profiler` measures the [`plan::profile::Profile`] the planners read, on a real Burn device
//! (without the feature, the `plan` module runs no Burn device):
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
//! The output is a [`plan::profile::Profile`] file that `slices`, `schedule` and the others take.

#[cfg(feature = "runtime")]
pub mod block;
pub mod pipeline;
pub mod plan;
#[cfg(feature = "profiler")]
pub mod profiler;
#[cfg(feature = "runtime")]
pub mod tensor;
