//! What [`LlmEngine::step`](crate::LlmEngine::step) reports: the step-level output types shared by
//! every engine, defined in the models crate.

pub use burn_llm_models::generation::{SequenceDelta, StepOutput};
