//! # burn-offload
//!
//! FlexGen (Sheng et al., ICML '23) on Burn, with LM-Offload's quantization-aware cost model and
//! thread control: run models larger than the device's memory by placing weights and KV cache
//! across the device, host memory and disk, traversing layers in a zig-zag block schedule that
//! loads each layer once per block of GPU batches, prefetching the next layer while the current
//! one computes, and attending on the CPU where the cache lives there.
//!
//! - [`policy`]: hardware profile, model shape, FlexGen's cost model (Appendix A.3), the LP
//!   placement search (`good_lp`, pure-Rust `microlp`), rounding to whole layers, thread control.
//! - [`cache`]: the offloaded KV cache the models attend through: each layer's slots on the
//!   device, the host or disk, attention where they live, Top-K sparse attention.
//! - [`store`]: the disk tier (one checksummed, memory-mapped file per tensor) and the per-tier
//!   memory ledger that enforces the budgets.
//! - [`weights`]: layers stored on the disk tier.
//! - [`OffloadEngine`]: places a model per policy and generates with the block schedule.
//! - [`profiler`]: measures the cost model's constants.

#![warn(missing_docs)]

pub mod cache;
mod engine;
pub mod error;
pub mod policy;
pub mod profiler;
pub mod store;
pub mod weights;

pub use engine::{MemoryReport, OffloadConfig, OffloadEngine, OffloadReport, PolicyChoice, model_shape};
pub use error::{OffloadError, Result};
