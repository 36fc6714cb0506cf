//! The `stages` planner over heterogeneous devices with a tensor-parallel degree chosen per stage
//! (Alpa's inter-operator DP, thesis §3.5.2, Eq. 3.3, over (layers, submesh) choices): the
//! devices are listed in pipeline order, each stage takes the next `g` of them as one
//! tensor-parallel group of degree `g`, and every device is used (Alpa's submeshes cover the
//! cluster). The number of stages is free (Eq. 3.4 minimises over `s`).
//!
//! Each candidate group (its first device and its degree) brings its measured per-layer latency
//! at that degree, its fixed cost per request, and its link to the next stage's first device. A
//! stage on a group of degree `g` holds `⌈Σ its layers' bytes / g⌉` on every device of the group,
//! plus the embeddings (first stage) and the LM head (last stage) on the group's first device.
//!
//! `F(k, d; t_max)` is the least total latency of covering layers `0..k` with stages on devices
//! `0..d`, every stage at most `t_max`; the optimal bottleneck is the smallest `t_max` for which
//! `F(L, N)` is finite, found by bisection over every possible stage cost (feasibility grows with
//! the bound), and the split at that bound with the least total is kept.
//!
//! Stages that slow each other down when they work at once (`interference`, a measured `κ > 0`)
//! are split for the least `max + κ·(Σ − max)` of their costs, as the `stages` planner over
//! devices does: the least-total split of every feasible bound is scored (at most 512 bounds).

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
use super::stages::{StageExtra, least_interval, smallest_feasible};
use crate::units::fmt_bytes;

/// Largest number of layers, devices or groups accepted.
const MAX_ITEMS: usize = 4096;
/// Largest number of candidate stage costs the search sorts.
const MAX_CANDIDATES: usize = 1 << 24;

/// One device of the pipeline, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupDevice {
    /// How errors and outputs name the device (`flex`, `ws://host:3001`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Bytes this device can give its stage.
    pub memory_bytes: u64,
}

/// A candidate stage placement: devices `first_device .. first_device + degree` as one
/// tensor-parallel group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroup {
    /// The group's first device (its rank 0) in `devices`.
    pub first_device: usize,
    /// Devices in the group: its tensor-parallel degree (≥ 1).
    pub degree: usize,
    /// Latency of each layer split over the group, in milliseconds (one entry per layer).
    pub layer_latency_ms: Vec<f64>,
    /// Milliseconds a stage on this group costs whatever layers it holds.
    #[serde(default)]
    pub fixed_ms: f64,
    /// Milliseconds to hand the stage's output to the next stage's first device (unused when the
    /// group ends the pipeline).
    #[serde(default)]
    pub link_ms: f64,
}

/// Input of [`plan`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupStagesInput {
    /// Bytes each layer needs at degree 1 (weights and KV cache); split evenly over a group.
    pub layer_memory_bytes: Vec<u64>,
    /// The devices, in pipeline order.
    pub devices: Vec<GroupDevice>,
    /// The groups a stage may run on (every single device at degree 1 should be among them,
    /// unless it may only run inside a larger group).
    pub groups: Vec<DeviceGroup>,
    /// What the first stage holds beyond its layers (embeddings), on its first device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage: Option<StageExtra>,
    /// What the last stage holds beyond its layers (final norm, LM head), on its first device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage: Option<StageExtra>,
    /// How much stages slow each other down when they work at once: `κ` of
    /// [`Interference`](crate::interference::Interference) (0, the default: not at all).
    #[serde(default)]
    pub interference: f64,
}

/// One planned stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStage {
    /// Half-open layer range.
    pub layers: [usize; 2],
    /// The group's first device.
    pub first_device: usize,
    /// Its tensor-parallel degree (devices `first_device .. first_device + degree`).
    pub degree: usize,
    /// The stage's latency (layers at its degree, fixed cost, extras, link).
    pub latency_ms: f64,
    /// Bytes the group's first device holds (its share of the layers, and the extras).
    pub memory_bytes: u64,
}

/// Output of [`plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStagesOutput {
    /// The stages in order, covering every layer and every device.
    pub stages: Vec<GroupStage>,
    /// The slowest stage's latency.
    pub bottleneck_ms: f64,
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GroupStagesError {
    /// A field cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
    /// No choice of groups and layer split fits every device's memory cap.
    #[error(
        "no split of {layers} layers over the {devices} devices' groups fits every device's memory cap \
         (smallest cap: {smallest_cap} on `{device}`): give the devices more memory (--device-memory), \
         add devices or allow larger tensor-parallel groups"
    )]
    NoSplit {
        /// Layers.
        layers: usize,
        /// Devices.
        devices: usize,
        /// The smallest cap, formatted.
        smallest_cap: String,
        /// The device with it.
        device: String,
    },
}

/// Plans stages, each on a group of consecutive devices at its own degree (see the module docs).
pub fn plan(input: &GroupStagesInput) -> Result<GroupStagesOutput, GroupStagesError> {
    let problem = Problem::checked(input)?;
    let mut candidates = Vec::new();
    for g in 0..input.groups.len() {
        for a in 0..problem.layers {
            for b in a + 1..=problem.layers {
                if let Some(ms) = problem.cost(g, a, b) {
                    candidates.push(ms);
                }
                if candidates.len() > MAX_CANDIDATES {
                    return Err(
                        InputError::new("groups", "make the search too large; give fewer groups or layers").into()
                    );
                }
            }
        }
    }
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    let fastest = smallest_feasible(&candidates, |t_max| problem.min_total(t_max)).ok_or_else(|| problem.no_split())?;
    let stage_costs = |o: &GroupStagesOutput| -> Vec<f64> { o.stages.iter().map(|s| s.latency_ms).collect() };
    Ok(least_interval(&candidates, fastest, input.interference, stage_costs, |t_max| problem.min_total(t_max)))
}

/// The checked input with prefix sums.
struct Problem<'a> {
    input: &'a GroupStagesInput,
    /// `latency[g][k]`: group `g`'s latency of layers `0..k`.
    latency: Vec<Vec<f64>>,
    /// Bytes of layers `0..k`.
    memory: Vec<u128>,
    first: StageExtra,
    last: StageExtra,
    layers: usize,
    devices: usize,
}

impl<'a> Problem<'a> {
    fn checked(input: &'a GroupStagesInput) -> Result<Self, InputError> {
        let layers = input.layer_memory_bytes.len();
        let devices = input.devices.len();
        check::count("layer_memory_bytes", layers, MAX_ITEMS)?;
        check::count("devices", devices, MAX_ITEMS)?;
        check::count("groups", input.groups.len(), MAX_ITEMS)?;
        for (g, group) in input.groups.iter().enumerate() {
            let field = |name: &str| format!("groups[{g}].{name}");
            if group.degree == 0 || group.first_device.saturating_add(group.degree) > devices {
                return Err(InputError::new(
                    field("degree"),
                    format!(
                        "devices {}..{} are not all among the {devices} devices; give a group inside the list",
                        group.first_device,
                        group.first_device.saturating_add(group.degree)
                    ),
                ));
            }
            if input.groups[..g].iter().any(|o| o.first_device == group.first_device && o.degree == group.degree) {
                return Err(InputError::new(field("first_device"), "this group is listed twice; give it once"));
            }
            check::same_len(&field("layer_latency_ms"), &group.layer_latency_ms, layers, "layers")?;
            check::latencies(&field("layer_latency_ms"), &group.layer_latency_ms)?;
            check::non_negative(&field("fixed_ms"), group.fixed_ms)?;
            check::non_negative(&field("link_ms"), group.link_ms)?;
        }
        let (first, last) = (input.first_stage.unwrap_or_default(), input.last_stage.unwrap_or_default());
        check::non_negative("first_stage.latency_ms", first.latency_ms)?;
        check::non_negative("last_stage.latency_ms", last.latency_ms)?;
        check::non_negative("interference", input.interference)?;
        let latency = input
            .groups
            .iter()
            .map(|g| {
                let mut acc = 0.0;
                std::iter::once(0.0)
                    .chain(g.layer_latency_ms.iter().map(|v| {
                        acc += v;
                        acc
                    }))
                    .collect()
            })
            .collect();
        let mut memory = vec![0u128];
        for &m in &input.layer_memory_bytes {
            memory.push(memory[memory.len() - 1] + u128::from(m));
        }
        Ok(Self { input, latency, memory, first, last, layers, devices })
    }

    /// Bytes on group `g`'s first device when its stage runs layers `a..b`, and on its other
    /// devices; `None` when a device of the group cannot hold them.
    fn fits(&self, g: usize, a: usize, b: usize) -> Option<u128> {
        let group = &self.input.groups[g];
        let degree = group.degree as u128;
        let share = (self.memory[b] - self.memory[a]).div_ceil(degree);
        let mut extras = 0u128;
        if a == 0 && group.first_device == 0 {
            extras += u128::from(self.first.memory_bytes);
        }
        if b == self.layers && group.first_device + group.degree == self.devices {
            extras += u128::from(self.last.memory_bytes);
        }
        let devices = &self.input.devices[group.first_device..group.first_device + group.degree];
        let rank0 = share + extras;
        let fits =
            devices.iter().enumerate().all(|(r, d)| u128::from(d.memory_bytes) >= if r == 0 { rank0 } else { share });
        fits.then_some(rank0)
    }

    /// Group `g`'s stage cost over layers `a..b` as the stage that starts at device
    /// `first_device` (first and last stage extras by position), or `None` when it cannot hold
    /// them or could not stand at that position (the first stage must start at layer 0 on device
    /// 0, the last end at both ends).
    fn cost(&self, g: usize, a: usize, b: usize) -> Option<f64> {
        let group = &self.input.groups[g];
        let starts = group.first_device == 0;
        let ends = group.first_device + group.degree == self.devices;
        if starts != (a == 0) || ends != (b == self.layers) {
            return None;
        }
        self.fits(g, a, b)?;
        let mut ms = self.latency[g][b] - self.latency[g][a] + group.fixed_ms;
        if starts {
            ms += self.first.latency_ms;
        }
        if ends {
            ms += self.last.latency_ms;
        } else {
            ms += group.link_ms;
        }
        Some(ms)
    }

    /// The plan with every stage at most `t_max` and the least total, if any.
    fn min_total(&self, t_max: f64) -> Option<GroupStagesOutput> {
        let (layers, devices) = (self.layers, self.devices);
        // f[k][d]: least total covering layers 0..k on devices 0..d; from[k][d]: (group, a).
        let mut f = vec![vec![f64::INFINITY; devices + 1]; layers + 1];
        let mut from = vec![vec![(usize::MAX, 0usize); devices + 1]; layers + 1];
        f[0][0] = 0.0;
        let mut by_start: Vec<Vec<usize>> = vec![Vec::new(); devices];
        for (g, group) in self.input.groups.iter().enumerate() {
            by_start[group.first_device].push(g);
        }
        for a in 0..layers {
            for d in 0..devices {
                if !f[a][d].is_finite() {
                    continue;
                }
                for &g in &by_start[d] {
                    let end = d + self.input.groups[g].degree;
                    for b in a + 1..=layers {
                        let Some(ms) = self.cost(g, a, b).filter(|&ms| ms <= t_max) else { continue };
                        let total = f[a][d] + ms;
                        if total < f[b][end] {
                            f[b][end] = total;
                            from[b][end] = (g, a);
                        }
                    }
                }
            }
        }
        if !f[layers][devices].is_finite() {
            return None;
        }
        let mut stages = Vec::new();
        let (mut k, mut d) = (layers, devices);
        while k > 0 {
            let (g, a) = from[k][d];
            let group = &self.input.groups[g];
            let latency_ms = self.cost(g, a, k)?;
            let memory = self.fits(g, a, k)?;
            stages.push(GroupStage {
                layers: [a, k],
                first_device: group.first_device,
                degree: group.degree,
                latency_ms,
                memory_bytes: u64::try_from(memory).unwrap_or(u64::MAX),
            });
            (k, d) = (a, group.first_device);
        }
        stages.reverse();
        let bottleneck_ms = stages.iter().map(|s| s.latency_ms).fold(0.0, f64::max);
        Some(GroupStagesOutput { stages, bottleneck_ms })
    }

    fn no_split(&self) -> GroupStagesError {
        let (index, smallest) = self
            .input
            .devices
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| d.memory_bytes)
            .map_or((0, 0), |(i, d)| (i, d.memory_bytes));
        let device =
            self.input.devices.get(index).and_then(|d| d.name.clone()).unwrap_or_else(|| format!("device {index}"));
        GroupStagesError::NoSplit {
            layers: self.layers,
            devices: self.devices,
            smallest_cap: fmt_bytes(smallest),
            device,
        }
    }
}
