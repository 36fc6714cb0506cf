//! `--api-key`: the `/v1` routes need `Authorization: Bearer <key>`; the key is compared in
//! constant time (no timing oracle on its bytes) and never logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;
use super::errors::ApiError;

/// Middleware: passes the request on when no key is configured or the bearer token matches,
/// else answers 401 with OpenAI's error object.
pub async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Some(key) = &state.config.api_key else { return next.run(request).await };
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if key_matches(key, given) { next.run(request).await } else { ApiError::unauthorized().into_response() }
}

/// Constant-time comparison of the configured key with the one given (only the length can leak).
pub fn key_matches(key: &str, given: &str) -> bool {
    key.as_bytes().ct_eq(given.as_bytes()).into()
}
