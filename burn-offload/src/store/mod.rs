//! Storage layer of the offloading runtime: the disk tier and the per-tier memory ledger.
//! Plain Rust, no Burn.
//!
//! FlexGen (§4.1) treats GPU memory, CPU memory and disk as a three-level hierarchy; weights and
//! KV cache that do not fit above are pushed down and streamed back up, part by part, when a
//! layer runs. This module provides the two pieces under that machinery:
//!
//! - [`DiskStore`] ([`disk`]): the disk tier. One file per tensor in a directory
//!   (`--offload-dir`), written atomically (temp file + rename), read back through a memory map
//!   as `&[f32]` / `&[u32]` after validating a header and a CRC-32 of the payload.
//! - [`SlotFile`] and [`ScratchDir`] ([`slots`]): scratch files for the KV cache and activations
//!   a run parks on disk, written slot by slot through a writable memory map.
//! - [`MemoryLedger`] ([`ledger`]): bytes resident per [`Tier`] against optional capacities,
//!   with RAII [`Reservation`]s, peak tracking and readable "does not fit" errors. Shared by
//!   loader threads (`Send + Sync`, lock-free atomics).
//!
//! # Tensor file format (version 1)
//!
//! All header integers are little-endian. The header is `32 + 8·rank` bytes, a multiple of 8, so
//! the payload starts 8-byte aligned in the file and therefore in the (page-aligned) memory map.
//!
//! | offset      | size    | field                                                           |
//! |-------------|---------|-----------------------------------------------------------------|
//! | 0           | 8       | magic `b"BOFFTNSR"`                                              |
//! | 8           | 2       | format version (`1`)                                            |
//! | 10          | 1       | dtype: `1` = f32, `2` = u32                                     |
//! | 11          | 1       | payload byte order: `1` = little-endian, `2` = big-endian       |
//! | 12          | 4       | rank `r` (at most [`MAX_RANK`])                                  |
//! | 16          | 8       | payload length in bytes (= 4 · product of dims)                  |
//! | 24          | 8·r     | dims, `u64` each                                                |
//! | 24 + 8r     | 4       | CRC-32 (IEEE, `crc32fast`) of the payload                       |
//! | 28 + 8r     | 4       | CRC-32 of the header bytes `[0, 28 + 8r)`                       |
//! | 32 + 8r     | payload | the values, in the machine's native byte order (see offset 11)  |
//!
//! The file length must be exactly header + payload. Every header byte is covered by the header
//! CRC, every payload byte by the payload CRC, so any single flipped bit is detected (CRC-32
//! detects all burst errors up to 32 bits; random damage slips through with probability 2⁻³²).
//! CRC-32 is an integrity check against disk/bit-rot/truncation, not a defence against a
//! malicious writer — but even a malicious file can only produce an error, never a panic or an
//! out-of-bounds read: every offset is bounds-checked against the mapped length.
//!
//! # Errors
//!
//! Everything returns [`StoreError`]; file errors name the tensor, the file and the problem.

pub mod disk;
pub mod ledger;
pub mod slots;

#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use disk::{
    Cleanup, DType, DiskStore, DiskStoreOptions, DiskTensor, FILE_EXTENSION, FORMAT_VERSION, HostData, HostValues,
    MAGIC, MAX_RANK, MappedTensor, TensorView,
};
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
    /// The tensor name cannot be stored (e.g. it is empty).
    #[error("invalid tensor name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Two different tensor names map to the same file name (astronomically unlikely: the file
    /// name embeds a 64-bit hash of the exact name; checked case-insensitively anyway).
    #[error("tensor names `{name}` and `{other}` map to the same file {}", .path.display())]
    NameCollision {
        /// The name being stored.
        name: String,
        /// The name already stored under that file.
        other: String,
        /// The shared file path.
        path: PathBuf,
    },
    /// The shape does not match the data, has too many dimensions, or overflows.
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
    /// The file is shorter than its header (or the fixed header part) says it must be.
    #[error(
        "tensor `{name}`: file {} is truncated: needs {expected} bytes, has {actual}",
        .path.display()
    )]
    Truncated {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// Bytes required (the fixed header, the full header, or header + payload).
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The payload checksum does not match the header's.
    #[error(
        "tensor `{name}`: file {} is corrupted: payload CRC-32 is {actual:08x}, header says {expected:08x}",
        .path.display()
    )]
    Corrupted {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// CRC-32 recorded in the header.
        expected: u32,
        /// CRC-32 of the payload as read.
        actual: u32,
    },
    /// The header is not a valid version-1 header (bad magic, version, dtype, rank, length,
    /// header checksum, trailing bytes…).
    #[error("tensor `{name}`: file {} has a bad header: {reason}", .path.display())]
    BadHeader {
        /// The tensor name.
        name: String,
        /// The file path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is a valid tensor file but not the one `put` wrote under this name (different
    /// dtype, shape or checksum).
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
        /// What the store was doing ("creating", "writing", "renaming to", "mapping"…).
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
