//! The wire types of every route: request bodies (what vLLM's `protocol.py` accepts, as serde
//! structs) and the response bodies and stream chunks the server sends, so that what a route
//! takes and gives is read off its types.
//!
//! Every request struct refuses unknown fields (`#[serde(deny_unknown_fields)]`), at every depth
//! (messages, content parts, tools, `response_format`, `stream_options`, …), and [`parse`] reads
//! a body with [`serde_path_to_error`], so a 400 names the field by its JSON path
//! (`messages[2].content[0].foo`). Fields that change nothing here by design (`user`, `metadata`,
//! …) are declared and ignored ([`IgnoredAny`](serde::de::IgnoredAny)). A value that is one of
//! several shapes (a string or a list of parts, a mode or a named function) is read by
//! [`either`] rather than an untagged enum, which would buffer the value and lose both the path
//! and the reason of an error below it.
//!
//! This module knows nothing of the server's state: requests are checked into engine inputs
//! ([`SamplingFields::params`], [`ConstraintFields::constraint`], …) with a [`FieldError`] naming
//! the field at fault, which the routes answer as a 400. A route added later (another API's
//! requests and responses) gets a module here beside [`chat`] and [`completions`].
//!
//! | module | what |
//! |---|---|
//! | [`common`] | `usage`, `finish_reason`, the error object, `stream_options`, string-or-list values |
//! | [`sampling`] | the sampling fields chat and completions share, and their [`SamplingParams`](burn_llm_models::SamplingParams) |
//! | [`structured`] | `response_format`, `guided_*`, `logit_bias`, `min_p` |
//! | [`completions`] | `/v1/completions`: request, response, chunk, log-probabilities |
//! | [`chat`] | `/v1/chat/completions`: messages, request, response, chunk, log-probabilities |
//! | [`tools`] | `tools`, `tool_choice`, earlier calls, and the calls a reply makes |
//! | [`tokenize`] | `/tokenize`, `/detokenize` |
//! | [`models`] | `/v1/models`, `/health`, `/version` |

pub mod chat;
pub mod common;
pub mod completions;
pub mod either;
pub mod models;
pub mod sampling;
pub mod structured;
pub mod tokenize;
pub mod tools;

pub use chat::{ChatRequest, MessageContent, MessageInput};
pub use common::{ErrorBody, ErrorObject, FinishReasonOut, OneOrMany, StreamOptions, Usage};
pub use completions::{CompletionRequest, PromptInput};
pub use sampling::{MAX_LOGPROBS, MAX_SEQUENCES, SamplingFields};
pub use structured::{ConstraintFields, ResponseFormat};

use serde::de::DeserializeOwned;

/// A request field that is wrong: what is wrong and what to do, the field (its JSON path), and a
/// machine-readable code when there is one. The routes answer it as a 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// What is wrong and what to do.
    pub message: String,
    /// The field at fault (a JSON path such as `messages[2].content`), when one is.
    pub param: Option<String>,
    /// A machine-readable code (`unknown_field`, `invalid_request_body`, …).
    pub code: Option<&'static str>,
}

impl FieldError {
    /// `message` about `param`.
    pub fn new(message: impl Into<String>, param: impl Into<String>) -> Self {
        Self { message: message.into(), param: Some(param.into()), code: None }
    }

    /// `message` about no field in particular.
    pub fn general(message: impl Into<String>) -> Self {
        Self { message: message.into(), param: None, code: None }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FieldError {}

/// Result of reading or checking a request.
pub type FieldResult<T> = Result<T, FieldError>;

/// A request body read as `T`: an unknown field anywhere is refused with its JSON path (code
/// `unknown_field`); a field of the wrong type or value, or JSON that does not parse, names
/// where (code `invalid_request_body`).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> FieldResult<T> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        described(&path, e.into_inner())
    })?;
    // Trailing characters after the value are an error, as `serde_json::from_slice` makes them.
    de.end().map_err(|e| described(".", e))?;
    Ok(value)
}

/// The 400 of `error` at `path` (`.`: the body itself).
fn described(path: &str, error: serde_json::Error) -> FieldError {
    let at = |field: &str| if path == "." { field.to_string() } else { format!("{path}.{field}") };
    if let Some(field) = unknown_field(&error.to_string()) {
        // The path serde_path_to_error reports ends at the unknown key itself where it read one.
        let field = if path == field || path.ends_with(&format!(".{field}")) { path.to_string() } else { at(field) };
        return FieldError::new(
            format!(
                "unknown field `{field}`: this server does not support it (see the server docs for the fields it takes)"
            ),
            field,
        )
        .with_code("unknown_field");
    }
    let what = match error.classify() {
        serde_json::error::Category::Data => "the request body has a field of the wrong type or value",
        _ => "the request body is not valid JSON",
    };
    let described = match path {
        "." | "?" => FieldError::general(format!("{what}: {error}")),
        _ => FieldError::new(format!("{what}: `{path}`: {error}"), path),
    };
    described.with_code("invalid_request_body")
}

/// The field of serde's "unknown field `NAME`, expected …" message.
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused<T: DeserializeOwned + std::fmt::Debug>(body: &str) -> FieldError {
        parse::<T>(body.as_bytes()).expect_err(body)
    }

    #[test]
    fn unknown_fields_are_named_by_their_path() {
        let cases = [
            (r#"{"messages": [], "foo": 1}"#, "foo"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y", "foo": 1}]}"#,
                "messages[1].foo",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}]}"#,
                "messages[0].content[0].foo",
            ),
            (
                r#"{"messages": [], "tools": [{"type": "function", "function": {"name": "f", "foo": 1}}]}"#,
                "tools[0].function.foo",
            ),
            (
                r#"{"messages": [], "tool_choice": {"type": "function", "function": {"name": "f"}, "foo": 1}}"#,
                "tool_choice.foo",
            ),
            (
                r#"{"messages": [], "response_format": {"type": "json_schema", "json_schema": {"foo": 1}}}"#,
                "response_format.json_schema.foo",
            ),
            (r#"{"messages": [], "stream_options": {"foo": 1}}"#, "stream_options.foo"),
        ];
        for (body, path) in cases {
            let error = refused::<ChatRequest>(body);
            assert_eq!((error.param.as_deref(), error.code), (Some(path), Some("unknown_field")), "{body}: {error}");
            assert!(error.message.contains(&format!("`{path}`")), "{error}");
        }
        let error =
            refused::<CompletionRequest>(r#"{"prompt": "x", "stream_options": {"include_usage": true, "foo": 1}}"#);
        assert_eq!(error.param.as_deref(), Some("stream_options.foo"));
    }

    #[test]
    fn shapes_and_types_are_read_in_place() {
        let ok: ChatRequest = parse(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "stop": "a",
                 "tool_choice": "auto", "user": "u", "chat_template_kwargs": {"enable_thinking": false}}"#,
        )
        .unwrap();
        assert!(matches!(&ok.messages[0].content, Some(MessageContent::Parts(p)) if p.len() == 1));
        assert_eq!(ok.sampling().stop, Some(OneOrMany::One("a".into())));
        let error =
            refused::<ChatRequest>(r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}"#);
        assert_eq!(
            (error.param.as_deref(), error.code),
            (Some("messages[0].content[0].text"), Some("invalid_request_body"))
        );
        let error = refused::<ChatRequest>(r#"{"messages": [{"role": "user", "content": 5}]}"#);
        assert_eq!(error.param.as_deref(), Some("messages[0].content"), "{error}");
        let error = refused::<ChatRequest>(r#"{"messages": []} trailing"#);
        assert_eq!(error.code, Some("invalid_request_body"));
    }
}
