//! Planners that decide how a model is split and scheduled, from measured costs. Each is a pure
//! function from a serde input to a serde output, with `thiserror` errors naming the bad field;
//! none depends on Burn. The example `plan` runs them from JSON files:
//! `cargo run --example plan -- <stages|slices|placement|schedule> --input FILE.json
//! [--exhaustive] [--baseline replication]` prints one JSON object (`{"error": "…"}` and exit
//! code 2 on bad or infeasible input). Sample inputs are in `burn-parallel/inputs/`.
//!
//! | planner | paper | input → output |
//! | --- | --- | --- |
//! | [`plan::stages`] | Alpa inter-op DP (thesis §3.5.2), AlpaServe's max-stage DP (§4.4.1) | `{"layer_latency_ms": [f64; L], "stages": S}` + optional `"layer_memory_bytes": [u64; L]`, `"stage_memory_bytes"`, `"tensor_parallel": {"devices", "degrees": [{"degree", "layer_latency_ms"}]}` → `{"stages": [[start, end]; S], "stage_latency_ms": [f64; S], "bottleneck_ms"}` (+ `"tensor_parallel_degrees"`) |
//! | [`plan::slices`] | TeraPipe Algorithm 1 (§2.3.3), batch knapsack (§2.3.4) | `{"seq_len": L, "stages": K, "t_fwd_ms": [[f64; L]; L]}` or `"profile"` instead of the table, optional `"epsilon_ms"`, `"unit_tokens"` → `{"slices": [l_1, …], "latency_ms": T}`; with `"batch": B` and `"t_fwd_ms_by_batch"` → `{"micro_batches": [{"batch", "slices", "latency_ms"}], "latency_ms"}` |
//! | [`plan::placement`] | AlpaServe Algorithms 3–4 (§4.4.2) on the simulator (§4.5) | `{"models": [{"name", "layer_latency_ms", "layer_memory_bytes", "slo_s"}], "devices", "device_memory_bytes", "workload": {"trace": [[time_s, model]]} or {"arrivals": [{"model", "rate", "cv"}], "duration_s", "seed"}}` → `{"groups": [{"devices", "pipeline_stages", "tensor_parallel", "models"}], "slo_attainment", "models", "latencies_s"}` |
//! | [`plan::schedule`] | ExeGPT RRA/WAA (§4), branch-and-bound (§5), XSimulator (§6) | `{"profile", "input_lengths", "output_lengths", "devices", "device_memory_bytes", "latency_bound_s"}` → `{"strategy", "encode_batch", "decode_batch", "decode_iterations", "decoder_micro_batches", "tensor_parallel_degree", …, "throughput_qps", "latency_s", "latency_percentile"}` |
//!
//! Shared pieces: [`plan::sim`], the discrete-event pipeline simulator whose semantics are part
//! of the interface; [`plan::profile`], the cost profile a Burn profiler writes and the planners
//! read; [`plan::cli`], the command line behind the example.

pub mod plan;
