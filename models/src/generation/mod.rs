//! Generation: sampling and beam search parameters, the on-device sampler, per-request
//! bookkeeping (stops, streaming text) and the plain static-batch engine built on the contiguous
//! KV cache.

mod batch;
pub mod beam;
pub mod constraint;
mod engine;
mod events;
pub mod penalties;
pub mod processors;
mod request;
pub mod sampling;

pub use batch::{
    FedIds, GenerationClock, GroupTokens, StaticBatch, prepare_requests, prompt_tokens, static_kv_capacity,
};
pub use beam::{BeamSearchParams, EarlyStopping};
pub use constraint::{Constraint, ConstraintCompiler, ConstraintState, SimpleVob};
pub use engine::Generator;
pub use events::{SequenceDelta, StepOutput, StreamEvent};
pub use penalties::{TokenCounts, apply_penalties};
pub use request::{
    FinishReason, GenerationOutput, Prompt, RequestOutput, RequestState, Timing, histories, prepare_prompt,
    record_sampled,
};
pub use sampling::{
    PromptLogprobs, Sampled, SamplingParams, TokenLogprob, chosen_logprobs, filtered_distribution, sample,
    sample_on_device, token_logprobs,
};
