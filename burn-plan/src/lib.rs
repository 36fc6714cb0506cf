//! The planners, each a pure function from a serde input to a serde output (see the crate docs).
pub mod check;
pub mod cli;
pub mod placement;
pub mod profile;
pub mod schedule;
pub mod serving;
pub mod sim;
pub mod slices;
mod stage_devices;
pub mod stage_groups;
pub mod stages;
