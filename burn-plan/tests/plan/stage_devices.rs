//! The `stages` planner over heterogeneous devices against brute force on seeded random inputs:
//! every device with its own per-layer latencies, memory cap and link, plus first- and last-stage
//! extras.

use burn_plan::stages::{self, DeviceStagesError, StageDevice, StageExtra, StagesError, StagesInput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::close;
use super::stages::partitions;

/// Cost of stage `s` over `r` (latency, bytes), as the planner defines it.
fn stage_cost(input: &StagesInput, s: usize, r: [usize; 2]) -> (f64, u64) {
    let devices = input.devices.as_ref().unwrap();
    let d = &devices[s];
    let mut ms: f64 = d.layer_latency_ms[r[0]..r[1]].iter().sum::<f64>() + d.fixed_ms;
    let mut bytes: u64 = input.layer_memory_bytes.as_ref().unwrap()[r[0]..r[1]].iter().sum();
    if s == 0 {
        let e = input.first_stage.unwrap_or_default();
        ms += e.latency_ms;
        bytes += e.memory_bytes;
    }
    if s + 1 == devices.len() {
        let e = input.last_stage.unwrap_or_default();
        ms += e.latency_ms;
        bytes += e.memory_bytes;
    } else {
        ms += d.link_ms;
    }
    (ms, bytes)
}

fn brute(input: &StagesInput) -> Option<f64> {
    let devices = input.devices.as_ref().unwrap();
    let mut best: Option<f64> = None;
    for p in partitions(input.layer_latency_ms.len(), input.stages) {
        let mut bottleneck = 0.0f64;
        let mut fits = true;
        for (s, &r) in p.iter().enumerate() {
            let (ms, bytes) = stage_cost(input, s, r);
            bottleneck = bottleneck.max(ms);
            fits &= bytes <= devices[s].memory_bytes;
        }
        if fits && best.is_none_or(|b| bottleneck < b) {
            best = Some(bottleneck);
        }
    }
    best
}

#[test]
fn plan_device_stages_match_brute_force_on_random_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let mut planned = 0;
    for case in 0..300 {
        let layers = rng.random_range(1..=9);
        let stages = rng.random_range(1..=layers.min(4));
        let memory: Vec<u64> = (0..layers).map(|_| rng.random_range(1..10)).collect();
        let devices = (0..stages)
            .map(|_| {
                let speed = rng.random_range(1..4) as f64;
                StageDevice {
                    name: None,
                    layer_latency_ms: (0..layers).map(|_| speed * rng.random_range(1..8) as f64 * 0.5).collect(),
                    memory_bytes: rng.random_range(8..40),
                    link_ms: rng.random_range(0..3) as f64 * 0.25,
                    fixed_ms: rng.random_range(0..3) as f64 * 0.5,
                }
            })
            .collect();
        let extra = |rng: &mut ChaCha8Rng| StageExtra {
            latency_ms: rng.random_range(0..4) as f64 * 0.5,
            memory_bytes: rng.random_range(0..6),
        };
        let input = StagesInput {
            layer_latency_ms: vec![1.0; layers],
            stages,
            layer_memory_bytes: Some(memory),
            devices: Some(devices),
            first_stage: Some(extra(&mut rng)),
            last_stage: Some(extra(&mut rng)),
            ..StagesInput::default()
        };
        let expected = brute(&input);
        match stages::plan(&input) {
            Ok(out) => {
                planned += 1;
                let best = expected.unwrap_or_else(|| panic!("case {case}: a plan brute force did not find"));
                assert!(close(out.bottleneck_ms, best), "case {case}: {} vs {best}", out.bottleneck_ms);
                assert_eq!(out.stages.first().map(|r| r[0]), Some(0));
                assert_eq!(out.stages.last().map(|r| r[1]), Some(layers));
                for (s, &r) in out.stages.iter().enumerate() {
                    let (ms, bytes) = stage_cost(&input, s, r);
                    assert!(close(ms, out.stage_latency_ms[s]), "case {case}");
                    assert_eq!(out.stage_memory_bytes.as_ref().unwrap()[s], bytes);
                }
            }
            Err(StagesError::Devices(
                DeviceStagesError::DeviceTooSmall { .. }
                | DeviceStagesError::ModelTooLarge { .. }
                | DeviceStagesError::NoSplit { .. },
            )) => assert_eq!(expected, None, "case {case}"),
            Err(e) => panic!("case {case}: {e}"),
        }
    }
    assert!(planned > 100, "only {planned} feasible cases: the generator is too tight");
}

#[test]
fn plan_device_stages_read_the_json_interface() {
    let json = r#"{"layer_latency_ms": [1, 1, 1, 1, 1, 1], "stages": 2, "layer_memory_bytes": [1, 1, 1, 1, 1, 1],
        "devices": [{"name": "flex", "layer_latency_ms": [1, 1, 1, 1, 1, 1], "memory_bytes": 100, "link_ms": 0.5},
                    {"name": "ws://w", "layer_latency_ms": [2, 2, 2, 2, 2, 2], "memory_bytes": 100, "fixed_ms": 1.0}],
        "last_stage": {"latency_ms": 1.0, "memory_bytes": 3}}"#;
    let input: StagesInput = serde_json::from_str(json).unwrap();
    let out = stages::plan(&input).unwrap();
    // The worker's fixed 1 ms per stage moves a layer to flex: 5.5 / 4 beats 4.5 / 6.
    assert_eq!(out.stages, vec![[0, 5], [5, 6]]);
    assert_eq!(out.stage_latency_ms, vec![5.5, 4.0]);
    let text = serde_json::to_string(&out).unwrap();
    assert!(text.contains(r#""stage_memory_bytes":[5,4]"#), "{text}");
}
