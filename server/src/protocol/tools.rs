//! Tool calling on the wire: `tools`, `tool_choice`, an assistant message's earlier
//! `tool_calls`, and the calls a reply makes (whole, and as stream deltas).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::either::{StringOr, deserialize_string_or};

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// `function` (the only kind).
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function the model may call (also what the chat template is given under `tools`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode (arguments are always constrained exactly with `required` or a named
    /// function).
    #[serde(skip_serializing)]
    pub strict: Option<bool>,
}

/// An assistant message's earlier tool call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallInput {
    /// The call's id.
    pub id: Option<String>,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// What was called.
    pub function: FunctionCallInput,
}

/// The function of an earlier call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallInput {
    /// Its name.
    pub name: String,
    /// Its arguments, as a JSON string (OpenAI's shape).
    pub arguments: String,
}

/// `tool_choice` as sent.
#[derive(Debug, Clone)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": …}}`.
    Named(NamedChoice),
}

impl StringOr for ToolChoice {
    type Other = NamedChoice;
    const EXPECTING: &'static str =
        "`none`, `auto`, `required` or {\"type\": \"function\", \"function\": {\"name\": …}}";

    fn from_string(mode: String) -> Self {
        Self::Mode(mode)
    }

    fn from_other(named: NamedChoice) -> Self {
        Self::Named(named)
    }
}

deserialize_string_or!(ToolChoice);

/// A named `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedChoice {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The named function.
    pub function: NamedFunction,
}

/// The function of a named `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    /// Its name.
    pub name: String,
}

/// A call in a reply (`message.tool_calls`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_…`, unique per server.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What is called.
    pub function: FunctionCall,
}

/// The function of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments as a JSON string.
    pub arguments: String,
}

/// A call in a stream delta: first its index, id, type and name with empty arguments, then its
/// index and the arguments (OpenAI's order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the reply.
    pub index: usize,
    /// Its id (first delta only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first delta only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name and arguments so far.
    pub function: FunctionCallDelta,
}

/// The function part of a call delta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// Its name (first delta only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Arguments text.
    pub arguments: String,
}
