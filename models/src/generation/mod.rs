//! Generation: sampling parameters, the on-device sampler, per-request bookkeeping (stops,
//! streaming text) and the plain static-batch engine built on the contiguous KV cache.

pub mod beam;
mod engine;
mod events;
mod request;
pub mod sampling;

pub use beam::{BeamSearchParams, EarlyStopping};
pub use engine::Generator;
pub use events::{SequenceDelta, StepOutput, StreamEvent};
pub use request::{prepare_prompt, record_sampled, FinishReason, GenerationOutput, Prompt, RequestOutput, RequestState, Timing};
pub use sampling::{filtered_distribution, sample, Sampled, SamplingParams, TokenLogprob};
