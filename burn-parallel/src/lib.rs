//! Planners that decide how a model is split and scheduled, from measured costs.
pub mod plan;
