//! What a server's placement (`serve --placement`) gives the [placement planner](super::placement):
//! the workload file (per served model, its gamma arrival process, SLO and request shape) and each
//! model's cost of one request per layer, read from its device profile.
//!
//! ```json
//! {"duration_s": 60, "seed": 0,
//!  "models": [{"model": "a", "rate": 0.5, "cv": 3, "slo_s": 8, "prompt_tokens": 16, "max_tokens": 16},
//!             {"model": "b", "rate": 0.2, "cv": 3, "slo_s": 8}]}
//! ```
//!
//! AlpaServe's simulator runs one request at a time through a pipeline's stages, each for its
//! latency; for a generative model a request is its prefill and its decode steps, so a layer's
//! latency here is its prefill of `prompt_tokens` plus `max_tokens − 1` decode steps over the
//! growing context, at batch 1. The embedding and the engine's per-step overhead are paid on the
//! first layer (a pipeline's first stage), the LM head on the last.

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
use super::placement::{Arrivals, ModelRef, PlacementWorkload};
use super::profile::{CostModel, Profile};

/// Prompt tokens of a request when the workload does not say.
pub const DEFAULT_PROMPT_TOKENS: usize = 16;
/// Generated tokens of a request when the workload does not say.
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Workload length when the file does not say, in seconds.
pub const DEFAULT_DURATION_S: f64 = 60.0;
/// Largest prompt or generation accepted (a context no model here has).
const MAX_TOKENS: usize = 1 << 20;

/// A server's workload: one arrival process per model with traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingWorkload {
    /// Seconds of arrivals the planner simulates (default 60).
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Seed of the arrivals (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Per served model, its traffic; models not listed get none.
    pub models: Vec<ModelLoad>,
}

/// One model's traffic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelLoad {
    /// The served model name.
    pub model: String,
    /// Mean requests per second (> 0).
    pub rate: f64,
    /// Coefficient of variation of the gaps between arrivals (≥ 0; 1 is Poisson, larger burstier).
    pub cv: f64,
    /// Latency objective of one request, in seconds (> 0).
    pub slo_s: f64,
    /// Prompt tokens of a request (default 16).
    #[serde(default)]
    pub prompt_tokens: Option<usize>,
    /// Tokens a request generates (default 16).
    #[serde(default)]
    pub max_tokens: Option<usize>,
}

impl ModelLoad {
    /// `(prompt tokens, generated tokens)` of one request.
    pub fn shape(&self) -> (usize, usize) {
        (self.prompt_tokens.unwrap_or(DEFAULT_PROMPT_TOKENS), self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS))
    }
}

impl ServingWorkload {
    /// Checks every field against the models served (`served`, their names): an unknown or
    /// repeated model, a rate, CV or SLO that is negative, zero where it must be positive, or not
    /// a number, each an error naming the field.
    pub fn check(&self, served: &[String]) -> Result<(), InputError> {
        check::positive("duration_s", self.duration_s.unwrap_or(DEFAULT_DURATION_S))?;
        if self.models.is_empty() {
            return Err(InputError::new("models", "is empty; give each served model's rate, cv and slo_s"));
        }
        for (i, m) in self.models.iter().enumerate() {
            let f = |name: &str| format!("models[{i}].{name}");
            if !served.contains(&m.model) {
                let names: Vec<String> = served.iter().map(|s| format!("`{s}`")).collect();
                return Err(InputError::new(
                    f("model"),
                    format!("`{}` is not served; the served models are {}", m.model, names.join(", ")),
                ));
            }
            if self.models[..i].iter().any(|o| o.model == m.model) {
                return Err(InputError::new(f("model"), format!("`{}` is listed twice; give it once", m.model)));
            }
            check::positive(&f("rate"), m.rate)?;
            check::non_negative(&f("cv"), m.cv)?;
            check::positive(&f("slo_s"), m.slo_s)?;
            let (prompt, max) = m.shape();
            check::count(&f("prompt_tokens"), prompt, MAX_TOKENS)?;
            check::count(&f("max_tokens"), max, MAX_TOKENS)?;
        }
        Ok(())
    }

    /// The traffic of `model`, if it has any.
    pub fn load(&self, model: &str) -> Option<&ModelLoad> {
        self.models.iter().find(|m| m.model == model)
    }

    /// The workload as the placement planner generates it.
    pub fn placement_workload(&self) -> PlacementWorkload {
        PlacementWorkload {
            trace: None,
            arrivals: Some(
                self.models
                    .iter()
                    .map(|m| Arrivals { model: ModelRef::Name(m.model.clone()), rate: m.rate, cv: m.cv })
                    .collect(),
            ),
            duration_s: Some(self.duration_s.unwrap_or(DEFAULT_DURATION_S)),
            seed: self.seed,
        }
    }
}

/// Each layer's latency of one request of `prompt` tokens generating `max_tokens` tokens, in
/// milliseconds (see the module docs).
pub fn request_layer_ms(cost: &CostModel, (prompt, max_tokens): (usize, usize)) -> Vec<f64> {
    let p = cost.profile();
    let decode_steps = max_tokens.saturating_sub(1);
    let mut per_layer = cost.prefill_layer_ms(1.0, prompt as f64, 0.0);
    let mut first = prompt as f64 * p.embedding.ms_per_token + cost.prefill_overhead_ms(1.0, prompt as f64);
    for step in 0..decode_steps {
        let context = (prompt + step) as f64;
        per_layer += cost.decode_layer_ms(1.0, context);
        first += p.embedding.ms_per_token + cost.decode_overhead_ms(1.0, context);
    }
    let head = (1 + decode_steps) as f64 * p.lm_head.ms_per_token;
    let mut layers = vec![per_layer; p.layers];
    if let Some(l) = layers.first_mut() {
        *l += first;
    }
    if let Some(l) = layers.last_mut() {
        *l += head;
    }
    layers
}

/// Each layer's weight bytes, the embedding's on the first layer and the head's on the last.
pub fn layer_memory_bytes(profile: &Profile) -> Vec<u64> {
    let mut layers = vec![profile.weight_bytes_per_layer; profile.layers];
    if let Some(l) = layers.first_mut() {
        *l = l.saturating_add(profile.embedding.weight_bytes);
    }
    if let Some(l) = layers.last_mut() {
        *l = l.saturating_add(profile.lm_head.weight_bytes);
    }
    layers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(json: &str) -> ServingWorkload {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn workload_errors_name_the_field() {
        let served = ["a".to_string(), "b".to_string()];
        let ok = workload(r#"{"models": [{"model": "a", "rate": 1, "cv": 3, "slo_s": 2}]}"#);
        ok.check(&served).unwrap();
        assert_eq!(ok.load("a").unwrap().shape(), (DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS));
        for (bad, field, words) in [
            (r#"{"models": [{"model": "c", "rate": 1, "cv": 1, "slo_s": 2}]}"#, "models[0].model", "`a`, `b`"),
            (r#"{"models": [{"model": "a", "rate": -1, "cv": 1, "slo_s": 2}]}"#, "models[0].rate", "-1"),
            (r#"{"models": [{"model": "a", "rate": 1, "cv": -3, "slo_s": 2}]}"#, "models[0].cv", "-3"),
            (r#"{"models": [{"model": "a", "rate": 1, "cv": 1, "slo_s": -2}]}"#, "models[0].slo_s", "-2"),
            (
                r#"{"models": [{"model": "a", "rate": 1, "cv": 1, "slo_s": 2, "max_tokens": 0}]}"#,
                "models[0].max_tokens",
                "at least 1",
            ),
            (
                r#"{"models": [{"model": "a", "rate": 1, "cv": 1, "slo_s": 2}, {"model": "a", "rate": 1, "cv": 1, "slo_s": 2}]}"#,
                "models[1].model",
                "twice",
            ),
            (
                r#"{"duration_s": 0, "models": [{"model": "a", "rate": 1, "cv": 1, "slo_s": 2}]}"#,
                "duration_s",
                "positive",
            ),
            (r#"{"models": []}"#, "models", "empty"),
        ] {
            let err = workload(bad).check(&served).unwrap_err();
            assert_eq!(err.field, field, "{bad}");
            assert!(err.problem.contains(words), "{bad}: {err}");
        }
        assert!(serde_json::from_str::<ServingWorkload>(r#"{"models": [], "rates": 1}"#).is_err());
    }

    #[test]
    fn a_requests_layer_cost_is_its_prefill_and_decode_steps() {
        let profile: Profile = serde_json::from_str(
            r#"{"layers": 3,
                "prefill": {"batch": [1], "tokens": [1, 16], "base_ms": [[1, 4]], "context_ms": [0, 0, 0, 0]},
                "decode": {"batch": [1], "context": [0, 100], "ms": [[1, 2]]},
                "weight_bytes_per_layer": 10, "kv_bytes_per_token_per_layer": 1,
                "embedding": {"weight_bytes": 5, "ms_per_token": 0.5},
                "lm_head": {"weight_bytes": 7, "ms_per_token": 2}}"#,
        )
        .unwrap();
        let cost = profile.cost_model("profile").unwrap();
        // Prefill of 16 tokens: 4 ms; decode steps at contexts 16 and 17: 1.16 + 1.17 ms.
        let layers = request_layer_ms(&cost, (16, 3));
        let per_layer = 4.0 + 1.16 + 1.17;
        let expected = [per_layer + 0.5 * 18.0, per_layer, per_layer + 2.0 * 3.0];
        for (got, want) in layers.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{layers:?} vs {expected:?}");
        }
        assert_eq!(layer_memory_bytes(&profile), [15, 10, 17]);
    }

    #[test]
    fn evaluating_a_planned_placement_gives_the_planners_own_outcome() {
        use super::super::placement::{self, ModelSpec, PlacementInput};
        let w = workload(
            r#"{"duration_s": 30, "seed": 3, "models": [
                {"model": "a", "rate": 4, "cv": 3, "slo_s": 0.5}, {"model": "b", "rate": 1, "cv": 1, "slo_s": 0.5}]}"#,
        );
        let model = |name: &str| ModelSpec {
            name: name.into(),
            layer_latency_ms: vec![40.0; 4],
            layer_memory_bytes: vec![10; 4],
            slo_s: 0.5,
            tensor_parallel: Vec::new(),
            measured_pipelines: Vec::new(),
        };
        let input = PlacementInput {
            models: vec![model("a"), model("b")],
            devices: 2,
            device_memory_bytes: 45,
            workload: w.placement_workload(),
            baseline: None,
            beam: None,
            interference: None,
            serve_every_model: false,
            admission: Default::default(),
        };
        for interference in [None, Some(0.7)] {
            let input = PlacementInput { interference, ..input.clone() };
            let planned = placement::plan(&input).unwrap();
            let evaluated = placement::evaluate(&input, planned.groups.clone()).unwrap();
            assert_eq!(evaluated, planned);
        }
        let planned = placement::plan(&input).unwrap();
        let mut unknown = planned.groups.clone();
        unknown[0].models[0].model = "c".into();
        let err = placement::evaluate(&input, unknown).unwrap_err().to_string();
        assert!(err.contains("no model is named `c`"), "{err}");
    }

    #[test]
    fn interference_takes_away_what_a_pipeline_gains_over_replicas() {
        use super::super::placement::{self, Arrivals, Baseline, ModelRef, ModelSpec, PlacementInput};
        use super::super::placement::{PlacementError, PlacementWorkload};
        // AlpaServe §4.3.1: two models of 0.4 s, two devices that each hold one, bursty traffic.
        let model = |name: &str| ModelSpec {
            name: name.into(),
            layer_latency_ms: vec![100.0; 4],
            layer_memory_bytes: vec![1 << 30; 4],
            slo_s: 0.8,
            tensor_parallel: Vec::new(),
            measured_pipelines: Vec::new(),
        };
        let arrivals = |name: &str| Arrivals { model: ModelRef::Name(name.into()), rate: 1.0, cv: 4.0 };
        let input = |interference: f64, baseline: Option<Baseline>| PlacementInput {
            models: vec![model("a"), model("b")],
            devices: 2,
            device_memory_bytes: 4 << 30,
            workload: PlacementWorkload {
                trace: None,
                arrivals: Some(vec![arrivals("a"), arrivals("b")]),
                duration_s: Some(2000.0),
                seed: Some(1),
            },
            baseline,
            beam: None,
            interference: Some(interference),
            serve_every_model: false,
            admission: Default::default(),
        };
        let attained = |kappa, baseline| placement::plan(&input(kappa, baseline)).unwrap().slo_attainment;
        let gain = |kappa| attained(kappa, None) - attained(kappa, Some(Baseline::Replication));
        // Devices that share nothing: the pipeline serves a burst of one model on both devices.
        assert!(gain(0.0) > 0.02, "{}", gain(0.0));
        // κ = 1: two stages at work take as long as one device doing both, and two replicas at
        // work as long as one device doing both requests, so neither placement gains.
        assert!(gain(1.0).abs() < gain(0.0) / 4.0, "{} vs {}", gain(1.0), gain(0.0));
        // Interference only ever slows the same placement down.
        for baseline in [None, Some(Baseline::Replication)] {
            assert!(attained(1.0, baseline) < attained(0.0, baseline));
            assert!(attained(0.5, baseline) <= attained(0.0, baseline) + 1e-12);
        }
        let err = placement::plan(&input(-0.5, None)).unwrap_err();
        assert!(matches!(&err, PlacementError::Input(e) if e.field == "interference"), "{err}");
    }
}
