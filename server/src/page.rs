//! `GET /`: the chat page, one static HTML/JS file compiled into the binary (no build step). It
//! streams a conversation through `/v1/chat/completions`, shows tokens as they arrive, and has
//! the sampling settings and a stop button. `/?q=TEXT` opens it with TEXT sent (a link to a
//! question; `&temperature=`, `&max_tokens=` preset the settings; `&model=` picks the model, which
//! a select filled from `/v1/models` also does).

use axum::response::Html;

/// The page.
pub const PAGE: &str = include_str!("page.html");

/// The route.
pub async fn handle() -> Html<&'static str> {
    Html(PAGE)
}
