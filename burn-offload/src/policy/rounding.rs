//! Rounding an LP placement to what the runtime can execute: whole layers of weights, whole
//! KV-cache tensors (one per layer and GPU batch) and whole activation tensors (one per GPU
//! batch), then re-checking memory.
//!
//! The LP treats percentages as continuous (FlexGen §4.3 relaxes them "since it is changing
//! gradually"). With whole layers, a layer's weights are either resident or loaded in full, so
//! the estimate here is the layer-weighted sum of per-layer costs (a GPU-resident layer has no
//! weight transfer, an offloaded one moves all of `W`), and the weight working buffers are those
//! of whole layers: up to two offloaded layers in flight on the GPU (current and prefetched), one
//! staged on the CPU, one read from disk.
//!
//! Note on terms: FlexGen's paper calls its weight split "layer granularity" meaning *tensors
//! within each layer*; this crate's runtime places whole layers, so this helper rounds to those.

use serde::{Deserialize, Serialize};

use super::cost::{CostEstimate, LinearModel, TermBreakdown, TierBytes, stored_layer_weight_bytes};
use super::error::PolicyError;
use super::hardware::HardwareProfile;
use super::model::{ModelShape, OffloadWorkload};
use super::types::{Placement, Policy, PolicyShape, Tier};

/// A policy rounded to whole layers and tensors, with its re-checked estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundedPolicy {
    /// The policy with percentages equal to the rounded counts.
    pub policy: Policy,
    /// Layers whose weights live on `[gpu, cpu, disk]`.
    pub weight_layers: [u64; 3],
    /// Tier of each layer's weights, GPU-resident layers spread evenly over the depth.
    pub layer_tiers: Vec<Tier>,
    /// KV-cache tensors (one per layer and GPU batch, `l · num_gpu_batches` in all) on
    /// `[gpu, cpu, disk]`.
    pub cache_tensors: [u64; 3],
    /// Activation tensors (one per GPU batch) on `[gpu, cpu, disk]`.
    pub activation_tensors: [u64; 3],
    /// Cost-model estimate for the whole-layer placement.
    pub estimate: CostEstimate,
}

/// Unit counts per tier for the three tensor kinds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    kinds: [[u64; 3]; 3],
    totals: [u64; 3],
}

impl Counts {
    fn placement(&self, kind: usize) -> Placement {
        let t = self.totals[kind].max(1) as f64;
        Placement::from_array(self.kinds[kind].map(|c| c as f64 / t))
    }

    fn vector(&self) -> [f64; 9] {
        let mut x = [0.0; 9];
        for kind in 0..3 {
            let p = self.placement(kind).to_array();
            x[3 * kind..3 * kind + 3].copy_from_slice(&p);
        }
        x
    }
}

/// Largest-first floor rounding: GPU gets `⌊p.gpu·N⌋`, GPU+CPU get `⌊(p.gpu+p.cpu)·N⌋`, disk the
/// rest, so rounding errs toward the larger, slower tiers.
fn floor_counts(p: Placement, total: u64) -> [u64; 3] {
    let n = total as f64;
    let g = ((p.gpu * n + 1e-6).floor().max(0.0) as u64).min(total);
    let gc = (((p.gpu + p.cpu) * n + 1e-6).floor().max(0.0) as u64).clamp(g, total);
    [g, gc - g, total - gc]
}

/// Estimate for whole layers: per-class times weighted by layer counts, fractional homes plus
/// whole-layer working buffers.
fn evaluate_counts(lm: &LinearModel, w_stored: f64, counts: &Counts) -> CostEstimate {
    let x = counts.vector();
    let base = lm.evaluate(&x);
    let l = counts.totals[0] as f64;
    let wl = counts.kinds[0];

    let (mut t_pre, mut t_gen) = (0.0, 0.0);
    let zero = TermBreakdown {
        cpu_to_gpu: 0.0,
        gpu_to_cpu: 0.0,
        disk_to_cpu: 0.0,
        cpu_to_disk: 0.0,
        compute: 0.0,
        serial: 0.0,
        quantization: 0.0,
    };
    let (mut pre_terms, mut gen_terms) = (zero, zero);
    let add = |acc: &mut TermBreakdown, t: &TermBreakdown, w: f64| {
        acc.cpu_to_gpu += w * t.cpu_to_gpu;
        acc.gpu_to_cpu += w * t.gpu_to_cpu;
        acc.disk_to_cpu += w * t.disk_to_cpu;
        acc.cpu_to_disk += w * t.cpu_to_disk;
        acc.compute += w * t.compute;
        acc.serial += w * t.serial;
        acc.quantization += w * t.quantization;
    };
    for tier in Tier::ALL {
        let k = wl[tier.index()];
        if k == 0 {
            continue;
        }
        let mut xc = x;
        xc[0..3].copy_from_slice(&Placement::all_on(tier).to_array());
        let e = lm.evaluate(&xc);
        let share = k as f64 / l;
        t_pre += share * e.t_prefill_layer;
        t_gen += share * e.t_decode_layer;
        add(&mut pre_terms, &e.prefill_terms, share);
        add(&mut gen_terms, &e.decode_terms, share);
    }
    let off = (wl[1] + wl[2]) as f64;
    let disk = wl[2] as f64;
    let gpu_fix = (off.min(2.0) * w_stored - 2.0 * off / l * w_stored).max(0.0);
    let cpu_p_fix = (off.min(1.0) * w_stored - off / l * w_stored).max(0.0);
    let cpu_g_fix = (disk.min(1.0) * w_stored - disk / l * w_stored).max(0.0);
    let mut peak = base.peak_memory;
    peak.prefill.gpu += gpu_fix;
    peak.decode.gpu += gpu_fix;
    peak.prefill.cpu += cpu_p_fix;
    peak.decode.cpu += cpu_g_fix;
    lm.estimate([t_pre, t_gen], [pre_terms, gen_terms], peak)
}

/// Spread `count` marks evenly over `len` slots.
fn spread(count: usize, len: usize) -> Vec<bool> {
    let mut marks = vec![false; len];
    if count == 0 || len == 0 {
        return marks;
    }
    for j in 0..count.min(len) {
        let idx = ((2 * j + 1) * len) / (2 * count.min(len));
        if let Some(m) = marks.get_mut(idx.min(len - 1)) {
            *m = true;
        }
    }
    marks
}

/// Which tier each layer's weights live on: GPU layers spread evenly, then disk layers spread
/// evenly over the rest, CPU layers in between.
fn layer_tiers(w: [u64; 3]) -> Vec<Tier> {
    let l = (w[0] + w[1] + w[2]) as usize;
    let gpu = spread(w[0] as usize, l);
    let rest = l - gpu.iter().filter(|m| **m).count();
    let disk = spread(w[2] as usize, rest);
    let mut out = Vec::with_capacity(l);
    let mut r = 0;
    for is_gpu in gpu {
        if is_gpu {
            out.push(Tier::Gpu);
        } else {
            out.push(if disk.get(r).copied().unwrap_or(false) { Tier::Disk } else { Tier::Cpu });
            r += 1;
        }
    }
    out
}

/// Round `policy` to whole layers (weights) and whole tensors (cache, activations), then make it
/// fit: while a tier overflows, move one unit of the kind whose move costs the least throughput
/// one tier down; then, while a unit can move one tier up, still fit and raise throughput, move
/// it. Errors when the disk overflows or nothing can move.
pub fn round_to_whole(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    policy: &Policy,
    reserved: &TierBytes,
) -> Result<RoundedPolicy, PolicyError> {
    policy.validate()?;
    let shape: PolicyShape = policy.shape;
    let lm = LinearModel::build(hw, model, workload, &shape)?;
    let available = TierBytes::available(hw, reserved);
    let w_stored = stored_layer_weight_bytes(model, &shape);
    let l = u64::from(model.num_layers);
    let nb = u64::from(policy.shape.num_gpu_batches);
    let totals = [l, l * nb, nb];
    let placements = [policy.weights, policy.cache, policy.activations];
    let mut counts = Counts {
        kinds: [
            floor_counts(placements[0], totals[0]),
            floor_counts(placements[1], totals[1]),
            floor_counts(placements[2], totals[2]),
        ],
        totals,
    };
    // Kinds that may go to disk: activations only if the policy already put some there.
    let disk_ok = [true, true, policy.activations.disk > 0.0];
    let max_steps = (totals.iter().sum::<u64>() as usize + 1) * 3;

    let mut est = evaluate_counts(&lm, w_stored, &counts);
    let mut steps = 0;
    while let Some((constraint, needed, have)) = est.memory_overflow(&available) {
        steps += 1;
        let tier = constraint.tier();
        let below = match tier {
            Tier::Gpu => Tier::Cpu,
            Tier::Cpu => Tier::Disk,
            Tier::Disk => {
                return Err(PolicyError::InsufficientMemory {
                    tier,
                    needed_bytes: needed,
                    available_bytes: have,
                    what: "the rounded placement".into(),
                });
            }
        };
        let mut best: Option<(Counts, CostEstimate)> = None;
        for (kind, &may_use_disk) in disk_ok.iter().enumerate() {
            if counts.kinds[kind][tier.index()] == 0 || (below == Tier::Disk && !may_use_disk) {
                continue;
            }
            let mut c = counts;
            c.kinds[kind][tier.index()] -= 1;
            c.kinds[kind][below.index()] += 1;
            let e = evaluate_counts(&lm, w_stored, &c);
            if best.as_ref().is_none_or(|(_, b)| e.throughput_tokens_per_s > b.throughput_tokens_per_s) {
                best = Some((c, e));
            }
        }
        match best {
            Some((c, e)) if steps <= max_steps => {
                counts = c;
                est = e;
            }
            _ => {
                return Err(PolicyError::InsufficientMemory {
                    tier,
                    needed_bytes: needed,
                    available_bytes: have,
                    what: "the rounded placement (nothing left to move down)".into(),
                });
            }
        }
    }

    // Greedy promotion: recover what flooring gave away.
    for _ in 0..max_steps {
        let mut best: Option<(Counts, CostEstimate)> = None;
        for kind in 0..3 {
            for (from, to) in [(Tier::Cpu, Tier::Gpu), (Tier::Disk, Tier::Cpu)] {
                if counts.kinds[kind][from.index()] == 0 {
                    continue;
                }
                let mut c = counts;
                c.kinds[kind][from.index()] -= 1;
                c.kinds[kind][to.index()] += 1;
                let e = evaluate_counts(&lm, w_stored, &c);
                let target = best.as_ref().map_or(est.throughput_tokens_per_s, |(_, b)| b.throughput_tokens_per_s);
                if e.fits(&available) && e.throughput_tokens_per_s > target * (1.0 + 1e-9) {
                    best = Some((c, e));
                }
            }
        }
        match best {
            Some((c, e)) => {
                counts = c;
                est = e;
            }
            None => break,
        }
    }

    let rounded = Policy::from_parts(shape, counts.placement(0), counts.placement(1), counts.placement(2));
    Ok(RoundedPolicy {
        policy: rounded,
        weight_layers: counts.kinds[0],
        layer_tiers: layer_tiers(counts.kinds[0]),
        cache_tensors: counts.kinds[1],
        activation_tensors: counts.kinds[2],
        estimate: est,
    })
}
