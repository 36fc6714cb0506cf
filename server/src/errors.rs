//! OpenAI's error object: every failure a client can cause answers with an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`, the shape the `openai` client libraries
//! turn into their typed exceptions.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::protocol::{ErrorBody, ErrorObject, FieldError};

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 401: no or a wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or invalid API key: send `Authorization: Bearer <key>` with the key the server was started with".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404: a model this server does not serve (`served`: the names it does serve, as text).
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{asked}` does not exist: this server serves {served} (see GET /v1/models)"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404: no such route.
    pub fn no_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no route {path}: see the README's Server section for the routes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// 413: the body is over `--max-body-bytes`.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body over {limit} bytes (the server's --max-body-bytes)"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 503: too many requests waiting (`--max-waiting`) or the engine has stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("service_unavailable"),
        }
    }

    /// 408: the request ran past `--request-timeout-s` (its engine requests are aborted).
    pub fn timeout(limit: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request did not finish within the server's limit of {:.3} s (--request-timeout-s): ask for fewer tokens or retry later",
                limit.as_secs_f64()
            ),
            kind: "timeout_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// 500: the engine failed while running a request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The error object (also sent as an SSE event when a stream fails after it started).
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: self.code.map(str::to_string),
            },
        }
    }
}

impl From<FieldError> for ApiError {
    /// A request field that is wrong: 400.
    fn from(error: FieldError) -> Self {
        let FieldError { message, param, code } = error;
        Self { status: StatusCode::BAD_REQUEST, message, kind: "invalid_request_error", param, code }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// Result of a route.
pub type ApiResult<T> = std::result::Result<T, ApiError>;
