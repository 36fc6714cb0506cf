//! Alpa's stage planner against brute force over every partition, on seeded random inputs.

use burn_plan::stages::{self, StagesError, StagesInput, TensorParallel, TpDegree};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::close;

/// Every split of `0..layers` into `stages` non-empty contiguous ranges.
pub(super) fn partitions(layers: usize, stages: usize) -> Vec<Vec<[usize; 2]>> {
    fn go(start: usize, layers: usize, left: usize, acc: &mut Vec<[usize; 2]>, out: &mut Vec<Vec<[usize; 2]>>) {
        if left == 1 {
            acc.push([start, layers]);
            out.push(acc.clone());
            acc.pop();
            return;
        }
        for end in start + 1..=layers - (left - 1) {
            acc.push([start, end]);
            go(end, layers, left - 1, acc, out);
            acc.pop();
        }
    }
    let mut out = Vec::new();
    go(0, layers, stages, &mut Vec::new(), &mut out);
    out
}

/// Brute-force least bottleneck over partitions and degree choices (`None`: infeasible).
fn stages_brute(input: &StagesInput) -> Option<f64> {
    let layers = input.layer_latency_ms.len();
    let mut options: Vec<(usize, &[f64])> = vec![(1, &input.layer_latency_ms)];
    if let Some(tp) = &input.tensor_parallel {
        options.extend(tp.degrees.iter().map(|d| (d.degree, d.layer_latency_ms.as_slice())));
    }
    let devices = input.tensor_parallel.as_ref().map(|t| t.devices);
    let mut best: Option<f64> = None;
    for p in partitions(layers, input.stages) {
        let choices = options.len().pow(p.len() as u32);
        for mut code in 0..choices {
            let (mut used, mut bottleneck, mut ok) = (0, 0.0f64, true);
            for r in &p {
                let (degree, lat) = options[code % options.len()];
                code /= options.len();
                used += degree;
                bottleneck = bottleneck.max(lat[r[0]..r[1]].iter().sum());
                if let (Some(mem), Some(cap)) = (&input.layer_memory_bytes, input.stage_memory_bytes) {
                    let bytes: u64 = mem[r[0]..r[1]].iter().sum();
                    ok &= bytes.div_ceil(degree as u64) <= cap;
                }
            }
            if devices.is_some_and(|d| used > d) || !ok {
                continue;
            }
            if best.is_none_or(|b| bottleneck < b) {
                best = Some(bottleneck);
            }
        }
    }
    best
}

#[test]
fn plan_stages_match_brute_force_on_random_inputs() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..300 {
        let layers = rng.random_range(1..=8);
        let stages = rng.random_range(1..=layers);
        let lat: Vec<f64> = (0..layers).map(|_| rng.random_range(0..20) as f64 * 0.5).collect();
        let mut input = StagesInput { layer_latency_ms: lat.clone(), stages, ..StagesInput::default() };
        if case % 2 == 1 {
            input.layer_memory_bytes = Some((0..layers).map(|_| rng.random_range(1..10)).collect());
            input.stage_memory_bytes = Some(rng.random_range(5..30));
        }
        if case % 3 == 2 && stages <= 3 {
            input.tensor_parallel = Some(TensorParallel {
                devices: stages + rng.random_range(0..=3),
                degrees: vec![TpDegree {
                    degree: 2,
                    layer_latency_ms: lat.iter().map(|l| l * rng.random_range(0.4..0.9)).collect(),
                }],
            });
        }
        let expected = stages_brute(&input);
        match stages::plan(&input) {
            Ok(out) => {
                let best = expected.unwrap_or_else(|| panic!("case {case}: planner found a plan brute force did not"));
                assert!(close(out.bottleneck_ms, best), "case {case}: {} vs {best}", out.bottleneck_ms);
                assert_eq!(out.stages.len(), stages);
                assert_eq!(out.stages[0][0], 0);
                assert_eq!(out.stages[stages - 1][1], layers);
                for w in out.stages.windows(2) {
                    assert_eq!(w[0][1], w[1][0]);
                }
                assert!(out.stages.iter().all(|r| r[0] < r[1]));
                let max = out.stage_latency_ms.iter().copied().fold(0.0, f64::max);
                assert_eq!(max, out.bottleneck_ms);
                if let Some(tp) = &input.tensor_parallel {
                    let degrees = out.tensor_parallel_degrees.as_ref().unwrap();
                    assert!(degrees.iter().sum::<usize>() <= tp.devices);
                }
            }
            Err(StagesError::DoesNotFit { .. }) => assert_eq!(expected, None, "case {case}"),
            Err(e) => panic!("case {case}: {e}"),
        }
    }
}
