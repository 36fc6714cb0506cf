//! The HTTP client of the server tests and `cargo xtask bench serve --online` (shared through a
//! `#[path]` module): `reqwest` on loopback, plus a reader of Server-Sent Events.
//!
//! Burn's `remote-websocket` feature (through `iroh`) turns on reqwest's `rustls-no-provider`, so
//! building a `reqwest::Client` panics unless a rustls crypto provider is installed first;
//! [`client`] installs `ring` (already compiled into the workspace) once per process.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};

/// A `reqwest` client, after installing the process's rustls crypto provider (a no-op when one is
/// installed already).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// The `data:` payloads of a Server-Sent-Events body, one per event, as they arrive.
pub struct SseEvents<S> {
    body: Pin<Box<S>>,
    /// Bytes received after the last complete line.
    pending: Vec<u8>,
    /// The `data:` lines of the event being read, joined by newlines.
    data: Option<String>,
}

impl<S, B> SseEvents<S>
where
    S: Stream<Item = reqwest::Result<B>>,
    B: AsRef<[u8]>,
{
    /// Reads `body`, typically `response.bytes_stream()`.
    pub fn new(body: S) -> Self {
        Self { body: Box::pin(body), pending: Vec::new(), data: None }
    }

    /// The next event's data (`None` once the body ends; an event cut off by the end is dropped,
    /// as the SSE specification says).
    pub async fn next(&mut self) -> Option<reqwest::Result<String>> {
        loop {
            while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if let Some(data) = self.data.take() {
                        return Some(Ok(data));
                    }
                } else if let Some(value) = line.strip_prefix("data:") {
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match &mut self.data {
                        Some(data) => {
                            data.push('\n');
                            data.push_str(value);
                        }
                        None => self.data = Some(value.to_string()),
                    }
                } // comments (`:`), `event:`, `id:` and `retry:` lines carry nothing the callers use
            }
            match self.body.next().await? {
                Ok(bytes) => self.pending.extend_from_slice(bytes.as_ref()),
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Every remaining event's data.
    pub async fn collect(mut self) -> reqwest::Result<Vec<String>> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event?);
        }
        Ok(events)
    }
}
