//! Integration tests of burn-llm, in one binary (each binary links all of Burn).
//!
//! Fixtures under `tests/fixtures/` are tiny random HF checkpoints with HF reference outputs,
//! made by `scripts/make_fixtures.py`. Tests run on `flex` and, when the `wgpu` feature is on, on
//! wgpu too (Mesa lavapipe on machines without a GPU); set `BURN_LLM_TEST_WGPU=0` to skip wgpu, or
//! `BURN_LLM_TEST_DEVICE=vulkan` (a build with `--features vulkan`) to run them on the Vulkan runtime alone.

mod common;

mod archs;
mod auto_stages;
mod batch_invariance;
mod chunked;
mod cli;
mod cli_golden;
mod disagg;
mod engine;
mod errors;
mod fused_projections;
mod gguf;
mod gguf_archs;
mod gguf_writer;
mod headless_chromium;
mod loopback_client;
mod offload;
mod paged;
mod paged_kv_quant;
mod parallel;
mod parity;
mod plan_cli;
mod precision;
mod quantized;
mod real_model;
#[cfg(feature = "remote")]
mod remote;
mod sampling;
mod server;
mod server_clients;
mod server_models;
mod server_placement;
mod server_protocol;
mod server_structured;
mod spec;
mod stage_degrees;
mod structured;
mod virtual_engines;
