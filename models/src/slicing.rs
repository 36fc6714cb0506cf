//! Token slicing of a prefill through pipeline stages (TeraPipe, thesis ch. 2): a prompt's new
//! tokens are cut into slices that enter the stages one after another, so that stage `s + 1`
//! works on slice `i` while stage `s` works on slice `i + 1`. Slice `i` attends over the slices
//! before it, which the same stage has already cached, so the result equals one unsliced pass.
//!
//! Engines hold an optional [`PrefillSlicing`] and issue a sliced prefill's slices as micro-batches
//! through [`LanguageModel::forward_micro_batches`](crate::LanguageModel::forward_micro_batches).
//! [`UniformSlices`] is `--prefill-slices uniform:N`; the planner-driven slicing (`auto`) lives in
//! `burn-parallel`, which measures the stages' costs.

use std::fmt::Debug;

/// How a pipelined prefill of `len` new tokens, after `context` tokens already cached, is cut
/// into slices.
pub trait PrefillSlicing: Send + Sync + Debug {
    /// Slice lengths in order: each ≥ 1, summing to `len` (`[len]` means unsliced; empty when
    /// `len` is 0).
    fn slices(&self, len: usize, context: usize) -> Vec<usize>;
}

/// `N` slices of near-equal length (the first `len % N` one token longer); fewer when the
/// prefill has fewer than `N` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniformSlices {
    count: usize,
}

impl UniformSlices {
    /// `count` slices per prefill; `None` when `count` is 0.
    pub fn new(count: usize) -> Option<Self> {
        (count > 0).then_some(Self { count })
    }

    /// Slices per prefill.
    pub fn count(&self) -> usize {
        self.count
    }
}

impl PrefillSlicing for UniformSlices {
    fn slices(&self, len: usize, _context: usize) -> Vec<usize> {
        let n = self.count.min(len);
        if n == 0 {
            return Vec::new();
        }
        (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_slices_cover_the_prefill_in_order() {
        let s = UniformSlices::new(4).unwrap();
        assert_eq!(s.slices(10, 0), vec![3, 3, 2, 2]);
        assert_eq!(s.slices(3, 7), vec![1, 1, 1]);
        assert!(s.slices(0, 0).is_empty());
        assert!(UniformSlices::new(0).is_none());
    }
}
