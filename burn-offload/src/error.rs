//! Errors of the offloading engine.

use burn_llm_models::ModelError;

use crate::policy::{PolicyError, ProfileError};
use crate::store::StoreError;

/// What went wrong while offloading.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    /// Loading, tokenizing or running the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// No policy fits, or a given policy is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A hardware profile could not be read or written.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The disk tier or a memory budget refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration is unusable.
    #[error("invalid offloading configuration: {0}")]
    Config(String),
    /// The engine's own bookkeeping disagrees with itself (a task panicked, a layer or cache
    /// that the schedule loaded is not there): a bug in burn-offload, not a problem with the
    /// request, the configuration or the machine.
    #[error("internal error in the offloading engine (please report this as a bug): {0}")]
    Internal(String),
}

/// Result of the offloading engine.
pub type Result<T> = std::result::Result<T, OffloadError>;
