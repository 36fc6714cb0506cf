//! Benchmarks. Each writes `bench-results/<name>.{json,md}` with the machine it ran on.

mod attention;
mod calls;
pub(crate) mod cpu;
mod dispatches;
mod generate;
mod kernels;
mod matvec;
mod offload;
mod online;
mod online_structured;
mod paged_attention;
mod parallel;
mod pipeline;
mod placement;
mod plot;
mod process_cpu;
mod quant;
mod schedule;
mod serve;
mod structured;
mod synthetic;
mod workload;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum Which {
    /// Prefill and decode tokens/s of the plain engine at batch sizes 1, 8, 32.
    Generate(generate::Args),
    /// burn-llm's CPU path vs llama.cpp on the same GGUF file: decode, prompt processing, batch.
    Cpu(cpu::Args),
    /// Cost of group quantization: dequantize GB/s, fused vs f32 matmul, decode tokens/s.
    Quant(quant::Args),
    /// The Flex kernels alone: `kernels::matmul` vs Burn on the LM head, the integer strip
    /// kernel's single-thread rate per instruction set.
    Kernels(kernels::Args),
    /// The decode matrix-vector kernels vs Burn's matmul and the per-output quantized kernel, in
    /// GB/s of weights read, at decode shapes on a GPU device.
    Matvec(matvec::Args),
    /// FlexGen policies on a model larger than the device budget: searched vs baselines.
    Offload(offload::Args),
    /// Paged engine vs static batching on ShareGPT/Alpaca-like workloads; sharing savings
    /// (`--online`: HTTP serving at Poisson arrival rates).
    Serve(serve::Args),
    /// ExeGPT's latency-bounded schedule vs FCFS (default and tuned) on the paged engine.
    Schedule(schedule::Args),
    /// Pipeline parallelism over local devices: time and bytes between stages vs one device.
    Parallel(parallel::Args),
    /// Alpa's automatic stages vs an even split, TeraPipe's token slices (time to first token at
    /// PP=2) and chunked prefill under mixed load, each against its prediction and baseline.
    Pipeline(pipeline::Args),
    /// AlpaServe's placement vs replication over two one-thread workers: SLO attainment and p99
    /// at CV 1, 3, 6 and swept rates, each beside the simulator's prediction.
    Placement(placement::Args),
    /// Structured outputs' cost: token-mask time per sequence and the paged engine's decode step
    /// with every sequence constrained vs none, at batch 1 and 32.
    Structured(structured::Args),
    /// The PagedAttention kernel's achieved memory bandwidth (KV bytes read ÷ kernel time) next
    /// to the device's streaming bandwidth.
    PagedAttention(paged_attention::Args),
    /// Prefill attention on a GPU: the flash-attention kernel vs the matmul path, time and
    /// effective FLOP/s, checked against the Flex twin.
    Attention(attention::Args),
    /// GPU kernel launches per decode step and per decoder layer (CubeCL's launch observer), for a
    /// LLaMA-shaped and a Gemma-shaped model.
    Dispatches(dispatches::Args),
}

/// Runs one benchmark.
pub fn run(which: Which) -> Result<(), Box<dyn std::error::Error>> {
    match which {
        Which::Generate(args) => generate::run(args),
        Which::Cpu(args) => cpu::run(args),
        Which::Quant(args) => quant::run(args),
        Which::Kernels(args) => kernels::run(args),
        Which::Matvec(args) => matvec::run(args),
        Which::Serve(args) => serve::run(args),
        Which::Offload(args) => offload::run(args),
        Which::Schedule(args) => schedule::run(args),
        Which::Parallel(args) => parallel::run(args),
        Which::Pipeline(args) => pipeline::run(args),
        Which::Placement(args) => placement::run(args),
        Which::PagedAttention(args) => paged_attention::run(args),
        Which::Structured(args) => structured::run(args),
        Which::Dispatches(args) => dispatches::run(args),
        Which::Attention(args) => attention::run(args),
    }
}
