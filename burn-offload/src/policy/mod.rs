//! Offloading-policy search: FlexGen's cost model and LP placement search, with LM-Offload's
//! quantization terms and thread-parallelism control. Pure logic: no tensors, no Burn.
//!
//! # What the papers say, in short
//!
//! **FlexGen** (Sheng et al., ICML '23) runs a model larger than the GPU by streaming weights,
//! KV cache and activations between GPU, CPU and disk. It traverses the (token × layer) grid in a
//! *zig-zag block schedule*: a block of `num_gpu_batches` GPU batches of `gbs` sequences goes
//! through one layer before the next, so each layer's weights are loaded once per block
//! (`bls = gbs · num_gpu_batches` sequences) instead of once per batch. Loading the next layer's
//! weights, loading/storing cache and activations of neighbouring batches and computing the
//! current batch overlap (Algorithm 1). A policy fixes `gbs`, `bls` and nine percentages: where
//! weights (`wg, wc, wd`), KV cache (`cg, cc, cd`) and activations (`hg, hc, hd`) live. Decode
//! attention may run on the CPU for the cache held there ("computation delegation"), which moves
//! `b·h1` activations instead of `b·s·h1` cache. An analytical cost model (Appendix A.3) predicts
//! the per-layer prefill and decode latencies as the max of five terms (CPU→GPU, GPU→CPU,
//! disk→CPU, CPU→disk, compute) and the peak memory of each tier; for fixed `(gbs, bls)` the
//! placement is a linear program (Eq. 1) minimising `T / bls`. Group-wise 4-bit quantization
//! (§5) shrinks weights and cache.
//!
//! **LM-Offload** (Wu et al.) adds (i) a quantization-aware model: weights are quantized once
//! and dequantized at every load, the KV cache is quantized when written and dequantized when
//! read, each on the GPU, and with CPU attention the cache is never moved so quantizing it gives
//! neither benefit nor cost (§3.2); and (ii) thread-parallelism control (Algorithm 3) choosing
//! intra-op and inter-op thread counts for CPU attention and the five I/O tasks.
//!
//! # Modules
//!
//! - [`HardwareProfile`] ([`hardware`]): machine constants, JSON load/save.
//! - [`ModelShape`], [`OffloadWorkload`] ([`model`]): per-layer sizes for OPT, LLaMA, GQA.
//! - [`Policy`], [`Placement`] ([`types`]), with the DeepSpeed-like and Accelerate-like baseline
//!   constructors; compression is the kernels crate's [`QuantSpec`] ([`compression`]: FlexGen's
//!   settings, the policy-file shape).
//! - [`estimate`] ([`cost`]): the A.3 cost model + LM-Offload terms → [`CostEstimate`].
//! - [`search()`] ([`mod@search`]): enumeration + LP placement (good_lp / microlp).
//! - [`round_to_whole`] ([`rounding`]): LP percentages → whole layers and tensors, re-checked.
//! - [`choose_threads`] ([`threads`]): LM-Offload Algorithm 3.
//!
//! # Where this deviates from or extends the papers
//!
//! 1. **Shapes beyond OPT.** The paper's `8h1² + 4h1h2` bytes of weights, `4h1` bytes of cache
//!    per token and `2h1` bytes of activation per token are computed from explicit shapes:
//!    GQA (`kv_heads < heads`) shrinks K/V projections, the cache and its transfers; gated MLPs
//!    count `3·h1·h2`; `bytes_per_element` replaces the hard-coded fp16; biases and norms
//!    (`extra_params_per_layer`) add bytes but not FLOPs. Attention FLOPs use the query width.
//! 2. **GPU attention.** Appendix A.3 writes the decode terms for CPU delegation only (the
//!    off-GPU cache is attended on the CPU). With `cpu_attention = false` the off-GPU cache is
//!    loaded to the GPU every step (`(cc+cd)·s̄·K·bls` added to CPU→GPU), new entries are written
//!    back (`(cc+cd)·K·bls` added to GPU→CPU), all attention FLOPs go to `bmm_flops`, and the GPU
//!    working set holds the current batch's loaded cache twice (double buffering).
//! 3. **Delegation traffic.** With CPU attention the `b·h1`-sized activation movement that §4.2
//!    describes but A.3 omits is counted: q, k, v of the new token to the CPU, the attention
//!    output back, scaled by `cc + cd`.
//! 4. **Rooflines.** Optional `cpu_attention_bandwidth` (bytes of cache per second): CPU
//!    attention time is the larger of the FLOP- and byte-based estimates. Optional
//!    `gpu_memory_bandwidth`: GPU matmuls take at least the time to read the layer's weights once
//!    per GPU batch and GPU decode attention at least the time to read the cache. FlexGen instead
//!    fits separate prefill/decode FLOP rates; with both unset the terms are the paper's.
//! 5. **Working memory typos/omissions fixed.** Prefill attention always runs on the GPU, so its
//!    working set is not scaled by `cg` (A.3 multiplies `att1^p`, `att2^p` by `cg`); the decode
//!    GPU working set holds one token of activation per sequence, not `s` (A.3 writes
//!    `(1−hg)·2s·h1·gbs` for decode too); the CPU score buffer `2nh(s+n)gbs` is counted only with
//!    CPU attention.
//! 6. **Quantization (LM-Offload).** Storage is `bits/8 + 8/group` bytes per value (f32 scale and
//!    min per group; FlexGen stores fp16 ones). Compressed tensors are compressed on every tier
//!    (FlexGen §5), so GPU-resident weights are dequantized too: weight dequantization is charged
//!    for the whole layer once per layer per block (LM-Offload Eq. 16 scales it by `wc`, which
//!    cannot hold when GPU-resident weights are stored compressed), and the GPU working set
//!    holds one dequantized layer. LM-Offload's `minmax + norm + postprocess` terms (Eq. 13–15,
//!    21–23), all proportional to the element count, are collapsed into measured (de)quantization
//!    throughputs. The one-time CPU weight quantization (Eq. 3) is reported as `init_time` and
//!    kept out of throughput, which FlexGen defines over an unbounded stream of blocks. Cache
//!    compression with CPU attention is ignored ([`PolicyShape::effective_cache_compression`]).
//! 7. **No overlap.** With `overlap = false` a layer's time is the sum of its terms instead of
//!    their max (used for the Accelerate-like baseline).
//! 8. **Activations on disk** are off by default ([`SearchSpace::allow_disk_activations`]): every
//!    policy FlexGen reports keeps `hg + hc = 100%`.
//! 9. **LP tie-break.** A 10⁻⁶-weighted sum of all terms is added to the objective so that among
//!    equally fast placements the LP picks the one moving the fewest bytes.
//! 10. **Whole layers.** The runtime places whole layers, whereas FlexGen splits tensors inside
//!     each layer; [`round_to_whole`] rounds and re-costs accordingly.
//! 11. **Embeddings** are outside the model, as in FlexGen (footnote 1); reserve their bytes with
//!     [`SearchSpace::reserved_bytes`] ([`ModelShape::embedding_bytes`]).
//! 12. **Infeasibility** is explained: the error names the tier and the least memory it needs for
//!     the smallest shapes of the space (found by small LPs minimising that tier's peak).

pub mod compression;
pub mod cost;
pub mod error;
pub mod hardware;
pub mod model;
pub mod rounding;
pub mod search;
pub mod threads;
pub mod types;

#[cfg(test)]
mod tests;

pub use burn_llm_kernels::QuantSpec;
pub use compression::{FLEXGEN_CACHE, FLEXGEN_WEIGHTS};
pub use cost::{
    CostEstimate, MemoryConstraint, PeakMemory, Term, TermBreakdown, TierBytes, estimate, largest_fitting_batch,
};
pub use error::{PolicyError, ProfileError};
pub use hardware::HardwareProfile;
pub use model::{MlpKind, ModelShape, OffloadWorkload};
pub use rounding::{RoundedPolicy, round_to_whole};
pub use search::{Binding, SearchResult, SearchSpace, search, search_whole, solve_placement};
pub use threads::{
    ComputeOp, ComputeSample, IoSample, IoTaskProfile, ThreadPlan, ThreadProfile, choose_threads, max_concurrency,
};
pub use types::{Placement, Policy, PolicyShape, Tier};
