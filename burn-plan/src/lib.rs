//! Planners for parallel LLM inference, from measured costs, with no Burn in them: each is a pure
//! function from a serde input to a serde output, with `thiserror` errors naming the bad field,
//! so that they build and test in seconds. `burn-parallel` runs what they plan (pipeline stages,
//! tensor-parallel layers) and its profiler measures the [`profile::Profile`] they read; the
//! paged engine's phased scheduler runs the [`admission`] rule the schedule planner replays.
//!
//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json [--exhaustive]
//! [--baseline replication]` (the facade's `burn_llm::cli::plan`) runs one planner on a JSON
//! file through [`json::run`] and prints one JSON object (`{"error": "…"}` and exit code 2 on bad
//! or infeasible input). Sample inputs are in `burn-plan/inputs/`.
//!
//! | planner | paper | input → output |
//! | --- | --- | --- |
//! | [`stages`] | Alpa inter-op DP (thesis §3.5.2), AlpaServe's max-stage DP (§4.4.1) | `{"layer_latency_ms": [f64; L], "stages": S}` + optional `"layer_memory_bytes": [u64; L]`, `"stage_memory_bytes"`, `"tensor_parallel": {"devices", "degrees": [{"degree", "layer_latency_ms"}]}`, or heterogeneous `"devices": [{"name", "layer_latency_ms", "memory_bytes", "link_ms"}; S]` with `"first_stage"`/`"last_stage": {"latency_ms", "memory_bytes"}` → `{"stages": [[start, end]; S], "stage_latency_ms": [f64; S], "bottleneck_ms"}` (+ `"tensor_parallel_degrees"`, `"stage_memory_bytes"`) |
//! | [`slices`] | TeraPipe Algorithm 1 (§2.3.3), batch knapsack (§2.3.4) | `{"seq_len": L, "stages": K, "t_fwd_ms": [[f64; L]; L]}` or `"profile"` instead of the table, optional `"epsilon_ms"`, `"unit_tokens"` → `{"slices": [l_1, …], "latency_ms": T}`; with `"batch": B` and `"t_fwd_ms_by_batch"` → `{"micro_batches": [{"batch", "slices", "latency_ms"}], "latency_ms"}` |
//! | [`placement`] | AlpaServe Algorithms 3–4 (§4.4.2) on the simulator (§4.5) | `{"models": [{"name", "layer_latency_ms", "layer_memory_bytes", "slo_s"}], "devices", "device_memory_bytes", "workload": {"trace": [[time_s, model]]} or {"arrivals": [{"model", "rate", "cv"}], "duration_s", "seed"}}` → `{"groups": [{"devices", "pipeline_stages", "tensor_parallel", "models"}], "slo_attainment", "models", "latencies_s"}` |
//! | [`schedule`] | ExeGPT RRA/WAA (§4), branch-and-bound (§5), XSimulator (§6) | `{"profile", "input_lengths", "output_lengths", "devices", "device_memory_bytes", "latency_bound_s"}` → `{"strategy", "encode_batch", "decode_batch", "decode_iterations", "decoder_micro_batches", "tensor_parallel_degree", …, "throughput_qps", "latency_s", "latency_percentile"}` |
//!
//! Shared pieces: [`sim`], the discrete-event pipeline simulator whose semantics are part of the
//! interface; [`profile`], the cost profile the Burn profiler writes and the planners read;
//! [`interference`], how much stages working at once slow each other down, and the price of a
//! pipelined pass; [`admission`], ExeGPT's phased admission rule, shared with the paged engine's
//! scheduler so that the schedule planner's replay and the engine cannot drift apart; [`check`],
//! the input checks every planner runs; [`stage_pass`], one pipeline stage's pass priced from
//! its device's profile; [`units`], byte counts in messages.

pub mod admission;
pub mod check;
pub mod interference;
pub mod json;
pub mod placement;
pub mod profile;
pub mod schedule;
pub mod serving;
pub mod sim;
pub mod slices;
mod stage_devices;
pub mod stage_groups;
pub mod stage_pass;
pub mod stages;
pub mod units;
