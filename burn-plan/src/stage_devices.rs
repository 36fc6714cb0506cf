//! The `stages` planner over heterogeneous devices (Alpa's inter-operator DP, thesis §3.5.2, with
//! each stage bound to its own device): stage `s` runs on `devices[s]` at that device's measured
//! per-layer latency, under that device's memory cap, plus what only the first stage (embeddings)
//! and the last stage (final norm, LM head) hold, plus the time to hand its output to the next
//! stage's device, plus the device's fixed cost per stage (its passes' synchronisations).
//!
//! The search is the homogeneous planner's: the optimal bottleneck is the smallest stage cost
//! `t_max` for which a split keeps every stage at most `t_max` (found by bisection over every
//! stage's possible cost, feasibility growing with the bound), and among the splits at that bound
//! the one with the least total cost is kept (`F(s, k; t_max)` of Eq. 3.3 with the device fixed
//! by `s`).
//!
//! Stages that slow each other down when they work at once (a measured interference `κ > 0`,
//! `burn_parallel::profiler::pipeline_interference`) are split for the least `max + κ·(Σ − max)` of
//! their costs instead: what one micro-batch adds to a pipelined pass. A looser bound can then
//! win by a smaller sum, so the least-sum split of every feasible bound is scored (at most
//! 512 bounds, spread evenly, the tightest and loosest among them).

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
use super::stages::{StagesError, StagesInput, StagesOutput, least_interval, smallest_feasible};
use crate::units::fmt_bytes;

/// One device of a heterogeneous pipeline, the stage of its position in `devices` runs on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageDevice {
    /// How errors and outputs name the device (`flex`, `ws://host:3001`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Latency of each layer on this device, in milliseconds (one entry per layer).
    pub layer_latency_ms: Vec<f64>,
    /// Bytes this device can give its stage (weights, KV cache and extras).
    pub memory_bytes: u64,
    /// Milliseconds to hand the stage's output to the next stage's device (ignored on the last).
    #[serde(default)]
    pub link_ms: f64,
    /// Milliseconds the stage costs on this device whatever layers it holds: the fixed cost of
    /// its passes (issuing them and the synchronisation ending each, a round trip to a worker).
    #[serde(default)]
    pub fixed_ms: f64,
}

/// What the first or the last stage holds beyond its layers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageExtra {
    /// Its time per request, in milliseconds, on whichever device holds it.
    #[serde(default)]
    pub latency_ms: f64,
    /// Its bytes.
    #[serde(default)]
    pub memory_bytes: u64,
}

/// Why heterogeneous devices cannot be split as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceStagesError {
    /// A device cannot hold even its smallest possible stage.
    #[error(
        "device {index} (`{name}`) can hold {cap} but its stage needs at least {needed} (one layer{extras}): \
         give it more memory (--device-memory) or leave it out of --devices"
    )]
    DeviceTooSmall {
        /// Position in `devices`.
        index: usize,
        /// The device's name.
        name: String,
        /// Its cap, formatted.
        cap: String,
        /// The smallest stage it could run, formatted.
        needed: String,
        /// What beyond a layer the stage holds (`" and the embeddings"`), or nothing.
        extras: &'static str,
    },
    /// The devices together hold less than the model.
    #[error(
        "the model needs {needed} (layers, embeddings and LM head) but the {devices} devices' memory caps add up to \
         {available}: add devices or give them more memory (--device-memory)"
    )]
    ModelTooLarge {
        /// The model's bytes, formatted.
        needed: String,
        /// The caps' sum, formatted.
        available: String,
        /// Devices.
        devices: usize,
    },
    /// Every device could hold a stage and together they hold the model, but no contiguous split
    /// fits every cap.
    #[error(
        "no split of {layers} layers into {stages} contiguous stages fits every device's memory cap: \
         give the devices more memory (--device-memory) or add devices"
    )]
    NoSplit {
        /// Stages (devices).
        stages: usize,
        /// Layers.
        layers: usize,
    },
}

/// Plans `input`'s stages over its (checked by the caller: layers, stages) heterogeneous `devices`.
pub(super) fn plan(input: &StagesInput, devices: &[StageDevice]) -> Result<StagesOutput, StagesError> {
    let layers = input.layer_latency_ms.len();
    let stages = input.stages;
    check::same_len("devices", devices, stages, "stages")?;
    if input.tensor_parallel.is_some() {
        return Err(InputError::new("tensor_parallel", "cannot be combined with `devices`; drop one").into());
    }
    if input.stage_memory_bytes.is_some() {
        return Err(
            InputError::new("stage_memory_bytes", "is replaced by each device's `memory_bytes`; drop it").into()
        );
    }
    let Some(memory) = &input.layer_memory_bytes else {
        return Err(InputError::new("layer_memory_bytes", "is missing; give it with `devices`").into());
    };
    check::same_len("layer_memory_bytes", memory, layers, "layers")?;
    for (i, d) in devices.iter().enumerate() {
        let field = format!("devices[{i}].layer_latency_ms");
        check::same_len(&field, &d.layer_latency_ms, layers, "layers")?;
        check::latencies(&field, &d.layer_latency_ms)?;
        check::non_negative(&format!("devices[{i}].link_ms"), d.link_ms)?;
        check::non_negative(&format!("devices[{i}].fixed_ms"), d.fixed_ms)?;
    }
    let first = input.first_stage.unwrap_or_default();
    let last = input.last_stage.unwrap_or_default();
    check::non_negative("first_stage.latency_ms", first.latency_ms)?;
    check::non_negative("last_stage.latency_ms", last.latency_ms)?;
    if stages > layers {
        return Err(StagesError::TooManyStages { stages, layers });
    }
    check::non_negative("interference", input.interference)?;
    let problem = Problem::new(devices, memory, first, last, input.interference);
    problem.check_capacity()?;
    let (ranges, costs) = problem.solve().ok_or(DeviceStagesError::NoSplit { stages, layers })?;
    let stage_memory_bytes = ranges
        .iter()
        .enumerate()
        .map(|(s, r)| u64::try_from(problem.memory(s, r[0], r[1])).unwrap_or(u64::MAX))
        .collect();
    Ok(StagesOutput {
        stages: ranges,
        bottleneck_ms: costs.iter().copied().fold(0.0, f64::max),
        stage_latency_ms: costs,
        tensor_parallel_degrees: None,
        stage_memory_bytes: Some(stage_memory_bytes),
    })
}

/// The checked problem: prefix sums per device.
struct Problem<'a> {
    devices: &'a [StageDevice],
    /// `latency[s][k]`: device `s`'s latency of layers `0..k`.
    latency: Vec<Vec<f64>>,
    /// Bytes of layers `0..k`.
    memory: Vec<u128>,
    first: StageExtra,
    last: StageExtra,
    layers: usize,
    /// `κ`: a split is scored `max + κ·(Σ − max)` of its stage costs.
    interference: f64,
}

impl<'a> Problem<'a> {
    fn new(devices: &'a [StageDevice], memory: &[u64], first: StageExtra, last: StageExtra, interference: f64) -> Self {
        let prefix = |values: &mut dyn Iterator<Item = f64>| {
            let mut acc = 0.0;
            std::iter::once(0.0)
                .chain(values.map(|v| {
                    acc += v;
                    acc
                }))
                .collect::<Vec<f64>>()
        };
        let latency = devices.iter().map(|d| prefix(&mut d.layer_latency_ms.iter().copied())).collect();
        let mut bytes = vec![0u128];
        for &m in memory {
            bytes.push(bytes[bytes.len() - 1] + u128::from(m));
        }
        Self { devices, latency, memory: bytes, first, last, layers: memory.len(), interference }
    }

    fn stages(&self) -> usize {
        self.devices.len()
    }

    /// What stage `s` holds beyond its layers: (latency, bytes).
    fn extras(&self, s: usize) -> (f64, u128) {
        let mut extra = (self.devices[s].fixed_ms, 0u128);
        if s == 0 {
            extra = (extra.0 + self.first.latency_ms, u128::from(self.first.memory_bytes));
        }
        if s + 1 == self.stages() {
            extra = (extra.0 + self.last.latency_ms, extra.1 + u128::from(self.last.memory_bytes));
        } else {
            extra.0 += self.devices[s].link_ms;
        }
        extra
    }

    /// Bytes stage `s` holds when it runs layers `a..b`.
    fn memory(&self, s: usize, a: usize, b: usize) -> u128 {
        self.memory[b] - self.memory[a] + self.extras(s).1
    }

    /// Stage `s`'s cost over layers `a..b`, or `None` when its device cannot hold them.
    fn cost(&self, s: usize, a: usize, b: usize) -> Option<f64> {
        (self.memory(s, a, b) <= u128::from(self.devices[s].memory_bytes))
            .then(|| self.latency[s][b] - self.latency[s][a] + self.extras(s).0)
    }

    /// Errors naming the device that cannot hold one layer, or the shortfall of all caps.
    fn check_capacity(&self) -> Result<(), DeviceStagesError> {
        let smallest = (0..self.layers).map(|l| self.memory[l + 1] - self.memory[l]).min().unwrap_or(0);
        for (s, d) in self.devices.iter().enumerate() {
            let needed = smallest + self.extras(s).1;
            if needed > u128::from(d.memory_bytes) {
                let extras = match (s == 0, s + 1 == self.stages()) {
                    (true, true) => ", the embeddings and the LM head",
                    (true, false) => " and the embeddings",
                    (false, true) => " and the final norm and LM head",
                    (false, false) => "",
                };
                return Err(DeviceStagesError::DeviceTooSmall {
                    index: s,
                    name: d.name.clone().unwrap_or_else(|| format!("device {s}")),
                    cap: fmt_bytes(d.memory_bytes),
                    needed: fmt_bytes(u64::try_from(needed).unwrap_or(u64::MAX)),
                    extras,
                });
            }
        }
        let needed =
            self.memory[self.layers] + u128::from(self.first.memory_bytes) + u128::from(self.last.memory_bytes);
        let available: u128 = self.devices.iter().map(|d| u128::from(d.memory_bytes)).sum();
        if needed > available {
            let fmt = |b: u128| fmt_bytes(u64::try_from(b).unwrap_or(u64::MAX));
            return Err(DeviceStagesError::ModelTooLarge {
                needed: fmt(needed),
                available: fmt(available),
                devices: self.stages(),
            });
        }
        Ok(())
    }

    /// Layers stage `s` may start at and end before (every stage keeps at least one layer).
    fn bounds(&self, s: usize) -> (usize, usize) {
        (s, self.layers - (self.stages() - 1 - s))
    }

    /// The optimal split (least bottleneck, then least total) and its stage costs.
    fn solve(&self) -> Option<(Vec<[usize; 2]>, Vec<f64>)> {
        let mut candidates = Vec::new();
        for s in 0..self.stages() {
            let (lo, hi) = self.bounds(s);
            for a in lo..hi {
                candidates.extend((a + 1..=hi).filter_map(|b| self.cost(s, a, b)));
            }
        }
        candidates.sort_by(f64::total_cmp);
        candidates.dedup();
        let fastest = smallest_feasible(&candidates, |t_max| self.min_total(t_max))?;
        Some(least_interval(
            &candidates,
            fastest,
            self.interference,
            |split| split.1.clone(),
            |t_max| self.min_total(t_max),
        ))
    }

    /// The split with every stage at most `t_max` and the least total cost, if any.
    fn min_total(&self, t_max: f64) -> Option<(Vec<[usize; 2]>, Vec<f64>)> {
        let (stages, layers) = (self.stages(), self.layers);
        // f[s][k]: least total of stages 0..s covering layers 0..k; from[s][k]: the boundary before.
        let mut f = vec![vec![f64::INFINITY; layers + 1]; stages + 1];
        let mut from = vec![vec![0usize; layers + 1]; stages + 1];
        f[0][0] = 0.0;
        for s in 0..stages {
            let (lo, hi) = self.bounds(s);
            for a in lo..hi {
                if !f[s][a].is_finite() {
                    continue;
                }
                for b in a + 1..=hi {
                    let Some(cost) = self.cost(s, a, b).filter(|&c| c <= t_max) else { continue };
                    if f[s][a] + cost < f[s + 1][b] {
                        f[s + 1][b] = f[s][a] + cost;
                        from[s + 1][b] = a;
                    }
                }
            }
        }
        if !f[stages][layers].is_finite() {
            return None;
        }
        let mut ranges = vec![[0, 0]; stages];
        let mut costs = vec![0.0; stages];
        let mut k = layers;
        for s in (0..stages).rev() {
            let a = from[s + 1][k];
            ranges[s] = [a, k];
            costs[s] = self.cost(s, a, k)?;
            k = a;
        }
        Some((ranges, costs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stages::plan as plan_stages;

    fn device(lat: f64, layers: usize, memory: u64) -> StageDevice {
        StageDevice {
            name: None,
            layer_latency_ms: vec![lat; layers],
            memory_bytes: memory,
            link_ms: 0.0,
            fixed_ms: 0.0,
        }
    }

    fn input(devices: Vec<StageDevice>, layers: usize) -> StagesInput {
        StagesInput {
            layer_latency_ms: vec![1.0; layers],
            stages: devices.len(),
            layer_memory_bytes: Some(vec![10; layers]),
            devices: Some(devices),
            ..StagesInput::default()
        }
    }

    #[test]
    fn stages_that_interfere_trade_the_bottleneck_for_a_smaller_sum() {
        // 6 layers, the first device twice as fast. Balanced (κ = 0): 4 + 2 layers, 4 ms each.
        let devices = vec![device(1.0, 6, 1000), device(2.0, 6, 1000)];
        let balanced = plan_stages(&input(devices.clone(), 6)).expect("plans");
        assert_eq!(balanced.stages, vec![[0, 4], [4, 6]]);
        // Stages that take turns (κ = 1) cost their sum: 5 + 1 layers, 7 ms, beat 8 ms.
        let turns = plan_stages(&StagesInput { interference: 1.0, ..input(devices.clone(), 6) }).expect("plans");
        assert_eq!(turns.stages, vec![[0, 5], [5, 6]]);
        assert_eq!(turns.bottleneck_ms, 5.0);
        // A little interference keeps the balanced split: 4 + 0.2·4 < 5 + 0.2·2.
        let little = plan_stages(&StagesInput { interference: 0.2, ..input(devices.clone(), 6) }).expect("plans");
        assert_eq!(little.stages, balanced.stages);
        let negative = plan_stages(&StagesInput { interference: -0.5, ..input(devices, 6) });
        assert!(matches!(negative, Err(StagesError::Input(ref e)) if e.to_string().contains("interference")));
        let homogeneous =
            StagesInput { layer_latency_ms: vec![1.0; 4], stages: 2, interference: 1.0, ..Default::default() };
        assert!(
            matches!(plan_stages(&homogeneous), Err(StagesError::Input(ref e)) if e.to_string().contains("interference"))
        );
    }

    #[test]
    fn a_device_twice_as_fast_gets_twice_the_layers() {
        let out = plan_stages(&input(vec![device(1.0, 12, 1000), device(2.0, 12, 1000)], 12)).unwrap();
        assert_eq!(out.stages, vec![[0, 8], [8, 12]]);
        assert_eq!(out.stage_latency_ms, vec![8.0, 8.0]);
        assert_eq!(out.stage_memory_bytes, Some(vec![80, 40]));
    }

    #[test]
    fn extras_and_links_count_on_their_stage() {
        let mut i = input(vec![device(1.0, 10, 1000), device(1.0, 10, 1000)], 10);
        i.last_stage = Some(StageExtra { latency_ms: 4.0, memory_bytes: 5 });
        let out = plan_stages(&i).unwrap();
        assert_eq!(out.stages, vec![[0, 7], [7, 10]]);
        assert_eq!(out.bottleneck_ms, 7.0);
        i.devices.as_mut().unwrap()[0].link_ms = 2.0;
        let out = plan_stages(&i).unwrap();
        assert_eq!(out.stages, vec![[0, 6], [6, 10]]);
        assert_eq!(out.stage_latency_ms, vec![8.0, 8.0]);
    }

    #[test]
    fn a_memory_cap_forces_the_split() {
        // The fast device could take 8 layers but holds only 5.
        let out = plan_stages(&input(vec![device(1.0, 12, 50), device(2.0, 12, 1000)], 12)).unwrap();
        assert_eq!(out.stages, vec![[0, 5], [5, 12]]);
        assert_eq!(out.bottleneck_ms, 14.0);
    }

    #[test]
    fn caps_that_cannot_hold_a_layer_or_the_model_name_the_problem() {
        let mut i = input(vec![device(1.0, 4, 100), device(1.0, 4, 9)], 4);
        let err = plan_stages(&i).unwrap_err().to_string();
        assert!(err.contains("device 1 (`device 1`)") && err.contains("at least 10 B"), "{err}");
        i.first_stage = Some(StageExtra { latency_ms: 0.0, memory_bytes: 95 });
        i.devices.as_mut().unwrap()[1].memory_bytes = 20;
        let err = plan_stages(&i).unwrap_err().to_string();
        assert!(err.contains("device 0") && err.contains("embeddings"), "{err}");
        let i = input(vec![device(1.0, 4, 25), device(1.0, 4, 10)], 4);
        let err = plan_stages(&i).unwrap_err().to_string();
        assert!(err.contains("needs 40 B") && err.contains("add up to 35 B"), "{err}");
        // Enough in all, but layer sizes make no contiguous split fit.
        let mut i = input(vec![device(1.0, 3, 12), device(1.0, 3, 12)], 3);
        i.layer_memory_bytes = Some(vec![10, 4, 10]);
        assert!(matches!(plan_stages(&i), Err(StagesError::Devices(DeviceStagesError::NoSplit { .. }))));
    }

    #[test]
    fn bad_device_fields_are_named() {
        let mut i = input(vec![device(1.0, 4, 100)], 4);
        i.stages = 2;
        assert!(plan_stages(&i).unwrap_err().to_string().contains("`devices`"));
        let mut i = input(vec![device(1.0, 3, 100), device(1.0, 4, 100)], 4);
        assert!(plan_stages(&i).unwrap_err().to_string().contains("devices[0].layer_latency_ms"));
        i.devices.as_mut().unwrap()[0] = device(f64::NAN, 4, 100);
        assert!(plan_stages(&i).unwrap_err().to_string().contains("devices[0].layer_latency_ms[0]"));
        i.devices.as_mut().unwrap()[0] = device(1.0, 4, 100);
        i.layer_memory_bytes = None;
        assert!(plan_stages(&i).unwrap_err().to_string().contains("layer_memory_bytes"));
    }
}
