//! ExeGPT's phased (RRA) admission rule, shared by the engine that runs it (`burn-paged`'s
//! `SchedulingPolicy::Phased`) and the planner that predicts it (the schedule planner's replay,
//! [`crate::schedule`]), so that the two cannot drift apart.
//!
//! RRA (ExeGPT §4.1) alternates a prefill step of up to `B_E` queries with `N_D` decode
//! iterations. ExeGPT §5.2's decoder-batch monitor brings the next prefill forward: once `B_E` of
//! the `⌈B_D⌉` seats are free, the completions the cycle waits `N_D` iterations for have come, and
//! the batch is refilled at once; an empty batch is refilled at once too.

/// The phased schedule's parameters: encode batch `B_E`, decode iterations `N_D` between
/// prefills, and the seats (sequences the decode batch holds at most, `⌈B_D⌉`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhasedAdmission {
    /// `B_E`: queries one prefill step admits at most.
    pub encode_batch: usize,
    /// `N_D`: decode steps after which a prefill is due whatever the batch.
    pub decode_iterations: usize,
    /// Sequences the running batch holds at most.
    pub seats: usize,
}

impl PhasedAdmission {
    /// Whether a prefill step is due with `seats_used` seats taken (`batch_empty` when nothing
    /// runs) and `decodes_since_prefill` decode steps since the last prefill: the batch is empty,
    /// `N_D` decode steps have passed, or `B_E` seats (all of them, when there are fewer) are free.
    /// Whether the prefill admits anything is the caller's to decide (queue, memory, free seats).
    pub fn prefill_due(&self, batch_empty: bool, seats_used: usize, decodes_since_prefill: usize) -> bool {
        batch_empty
            || decodes_since_prefill >= self.decode_iterations
            || self.seats.saturating_sub(seats_used) >= self.encode_batch.min(self.seats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_is_due_when_empty_after_n_d_decodes_or_with_b_e_seats_free() {
        let rule = PhasedAdmission { encode_batch: 2, decode_iterations: 3, seats: 4 };
        // Empty batch: at once.
        assert!(rule.prefill_due(true, 0, 0));
        // Full batch: only once N_D decode steps have passed.
        assert!(!rule.prefill_due(false, 4, 2));
        assert!(rule.prefill_due(false, 4, 3));
        // One seat free is not B_E; two are.
        assert!(!rule.prefill_due(false, 3, 0));
        assert!(rule.prefill_due(false, 2, 0));
        // B_E above the seat count: every seat free is enough.
        let wide = PhasedAdmission { encode_batch: 8, decode_iterations: 100, seats: 2 };
        assert!(!wide.prefill_due(false, 1, 0));
        assert!(wide.prefill_due(false, 0, 0));
    }
}
