//! `admission: "slo"`: groups drop at arrival the requests they would serve past their SLO, as
//! AlpaServe's controller does (thesis §4.6), so that a burst's hopeless requests do not hold
//! the devices that later requests need.

use burn_plan::placement::{self, Baseline, PlacementInput};
use burn_plan::sim::Admission;

use super::measured_pipelines::bursty;

fn with(admission: Admission, baseline: Option<Baseline>) -> PlacementInput {
    PlacementInput { admission, baseline, ..bursty(None) }
}

#[test]
fn dropping_late_requests_serves_the_rest_within_their_slo() {
    for baseline in [None, Some(Baseline::Replication)] {
        let all = placement::plan(&with(Admission::All, baseline)).unwrap();
        let slo = placement::plan(&with(Admission::Slo, baseline)).unwrap();
        // Devices that share nothing run as the clocks say: every request taken meets its SLO,
        // so the attainment is the share taken.
        let taken = slo.latencies_s.iter().flatten().count();
        assert!(slo.latencies_s.iter().flatten().all(|&l| l <= 0.8 + 1e-9), "{baseline:?}");
        assert!((slo.slo_attainment - taken as f64 / slo.latencies_s.len() as f64).abs() < 1e-12);
        assert!(taken < slo.latencies_s.len(), "the bursts overload the devices: some are dropped");
        // Without dropping, a burst's late requests delay the ones behind them.
        assert!(
            slo.slo_attainment > all.slo_attainment,
            "{baseline:?}: {} vs {}",
            slo.slo_attainment,
            all.slo_attainment
        );
    }
    // AlpaServe's claim holds under its own admission: pipelining both models over both devices
    // serves a burst of one model on both.
    let model_parallel = placement::plan(&with(Admission::Slo, None)).unwrap();
    assert!(model_parallel.groups.iter().any(|g| g.pipeline_stages == 2), "{:?}", model_parallel.groups);
    let replication = placement::plan(&with(Admission::Slo, Some(Baseline::Replication))).unwrap();
    assert!(model_parallel.slo_attainment > replication.slo_attainment);
}

#[test]
fn admission_is_read_from_json_and_a_wrong_one_is_refused() {
    let mut json = serde_json::to_value(bursty(None)).unwrap();
    assert!(json.get("admission").is_none(), "the default is left out");
    json["admission"] = "slo".into();
    let input: PlacementInput = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(input.admission, Admission::Slo);
    assert_eq!(serde_json::to_value(&input).unwrap()["admission"], "slo");
    json["admission"] = "late".into();
    let err = serde_json::from_value::<PlacementInput>(json).unwrap_err().to_string();
    assert!(err.contains("unknown variant `late`") && err.contains("`all` or `slo`"), "{err}");
}
