//! Log-probabilities in the API's two shapes, from the engine's per-token lists:
//! - completions: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`;
//! - chat: `{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
//!
//! The engine is asked for `max(top, 1)` alternatives per step and lists the sampled token first,
//! then the top ones ([`split`] also reads a list of the top ones alone, taking the sampled
//! token's entry from it when it is there).

use burn_llm_models::{PromptLogprobs, TokenLogprob};

use super::ServedModel;
use super::protocol::chat::{ChatLogprobs, ChatTokenLogprob, TopLogprob};
use super::protocol::completions::{CompletionLogprobs, TopTokens};

/// The sampled token's log-probability (when known) and the alternatives of one step whose
/// request asked the engine for `k` alternatives.
pub fn split(step: &[TokenLogprob], sampled: u32, k: usize) -> (Option<f32>, &[TokenLogprob]) {
    match step.split_first() {
        Some((first, rest)) if step.len() > k => (Some(first.logprob), rest),
        _ => (step.iter().find(|t| t.id == sampled).map(|t| t.logprob), step),
    }
}

/// One token of a completions `logprobs` object: its id and its scored list (the token's own
/// entry first, then the alternatives), or `None` where nothing was scored (a prompt's first
/// token).
pub type Entry<'a> = (u32, Option<&'a [TokenLogprob]>);

/// The entries of sampled `ids` with their `steps`.
pub fn entries<'a>(ids: &'a [u32], steps: &'a [Vec<TokenLogprob>]) -> impl Iterator<Item = Entry<'a>> + 'a {
    ids.iter().zip(steps).map(|(&id, step)| (id, Some(step.as_slice())))
}

/// The entries of prompt `ids` scored by the engine (`echo` with `logprobs`).
pub fn prompt_entries<'a>(ids: &'a [u32], scored: &'a PromptLogprobs) -> impl Iterator<Item = Entry<'a>> + 'a {
    ids.iter().zip(scored).map(|(&id, step)| (id, step.as_deref()))
}

/// The completions shape for `entries`, `top` alternatives each; `offset` is where the first
/// token's text starts in the choice's text (moved past the tokens). An unscored token has
/// `null` for its log-probability and its alternatives, as OpenAI's echoed first token does.
pub fn completion<'a>(
    model: &ServedModel,
    entries: impl Iterator<Item = Entry<'a>>,
    top: usize,
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for (id, step) in entries {
        let token = model.token_text(id);
        out.text_offset.push(*offset);
        *offset += token.chars().count();
        let Some(step) = step else {
            out.tokens.push(token);
            out.token_logprobs.push(None);
            out.top_logprobs.push(None);
            continue;
        };
        let (logprob, alternatives) = split(step, id, top.max(1));
        let mut map = TopTokens::default();
        if let Some(lp) = logprob {
            map.insert(token.clone(), lp);
        }
        for alt in alternatives.iter().take(top) {
            map.insert(model.token_text(alt.id), alt.logprob);
        }
        out.tokens.push(token);
        out.token_logprobs.push(logprob);
        out.top_logprobs.push(Some(map));
    }
    out
}

/// The chat shape for the sampled `ids` and their `steps`, `top` alternatives each.
pub fn chat(model: &ServedModel, ids: &[u32], steps: &[Vec<TokenLogprob>], top: usize) -> ChatLogprobs {
    let entry = |id: u32, logprob: Option<f32>| {
        let token = model.token_text(id);
        let bytes = token.as_bytes().to_vec();
        TopLogprob { token, logprob, bytes }
    };
    let content = ids
        .iter()
        .zip(steps)
        .map(|(&id, step)| {
            let (logprob, alternatives) = split(step, id, top.max(1));
            let TopLogprob { token, logprob, bytes } = entry(id, logprob);
            let top_logprobs = alternatives.iter().take(top).map(|t| entry(t.id, Some(t.logprob))).collect();
            ChatTokenLogprob { token, logprob, bytes, top_logprobs }
        })
        .collect();
    ChatLogprobs { content }
}
