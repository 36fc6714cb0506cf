//! A (partial) placement as Algorithm 3 grows it, and how two of them compare.

use crate::sim::Group;

/// A (partial) placement: group shapes, replicas, and how it simulates.
#[derive(Debug, Clone)]
pub(super) struct Selection {
    pub(super) shapes: Vec<(usize, usize)>,
    /// Models on each group, in the order they were added.
    pub(super) replicas: Vec<Vec<usize>>,
    /// Bytes used on each device of each stage of each group.
    pub(super) used: Vec<Vec<u64>>,
    pub(super) attainment: f64,
    /// The selection as the simulator sees it.
    pub(super) groups: Vec<Group>,
}

impl Selection {
    pub(super) fn is_empty(&self) -> bool {
        self.replicas.iter().all(Vec::is_empty)
    }

    /// Whether every one of `models` has a replica.
    fn serves_all(&self, models: usize) -> bool {
        (0..models).all(|m| self.replicas.iter().any(|r| r.contains(&m)))
    }

    /// More attainment, or the first placement that serves anything at all; with `every` (the
    /// number of models) a placement that serves them all beats one that does not, first.
    pub(super) fn better_than(&self, other: &Selection, every: Option<usize>) -> bool {
        if let Some(models) = every {
            let (mine, theirs) = (self.serves_all(models), other.serves_all(models));
            if mine != theirs {
                return mine;
            }
        }
        !self.is_empty() && (other.is_empty() || self.attainment > other.attainment)
    }
}

/// Whether two selections hold the same replicas (in any order of addition).
pub(super) fn same_replicas(a: &Selection, b: &Selection) -> bool {
    a.replicas.iter().zip(&b.replicas).all(|(x, y)| {
        let (mut x, mut y) = (x.clone(), y.clone());
        x.sort_unstable();
        y.sort_unstable();
        x == y
    })
}
