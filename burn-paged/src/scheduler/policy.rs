//! Which steps prefill and which decode, and how much KV memory admission reserves: vLLM's FCFS
//! (every step advances the running groups and admits new ones), ExeGPT's RRA schedule (ExeGPT
//! §4.1: a prefill phase, then a fixed number of decode iterations without new prefills,
//! repeated), and the two baselines vLLM is measured against (thesis §5.6.1): Orca's
//! iteration-level scheduling with contiguous per-request reservations, and request-level static
//! batching (FasterTransformer).

/// How much KV memory an Orca-style system reserves per sequence when it admits a request, as a
/// contiguous chunk it keeps until the request finishes (thesis §5.6.1, "Baseline 2: Orca").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvReservation {
    /// Orca (Max): the model's maximum sequence length, whatever the request.
    Max,
    /// Orca (Pow2): the prompt plus the output budget rounded up to a power of two (at most 2×
    /// over-reservation of the output).
    Pow2,
    /// Orca (Oracle): the prompt plus exactly the output the request may produce
    /// (`max_new_tokens`; the true output length when EOS is ignored, as in the benchmarks).
    Oracle,
}

impl KvReservation {
    /// KV tokens reserved for one sequence with `prompt_len` prompt tokens that may generate
    /// `max_new_tokens`, in a model of `max_model_len` positions.
    pub fn tokens(self, prompt_len: usize, max_new_tokens: usize, max_model_len: usize) -> usize {
        let output = max_new_tokens.min(max_model_len.saturating_sub(prompt_len));
        match self {
            Self::Max => max_model_len,
            Self::Pow2 => (prompt_len + output.max(1).next_power_of_two()).min(max_model_len),
            Self::Oracle => prompt_len + output,
        }
    }
}

/// How the scheduler interleaves prompt (prefill) and decode work across steps, and how it
/// admits requests. The block budget and preemption are the same under every policy (the
/// reserving ones never need to preempt).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SchedulingPolicy {
    /// vLLM's policy: every step advances all running groups, brings swapped groups back and
    /// admits waiting ones, so prompts and decodes share a step.
    #[default]
    Fcfs,
    /// ExeGPT's RRA schedule on one device (ExeGPT §4.1, "RRA Scheduling"): a prefill step admits
    /// up to `encode_batch` waiting requests (`B_E`) and computes only their prompts; then
    /// `decode_iterations` steps (`N_D`) compute only decode tokens of the running sequences,
    /// admitting nothing; then the next prefill. At most `decode_batch` sequences (`B_D`) run at
    /// once. Fewer decode iterations mean more frequent, smaller-gapped prefills: a larger
    /// decode batch and more throughput, at the cost of the running sequences' latency (§4.2,
    /// "encoding frequency").
    ///
    /// The cycle is adjusted at run time to the decoder's batch (§5.2, "Dynamic Scheduling for
    /// Consistent Workload"): RRA sizes `B_E` as the queries that complete in `N_D` iterations,
    /// so when `B_E` seats are free before the `N_D` iterations are over, those completions have
    /// come early and the prefill is due at once, instead of decoding a batch `B_E` short until
    /// the phase ends. A prefill step that admits nothing (no request waiting, or no room yet)
    /// decodes instead, and the next step tries the prefill again; when nothing is running a
    /// prefill is due at once.
    Phased {
        /// Requests admitted (prompts computed) per prefill step at most, `B_E`.
        encode_batch: usize,
        /// Sequences running at once at most, `B_D` (also capped by `max_num_seqs`).
        decode_batch: usize,
        /// Decode steps between two prefill steps, `N_D`.
        decode_iterations: usize,
    },
    /// Orca's iteration-level scheduling (thesis §5.6.1): like FCFS, a finished request's seat is
    /// refilled at the next step, but each admitted request first reserves contiguous KV memory for
    /// every sequence it may run, as [`KvReservation`] says, and holds it until it finishes. A
    /// request is admitted only while the reservations fit the KV pool, so the batch is bounded by
    /// the reservations rather than by the tokens actually stored. The paged pool executes it
    /// (blocks are taken as tokens arrive, always within the reservation), so the policy costs
    /// exactly the memory Orca would tie up, without its buddy allocator's external fragmentation
    /// (an advantage to Orca). Prefix caching still shares blocks; disable it to model Orca fully.
    Orca(KvReservation),
    /// Request-level static batching (FasterTransformer; the thesis's Baseline 1): a batch is
    /// admitted only when the previous one has completely finished, each request reserving the
    /// model's maximum length ([`KvReservation::Max`]); finished requests leave their seats empty
    /// until the batch's longest request is done. They are not computed (the paged engine skips
    /// them), so this baseline pays the waiting, not padded compute.
    Static,
}

impl SchedulingPolicy {
    /// The per-sequence reservation admission makes, if any.
    pub fn reservation(&self) -> Option<KvReservation> {
        match *self {
            Self::Orca(r) => Some(r),
            Self::Static => Some(KvReservation::Max),
            Self::Fcfs | Self::Phased { .. } => None,
        }
    }

    /// Its name on the command line (`--schedule`).
    pub fn name(&self) -> &'static str {
        match *self {
            Self::Fcfs => "fcfs",
            Self::Phased { .. } => "exegpt",
            Self::Orca(KvReservation::Max) => "orca-max",
            Self::Orca(KvReservation::Pow2) => "orca-pow2",
            Self::Orca(KvReservation::Oracle) => "orca-oracle",
            Self::Static => "static",
        }
    }

    /// Checks the policy can run: every count of a phased schedule is at least 1.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Self::Fcfs | Self::Orca(_) | Self::Static => Ok(()),
            Self::Phased { encode_batch, decode_batch, decode_iterations } => {
                for (name, value) in [
                    ("encode_batch", encode_batch),
                    ("decode_batch", decode_batch),
                    ("decode_iterations", decode_iterations),
                ] {
                    if value == 0 {
                        return Err(format!("a phased (ExeGPT RRA) schedule needs {name} ≥ 1, got 0"));
                    }
                }
                Ok(())
            }
        }
    }
}

/// Limits of one admission pass over the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Admission {
    /// Seats (sequences) the running groups may hold after admission.
    pub seats: usize,
    /// Groups admitted at most.
    pub groups: usize,
    /// Free device blocks left untouched (the running groups' next appends).
    pub reserved_blocks: usize,
    /// Orca-style contiguous reservations: admitted groups' reservations must fit the pool.
    pub reservation: Option<KvReservation>,
}

impl Admission {
    /// FCFS admission: only the seat limit.
    pub fn fcfs(seats: usize) -> Self {
        Self { seats, groups: usize::MAX, reserved_blocks: 0, reservation: None }
    }
}
