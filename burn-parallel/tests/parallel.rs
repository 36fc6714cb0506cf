//! The runtime against one device: pipeline stages (`pipeline/`) and tensor-parallel layers
//! (`parallel/`) give the single-device tokens and logits; the profiler (`parallel/profiler.rs`)
//! writes profiles the planners take.

#[cfg(feature = "runtime")]
mod pipeline;
#[cfg(feature = "profiler")]
#[path = "parallel/profiler.rs"]
mod profiler;

#[cfg(feature = "flex")]
#[path = "parallel/tensor.rs"]
mod tensor_parallel;
