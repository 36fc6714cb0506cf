//! Errors of the paged engine.

use burn_llm_models::ModelError;

use crate::memory::BlockError;

/// What went wrong in the paged engine.
#[derive(Debug, thiserror::Error)]
pub enum PagedError {
    /// Loading, tokenizing or running the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A block-manager operation was refused.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// A paged kernel refused its arguments.
    #[error("paged kernel: {0}")]
    Kernel(#[from] burn_llm_kernels::paged::PagedKernelError),
    /// Beam-search parameters or inputs are invalid.
    #[error(transparent)]
    Beam(#[from] crate::beam::BeamError),
    /// The engine configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The KV-cache budget cannot hold what the model needs.
    #[error("the KV cache budget of {budget} holds {blocks} blocks of {block_size} tokens ({block} each), but one sequence of the model's context length {max_model_len} needs {needed} blocks: raise --kv-cache-memory, lower the block size, or lower the context length",
        budget = burn_llm_models::units::fmt_bytes(*budget_bytes),
        block = burn_llm_models::units::fmt_bytes(*block_bytes as u64))]
    KvBudget {
        /// Budget given.
        budget_bytes: u64,
        /// Blocks it holds.
        blocks: usize,
        /// Tokens per block.
        block_size: usize,
        /// Bytes per block over all layers.
        block_bytes: usize,
        /// Context length of the model.
        max_model_len: usize,
        /// Blocks one full-length sequence needs.
        needed: usize,
    },
    /// A request id is already in use.
    #[error("a request with id `{0}` is already running")]
    DuplicateRequest(String),
    /// A prompt is longer than a single step may compute, and prompts are not chunked (chunked
    /// prefill off, or a schedule whose prefills are whole prompts).
    #[error(
        "prompt {request} has {len} tokens but a step computes at most {max} (max_num_batched_tokens) and \
         prompts are computed whole: raise --max-num-batched-tokens, or drop --no-chunked-prefill (FCFS and \
         Orca schedules compute long prompts in chunks)"
    )]
    PromptTooLong {
        /// Request id.
        request: String,
        /// Prompt tokens.
        len: usize,
        /// The step limit.
        max: usize,
    },
    /// A prompt's KV blocks outnumber the engine's whole device pool, so it could never be
    /// scheduled (a byte budget holds the full context, so only an explicit block count, or a
    /// pool divided between virtual engines, can be this small).
    #[error(
        "prompt {request} has {len} tokens, whose KV cache takes {needed} blocks of {block_size} tokens, but the \
         engine's device pool holds {blocks} blocks: raise --kv-cache-memory (virtual engines each get an even \
         share of it), or send a shorter prompt"
    )]
    PromptExceedsKvPool {
        /// Request id.
        request: String,
        /// Prompt tokens.
        len: usize,
        /// Blocks the prompt takes.
        needed: usize,
        /// Tokens per block.
        block_size: usize,
        /// Blocks in the device pool.
        blocks: usize,
    },
    /// A request's sequences (`n`, `best_of`, beams) outnumber the tokens one step computes: a
    /// preempted group recomputes all its sequences' last prompt tokens in one step, which could
    /// then never be scheduled.
    #[error(
        "request {request} runs {width} sequences (n, best_of or beam width) but a step computes at most {max} \
         tokens (max_num_batched_tokens): raise --max-num-batched-tokens to at least {width}, or ask for fewer sequences"
    )]
    TooWideForStep {
        /// Request id.
        request: String,
        /// Sequences the request runs at once.
        width: usize,
        /// The step limit.
        max: usize,
    },
    /// Reading a tensor back from the device failed.
    #[error("device error: {0}")]
    Device(String),
    /// The engine's own bookkeeping disagrees with itself: a bug in burn-paged, not a problem
    /// with the request or the machine.
    #[error("internal error in the paged engine (please report this as a bug): {0}")]
    Internal(String),
}

/// Result of the paged engine.
pub type Result<T> = std::result::Result<T, PagedError>;
