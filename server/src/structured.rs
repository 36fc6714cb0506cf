//! The request fields that constrain or bias what a model may write, and the rule that every
//! other field is known: OpenAI's `response_format` (`text`, `json_object`, `json_schema`), vLLM's
//! `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (one at most: each becomes
//! a [`Constraint`]), `logit_bias` (token id strings → bias) and vLLM's `min_p`.

use std::collections::{BTreeMap, HashMap};

use burn_llm_models::Constraint;
use serde::Deserialize;
use serde_json::Value;

use super::errors::{ApiError, ApiResult};

/// Fields a request may carry that change nothing here, by design (as in vLLM): who the end user
/// is, bookkeeping for OpenAI's stored completions and tiers, which structured-output backend to
/// use (there is one), and `parallel_tool_calls` (a reply holds one tool call at most).
pub const IGNORED_FIELDS: [&str; 9] = [
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "parallel_tool_calls",
];

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (required by OpenAI; unused).
    pub name: Option<String>,
    /// What it is for (unused).
    pub description: Option<String>,
    /// The JSON schema.
    pub schema: Option<Value>,
    /// OpenAI's strict mode: the schema is always enforced exactly here.
    pub strict: Option<bool>,
}

/// The constraint and bias fields, flattened into both generation requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConstraintFields {
    /// OpenAI's output format.
    pub response_format: Option<ResponseFormat>,
    /// vLLM: a JSON schema (an object, or a string holding one).
    pub guided_json: Option<Value>,
    /// vLLM: a regex the whole output matches.
    pub guided_regex: Option<String>,
    /// vLLM: the output is one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM: a Lark grammar.
    pub guided_grammar: Option<String>,
    /// OpenAI: token id (as a string) → bias in [-100, 100] added to its logit.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// vLLM: drop tokens less likely than `min_p` × the most likely one.
    pub min_p: Option<f32>,
}

impl ConstraintFields {
    /// The request's constraint; two at once, or an empty or malformed one, is a 400 naming the
    /// field.
    pub fn constraint(&self) -> ApiResult<Option<Constraint>> {
        let mut found: Vec<(&'static str, Constraint)> = Vec::new();
        match &self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject) => found.push(("response_format", Constraint::JsonObject)),
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                let schema = json_schema.schema.clone().ok_or_else(|| {
                    ApiError::bad_request("response_format.json_schema needs a `schema`", Some("response_format"))
                })?;
                found.push(("response_format", Constraint::JsonSchema(schema)));
            }
        }
        if let Some(schema) = &self.guided_json {
            let schema = match schema {
                Value::String(text) => serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_request(format!("guided_json is not valid JSON: {e}"), Some("guided_json"))
                })?,
                other => other.clone(),
            };
            found.push(("guided_json", Constraint::JsonSchema(schema)));
        }
        if let Some(regex) = &self.guided_regex {
            found.push(("guided_regex", Constraint::Regex(regex.clone())));
        }
        if let Some(choices) = &self.guided_choice {
            if choices.is_empty() {
                return Err(ApiError::bad_request("guided_choice must not be empty", Some("guided_choice")));
            }
            found.push(("guided_choice", Constraint::Choice(choices.clone())));
        }
        if let Some(grammar) = &self.guided_grammar {
            found.push(("guided_grammar", Constraint::Grammar(grammar.clone())));
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop().map(|(_, c)| c)),
            _ => {
                let names: Vec<&str> = found.iter().map(|(name, _)| *name).collect();
                Err(ApiError::bad_request(
                    format!("give one structured-output field at most, got {}", names.join(", ")),
                    Some(names[1]),
                ))
            }
        }
    }

    /// `logit_bias` with token ids as numbers (a key that is not an id is a 400).
    pub fn logit_bias(&self) -> ApiResult<BTreeMap<u32, f32>> {
        self.logit_bias
            .iter()
            .flatten()
            .map(|(key, &bias)| {
                let id = key.trim().parse::<u32>().map_err(|_| {
                    ApiError::bad_request(
                        format!("logit_bias: `{key}` is not a token id (keys are token ids as strings)"),
                        Some("logit_bias"),
                    )
                })?;
                Ok((id, bias))
            })
            .collect()
    }
}

/// A 400 naming the first field of `extra` (what no request struct took) that is not ignored by
/// design.
pub fn refuse_unknown(extra: &BTreeMap<String, Value>) -> ApiResult<()> {
    match extra.keys().find(|k| !IGNORED_FIELDS.contains(&k.as_str())) {
        Some(field) => Err(ApiError::bad_request(
            format!(
                "unknown field `{field}`: this server does not support it (see the server docs for the fields it takes)"
            ),
            Some(field),
        )
        .with_code("unknown_field")),
        None => Ok(()),
    }
}
