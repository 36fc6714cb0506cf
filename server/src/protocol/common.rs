//! What several routes share: `usage`, `finish_reason`, OpenAI's error object, `stream_options`
//! and `stop`'s string-or-list.

use burn_llm_models::FinishReason;
use serde::{Deserialize, Serialize};

use super::either::{StringOr, deserialize_string_or};

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StringOr for OneOrMany {
    type Other = Vec<String>;
    const EXPECTING: &'static str = "a string or a list of strings";

    fn from_string(text: String) -> Self {
        Self::One(text)
    }

    fn from_other(list: Vec<String>) -> Self {
        Self::Many(list)
    }
}

deserialize_string_or!(OneOrMany);

impl OneOrMany {
    /// The strings.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and `choices: []`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt(s).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// The usage of `prompt_tokens` in, `completion_tokens` out.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}

/// `finish_reason` as the API spells it: the engine's reasons, and `tool_calls` for a chat reply
/// read as calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReasonOut {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context.
    Length,
    /// Aborted.
    Abort,
    /// The reply is tool calls.
    ToolCalls,
}

impl From<FinishReason> for FinishReasonOut {
    fn from(reason: FinishReason) -> Self {
        match reason {
            FinishReason::Stop => Self::Stop,
            FinishReason::Length => Self::Length,
            FinishReason::Abort => Self::Abort,
        }
    }
}

/// OpenAI's error body, `{"error": {...}}` (also sent as a stream event when a stream fails
/// after it started).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorObject,
}

/// The error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// What went wrong and what to do.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault (a JSON path), when one is.
    pub param: Option<String>,
    /// A machine-readable code, when there is one.
    pub code: Option<String>,
}
