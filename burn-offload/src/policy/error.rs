//! Errors of the policy search.

use std::path::PathBuf;

use super::types::Tier;
use crate::store::fmt_bytes;

/// A hardware profile file could not be read, parsed or accepted.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read or written.
    #[error("hardware profile {path}: {source}")]
    Io {
        /// File that was read or written.
        path: PathBuf,
        /// Underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a JSON hardware profile (syntax error, missing or unknown field).
    #[error("hardware profile {path} is not valid JSON for a HardwareProfile: {source}")]
    Parse {
        /// File that was parsed (`<string>` when parsed from memory).
        path: PathBuf,
        /// Underlying JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A field holds a value the cost model cannot use.
    #[error("hardware profile field `{field}` = {value}: {reason}")]
    Invalid {
        /// Name of the field.
        field: &'static str,
        /// The rejected value.
        value: f64,
        /// Why it was rejected.
        reason: &'static str,
    },
}

/// Everything the cost model, the placement search and the thread selection can refuse.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The hardware profile is unusable.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The model shape is inconsistent (zero sizes, heads not divisible, ...).
    #[error("invalid model shape: {0}")]
    InvalidModel(String),
    /// The workload is inconsistent (zero lengths, ...).
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
    /// A policy is inconsistent (percentages outside [0, 1] or not summing to 1, zero batch, ...).
    #[error("invalid policy: {0}")]
    InvalidPolicy(String),
    /// The search space is empty or holds an invalid choice.
    #[error("invalid search space: {0}")]
    InvalidSearchSpace(String),
    /// A thread-selection profile is inconsistent.
    #[error("invalid thread profile: {0}")]
    InvalidThreadProfile(String),
    /// No policy in the search space fits in memory; `tier` is the memory that is too small.
    #[error(
        "no policy fits: {what} needs {needed} of {tier} memory, have {available}",
        needed = fmt_bytes(*needed_bytes as u64),
        available = fmt_bytes(*available_bytes as u64)
    )]
    InsufficientMemory {
        /// The memory tier that is too small.
        tier: Tier,
        /// Bytes that tier needs at the least (for the smallest configuration of the space).
        needed_bytes: f64,
        /// Bytes that tier has (capacity minus reservation).
        available_bytes: f64,
        /// What needs the memory, in words.
        what: String,
    },
    /// The LP solver failed for a reason other than infeasibility.
    #[error("LP solver failed: {0}")]
    Solver(String),
}

/// Bytes in a GiB, for messages.
pub(crate) const GIB: f64 = (1u64 << 30) as f64;
