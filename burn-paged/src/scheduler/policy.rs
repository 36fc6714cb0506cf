//! Which steps prefill and which decode: vLLM's FCFS (every step advances the running groups and
//! admits new ones) or ExeGPT's RRA schedule (ExeGPT §4.1: a prefill phase, then a fixed number of
//! decode iterations without new prefills, repeated).

/// How the scheduler interleaves prompt (prefill) and decode work across steps. Admission,
/// the block budget and preemption are the same under every policy.
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
    /// A prefill step that admits nothing (no request waiting, or no room yet) decodes instead,
    /// and the next step tries the prefill again; when nothing is running a prefill is due at
    /// once.
    Phased {
        /// Requests admitted (prompts computed) per prefill step at most, `B_E`.
        encode_batch: usize,
        /// Sequences running at once at most, `B_D` (also capped by `max_num_seqs`).
        decode_batch: usize,
        /// Decode steps between two prefill steps, `N_D`.
        decode_iterations: usize,
    },
}

impl SchedulingPolicy {
    /// Checks the policy can run: every count of a phased schedule is at least 1.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Self::Fcfs => Ok(()),
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
}

impl Admission {
    /// FCFS admission: only the seat limit.
    pub fn fcfs(seats: usize) -> Self {
        Self { seats, groups: usize::MAX, reserved_blocks: 0 }
    }
}
