//! Stage partitioning: split `L` layers into `S` contiguous pipeline stages so that the slowest
//! stage is as fast as possible (AlpaServe §4.4.1, `F(s, k) = min_i max{F(s−1, i−1), latency(i, k)}`),
//! under a per-device memory cap and, optionally, with a tensor-parallel degree chosen per stage
//! within a device budget (Alpa's intra-op choice reduced to a degree per stage, §3.5.2).
//!
//! The search follows Alpa's inter-operator DP (§3.5.2, Eq. 3.3): for a bound `t_max` on every
//! stage's latency, `F(s, k, d; t_max)` is the least total latency of covering layers `0..k` with
//! `s` stages on `d` devices. Feasibility grows with `t_max`, so the smallest feasible `t_max`
//! among the possible stage latencies is found by bisection; it is the optimal bottleneck, and the
//! DP at that bound also minimises the sum of the stage latencies (then the devices used).

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
pub use super::stage_devices::{DeviceStagesError, StageDevice, StageExtra};
use crate::interference::Interference;

/// Largest number of layers, stages, devices or degrees accepted.
const MAX_LAYERS: usize = 4096;
/// Largest DP table (states) and candidate list the planner allocates.
const MAX_ENTRIES: usize = 1 << 24;

/// Input of [`plan`]. JSON: `{"layer_latency_ms": [f64; L], "stages": S}` plus the optional fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagesInput {
    /// Latency of each layer on one device, in milliseconds.
    pub layer_latency_ms: Vec<f64>,
    /// Number of pipeline stages `S` (`1 ≤ S ≤ L`).
    pub stages: usize,
    /// Bytes each layer needs (weights plus whatever the caller counts per layer). Give it
    /// together with `stage_memory_bytes`.
    #[serde(default)]
    pub layer_memory_bytes: Option<Vec<u64>>,
    /// Memory of one device: a stage at tensor-parallel degree `d` needs `⌈Σ layer_memory / d⌉`
    /// bytes on each of its `d` devices.
    #[serde(default)]
    pub stage_memory_bytes: Option<u64>,
    /// Optional tensor parallelism: each stage picks a degree (1, or one of `degrees`), and the
    /// degrees of all stages add up to at most `devices`.
    #[serde(default)]
    pub tensor_parallel: Option<TensorParallel>,
    /// Heterogeneous devices, one per stage in pipeline order (`devices.len() == stages`): stage
    /// `s` runs on `devices[s]` at that device's own per-layer latency, under its own memory cap,
    /// and pays its link to the next stage. Replaces `stage_memory_bytes`; with it,
    /// `layer_latency_ms` is only the layer count's witness and `tensor_parallel` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<StageDevice>>,
    /// What the first stage holds beyond its layers (embeddings): time per request and bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage: Option<StageExtra>,
    /// What the last stage holds beyond its layers (final norm, LM head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage: Option<StageExtra>,
    /// With `devices`: how much the stages slow each other down when they work at once, the
    /// measured `κ` of `burn_parallel::profiler::pipeline_interference` (0, the default: not at all).
    /// Above 0 the split minimises a pipelined pass's `max + κ·(Σ − max)` of the stage costs
    /// instead of the bottleneck alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub interference: f64,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// Tensor-parallel degrees a stage may use, and the devices they share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorParallel {
    /// Devices available to the whole pipeline (`Σ degree ≤ devices`).
    pub devices: usize,
    /// Degrees beyond 1 with the per-layer latency measured at that degree (communication
    /// included). Degree 1 is always available, with `layer_latency_ms`; a degree larger than
    /// `devices` is never chosen.
    pub degrees: Vec<TpDegree>,
}

/// Per-layer latency at one tensor-parallel degree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpDegree {
    /// Devices one stage spans (≥ 2).
    pub degree: usize,
    /// Latency of each layer when split over `degree` devices, in milliseconds.
    pub layer_latency_ms: Vec<f64>,
}

/// Output of [`plan`]: `{"stages": [[start, end], …], "stage_latency_ms": [f64; S], "bottleneck_ms": f64}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagesOutput {
    /// Half-open layer ranges, in order, covering `0..L`, none empty.
    pub stages: Vec<[usize; 2]>,
    /// Latency of each stage (sum of its layers at its degree).
    pub stage_latency_ms: Vec<f64>,
    /// The slowest stage's latency: the pipeline's time per request in steady state.
    pub bottleneck_ms: f64,
    /// Degree chosen for each stage; present only when `tensor_parallel` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel_degrees: Option<Vec<usize>>,
    /// Bytes each stage's device holds (layers and extras); present only when `devices` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_memory_bytes: Option<Vec<u64>>,
}

/// Why no stage plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StagesError {
    /// A field cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
    /// More stages than layers: some stage would be empty.
    #[error(
        "{stages} stages cannot split {layers} layers (every stage needs a layer); ask for at most {layers} stages"
    )]
    TooManyStages {
        /// Stages asked for.
        stages: usize,
        /// Layers available.
        layers: usize,
    },
    /// Even one device per stage exceeds the device budget.
    #[error(
        "{stages} stages need at least {stages} devices but `tensor_parallel.devices` is {devices}; give more devices or fewer stages"
    )]
    NotEnoughDevices {
        /// Stages asked for.
        stages: usize,
        /// Devices available.
        devices: usize,
    },
    /// The DP would not fit in memory.
    #[error("the search needs {entries} table entries, more than {max}; use fewer layers, stages, devices or degrees")]
    TooLarge {
        /// Entries needed.
        entries: usize,
        /// Entries allowed.
        max: usize,
    },
    /// No split fits the per-device memory.
    #[error(
        "no split into {stages} stages fits {cap} bytes per device; raise `stage_memory_bytes`, use more stages or tensor-parallel degrees"
    )]
    DoesNotFit {
        /// Stages asked for.
        stages: usize,
        /// Memory per device.
        cap: u64,
    },
    /// Heterogeneous devices cannot be split as asked (see [`DeviceStagesError`]).
    #[error(transparent)]
    Devices(#[from] DeviceStagesError),
}

/// Plans the stages for `input` (see the module docs).
pub fn plan(input: &StagesInput) -> Result<StagesOutput, StagesError> {
    let layers = input.layer_latency_ms.len();
    check::latencies("layer_latency_ms", &input.layer_latency_ms)?;
    check::count("layer_latency_ms", layers, MAX_LAYERS)?;
    check::count("stages", input.stages, MAX_LAYERS)?;
    if let Some(devices) = &input.devices {
        return super::stage_devices::plan(input, devices);
    }
    let interference = input.interference != 0.0;
    for (field, given) in [
        ("first_stage", input.first_stage.is_some()),
        ("last_stage", input.last_stage.is_some()),
        ("interference", interference),
    ] {
        if given {
            return Err(InputError::new(field, "is only read with `devices`; give one entry per stage there").into());
        }
    }
    let memory = match (&input.layer_memory_bytes, input.stage_memory_bytes) {
        (None, None) => None,
        (Some(mem), Some(cap)) => {
            check::same_len("layer_memory_bytes", mem, layers, "layers")?;
            Some((mem.as_slice(), cap))
        }
        (Some(_), None) => {
            return Err(InputError::new("stage_memory_bytes", "is missing; give it with `layer_memory_bytes`").into());
        }
        (None, Some(_)) => {
            return Err(InputError::new("layer_memory_bytes", "is missing; give it with `stage_memory_bytes`").into());
        }
    };
    let mut options = vec![StageOption::new(1, &input.layer_latency_ms)];
    let mut devices = None;
    if let Some(tp) = &input.tensor_parallel {
        check::count("tensor_parallel.devices", tp.devices, MAX_LAYERS)?;
        for (i, d) in tp.degrees.iter().enumerate() {
            let field = format!("tensor_parallel.degrees[{i}]");
            if d.degree < 2 || d.degree > MAX_LAYERS {
                return Err(InputError::new(
                    format!("{field}.degree"),
                    format!("{} must be between 2 and {MAX_LAYERS}", d.degree),
                )
                .into());
            }
            if options.iter().any(|o| o.degree == d.degree) {
                return Err(
                    InputError::new(format!("{field}.degree"), format!("degree {} is listed twice", d.degree)).into()
                );
            }
            check::same_len(&format!("{field}.layer_latency_ms"), &d.layer_latency_ms, layers, "layers")?;
            check::latencies(&format!("{field}.layer_latency_ms"), &d.layer_latency_ms)?;
            options.push(StageOption::new(d.degree, &d.layer_latency_ms));
        }
        devices = Some(tp.devices);
    }
    let problem = Problem::new(options, memory, input.stages, devices)?;
    let partition = problem.solve()?;
    Ok(StagesOutput {
        tensor_parallel_degrees: input.tensor_parallel.as_ref().map(|_| partition.degrees.clone()),
        stages: partition.ranges,
        stage_latency_ms: partition.stage_latency_ms,
        bottleneck_ms: partition.bottleneck_ms,
        stage_memory_bytes: None,
    })
}

/// One way to run a stage: a tensor-parallel degree and the per-layer latencies at it.
#[derive(Debug, Clone)]
pub(crate) struct StageOption {
    degree: usize,
    layer_latency_ms: Vec<f64>,
    prefix: Vec<f64>,
}

impl StageOption {
    /// The option of running layers at `degree` with the given (checked) latencies.
    pub(crate) fn new(degree: usize, layer_latency_ms: &[f64]) -> Self {
        let mut prefix = Vec::with_capacity(layer_latency_ms.len() + 1);
        prefix.push(0.0);
        let mut acc = 0.0;
        for &l in layer_latency_ms {
            acc += l;
            prefix.push(acc);
        }
        Self { degree, layer_latency_ms: layer_latency_ms.to_vec(), prefix }
    }

    /// Latency of layers `a..b` as the DP compares it.
    fn latency(&self, a: usize, b: usize) -> f64 {
        self.prefix[b] - self.prefix[a]
    }
}

/// A solved partition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Partition {
    pub ranges: Vec<[usize; 2]>,
    pub degrees: Vec<usize>,
    pub stage_latency_ms: Vec<f64>,
    pub bottleneck_ms: f64,
    /// Bytes each device of each stage holds (`⌈stage memory / degree⌉`); zeros without memory.
    pub device_memory_bytes: Vec<u64>,
}

/// A checked partitioning problem.
pub(crate) struct Problem {
    options: Vec<StageOption>,
    /// Prefix sums of layer memory, and the per-device cap.
    memory: Option<(Vec<u128>, u64)>,
    stages: usize,
    /// Device budget when degrees count against one.
    devices: Option<usize>,
    layers: usize,
}

impl Problem {
    /// A problem over checked options (all with the same number of layers).
    pub(crate) fn new(
        options: Vec<StageOption>,
        memory: Option<(&[u64], u64)>,
        stages: usize,
        devices: Option<usize>,
    ) -> Result<Self, StagesError> {
        let layers = options[0].layer_latency_ms.len();
        if stages > layers {
            return Err(StagesError::TooManyStages { stages, layers });
        }
        if let Some(devices) = devices
            && devices < stages * options.iter().map(|o| o.degree).min().unwrap_or(1)
        {
            return Err(StagesError::NotEnoughDevices { stages, devices });
        }
        let d_max = devices.unwrap_or(0);
        let states = (stages + 1).saturating_mul(layers + 1).saturating_mul(d_max + 1);
        let candidates = options.len().saturating_mul(layers * (layers + 1) / 2);
        let entries = states.max(candidates);
        if entries > MAX_ENTRIES {
            return Err(StagesError::TooLarge { entries, max: MAX_ENTRIES });
        }
        let memory = memory.map(|(mem, cap)| {
            let mut prefix = Vec::with_capacity(layers + 1);
            prefix.push(0u128);
            for &m in mem {
                prefix.push(prefix[prefix.len() - 1] + u128::from(m));
            }
            (prefix, cap)
        });
        Ok(Self { options, memory, stages, devices, layers })
    }

    /// Bytes per device of layers `a..b` at `degree`.
    fn device_bytes(&self, degree: usize, a: usize, b: usize) -> u128 {
        self.memory.as_ref().map_or(0, |(prefix, _)| (prefix[b] - prefix[a]).div_ceil(degree as u128))
    }

    fn fits(&self, degree: usize, a: usize, b: usize) -> bool {
        self.memory.as_ref().is_none_or(|(_, cap)| self.device_bytes(degree, a, b) <= u128::from(*cap))
    }

    /// The optimal partition (least bottleneck, then least total latency, then fewest devices).
    pub(crate) fn solve(&self) -> Result<Partition, StagesError> {
        let mut candidates = Vec::new();
        for o in &self.options {
            for a in 0..self.layers {
                for b in a + 1..=self.layers {
                    if self.fits(o.degree, a, b) {
                        candidates.push(o.latency(a, b));
                    }
                }
            }
        }
        candidates.sort_by(f64::total_cmp);
        candidates.dedup();
        let infeasible =
            || StagesError::DoesNotFit { stages: self.stages, cap: self.memory.as_ref().map_or(u64::MAX, |m| m.1) };
        smallest_feasible(&candidates, |t_max| self.min_total(t_max)).ok_or_else(infeasible)
    }

    /// Alpa's `F(S, L, d; t_max)`: the partition with every stage at most `t_max` and the least
    /// total latency, or `None` when no partition keeps under `t_max`.
    fn min_total(&self, t_max: f64) -> Option<Partition> {
        let (s_max, l_max) = (self.stages, self.layers);
        let d_max = self.devices.unwrap_or(0);
        let idx = |s: usize, k: usize, d: usize| (s * (l_max + 1) + k) * (d_max + 1) + d;
        let size = (s_max + 1) * (l_max + 1) * (d_max + 1);
        let mut f = vec![f64::INFINITY; size];
        // (previous layer boundary, option index) that reached each state.
        let mut from = vec![(0usize, 0usize); size];
        f[idx(0, 0, 0)] = 0.0;
        for s in 1..=s_max {
            for k in s..=l_max - (s_max - s) {
                for prev in s - 1..k {
                    for (oi, o) in self.options.iter().enumerate() {
                        let lat = o.latency(prev, k);
                        if lat > t_max || !self.fits(o.degree, prev, k) {
                            continue;
                        }
                        let cost = if self.devices.is_some() { o.degree } else { 0 };
                        for d in cost..=d_max {
                            let base = f[idx(s - 1, prev, d - cost)];
                            let v = base + lat;
                            if v < f[idx(s, k, d)] {
                                f[idx(s, k, d)] = v;
                                from[idx(s, k, d)] = (prev, oi);
                            }
                        }
                    }
                }
            }
        }
        let d_best = (0..=d_max)
            .filter(|&d| f[idx(s_max, l_max, d)].is_finite())
            .min_by(|&a, &b| f[idx(s_max, l_max, a)].total_cmp(&f[idx(s_max, l_max, b)]))?;
        let (mut k, mut d) = (l_max, d_best);
        let mut chosen = Vec::with_capacity(s_max);
        for s in (1..=s_max).rev() {
            let (prev, oi) = from[idx(s, k, d)];
            chosen.push((prev, k, oi));
            if self.devices.is_some() {
                d -= self.options[oi].degree;
            }
            k = prev;
        }
        chosen.reverse();
        let mut partition = Partition {
            ranges: Vec::with_capacity(s_max),
            degrees: Vec::with_capacity(s_max),
            stage_latency_ms: Vec::with_capacity(s_max),
            bottleneck_ms: 0.0,
            device_memory_bytes: Vec::with_capacity(s_max),
        };
        for (a, b, oi) in chosen {
            let o = &self.options[oi];
            let latency: f64 = o.layer_latency_ms[a..b].iter().sum();
            partition.ranges.push([a, b]);
            partition.degrees.push(o.degree);
            partition.stage_latency_ms.push(latency);
            partition.bottleneck_ms = partition.bottleneck_ms.max(latency);
            // Fits was checked against a u64 cap, so this converts.
            partition.device_memory_bytes.push(u64::try_from(self.device_bytes(o.degree, a, b)).unwrap_or(u64::MAX));
        }
        Some(partition)
    }
}

/// The plan of the smallest bound in `candidates` (sorted ascending) for which `plan` finds one,
/// by bisection: feasibility only grows with the bound, so the smallest feasible bound is the
/// optimal bottleneck. `None` when even the largest bound is infeasible.
pub(super) fn smallest_feasible<T>(candidates: &[f64], plan: impl Fn(f64) -> Option<T>) -> Option<T> {
    let mut best = plan(*candidates.last()?)?;
    let (mut lo, mut hi) = (0usize, candidates.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        match plan(candidates[mid]) {
            Some(p) => {
                best = p;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    // `best` is the plan at `candidates[hi]`, the smallest feasible bound.
    Some(best)
}

/// Most bounds whose splits [`least_interval`] scores.
const MAX_SCORED_BOUNDS: usize = 512;

/// For stages that slow each other down by `kappa` (a measured interference), the split of least
/// `max + κ·(Σ − max)` of its stage costs (`costs`), what one micro-batch adds to a pipelined
/// pass: a looser bound than `fastest`'s (the plan at the smallest feasible bound) may trade a
/// slower bottleneck for a smaller sum, so the least-total split (`plan`) of every feasible bound
/// in `candidates` (sorted ascending) is scored, at most [`MAX_SCORED_BOUNDS`] of them, spread
/// evenly from the tightest to the loosest, with both. `kappa ≤ 0`: `fastest`.
pub(super) fn least_interval<T>(
    candidates: &[f64],
    fastest: T,
    kappa: f64,
    costs: impl Fn(&T) -> Vec<f64>,
    plan: impl Fn(f64) -> Option<T>,
) -> T {
    if kappa <= 0.0 {
        return fastest;
    }
    let score = |t: &T| Interference::interval_ms(&costs(t), kappa);
    let bottleneck = costs(&fastest).into_iter().fold(0.0, f64::max);
    let feasible = &candidates[candidates.partition_point(|&c| c < bottleneck)..];
    let step = feasible.len().div_ceil(MAX_SCORED_BOUNDS).max(1);
    let mut best_score = score(&fastest);
    let mut best = fastest;
    for &t_max in feasible.iter().step_by(step).chain(feasible.last()) {
        let Some(split) = plan(t_max) else { continue };
        let split_score = score(&split);
        if split_score < best_score {
            (best, best_score) = (split, split_score);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(lat: &[f64], stages: usize) -> StagesInput {
        StagesInput {
            layer_latency_ms: lat.to_vec(),
            stages,
            layer_memory_bytes: None,
            stage_memory_bytes: None,
            tensor_parallel: None,
            devices: None,
            first_stage: None,
            last_stage: None,
            interference: 0.0,
        }
    }

    #[test]
    fn stages_balance_a_small_example() {
        let out = plan(&input(&[1.0, 2.0, 3.0, 4.0], 2)).unwrap();
        assert_eq!(out.stages, vec![[0, 3], [3, 4]]);
        assert_eq!(out.bottleneck_ms, 6.0);
    }

    #[test]
    fn stages_memory_cap_moves_the_split() {
        let mut i = input(&[1.0, 1.0, 1.0, 10.0], 2);
        i.layer_memory_bytes = Some(vec![5, 5, 5, 1]);
        i.stage_memory_bytes = Some(10);
        let out = plan(&i).unwrap();
        assert_eq!(out.stages, vec![[0, 2], [2, 4]]);
        assert_eq!(out.bottleneck_ms, 11.0);
        i.stage_memory_bytes = Some(4);
        assert!(matches!(plan(&i), Err(StagesError::DoesNotFit { .. })));
    }

    #[test]
    fn stages_tensor_parallel_spends_spare_devices_on_the_slow_stage() {
        let mut i = input(&[1.0, 1.0, 8.0], 2);
        i.tensor_parallel = Some(TensorParallel {
            devices: 3,
            degrees: vec![TpDegree { degree: 2, layer_latency_ms: vec![0.6, 0.6, 4.5] }],
        });
        let out = plan(&i).unwrap();
        assert_eq!(out.stages, vec![[0, 2], [2, 3]]);
        assert_eq!(out.tensor_parallel_degrees, Some(vec![1, 2]));
        assert_eq!(out.bottleneck_ms, 4.5);
    }

    #[test]
    fn stages_reject_bad_input() {
        assert!(matches!(plan(&input(&[1.0], 2)), Err(StagesError::TooManyStages { .. })));
        assert!(matches!(plan(&input(&[], 1)), Err(StagesError::Input(_))));
        assert!(matches!(plan(&input(&[1.0, -1.0], 1)), Err(StagesError::Input(_))));
        assert!(matches!(plan(&input(&[1.0, f64::NAN], 1)), Err(StagesError::Input(_))));
        assert!(matches!(plan(&input(&[1.0], 0)), Err(StagesError::Input(_))));
    }
}
