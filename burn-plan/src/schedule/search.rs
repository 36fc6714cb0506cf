//! ExeGPT's branch-and-bound (§5.1, Algorithm 1) and the exhaustive search over the same space.
//!
//! A space is a box of integer coordinates oriented so that a larger coordinate means more
//! throughput and more latency (RRA: encode batch `B_E` up, `N_D` down; WAA: `B_E` up). A block
//! is bounded by the most throughput any of its points can reach and the least latency (with
//! memory) any can have, both read from the simulator by monotonicity; blocks that cannot hold a
//! better feasible point are pruned, the rest are split. The paper's split heuristic is kept:
//! when the top-left corner is feasible and beats the bottom-right one, split along the first
//! coordinate, otherwise along the second; when neither is feasible, along the longer side.
//! Because the bounds are valid for every point of a block, the result equals the exhaustive
//! search's optimum; of points with equal throughput both keep the one of least latency
//! ([`Perf::better_than`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::xsim::{Perf, Pipe, XSim};

/// One space of the search: the strategy's fixed variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    /// RRA on `pipe`, `N_D ∈ 1..=nd_max`.
    Rra { pipe: Pipe, nd_max: usize },
    /// WAA with `encoders` encoding devices, `micro` decoder micro-batches, decoders as `pipe`.
    Waa { encoders: usize, micro: usize, pipe: Pipe },
}

/// A point of a space in its control variables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub encode_batch: usize,
    pub decode_iterations: Option<usize>,
}

/// The simulator, remembering what it has simulated (each distinct simulation counts once).
pub(crate) struct Searcher<'a> {
    sim: &'a XSim,
    max_batch: usize,
    bound_s: f64,
    evaluated: RefCell<HashMap<(Space, Vec<usize>), Perf>>,
    upper: RefCell<HashMap<(Space, [usize; 4]), f64>>,
    /// Simulations of the exhaustive search, which visits each point once and keeps none.
    uncached: Cell<usize>,
}

impl<'a> Searcher<'a> {
    /// A searcher over encode batches `1..=max_batch` for the latency bound `bound_s`.
    pub fn new(sim: &'a XSim, max_batch: usize, bound_s: f64) -> Self {
        Self {
            sim,
            max_batch,
            bound_s,
            evaluated: RefCell::default(),
            upper: RefCell::default(),
            uncached: Cell::new(0),
        }
    }

    /// Distinct simulations run so far.
    pub fn simulations(&self) -> usize {
        self.evaluated.borrow().len() + self.upper.borrow().len() + self.uncached.get()
    }
}

impl Searcher<'_> {
    fn dims(&self, space: &Space) -> Vec<usize> {
        match space {
            Space::Rra { nd_max, .. } => vec![self.max_batch, *nd_max],
            Space::Waa { .. } => vec![self.max_batch],
        }
    }

    /// The control variables at coordinates `c`.
    pub fn point(&self, space: &Space, c: &[usize]) -> Point {
        match space {
            Space::Rra { nd_max, .. } => Point { encode_batch: c[0] + 1, decode_iterations: Some(nd_max - c[1]) },
            Space::Waa { .. } => Point { encode_batch: c[0] + 1, decode_iterations: None },
        }
    }

    /// Simulates the point at coordinates `c`.
    pub fn evaluate(&self, space: &Space, c: &[usize]) -> Perf {
        let key = (*space, c.to_vec());
        if let Some(perf) = self.evaluated.borrow().get(&key) {
            return *perf;
        }
        let perf = self.simulate(space, c);
        self.evaluated.borrow_mut().insert(key, perf);
        perf
    }

    /// Runs the simulator at coordinates `c`.
    fn simulate(&self, space: &Space, c: &[usize]) -> Perf {
        let p = self.point(space, c);
        match space {
            Space::Rra { pipe, .. } => {
                let n_d = p.decode_iterations.unwrap_or(1);
                let mut perf = self.sim.rra(p.encode_batch as f64, n_d, pipe);
                // The engine's throughput, replayed where the search reads it (a point that
                // cannot be chosen keeps the closed form).
                if self.feasible(&perf) {
                    perf.throughput_qps = self.sim.rra_replayed(p.encode_batch, n_d, pipe);
                }
                perf
            }
            Space::Waa { encoders, micro, pipe } => self.sim.waa(p.encode_batch as f64, *micro, *encoders, pipe),
        }
    }

    fn feasible(&self, perf: &Perf) -> bool {
        perf.fits && perf.latency_s <= self.bound_s
    }

    /// The least latency any point of a block whose lowest corner is `lo` can have (infinite
    /// when none fits). Extra coordinates of `lo` beyond the space's are ignored.
    pub fn least_latency(&self, space: &Space, lo: &[usize]) -> f64 {
        let p = self.evaluate(space, lo);
        if p.fits { p.latency_s } else { f64::INFINITY }
    }

    /// The most throughput any point of the block `lo..=hi` can have.
    fn most_throughput(&self, space: &Space, lo: &[usize], hi: &[usize]) -> f64 {
        let (b_lo, b_hi) = ((lo[0] + 1) as f64, (hi[0] + 1) as f64);
        let key = match space {
            Space::Rra { .. } => [lo[0], hi[0], lo[1], hi[1]],
            Space::Waa { .. } => [lo[0], hi[0], 0, 0],
        };
        *self.upper.borrow_mut().entry((*space, key)).or_insert_with(|| match space {
            Space::Rra { pipe, nd_max } => self.sim.rra_upper(hi[0] + 1, nd_max - hi[1], pipe),
            Space::Waa { encoders, micro, pipe } => self.sim.waa_upper(b_lo, b_hi, *micro, *encoders, pipe),
        })
    }

    /// Exhaustive search: the feasible point of most throughput (first in coordinate order on ties).
    pub fn exhaustive(&self, space: &Space) -> Option<(Vec<usize>, Perf)> {
        let dims = self.dims(space);
        let mut best: Option<(Vec<usize>, Perf)> = None;
        let mut c = vec![0usize; dims.len()];
        loop {
            self.uncached.set(self.uncached.get() + 1);
            let perf = self.simulate(space, &c);
            if self.feasible(&perf) && best.as_ref().is_none_or(|b| perf.better_than(&b.1)) {
                best = Some((c.clone(), perf));
            }
            // Next coordinate, last dimension fastest.
            let mut d = dims.len();
            loop {
                if d == 0 {
                    return best;
                }
                d -= 1;
                c[d] += 1;
                if c[d] < dims[d] {
                    break;
                }
                c[d] = 0;
            }
        }
    }

    /// Branch-and-bound (Algorithm 1).
    pub fn branch_and_bound(&self, space: &Space) -> Option<(Vec<usize>, Perf)> {
        let dims = self.dims(space);
        let root_lo = vec![0; dims.len()];
        let root_hi: Vec<usize> = dims.iter().map(|d| d - 1).collect();
        let mut best: Option<(Vec<usize>, Perf)> = None;
        let consider = |c: &[usize], perf: Perf, best: &mut Option<(Vec<usize>, Perf)>| {
            if self.feasible(&perf) && best.as_ref().is_none_or(|b| perf.better_than(&b.1)) {
                *best = Some((c.to_vec(), perf));
            }
        };
        // A block whose throughput cannot beat the best, nor equal it at less latency.
        let beaten = |lo: &[usize], upper: f64, best: &Option<(Vec<usize>, Perf)>| {
            best.as_ref().is_some_and(|b| {
                upper < b.1.throughput_qps
                    || (upper == b.1.throughput_qps && self.least_latency(space, lo) >= b.1.latency_s)
            })
        };
        let mut queue: Vec<(Vec<usize>, Vec<usize>, f64)> = Vec::new();
        if self.least_latency(space, &root_lo) <= self.bound_s {
            let upper = self.most_throughput(space, &root_lo, &root_hi);
            queue.push((root_lo, root_hi, upper));
        }
        while let Some(i) = (0..queue.len()).max_by(|&a, &b| queue[a].2.total_cmp(&queue[b].2)) {
            let (lo, hi, upper) = queue.swap_remove(i);
            if beaten(&lo, upper, &best) {
                continue;
            }
            let top = self.evaluate(space, &hi);
            consider(&hi, top, &mut best);
            if lo == hi || beaten(&lo, upper, &best) {
                continue;
            }
            let axis = if dims.len() == 2 && lo[0] < hi[0] && lo[1] < hi[1] {
                let tl = [lo[0], hi[1]];
                let br = [hi[0], lo[1]];
                let (p_tl, p_br) = (self.evaluate(space, &tl), self.evaluate(space, &br));
                consider(&tl, p_tl, &mut best);
                consider(&br, p_br, &mut best);
                match (self.feasible(&p_tl), self.feasible(&p_br)) {
                    (true, false) => 0,
                    (true, true) if p_tl.throughput_qps > p_br.throughput_qps => 0,
                    (false, false) => longest(&lo, &hi),
                    _ => 1,
                }
            } else {
                longest(&lo, &hi)
            };
            let mid = (lo[axis] + hi[axis]) / 2;
            let (mut hi1, mut lo2) = (hi.clone(), lo.clone());
            hi1[axis] = mid;
            lo2[axis] = mid + 1;
            for (l, h) in [(lo.clone(), hi1), (lo2, hi.clone())] {
                if self.least_latency(space, &l) > self.bound_s {
                    continue;
                }
                let upper = self.most_throughput(space, &l, &h);
                if !beaten(&l, upper, &best) {
                    queue.push((l, h, upper));
                }
            }
        }
        best
    }
}

/// The axis along which `lo..=hi` is longest.
fn longest(lo: &[usize], hi: &[usize]) -> usize {
    (0..lo.len()).max_by_key(|&d| hi[d] - lo[d]).unwrap_or(0)
}
