//! A placement as `/health` shows it ([`PlacementReport`]).

use burn_plan::placement::{MeasuredPipeline, ModelAttainment};
use burn_plan::sim::Admission;
use serde::Serialize;

use super::{ChunkChoice, ServingPlacement};

/// A placement as `/health` shows it: the mode, the groups with their devices and models, the
/// admission rule, and with a workload the prediction, the interference priced, the pipelines
/// timed and the prefill chunks chosen.
#[derive(Debug, Clone, Serialize)]
pub struct PlacementReport<'a> {
    /// `auto`, `replicate` or `manual`.
    pub mode: &'static str,
    /// The device groups.
    pub groups: Vec<GroupReport<'a>>,
    /// `all` or `slo`.
    pub admission: Admission,
    /// The simulator's SLO attainment on the workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_slo_attainment: Option<f64>,
    /// Its attainment per model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_models: Option<&'a [ModelAttainment]>,
    /// The devices' interference the prediction priced (0: none measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interference: Option<f64>,
    /// The pipelines timed running, per model.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub measured_pipelines: Vec<MeasuredReport<'a>>,
    /// The prefill chunks chosen per model and stage count.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub chunk_tokens: &'a [ChunkChoice],
}

/// One group of a [`PlacementReport`].
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport<'a> {
    /// Its `--devices` entries.
    pub devices: Vec<&'a str>,
    /// Its pipeline stages.
    pub pipeline_stages: usize,
    /// The models it serves.
    pub models: Vec<GroupModelReport<'a>>,
}

/// A model on a group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupModelReport<'a> {
    /// The served model's name.
    pub model: &'a str,
    /// Its layers per stage.
    pub stages: &'a [[usize; 2]],
}

/// A pipeline timed running.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredReport<'a> {
    /// The served model's name.
    pub model: &'a str,
    /// What was measured.
    pub pipeline: &'a MeasuredPipeline,
}

impl ServingPlacement {
    /// The placement as `/health` shows it.
    pub fn report(&self) -> PlacementReport<'_> {
        let groups = self
            .groups
            .iter()
            .map(|g| GroupReport {
                devices: g.devices.iter().map(|&d| self.pool[d].as_str()).collect(),
                pipeline_stages: g.pipeline_stages,
                models: g.models.iter().map(|m| GroupModelReport { model: &m.model, stages: &m.stages }).collect(),
            })
            .collect();
        // The pipelines timed running, which priced the groups of their stage count.
        let measured_pipelines = self
            .input
            .iter()
            .flat_map(|i| &i.models)
            .flat_map(|m| m.measured_pipelines.iter().map(move |pipeline| MeasuredReport { model: &m.name, pipeline }))
            .collect();
        PlacementReport {
            mode: self.mode,
            groups,
            admission: self.input.as_ref().map(|i| i.admission).unwrap_or_default(),
            predicted_slo_attainment: self.prediction.as_ref().map(|p| p.slo_attainment),
            predicted_models: self.prediction.as_ref().map(|p| p.models.as_slice()),
            interference: self.prediction.as_ref().map(|_| self.interference().unwrap_or(0.0)),
            measured_pipelines,
            chunk_tokens: &self.chunk_tokens,
        }
    }

    /// [`ServingPlacement::report`] as a JSON value (what [`ServerConfig::placement`](super::ServerConfig) holds).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.report()).unwrap_or_default()
    }
}
