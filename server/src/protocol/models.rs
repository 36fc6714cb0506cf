//! `GET /v1/models`, `GET /health` and `GET /version`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `/v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The served models.
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    /// Its served name.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix time the server started.
    pub created: u64,
    /// `burn-llm`.
    pub owned_by: String,
    /// Its served name (vLLM's `root`).
    pub root: String,
    /// The model it derives from (none).
    pub parent: Option<String>,
    /// Its context length.
    pub max_model_len: usize,
}

/// `/health`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// Each model's state: `ok`, `ok (…replicas down…)` or `down: why`.
    pub models: BTreeMap<String, String>,
    /// With `--placement`: the placement (see the server docs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<serde_json::Value>,
}

/// `/version`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Version {
    /// The server's version.
    pub version: String,
}
