//! The request fields that constrain or bias what a model may write: OpenAI's `response_format`
//! (`text`, `json_object`, `json_schema`), vLLM's `guided_json` / `guided_regex` /
//! `guided_choice` / `guided_grammar` (one at most: each becomes a [`Constraint`]), `logit_bias`
//! (token id strings → bias) and vLLM's `min_p`.

use std::collections::{BTreeMap, HashMap};

use burn_llm_models::Constraint;
use serde::Deserialize;
use serde_json::Value;

use super::{FieldError, FieldResult};

/// `response_format.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseFormatKind {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema,
}

/// `response_format` (a struct rather than a tagged enum, so that an unknown field inside it is
/// refused with its path).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// What the reply is.
    #[serde(rename = "type")]
    pub kind: ResponseFormatKind,
    /// With `json_schema`: the schema and its name.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// The constraint and bias fields of a generation request.
#[derive(Debug, Clone, Default)]
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
    /// The request's constraint; two at once, or an empty or malformed one, is an error naming
    /// the field.
    pub fn constraint(&self) -> FieldResult<Option<Constraint>> {
        let mut found: Vec<(&'static str, Constraint)> = Vec::new();
        if let Some(format) = &self.response_format {
            match (format.kind, &format.json_schema) {
                (ResponseFormatKind::Text, _) => {}
                (ResponseFormatKind::JsonObject, _) => found.push(("response_format", Constraint::JsonObject)),
                (ResponseFormatKind::JsonSchema, json_schema) => {
                    let schema = json_schema.as_ref().and_then(|j| j.schema.clone()).ok_or_else(|| {
                        FieldError::new(
                            "response_format.json_schema needs a `schema`",
                            "response_format.json_schema.schema",
                        )
                    })?;
                    found.push(("response_format", Constraint::JsonSchema(schema)));
                }
            }
        }
        if let Some(schema) = &self.guided_json {
            let schema = match schema {
                Value::String(text) => serde_json::from_str(text)
                    .map_err(|e| FieldError::new(format!("guided_json is not valid JSON: {e}"), "guided_json"))?,
                other => other.clone(),
            };
            found.push(("guided_json", Constraint::JsonSchema(schema)));
        }
        if let Some(regex) = &self.guided_regex {
            found.push(("guided_regex", Constraint::Regex(regex.clone())));
        }
        if let Some(choices) = &self.guided_choice {
            if choices.is_empty() {
                return Err(FieldError::new("guided_choice must not be empty", "guided_choice"));
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
                Err(FieldError::new(
                    format!("give one structured-output field at most, got {}", names.join(", ")),
                    names[1],
                ))
            }
        }
    }

    /// `logit_bias` with token ids as numbers (a key that is not an id is an error).
    pub fn logit_bias(&self) -> FieldResult<BTreeMap<u32, f32>> {
        self.logit_bias
            .iter()
            .flatten()
            .map(|(key, &bias)| {
                let id = key.trim().parse::<u32>().map_err(|_| {
                    FieldError::new(
                        format!("logit_bias: `{key}` is not a token id (keys are token ids as strings)"),
                        "logit_bias",
                    )
                })?;
                Ok((id, bias))
            })
            .collect()
    }
}
