//! From engine events to responses, shared by completions and chat: [`collect`] waits for every
//! final output (a plain JSON response), [`sse`] turns each delta into a chunk of Server-Sent
//! Events (axum's [`Sse`]) ending with `data: [DONE]`. A client that hangs up drops the stream,
//! which drops the [`Run`] and aborts its engine requests.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use burn_llm_models::{FinishReason, PromptLogprobs, RequestOutput, SequenceDelta};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use tokio_stream::wrappers::ReceiverStream;

use super::engine_loop::{EngineEvent, Run, Tagged};
use super::errors::{ApiError, ApiResult};
use super::protocol::Usage;

/// Waits for the final outputs of every engine request of `run` (per prompt, best first); past
/// `timeout`, a 408 (the caller then drops `run`, which aborts its requests and frees their
/// blocks).
pub async fn collect(run: &mut Run, timeout: Option<Duration>) -> ApiResult<Vec<Vec<RequestOutput>>> {
    match timeout {
        Some(limit) => tokio::time::timeout(limit, collect_all(run)).await.map_err(|_| ApiError::timeout(limit))?,
        None => collect_all(run).await,
    }
}

async fn collect_all(run: &mut Run) -> ApiResult<Vec<Vec<RequestOutput>>> {
    let mut outputs: Vec<Option<Vec<RequestOutput>>> = vec![None; run.len()];
    while outputs.iter().any(Option::is_none) {
        let Some(Tagged { tag, event }) = run.next().await else {
            return Err(ApiError::unavailable("the engine stopped before the request finished"));
        };
        match event {
            EngineEvent::Step(out) => {
                if let (Some(done), Some(slot)) = (out.finished, outputs.get_mut(tag)) {
                    *slot = Some(done);
                }
            }
            EngineEvent::Failed(message) => return Err(ApiError::internal(message)),
            EngineEvent::Accepted | EngineEvent::Rejected(_) => {}
        }
    }
    Ok(outputs.into_iter().flatten().collect())
}

/// How one route writes its stream chunks.
pub trait ChunkFormat: Send + 'static {
    /// The route's chunk type.
    type Chunk: Serialize + Send;
    /// Chunks sent before any token (chat: the role; completions with `echo`: the prompt).
    fn opening(&mut self) -> Vec<Self::Chunk>;
    /// Chunks for the prompt log-probabilities of prompt `prompt`, sent before its first tokens
    /// (completions with `echo` and `logprobs`); none by default.
    fn prompt_logprobs(&mut self, _prompt: usize, _logprobs: &PromptLogprobs) -> Vec<Self::Chunk> {
        Vec::new()
    }
    /// The chunks for new tokens of choice `choice` (none: nothing to send).
    fn delta(&mut self, choice: usize, delta: &SequenceDelta) -> Vec<Self::Chunk>;
    /// The chunk closing a choice that ended without a last delta (refused or aborted).
    fn close(&mut self, choice: usize, reason: FinishReason) -> Self::Chunk;
    /// The last chunk, with `usage` and no choices.
    fn usage(&self, usage: Usage) -> Self::Chunk;
}

/// An event of one JSON value (our own response types always serialize).
fn event(value: &impl Serialize) -> Event {
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// The SSE response of `run`: `n` choices per prompt (choice `prompt * n + sequence`), each
/// delta a chunk in order, the usage chunk when asked, then `[DONE]`. An engine failure after the
/// stream started, or `timeout` running out (its requests then aborted), is sent as an error
/// object before `[DONE]`.
pub fn sse(
    mut run: Run,
    (n, prompt_tokens, include_usage): (usize, usize, bool),
    timeout: Option<Duration>,
    mut format: impl ChunkFormat,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    // Far enough ahead to never fire when there is no limit.
    let deadline = tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(100 * 365 * 86_400));
    tokio::spawn(async move {
        for chunk in format.opening() {
            if tx.send(event(&chunk)).await.is_err() {
                return;
            }
        }
        let mut open: BTreeSet<usize> = (0..run.len() * n).collect();
        let mut completion_tokens = 0;
        while !open.is_empty() {
            let next = tokio::select! {
                next = run.next() => next,
                // The client hung up: returning drops `run`, which aborts its requests.
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(deadline), if timeout.is_some() => {
                    let error = timeout.map(ApiError::timeout).unwrap_or_else(|| ApiError::internal("timeout"));
                    let _ = tx.send(event(&error.body())).await;
                    let _ = tx.send(Event::default().data("[DONE]")).await;
                    return;
                }
            };
            let mut chunks = Vec::new();
            let mut failure = None;
            match next.map(|t| (t.tag, t.event)) {
                Some((tag, EngineEvent::Step(out))) => {
                    if let Some(logprobs) = &out.prompt_logprobs {
                        chunks.extend(format.prompt_logprobs(tag, logprobs));
                    }
                    for delta in &out.sequences {
                        let choice = tag * n + delta.index;
                        completion_tokens += delta.token_ids.len();
                        chunks.extend(format.delta(choice, delta));
                        if delta.finish_reason.is_some() {
                            open.remove(&choice);
                        }
                    }
                    if let Some(done) = &out.finished {
                        for i in 0..n {
                            if open.remove(&(tag * n + i)) {
                                let reason = done.get(i).map_or(FinishReason::Abort, |o| o.finish_reason);
                                chunks.push(format.close(tag * n + i, reason));
                            }
                        }
                    }
                }
                Some((_, EngineEvent::Failed(message))) => {
                    failure = Some(ApiError::internal(message));
                    open.clear();
                }
                Some(_) => {}
                None => {
                    failure = Some(ApiError::unavailable("the engine stopped before the request finished"));
                    open.clear();
                }
            }
            let events: Vec<Event> = chunks.iter().map(event).chain(failure.map(|e| event(&e.body()))).collect();
            for message in events {
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let _ = tx.send(event(&format.usage(Usage::new(prompt_tokens, completion_tokens)))).await;
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    Sse::new(ReceiverStream::new(rx).map(Ok)).keep_alive(KeepAlive::default())
}
