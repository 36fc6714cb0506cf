//! `measured_pipelines`: a model timed running as a pipeline prices the groups of that many
//! stages from the measurement (AlpaServe profiles each parallel configuration), so that a
//! pipeline that overlaps its requests worse than its layers promise stops winning the placement.

use burn_plan::placement::{self, Arrivals, MeasuredPipeline, ModelRef, PlacementInput};

use super::placement::{arrivals as workload, input, model};

/// AlpaServe §4.3.1's case: two 0.4 s models, two devices that each hold one, bursty traffic;
/// the layers alone make pipelining both models over both devices the best placement.
pub(crate) fn bursty(measured: Option<MeasuredPipeline>) -> PlacementInput {
    let arrivals = |name: &str| Arrivals { model: ModelRef::Name(name.into()), rate: 1.0, cv: 4.0 };
    let mut models = vec![model("a", 4, 100.0, 0.8), model("b", 4, 100.0, 0.8)];
    for m in &mut models {
        m.measured_pipelines = measured.iter().cloned().collect();
    }
    input(models, 2, 4 << 30, workload(vec![arrivals("a"), arrivals("b")], 2000.0, Some(1)))
}

#[test]
fn a_measured_pipeline_prices_its_groups_and_can_undo_model_parallelism() {
    let layers = placement::plan(&bursty(None)).unwrap();
    assert!(layers.groups.iter().any(|g| g.pipeline_stages == 2), "{:?}", layers.groups);
    // Measured as the layers promise (0.4 s alone, a second request 0.2 s later): nothing moves.
    let as_promised = MeasuredPipeline { stages: 2, latency_ms: 400.0, interval_ms: 200.0, steps: None };
    let same = placement::plan(&bursty(Some(as_promised))).unwrap();
    assert_eq!(same.groups, layers.groups);
    assert_eq!(same.slo_attainment, layers.slo_attainment);
    // Measured taking turns (a second request adds a whole request): the pipeline serves no
    // faster than one device, slower per request, and replication wins.
    let turns = MeasuredPipeline { stages: 2, latency_ms: 480.0, interval_ms: 480.0, steps: None };
    let out = placement::plan(&bursty(Some(turns))).unwrap();
    assert!(out.groups.iter().all(|g| g.pipeline_stages == 1 || g.models.is_empty()), "{:?}", out.groups);
    // On devices too small for a whole model only a pipeline fits, and its stages are priced
    // from the measurement: they add up to 420 ms, the slowest takes the 220 ms interval at κ = 0.
    let a_little = MeasuredPipeline { stages: 2, latency_ms: 420.0, interval_ms: 220.0, steps: None };
    let small = PlacementInput { device_memory_bytes: 3 << 30, ..bursty(Some(a_little)) };
    let out = placement::plan(&small).unwrap();
    let piped = out.groups.iter().find(|g| g.pipeline_stages == 2).expect("only a pipeline fits");
    assert!(!piped.models.is_empty());
    for m in &piped.models {
        assert_eq!(m.stage_latency_ms, vec![200.0, 220.0], "{piped:?}");
    }
}

fn turns_of(ms: f64) -> MeasuredPipeline {
    MeasuredPipeline { stages: 2, latency_ms: ms, interval_ms: ms, steps: None }
}

#[test]
fn bad_measured_pipelines_are_refused_naming_the_field() {
    let mut input = bursty(Some(MeasuredPipeline { stages: 9, latency_ms: 400.0, interval_ms: 200.0, steps: None }));
    let err = placement::plan(&input).unwrap_err().to_string();
    assert!(err.contains("models[0].measured_pipelines[0].stages"), "{err}");
    input.models[0].measured_pipelines =
        vec![turns_of(400.0), MeasuredPipeline { stages: 2, latency_ms: 300.0, interval_ms: 100.0, steps: None }];
    let err = placement::plan(&input).unwrap_err().to_string();
    assert!(err.contains("measured twice"), "{err}");
    input.models[0].measured_pipelines =
        vec![MeasuredPipeline { stages: 2, latency_ms: -1.0, interval_ms: 1.0, steps: None }];
    let err = placement::plan(&input).unwrap_err().to_string();
    assert!(err.contains("latency_ms"), "{err}");
}
