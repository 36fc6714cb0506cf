//! AlpaServe's simulator against hand-computed timelines, and the placement's latencies, its
//! claim on bursty traffic and an SLO no placement reaches.

use burn_plan::placement::{self, Arrivals, Baseline, ModelRef, ModelSpec, PlacementInput, PlacementWorkload};
use burn_plan::sim::{self, Group, Request};

use super::close;

#[test]
fn plan_sim_matches_hand_computed_timelines() {
    // One group, two stages of 1 s and 2 s; requests at 0, 0, 1, 10.
    let groups = [Group::new(2, vec![(0, vec![1.0, 2.0])])];
    let req = |t: f64| Request { arrival_s: t, model: 0 };
    let lat = sim::simulate(&groups, &[req(0.0), req(0.0), req(1.0), req(10.0)], 0.0);
    // r0: s0 0–1, s1 1–3. r1: s0 1–2, s1 3–5. r2: s0 2–3, s1 5–7. r3: 10–11, 11–13.
    assert_eq!(lat, vec![Some(3.0), Some(5.0), Some(6.0), Some(3.0)]);

    // Two one-stage groups of model 0, one of model 1; shortest queue first, ties to the lowest.
    let groups = [Group::new(1, vec![(0, vec![1.0])]), Group::new(1, vec![(0, vec![1.0]), (1, vec![0.5])])];
    let r = |t: f64, m: usize| Request { arrival_s: t, model: m };
    let lat = sim::simulate(&groups, &[r(0.0, 1), r(0.1, 0), r(0.2, 0), r(0.3, 0), r(0.4, 2)], 0.0);
    // m1 → g1: 0–0.5. m0@0.1 → g0 (queues 0 vs 1): 0.1–1.1. m0@0.2 → g0 (1 vs 1, tie to the
    // lowest): 1.1–2.1. m0@0.3 → g1 (2 vs 1): 0.5–1.5. Model 2: no group serves it.
    assert_eq!(lat[0], Some(0.5));
    assert!(close(lat[1].unwrap(), 1.0));
    assert!(close(lat[2].unwrap(), 1.9));
    assert!(close(lat[3].unwrap(), 1.2));
    assert_eq!(lat[4], None);
}

pub(super) fn model(name: &str, layers: usize, layer_ms: f64, slo_s: f64) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        layer_latency_ms: vec![layer_ms; layers],
        layer_memory_bytes: vec![1 << 30; layers],
        slo_s,
        tensor_parallel: Vec::new(),
        measured_pipelines: Vec::new(),
    }
}

/// `models` on `devices` devices of `device_memory_bytes` each under `workload`; the rest as the
/// planner's JSON leaves it out.
pub(super) fn input(
    models: Vec<ModelSpec>,
    devices: usize,
    device_memory_bytes: u64,
    workload: PlacementWorkload,
) -> PlacementInput {
    PlacementInput {
        models,
        devices,
        device_memory_bytes,
        workload,
        baseline: None,
        beam: None,
        interference: None,
        serve_every_model: false,
        admission: Default::default(),
    }
}

/// A workload of the requests of `requests` (arrival seconds, model).
pub(super) fn trace(requests: Vec<(f64, ModelRef)>) -> PlacementWorkload {
    PlacementWorkload { trace: Some(requests), arrivals: None, duration_s: None, seed: None }
}

/// A workload of gamma-process `arrivals` over `duration_s` seconds, drawn with `seed`.
pub(super) fn arrivals(arrivals: Vec<Arrivals>, duration_s: f64, seed: Option<u64>) -> PlacementWorkload {
    PlacementWorkload { trace: None, arrivals: Some(arrivals), duration_s: Some(duration_s), seed }
}

#[test]
fn plan_placement_reports_hand_computed_latencies_in_trace_order() {
    // Out of order on purpose: latencies come back in this order.
    let requests = vec![
        (1.0, ModelRef::Name("a".into())),
        (0.0, ModelRef::Index(0)),
        (0.1, ModelRef::Name("a".into())),
        (0.2, ModelRef::Index(0)),
    ];
    let input = input(vec![model("a", 3, 100.0, 0.5)], 1, 3 << 30, trace(requests));
    let out = placement::plan(&input).unwrap();
    // 0.0 → 0.3, 0.1 → 0.6, 0.2 → 0.9, 1.0 → 1.3.
    let expected = [0.3, 0.3, 0.5, 0.7];
    for (l, e) in out.latencies_s.iter().zip(expected) {
        assert!(close(l.unwrap(), e), "{:?}", out.latencies_s);
    }
    assert_eq!(out.slo_attainment, 0.75);
    assert_eq!(out.groups[0].models[0].stages, vec![[0, 3]]);
}

#[test]
fn plan_placement_model_parallelism_beats_replication_on_bursty_two_model_traffic() {
    // AlpaServe §4.3.1: two models of 0.4 s, two devices that each hold one model, bursty traffic.
    let input = super::measured_pipelines::bursty(None);
    let best = placement::plan(&input).unwrap();
    let replication =
        placement::plan(&PlacementInput { baseline: Some(Baseline::Replication), ..input.clone() }).unwrap();
    assert!(replication.groups.iter().all(|g| g.pipeline_stages == 1));
    assert!(best.groups.iter().any(|g| g.pipeline_stages == 2 && g.models.len() == 2), "{:?}", best.groups);
    assert!(
        best.slo_attainment > replication.slo_attainment + 0.02,
        "model parallel {} vs replication {}",
        best.slo_attainment,
        replication.slo_attainment
    );
    assert_eq!(best.latencies_s.len(), replication.latencies_s.len());
}

#[test]
fn plan_placement_with_unreachable_slo_still_places_every_model() {
    let workload = trace(vec![(0.0, ModelRef::Index(0))]);
    let mut input = PlacementInput { beam: Some(2), ..input(vec![model("a", 2, 500.0, 0.1)], 2, 2 << 30, workload) };
    let out = placement::plan(&input).unwrap();
    assert_eq!(out.slo_attainment, 0.0);
    assert!(out.groups.iter().any(|g| !g.models.is_empty()));
    assert!(close(out.latencies_s[0].unwrap(), 1.0));
    input.device_memory_bytes = 1;
    assert!(matches!(placement::plan(&input), Err(placement::PlacementError::NothingFits { .. })));
}
