//! LM-Offload's thread-level parallelism control (§4.2, Algorithm 3).
//!
//! During decode, six tasks run concurrently (FlexGen Algorithm 1): the compute task (CPU
//! attention when delegated) and five load/store tasks. Algorithm 3 enumerates the intra-op
//! thread count of the compute task; for each, it takes the inter-op parallelism of the compute
//! task from the maximum concurrency level of its operator dependency graph, gives the remaining
//! threads to the load/store tasks in proportion to their data volume (at least one each), and
//! predicts throughput from offline profiles; the best setting wins.
//!
//! Everything here is data in, decision out: the runtime measures the profiles (operator times per
//! intra-op thread count, I/O task times per thread count) and applies the returned plan.
//!
//! Extensions and choices, all documented on the items:
//! - the maximum concurrency level is computed on the as-soon-as-possible schedule of the graph
//!   with the profiled operator times (Kahn's algorithm gives a topological order; the peak
//!   number of overlapping operators is the concurrency level), and the compute task's time is
//!   that schedule's makespan;
//! - an I/O task's time at a thread count is linearly interpolated between profiled points (and
//!   clamped outside them);
//! - the predicted step time is the max over the six tasks (they overlap), throughput its inverse;
//!   ties keep the smaller intra-op count (Algorithm 3 replaces only on strictly better).

use serde::{Deserialize, Serialize};

use super::error::PolicyError;

/// One operator of the compute task and the operators it waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeOp {
    /// Operator name (for reports).
    pub name: String,
    /// Indices of the operators that must finish first.
    pub deps: Vec<usize>,
}

/// Profiled operator times of the compute task at one intra-op thread count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeSample {
    /// Intra-op threads used by every operator.
    pub intra_op_threads: u32,
    /// Seconds of each operator (same order as the graph).
    pub op_seconds: Vec<f64>,
}

/// One profiled point of an I/O task.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoSample {
    /// Threads used by the task.
    pub threads: u32,
    /// Seconds the task took.
    pub seconds: f64,
}

/// A load or store task (load weight, load cache, load activation, store cache, store
/// activation in LM-Offload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoTaskProfile {
    /// Task name (for reports).
    pub name: String,
    /// Bytes the task moves per step; threads are shared in proportion to it.
    pub bytes: f64,
    /// Profiled time versus thread count (at least one point).
    pub samples: Vec<IoSample>,
}

/// Everything Algorithm 3 needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadProfile {
    /// Hardware threads available (`max_thrs`).
    pub max_threads: u32,
    /// Operator dependency graph of the compute task.
    pub compute_ops: Vec<ComputeOp>,
    /// Operator times at several intra-op thread counts.
    pub compute_samples: Vec<ComputeSample>,
    /// The load/store tasks.
    pub io_tasks: Vec<IoTaskProfile>,
}

/// The chosen parallelism.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadPlan {
    /// Intra-op threads of every compute operator (`torch.set_num_threads` in LM-Offload).
    pub intra_op_compute: u32,
    /// Inter-op parallelism of the compute task (its maximum concurrency level).
    pub inter_op_compute: u32,
    /// Total inter-op parallelism: compute plus one per I/O task (LM-Offload: `+ 5`).
    pub inter_op_total: u32,
    /// Threads of each I/O task, in input order.
    pub io_threads: Vec<u32>,
    /// Predicted compute-task seconds.
    pub compute_seconds: f64,
    /// Predicted seconds of each I/O task.
    pub io_seconds: Vec<f64>,
    /// Predicted step seconds (max over all tasks).
    pub step_seconds: f64,
}

/// Peak number of concurrently running operators and the makespan of the as-soon-as-possible
/// schedule of `ops` with operator times `seconds`. Errors on cycles, bad indices, or bad times.
pub fn max_concurrency(ops: &[ComputeOp], seconds: &[f64]) -> Result<(u32, f64), PolicyError> {
    let bad = |m: String| PolicyError::InvalidThreadProfile(m);
    if ops.is_empty() {
        return Err(bad("the compute graph has no operators".into()));
    }
    if seconds.len() != ops.len() {
        return Err(bad(format!("{} operator times for {} operators", seconds.len(), ops.len())));
    }
    if let Some(t) = seconds.iter().find(|t| !t.is_finite() || **t < 0.0) {
        return Err(bad(format!("operator time {t} is not a finite non-negative number")));
    }
    let n = ops.len();
    let mut indegree = vec![0usize; n];
    let mut children = vec![Vec::new(); n];
    for (i, op) in ops.iter().enumerate() {
        for &d in &op.deps {
            if d >= n || d == i {
                return Err(bad(format!("operator `{}` depends on invalid index {d}", op.name)));
            }
            indegree[i] += 1;
            children[d].push(i);
        }
    }
    // Kahn's algorithm; start/finish times of the ASAP schedule along the way.
    let mut start = vec![0.0f64; n];
    let mut finish = vec![0.0f64; n];
    let mut queue: std::collections::VecDeque<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut seen = 0;
    while let Some(i) = queue.pop_front() {
        seen += 1;
        finish[i] = start[i] + seconds[i];
        for &c in &children[i] {
            start[c] = start[c].max(finish[i]);
            indegree[c] -= 1;
            if indegree[c] == 0 {
                queue.push_back(c);
            }
        }
    }
    if seen != n {
        return Err(bad("the compute graph has a cycle".into()));
    }
    // The overlap peak is reached at some operator's start.
    let mut peak = 1u32;
    for i in 0..n {
        let running = (0..n).filter(|&j| j == i || (start[j] <= start[i] && start[i] < finish[j])).count();
        peak = peak.max(u32::try_from(running).unwrap_or(u32::MAX));
    }
    let makespan = finish.iter().copied().fold(0.0, f64::max);
    Ok((peak, makespan))
}

/// Piecewise-linear interpolation of a task's time at `threads`, clamped outside the samples.
fn interpolate(samples: &[IoSample], threads: u32) -> f64 {
    let mut pts: Vec<(f64, f64)> = samples.iter().map(|s| (f64::from(s.threads), s.seconds)).collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t = f64::from(threads);
    let (Some(first), Some(last)) = (pts.first().copied(), pts.last().copied()) else {
        return f64::INFINITY;
    };
    if t <= first.0 {
        return first.1;
    }
    if t >= last.0 {
        return last.1;
    }
    for w in pts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if t >= a.0 && t <= b.0 {
            if b.0 == a.0 {
                return a.1.min(b.1);
            }
            return a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0);
        }
    }
    last.1
}

/// Share `free` threads among tasks in proportion to `bytes`, each getting at least one
/// (largest-remainder rounding). Equal shares when all volumes are zero.
fn share_threads(free: u32, bytes: &[f64]) -> Vec<u32> {
    let k = bytes.len() as u32;
    if k == 0 {
        return Vec::new();
    }
    let extra = free.saturating_sub(k);
    let total: f64 = bytes.iter().sum();
    let weights: Vec<f64> =
        if total > 0.0 { bytes.iter().map(|b| b / total).collect() } else { vec![1.0 / f64::from(k); bytes.len()] };
    let ideal: Vec<f64> = weights.iter().map(|w| w * f64::from(extra)).collect();
    let mut out: Vec<u32> = ideal.iter().map(|x| 1 + x.floor() as u32).collect();
    let mut left = extra.saturating_sub(ideal.iter().map(|x| x.floor() as u32).sum::<u32>());
    let mut order: Vec<usize> = (0..bytes.len()).collect();
    order.sort_by(|&a, &b| (ideal[b] - ideal[b].floor()).total_cmp(&(ideal[a] - ideal[a].floor())));
    for i in order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// LM-Offload Algorithm 3: choose intra-op and inter-op thread counts.
///
/// For every profiled intra-op count `p` with `p ≤ max_threads − #io_tasks`: the compute task's
/// inter-op parallelism `c` is the maximum concurrency of its graph; the free threads
/// `max_threads − c·p` (skipped when fewer than one per I/O task) are shared among the I/O tasks
/// in proportion to their bytes; the step time is the max of the compute makespan and the
/// interpolated I/O times. The fastest step wins.
pub fn choose_threads(profile: &ThreadProfile) -> Result<ThreadPlan, PolicyError> {
    let bad = |m: String| PolicyError::InvalidThreadProfile(m);
    let k = u32::try_from(profile.io_tasks.len()).map_err(|_| bad("too many I/O tasks".into()))?;
    if profile.compute_samples.is_empty() {
        return Err(bad("no compute samples".into()));
    }
    for task in &profile.io_tasks {
        if task.samples.is_empty() {
            return Err(bad(format!("I/O task `{}` has no samples", task.name)));
        }
        if !task.bytes.is_finite() || task.bytes < 0.0 {
            return Err(bad(format!("I/O task `{}` moves {} bytes", task.name, task.bytes)));
        }
        if let Some(s) = task.samples.iter().find(|s| s.threads == 0 || !s.seconds.is_finite() || s.seconds < 0.0) {
            return Err(bad(format!(
                "I/O task `{}` has an invalid sample ({} threads, {} s)",
                task.name, s.threads, s.seconds
            )));
        }
    }
    let mut samples: Vec<&ComputeSample> = profile.compute_samples.iter().collect();
    samples.sort_by_key(|s| s.intra_op_threads);
    let bytes: Vec<f64> = profile.io_tasks.iter().map(|t| t.bytes).collect();

    let mut best: Option<ThreadPlan> = None;
    for sample in samples {
        let intra = sample.intra_op_threads;
        if intra == 0 {
            return Err(bad("a compute sample has 0 intra-op threads".into()));
        }
        if intra.saturating_add(k) > profile.max_threads {
            continue;
        }
        let (inter, compute_seconds) = max_concurrency(&profile.compute_ops, &sample.op_seconds)?;
        let used = u64::from(inter) * u64::from(intra);
        let free = u64::from(profile.max_threads).saturating_sub(used);
        if free < u64::from(k) {
            continue;
        }
        let io_threads = share_threads(u32::try_from(free).unwrap_or(u32::MAX), &bytes);
        let io_seconds: Vec<f64> =
            profile.io_tasks.iter().zip(&io_threads).map(|(t, &n)| interpolate(&t.samples, n)).collect();
        let step = io_seconds.iter().copied().fold(compute_seconds, f64::max);
        let better = best.as_ref().is_none_or(|b| step < b.step_seconds);
        if better {
            best = Some(ThreadPlan {
                intra_op_compute: intra,
                inter_op_compute: inter,
                inter_op_total: inter.saturating_add(k),
                io_threads,
                compute_seconds,
                io_seconds,
                step_seconds: step,
            });
        }
    }
    best.ok_or_else(|| {
        bad(format!(
            "no profiled intra-op count leaves one thread for each of the {k} I/O tasks out of {} threads",
            profile.max_threads
        ))
    })
}
