//! The `stages` planner with a tensor-parallel group chosen per stage over heterogeneous devices
//! (Alpa's DP over (layers, submesh) choices) against brute force on seeded random inputs, and
//! memory caps that force unequal degrees.

use burn_plan::interference::Interference;
use burn_plan::stage_groups::{self, DeviceGroup, GroupDevice, GroupStagesError, GroupStagesInput};
use burn_plan::stages::StageExtra;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::close;
use super::stages::partitions;

/// Stage cost (latency, bytes on the group's first device, fits) of `group` over layers `r`, as
/// the module docs define it.
fn stage_cost(input: &GroupStagesInput, group: &DeviceGroup, r: [usize; 2]) -> (f64, u64, bool) {
    let layers = input.layer_memory_bytes.len();
    let (starts, ends) = (group.first_device == 0, group.first_device + group.degree == input.devices.len());
    let mut ms: f64 = group.layer_latency_ms[r[0]..r[1]].iter().sum::<f64>() + group.fixed_ms;
    let bytes: u64 = input.layer_memory_bytes[r[0]..r[1]].iter().sum();
    let share = bytes.div_ceil(group.degree as u64);
    let mut rank0 = share;
    if starts && r[0] == 0 {
        let e = input.first_stage.unwrap_or_default();
        ms += e.latency_ms;
        rank0 += e.memory_bytes;
    }
    if ends && r[1] == layers {
        let e = input.last_stage.unwrap_or_default();
        ms += e.latency_ms;
        rank0 += e.memory_bytes;
    } else {
        ms += group.link_ms;
    }
    let devices = &input.devices[group.first_device..group.first_device + group.degree];
    let fits = devices.iter().enumerate().all(|(i, d)| d.memory_bytes >= if i == 0 { rank0 } else { share });
    (ms, rank0, fits)
}

/// Every sequence of `groups` covering devices `from..devices` in order.
fn coverings(groups: &[DeviceGroup], from: usize, devices: usize) -> Vec<Vec<usize>> {
    if from == devices {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for (g, group) in groups.iter().enumerate().filter(|(_, g)| g.first_device == from) {
        for mut rest in coverings(groups, from + group.degree, devices) {
            rest.insert(0, g);
            out.push(rest);
        }
    }
    out
}

/// The least `max + κ·(Σ − max)` of a valid plan's stage costs (`κ = 0`: the least bottleneck).
fn brute(input: &GroupStagesInput) -> Option<f64> {
    let layers = input.layer_memory_bytes.len();
    let mut best: Option<f64> = None;
    for cover in coverings(&input.groups, 0, input.devices.len()) {
        if cover.len() > layers {
            continue;
        }
        for p in partitions(layers, cover.len()) {
            let mut costs = Vec::new();
            let mut fits = true;
            for (&g, &r) in cover.iter().zip(&p) {
                let (ms, _, ok) = stage_cost(input, &input.groups[g], r);
                costs.push(ms);
                fits &= ok;
            }
            let score = Interference::interval_ms(&costs, input.interference);
            if fits && best.is_none_or(|b| score < b) {
                best = Some(score);
            }
        }
    }
    best
}

fn random_input(rng: &mut ChaCha8Rng) -> GroupStagesInput {
    let layers = rng.random_range(1..=7);
    let devices = rng.random_range(1..=4);
    let speeds: Vec<f64> = (0..devices).map(|_| rng.random_range(1..4) as f64).collect();
    let mut groups = Vec::new();
    for first in 0..devices {
        for degree in [1, 2, 4].into_iter().filter(|&d| first + d <= devices) {
            // Degree 1 is always offered; larger groups only sometimes.
            if degree > 1 && rng.random_bool(0.3) {
                continue;
            }
            let slowest = speeds[first..first + degree].iter().copied().fold(0.0, f64::max);
            groups.push(DeviceGroup {
                first_device: first,
                degree,
                layer_latency_ms: (0..layers)
                    .map(|_| slowest * rng.random_range(1..8) as f64 * 0.5 / degree as f64 + 0.25 * (degree - 1) as f64)
                    .collect(),
                fixed_ms: rng.random_range(0..3) as f64 * 0.5,
                link_ms: rng.random_range(0..3) as f64 * 0.25,
            });
        }
    }
    let extra = |rng: &mut ChaCha8Rng| StageExtra {
        latency_ms: rng.random_range(0..4) as f64 * 0.5,
        memory_bytes: rng.random_range(0..6),
    };
    GroupStagesInput {
        layer_memory_bytes: (0..layers).map(|_| rng.random_range(1..10)).collect(),
        devices: (0..devices).map(|_| GroupDevice { name: None, memory_bytes: rng.random_range(4..40) }).collect(),
        groups,
        first_stage: Some(extra(rng)),
        last_stage: Some(extra(rng)),
        interference: 0.0,
    }
}

#[test]
fn plan_group_stages_match_brute_force_on_random_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(319);
    let (mut planned, mut grouped) = (0, 0);
    for case in 0..400 {
        let mut input = random_input(&mut rng);
        // Every other case with stages that slow each other down (κ ≤ 1: the least-total split
        // of the best plan's bottleneck scores no worse than it, so the planner is exact there).
        input.interference = if case % 2 == 1 { rng.random_range(0.0..=1.0) } else { 0.0 };
        let expected = brute(&input);
        match stage_groups::plan(&input) {
            Ok(out) => {
                planned += 1;
                let best = expected.unwrap_or_else(|| panic!("case {case}: a plan brute force did not find"));
                let costs: Vec<f64> = out.stages.iter().map(|s| s.latency_ms).collect();
                let score = Interference::interval_ms(&costs, input.interference);
                assert!(close(score, best), "case {case} (κ {}): {score} vs {best}", input.interference);
                assert!(close(out.bottleneck_ms, costs.iter().copied().fold(0.0, f64::max)), "case {case}");
                // The stages cover every layer and every device in order, and cost what they say.
                let (mut layer, mut device) = (0, 0);
                for stage in &out.stages {
                    assert_eq!((stage.layers[0], stage.first_device), (layer, device), "case {case}: {out:?}");
                    let group = input
                        .groups
                        .iter()
                        .find(|g| g.first_device == stage.first_device && g.degree == stage.degree)
                        .unwrap_or_else(|| panic!("case {case}: a stage on a group not offered"));
                    let (ms, bytes, fits) = stage_cost(&input, group, stage.layers);
                    assert!(fits && close(ms, stage.latency_ms) && bytes == stage.memory_bytes, "case {case}");
                    (layer, device) = (stage.layers[1], stage.first_device + stage.degree);
                }
                assert_eq!((layer, device), (input.layer_memory_bytes.len(), input.devices.len()), "case {case}");
                grouped += usize::from(out.stages.iter().any(|s| s.degree > 1));
            }
            Err(GroupStagesError::NoSplit { .. }) => assert_eq!(expected, None, "case {case}"),
            Err(e) => panic!("case {case}: {e}"),
        }
    }
    assert!(planned > 100, "only {planned} feasible cases: the generator is too tight");
    assert!(grouped > 20, "only {grouped} plans used a tensor-parallel group: the generator never needs one");
}

/// Three equal devices, the last two with a quarter of the first's memory: the last layers only
/// fit split over both, so the plan is a degree-1 stage and a degree-2 stage (unequal degrees).
#[test]
fn memory_caps_force_unequal_tensor_parallel_degrees() {
    let layers = 4;
    let group = |first_device, degree: usize| DeviceGroup {
        first_device,
        degree,
        layer_latency_ms: vec![1.0 / degree as f64 + 0.1 * (degree - 1) as f64; layers],
        fixed_ms: 0.0,
        link_ms: 0.0,
    };
    let device = |memory_bytes| GroupDevice { name: None, memory_bytes };
    let input = GroupStagesInput {
        layer_memory_bytes: vec![100; layers],
        devices: vec![device(400), device(100), device(100)],
        groups: vec![group(0, 1), group(1, 1), group(2, 1), group(1, 2)],
        first_stage: None,
        last_stage: None,
        interference: 0.0,
    };
    let out = stage_groups::plan(&input).unwrap();
    let shape: Vec<(usize, usize, [usize; 2])> =
        out.stages.iter().map(|s| (s.first_device, s.degree, s.layers)).collect();
    // Device 0 holds at least 2 layers either way (2 ms bottleneck); at that bound the degree-2
    // stage (2 layers, 1.2 ms) totals less than two single stages of a layer each (2 ms).
    assert_eq!(shape, vec![(0, 1, [0, 2]), (1, 2, [2, 4])], "{out:?}");
    assert!(close(out.bottleneck_ms, 2.0), "{out:?}");

    // Without the degree-2 group the small devices hold one layer each: 2 layers stay on device 0.
    let singles = GroupStagesInput { groups: input.groups[..3].to_vec(), ..input.clone() };
    let out = stage_groups::plan(&singles).unwrap();
    assert!(out.stages.iter().all(|s| s.degree == 1), "{out:?}");

    // Caps that nothing fits: an error naming the smallest cap's device and what to do.
    let tight = GroupStagesInput {
        devices: vec![device(100), GroupDevice { name: Some("ws://w".into()), memory_bytes: 40 }, device(100)],
        ..input
    };
    let err = stage_groups::plan(&tight).unwrap_err().to_string();
    assert!(err.contains("ws://w") && err.contains("--device-memory"), "{err}");
}
