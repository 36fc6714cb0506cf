//! `serve_every_model`: AlpaServe's Algorithm 3 keeps the highest attainment, which under
//! overload can leave a model out; a server asks for placements that serve every model.

use burn_plan::placement::{self, Arrivals, ModelRef, PlacementInput};

use super::placement::{arrivals as workload, input, model};

/// Two 1.25 s models, two devices that each hold one and a half of them, and bursty traffic at
/// 0.8 of what one device serves per model.
fn overloaded(serve_every_model: bool) -> PlacementInput {
    let arrivals = |name: &str| Arrivals { model: ModelRef::Name(name.into()), rate: 0.64, cv: 3.0 };
    let models = vec![model("a", 4, 312.5, 4.67), model("b", 4, 312.5, 4.67)];
    let workload = workload(vec![arrivals("a"), arrivals("b")], 60.0, Some(0));
    PlacementInput { interference: Some(0.36), serve_every_model, ..input(models, 2, 6 << 30, workload) }
}

fn served(out: &placement::PlacementOutput) -> Vec<String> {
    let mut names: Vec<String> = out.groups.iter().flat_map(|g| g.models.iter().map(|m| m.model.clone())).collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_server_placement_serves_every_model_where_algorithm_3_leaves_one_out() {
    let paper = placement::plan(&overloaded(false)).unwrap();
    assert_eq!(served(&paper).len(), 1, "Algorithm 3 keeps one model here: {:?}", paper.groups);
    let server = placement::plan(&overloaded(true)).unwrap();
    assert_eq!(served(&server), ["a", "b"], "{:?}", server.groups);
    assert!(server.slo_attainment <= paper.slo_attainment, "{} vs {}", server.slo_attainment, paper.slo_attainment);
    assert!(server.models.iter().all(|m| m.requests > 0));
}
