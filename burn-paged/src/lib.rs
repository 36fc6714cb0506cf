//! # burn-paged
//!
//! vLLM (Kwon et al., SOSP '23; thesis ch. 5) on Burn: the KV cache lives in fixed-size blocks
//! mapped through per-sequence block tables, so memory is committed a block at a time, blocks are
//! shared between sequences (parallel samples, beam candidates, common prefixes) with reference
//! counts and copy-on-write, and an iteration-level scheduler batches requests continuously,
//! preempting by swap or recomputation when blocks run out.
//!
//! - [`memory`]: block pools, block tables and the block manager (bookkeeping only).

#![warn(missing_docs)]

pub mod memory;
