//! FlexGen's policy search (§4.3): enumerate the scalar choices (`gbs`, number of GPU batches,
//! CPU delegation, compression) and, for each, solve the placement LP of Eq. (1) with `good_lp`
//! and the pure-Rust `microlp` solver.
//!
//! The LP has the nine placement variables in `[0, 1]` with `wg+wc+wd = cg+cc+cd = hg+hc+hd = 1`,
//! the five peak-memory constraints of Appendix A.3 (a working-set `max` becomes one constraint
//! per alternative), and minimizes `T / bls` with two auxiliary variables `t_pre ≥` each prefill
//! term and `t_gen ≥` each decode term (with overlap; without overlap the terms are summed, which
//! is linear already). A tiny tie-breaker (10⁻⁶ of the objective scale times the sum of all
//! terms) makes the LP prefer, among placements with the same latency, the one that moves the
//! fewest bytes.

use burn_llm_kernels::QuantSpec;
use good_lp::{Expression, ProblemVariables, ResolutionError, Solution, SolverModel, Variable, microlp, variable};
use serde::{Deserialize, Serialize};

use super::compression::{self, FLEXGEN_CACHE, FLEXGEN_WEIGHTS, check_cache, check_weights};
use super::cost::{Affine, CostEstimate, HD, LinearModel, MemoryConstraint, Term, TierBytes};
use super::error::{GIB, PolicyError};
use super::hardware::HardwareProfile;
use super::model::{ModelShape, OffloadWorkload};
use super::rounding::{RoundedPolicy, round_to_whole};
use super::types::{Placement, Policy, PolicyShape, Tier};

/// Relative tolerance when checking an LP solution against the capacities.
const LP_MEMORY_TOLERANCE: f64 = 1e-6;
/// Weight of the "fewest bytes moved" tie-breaker relative to the latency objective.
const TIE_BREAK: f64 = 1e-6;

/// The choices the search enumerates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSpace {
    /// GPU batch sizes to try.
    pub gpu_batch_sizes: Vec<u32>,
    /// Numbers of GPU batches per block to try.
    pub num_gpu_batches: Vec<u32>,
    /// CPU-delegation choices to try.
    pub cpu_attention: Vec<bool>,
    /// Weight compression choices (`None` = uncompressed).
    #[serde(serialize_with = "compression::serialize_choices", deserialize_with = "compression::weight_choices")]
    pub weight_compression: Vec<Option<QuantSpec>>,
    /// KV-cache compression choices (only tried with GPU attention).
    #[serde(serialize_with = "compression::serialize_choices", deserialize_with = "compression::cache_choices")]
    pub cache_compression: Vec<Option<QuantSpec>>,
    /// Overlap I/O with compute (FlexGen Algorithm 1).
    pub overlap: bool,
    /// Allow activations on disk (`hd > 0`). Off by default: activations are a few MB, and every
    /// policy FlexGen reports (Tables 2, 12–20) has `hg + hc = 100%`.
    pub allow_disk_activations: bool,
    /// Bytes per tier kept out of the search (embeddings, framework overhead, fragmentation).
    pub reserved_bytes: TierBytes,
}

impl Default for SearchSpace {
    /// FlexGen's space without compression: `gbs` ∈ {1, 2, 4, multiples of 4 up to 64, then
    /// 80 … 512}, 1 to 20 GPU batches per block, with and without CPU attention, overlap on.
    fn default() -> Self {
        let mut gbs = vec![1, 2];
        gbs.extend((1..=16).map(|i| 4 * i));
        gbs.extend([80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]);
        Self {
            gpu_batch_sizes: gbs,
            num_gpu_batches: (1..=20).collect(),
            cpu_attention: vec![false, true],
            weight_compression: vec![None],
            cache_compression: vec![None],
            overlap: true,
            allow_disk_activations: false,
            reserved_bytes: TierBytes::default(),
        }
    }
}

impl SearchSpace {
    /// Also try FlexGen's 4-bit, group-64 quantization for weights and for the KV cache
    /// (LM-Offload: decide per tensor kind).
    pub fn with_compression(mut self) -> Self {
        self.weight_compression = vec![None, Some(FLEXGEN_WEIGHTS)];
        self.cache_compression = vec![None, Some(FLEXGEN_CACHE)];
        self
    }

    /// Check that every list is non-empty and every value usable.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let empty = |name: &str| PolicyError::InvalidSearchSpace(format!("`{name}` is empty"));
        if self.gpu_batch_sizes.is_empty() {
            return Err(empty("gpu_batch_sizes"));
        }
        if self.num_gpu_batches.is_empty() {
            return Err(empty("num_gpu_batches"));
        }
        if self.cpu_attention.is_empty() {
            return Err(empty("cpu_attention"));
        }
        if self.weight_compression.is_empty() {
            return Err(empty("weight_compression"));
        }
        if self.cache_compression.is_empty() {
            return Err(empty("cache_compression"));
        }
        if self.gpu_batch_sizes.contains(&0) || self.num_gpu_batches.contains(&0) {
            return Err(PolicyError::InvalidSearchSpace("batch sizes must be ≥ 1".into()));
        }
        let axes = self.weight_compression.iter().map(|&c| check_weights(c));
        axes.chain(self.cache_compression.iter().map(|&c| check_cache(c)))
            .collect::<Result<(), _>>()
            .map_err(|e| PolicyError::InvalidSearchSpace(e.to_string()))?;
        let r = &self.reserved_bytes;
        if [r.gpu, r.cpu, r.disk].iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(PolicyError::InvalidSearchSpace("reserved_bytes must be finite and ≥ 0".into()));
        }
        Ok(())
    }

    /// Every policy shape of the space, grouped so that `num_gpu_batches` grows fastest.
    fn groups(&self, wl: &OffloadWorkload) -> Vec<Vec<PolicyShape>> {
        let mut gbs = self.gpu_batch_sizes.clone();
        gbs.sort_unstable();
        gbs.dedup();
        let mut nbs = self.num_gpu_batches.clone();
        nbs.sort_unstable();
        nbs.dedup();
        let mut groups = Vec::new();
        for &cpu_attention in &self.cpu_attention {
            for &compress_weights in &self.weight_compression {
                for &compress_cache in &self.cache_compression {
                    if cpu_attention && compress_cache.is_some() {
                        continue; // identical to no cache compression (LM-Offload §3.2)
                    }
                    for &g in &gbs {
                        let group: Vec<PolicyShape> = nbs
                            .iter()
                            .map(|&nb| PolicyShape {
                                gpu_batch_size: g,
                                num_gpu_batches: nb,
                                cpu_attention,
                                overlap: self.overlap,
                                compress_weights,
                                compress_cache,
                            })
                            .filter(|s| wl.num_prompts.is_none_or(|np| s.block_size() <= np))
                            .collect();
                        if !group.is_empty() {
                            groups.push(group);
                        }
                    }
                }
            }
        }
        groups
    }
}

/// Which constraints and terms are tight at the chosen policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    /// Memory constraints at capacity (slack ≤ 10⁻⁵ of the capacity).
    pub tight_memory: Vec<MemoryConstraint>,
    /// Bytes left under each constraint, in [`MemoryConstraint::ALL`] order.
    pub memory_slack: Vec<(MemoryConstraint, f64)>,
    /// The largest prefill term.
    pub prefill_bottleneck: Term,
    /// The largest decode term.
    pub decode_bottleneck: Term,
}

impl Binding {
    /// Compute slack and bottlenecks of `estimate` against `available`.
    pub fn of(estimate: &CostEstimate, available: &TierBytes) -> Self {
        let memory_slack: Vec<(MemoryConstraint, f64)> = estimate
            .peak_memory
            .by_constraint()
            .into_iter()
            .map(|(c, used)| (c, available.on(c.tier()) - used))
            .collect();
        let tight_memory = memory_slack
            .iter()
            .filter(|(c, slack)| *slack <= 1e-5 * available.on(c.tier()).max(GIB))
            .map(|(c, _)| *c)
            .collect();
        Self {
            tight_memory,
            memory_slack,
            prefill_bottleneck: estimate.prefill_terms.bottleneck(),
            decode_bottleneck: estimate.decode_terms.bottleneck(),
        }
    }
}

/// The best policy found and why it is what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    /// The chosen policy (fractional placements, as the LP returns them; see
    /// [`super::round_to_whole`] for the runtime's granularity).
    pub policy: Policy,
    /// Its cost-model prediction (throughput, peaks, terms).
    pub estimate: CostEstimate,
    /// Tight memory constraints and bottleneck terms.
    pub binding: Binding,
    /// Capacity per tier the search used (capacity minus reservation).
    pub available: TierBytes,
    /// Policy shapes whose LP was solved.
    pub shapes_solved: usize,
    /// Policy shapes with a feasible placement.
    pub shapes_feasible: usize,
}

/// What the LP optimizes.
#[derive(Debug, Clone, Copy)]
enum Goal {
    /// FlexGen's objective `T / bls` under all memory constraints.
    Latency,
    /// The smallest peak on one tier, under the other tiers' constraints (for diagnostics).
    MinimizeTier(Tier),
}

/// Affine → good_lp expression, multiplied by `scale`.
fn to_expr(a: &Affine, x: &[Variable], scale: f64) -> Expression {
    let mut e = Expression::from(a.c * scale);
    for (k, v) in a.k.iter().zip(x) {
        if *k != 0.0 {
            e.add_mul(*k * scale, *v);
        }
    }
    e
}

/// Solve one LP; `Ok(None)` when infeasible. `limits[tier]` is the capacity of each tier
/// (`None`: unconstrained); with [`Goal::MinimizeTier`] the minimized tier's limit is ignored.
fn run_lp(
    lm: &LinearModel,
    limits: &[Option<f64>; 3],
    allow_disk_activations: bool,
    goal: Goal,
) -> Result<Option<[f64; 9]>, PolicyError> {
    let mut vars = ProblemVariables::new();
    let x: Vec<Variable> = (0..9)
        .map(|i| {
            let max = if i == HD && !allow_disk_activations { 0.0 } else { 1.0 };
            vars.add(variable().min(0.0).max(max))
        })
        .collect();

    // Time scale: the layer time with everything on the CPU, so objective values are O(1).
    let all_cpu = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0];
    let reference = lm.evaluate(&all_cpu);
    let tau = reference.t_decode_layer.max(reference.t_prefill_layer).max(1e-30);
    let ts = 1.0 / tau;
    let n = lm.gen_len;

    let mut time_constraints = Vec::new();
    let mut minimized = None;
    let objective: Expression = match goal {
        Goal::Latency => {
            let mut obj = Expression::from(0.0);
            let phases = [(&lm.prefill, 1.0 / n, lm.prefill_serial), (&lm.decode, (n - 1.0) / n, 0.0)];
            for (terms, w, serial) in phases {
                obj += Expression::from(serial * ts * w);
                if lm.overlap {
                    let t = vars.add(variable().min(0.0));
                    obj.add_mul(w, t);
                    for term in terms {
                        time_constraints.push(to_expr(term, &x, ts).leq(t));
                    }
                } else {
                    for term in terms {
                        obj += to_expr(term, &x, ts * w);
                    }
                }
                for term in terms {
                    obj += to_expr(term, &x, ts * w * TIE_BREAK);
                }
            }
            obj
        }
        Goal::MinimizeTier(tier) => {
            let m = vars.add(variable().min(0.0));
            minimized = Some((tier, m));
            Expression::from(m)
        }
    };

    let mut problem = vars.minimise(objective).using(microlp);
    for c in time_constraints {
        problem.add_constraint(c);
    }
    for kind in 0..3 {
        let sum: Expression = (0..3).map(|j| x[3 * kind + j]).sum();
        problem.add_constraint(sum.eq(1.0));
    }
    for (mem, c) in lm.memory.iter().zip(MemoryConstraint::ALL) {
        let tier = c.tier();
        let limit = limits[tier.index()];
        let scale = 1.0 / limit.unwrap_or(0.0).max(GIB);
        for expr in mem.constraints() {
            let e = to_expr(&expr, &x, scale);
            match (minimized, limit) {
                (Some((t, m)), _) if t == tier => {
                    problem.add_constraint(e.leq(m));
                }
                (_, Some(cap)) => {
                    problem.add_constraint(e.leq(cap * scale));
                }
                (_, None) => {}
            }
        }
    }
    match problem.solve() {
        Ok(sol) => {
            let mut out = [0.0; 9];
            for (o, v) in out.iter_mut().zip(&x) {
                *o = sol.value(*v);
            }
            Ok(Some(out))
        }
        Err(ResolutionError::Infeasible) => Ok(None),
        Err(e) => Err(PolicyError::Solver(e.to_string())),
    }
}

/// Capacities as LP limits.
fn limits_of(available: &TierBytes) -> [Option<f64>; 3] {
    [Some(available.gpu), Some(available.cpu), Some(available.disk)]
}

/// Turn an LP solution into a policy with clean fractions.
fn to_policy(shape: PolicyShape, x: &[f64; 9]) -> Policy {
    Policy::from_parts(
        shape,
        Placement::from_array([x[0], x[1], x[2]]).normalized(),
        Placement::from_array([x[3], x[4], x[5]]).normalized(),
        Placement::from_array([x[6], x[7], x[8]]).normalized(),
    )
}

/// Whether `est` fits `available` within the LP tolerance.
fn fits_lp(est: &CostEstimate, available: &TierBytes) -> bool {
    est.peak_memory
        .by_constraint()
        .iter()
        .all(|(c, used)| *used <= available.on(c.tier()) + LP_MEMORY_TOLERANCE * available.on(c.tier()).max(GIB))
}

/// Solve the placement LP of FlexGen's Eq. (1) for one policy shape: the best placement and its
/// estimate, or `None` when no placement fits in `available`.
pub fn solve_placement(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    shape: &PolicyShape,
    available: &TierBytes,
    allow_disk_activations: bool,
) -> Result<Option<(Policy, CostEstimate)>, PolicyError> {
    let lm = LinearModel::build(hw, model, workload, shape)?;
    let Some(x) = run_lp(&lm, &limits_of(available), allow_disk_activations, Goal::Latency)? else {
        return Ok(None);
    };
    let policy = to_policy(*shape, &x);
    let est = lm.evaluate(&policy.placement_vector());
    Ok(fits_lp(&est, available).then_some((policy, est)))
}

/// Search the space for the policy with the highest predicted throughput (FlexGen §4.3).
///
/// Errors with [`PolicyError::InsufficientMemory`] naming the tier and the bytes it would need
/// when no shape of the space fits.
pub fn search(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    space: &SearchSpace,
) -> Result<SearchResult, PolicyError> {
    hw.validate()?;
    model.validate()?;
    workload.validate()?;
    space.validate()?;
    let available = TierBytes::available(hw, &space.reserved_bytes);
    let (best, solved, feasible) = search_by(hw, model, workload, space, &available, |policy, est| {
        Some(((policy, *est), est.throughput_tokens_per_s))
    })?;

    match best {
        Some((policy, estimate)) => Ok(SearchResult {
            binding: Binding::of(&estimate, &available),
            policy,
            estimate,
            available,
            shapes_solved: solved,
            shapes_feasible: feasible,
        }),
        None => Err(diagnose(hw, model, workload, space, &available)),
    }
}

/// Search like [`search`], but rank each shape's LP placement after rounding it to whole layers
/// and tensors ([`round_to_whole`]), which is what the runtime executes: with few layers, the
/// best fractional placement can round to a worse one than another shape's.
pub fn search_whole(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    space: &SearchSpace,
) -> Result<RoundedPolicy, PolicyError> {
    hw.validate()?;
    model.validate()?;
    workload.validate()?;
    space.validate()?;
    let available = TierBytes::available(hw, &space.reserved_bytes);
    let (best, _, _) = search_by(hw, model, workload, space, &available, |policy, _| {
        let rounded = round_to_whole(hw, model, workload, &policy, &space.reserved_bytes).ok()?;
        let throughput = rounded.estimate.throughput_tokens_per_s;
        Some((rounded, throughput))
    })?;
    best.ok_or_else(|| diagnose(hw, model, workload, space, &available))
}

/// Solves every shape of the space (pruning shapes that cannot fit) and keeps the candidate
/// `rank` scores highest; returns it with the numbers of shapes solved and feasible.
fn search_by<T>(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    space: &SearchSpace,
    available: &TierBytes,
    rank: impl Fn(Policy, &CostEstimate) -> Option<(T, f64)>,
) -> Result<(Option<T>, usize, usize), PolicyError> {
    let groups = space.groups(workload);
    if groups.is_empty() {
        return Err(PolicyError::InvalidSearchSpace(
            "no (gpu_batch_size, num_gpu_batches) pair has a block size within num_prompts".into(),
        ));
    }
    let mut best: Option<(T, f64)> = None;
    let (mut solved, mut feasible) = (0, 0);
    // Groups come in ascending gbs for each (delegation, compression) combination; memory only
    // grows with gbs and with the number of GPU batches, so the first infeasible shape ends its
    // group and an infeasible first shape ends the combination's larger batch sizes.
    let mut dead_combo: Option<(bool, Option<QuantSpec>, Option<QuantSpec>)> = None;
    for group in &groups {
        let first = group[0];
        let combo = (first.cpu_attention, first.compress_weights, first.compress_cache);
        if dead_combo == Some(combo) {
            continue;
        }
        for (i, shape) in group.iter().enumerate() {
            solved += 1;
            match solve_placement(hw, model, workload, shape, available, space.allow_disk_activations)? {
                Some((policy, est)) => {
                    feasible += 1;
                    if let Some((candidate, score)) = rank(policy, &est)
                        && best.as_ref().is_none_or(|(_, b)| score > b * (1.0 + 1e-9))
                    {
                        best = Some((candidate, score));
                    }
                }
                None => {
                    if i == 0 {
                        dead_combo = Some(combo);
                    }
                    break;
                }
            }
        }
    }
    Ok((best.map(|(t, _)| t), solved, feasible))
}

/// Explain why nothing fits: for the smallest shapes of the space, the least memory each tier
/// needs (GPU alone; CPU given GPU and disk; disk given GPU and CPU).
fn diagnose(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    space: &SearchSpace,
    available: &TierBytes,
) -> PolicyError {
    let gbs = space.gpu_batch_sizes.iter().copied().min().unwrap_or(1);
    let nb = space.num_gpu_batches.iter().copied().min().unwrap_or(1);
    let mut shapes = Vec::new();
    for &cpu_attention in &space.cpu_attention {
        for &compress_weights in &space.weight_compression {
            for &compress_cache in &space.cache_compression {
                shapes.push(PolicyShape {
                    gpu_batch_size: gbs,
                    num_gpu_batches: nb,
                    cpu_attention,
                    overlap: space.overlap,
                    compress_weights,
                    compress_cache,
                });
            }
        }
    }
    for tier in Tier::ALL {
        let mut least = f64::INFINITY;
        for shape in &shapes {
            let Ok(lm) = LinearModel::build(hw, model, workload, shape) else { continue };
            // The GPU check ignores the other tiers; lower tiers keep the limits of the others.
            let limits = match tier {
                Tier::Gpu => [None, None, None],
                _ => limits_of(available),
            };
            if let Ok(Some(x)) = run_lp(&lm, &limits, space.allow_disk_activations, Goal::MinimizeTier(tier)) {
                let est = lm.evaluate(&x);
                let used = est.peak_memory.max().on(tier);
                least = least.min(used);
            }
        }
        // An infinite `least` means the other tiers' limits conflict; a later tier reports it.
        if least.is_finite() && least > available.on(tier) * (1.0 + LP_MEMORY_TOLERANCE) {
            let needed = least;
            let what = match tier {
                Tier::Gpu => format!(
                    "even one layer's working set (gpu_batch_size = {gbs}, prompt {} + {} tokens, everything else offloaded)",
                    workload.prompt_len, workload.gen_len
                ),
                Tier::Cpu => "the offloaded weights, KV cache and staging buffers (with GPU and disk full)".into(),
                Tier::Disk => "what does not fit in GPU and CPU memory".into(),
            };
            return PolicyError::InsufficientMemory {
                tier,
                needed_bytes: needed,
                available_bytes: available.on(tier),
                what,
            };
        }
    }
    let total = available.gpu + available.cpu + available.disk;
    PolicyError::InsufficientMemory {
        tier: Tier::Disk,
        needed_bytes: total,
        available_bytes: total,
        what: "the tiers together (each fits alone, not all at once)".into(),
    }
}
