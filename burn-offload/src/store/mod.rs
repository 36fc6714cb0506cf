//! Storage layer of the offloading runtime: the disk tier and the per-tier memory ledger.
//! Plain Rust, no Burn.
//!
//! FlexGen (§4.1) treats GPU memory, CPU memory and disk as a three-level hierarchy; weights and
//! KV cache that do not fit above are pushed down and streamed back up, part by part, when a
//! layer runs. This module provides the pieces under that machinery:
//!
//! - [`DiskStore`] ([`disk`]): the disk tier. One safetensors file per tensor in a directory
//!   (`--offload-dir`), with a CRC-32 of the payload in its metadata, written atomically (temp
//!   file + rename) and read back through a memory map as `&[f32]` / `&[u32]` after validating
//!   the file against what was written and verifying the checksum.
//! - [`SlotFile`] and [`ScratchDir`] ([`slots`]): scratch files for the KV cache and activations
//!   a run parks on disk, written slot by slot through a writable memory map.
//! - [`MemoryLedger`] ([`ledger`]): bytes resident per [`Tier`] against optional capacities,
//!   with RAII [`Reservation`]s, peak tracking and readable "does not fit" errors. Shared by
//!   loader threads (`Send + Sync`, lock-free atomics).
//!
//! Everything returns [`StoreError`]; file errors name the tensor, the file and the problem.

pub mod disk;
pub mod ledger;
pub mod slots;

#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use disk::{DType, DiskStore, DiskTensor, HostData, MappedTensor, TensorView};
pub use ledger::{MemoryLedger, OverBudget, Reservation, Tier, fmt_bytes};
pub use slots::{ScratchDir, SlotFile};

/// Errors of the storage layer (disk tier and memory ledger).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// `get`/`remove` of a name that was never `put` (or was removed).
    #[error("no tensor named `{name}` in the disk store")]
    UnknownTensor {
        /// The requested tensor name.
        name: String,
    },
    /// The shape does not match the data, or overflows.
    #[error("tensor `{name}`: invalid shape {shape:?}: {reason}")]
    InvalidShape {
        /// The tensor name.
        name: String,
        /// The rejected shape.
        shape: Vec<usize>,
        /// Why it was rejected.
        reason: String,
    },
    /// The tensor's file no longer exists (deleted behind the store's back).
    #[error("tensor `{name}`: file {} is missing (deleted behind the store's back?)", .path.display())]
    Missing {
        /// The tensor name.
        name: String,
        /// The expected file path.
        path: PathBuf,
    },
    /// The file is shorter than what was written (or than the caller needs).
    #[error(
        "tensor `{name}`: file {} is truncated: needs {expected} bytes, has {actual}",
        .path.display()
    )]
    Truncated {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// Bytes required.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The payload checksum does not match the one written with it.
    #[error(
        "tensor `{name}`: file {} is corrupted: payload CRC-32 is {actual:08x}, was written as {expected:08x}",
        .path.display()
    )]
    Corrupted {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// CRC-32 recorded when the tensor was written.
        expected: u32,
        /// CRC-32 of the payload as read.
        actual: u32,
    },
    /// The file is not a valid tensor file (not safetensors, no tensor or checksum, payload out
    /// of place).
    #[error("tensor `{name}`: file {} is not a valid tensor file: {reason}", .path.display())]
    BadHeader {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is not the one `put` wrote under this name (different size, dtype, shape or
    /// checksum).
    #[error("tensor `{name}`: file {} does not hold what was stored: {reason}", .path.display())]
    Mismatch {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// Which recorded property differs.
        reason: String,
    },
    /// An operating-system I/O error.
    #[error("I/O error while {op} {}: {source}", .path.display())]
    Io {
        /// What the store was doing ("writing", "renaming temp file to", "memory-mapping"…).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A [`MemoryLedger::reserve`] that does not fit its tier's capacity.
    #[error("{0}")]
    OverBudget(Box<OverBudget>),
}
