//! `POST /v1/completions` (OpenAI's legacy completions, as vLLM serves them): the request, and
//! what is sent back (a whole response, or stream chunks).

use std::fmt;

use burn_llm_models::Prompt;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::common::{FinishReasonOut, Usage};
use super::sampling::generation_request;
use super::{FieldError, FieldResult};

/// `prompt`: text, texts, token ids, or lists of token ids (only numbers and strings, so an
/// untagged enum loses no path).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text.
    Text(String),
    /// Several texts (one completion each).
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<i64>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<i64>>),
}

impl PromptInput {
    /// The prompts, each as text or ids; an empty list or a negative id is an error.
    pub fn prompts(self) -> FieldResult<Vec<Prompt>> {
        let ids = |list: Vec<i64>| -> FieldResult<Prompt> {
            list.into_iter()
                .map(|id| {
                    u32::try_from(id).map_err(|_| FieldError::new(format!("prompt: {id} is not a token id"), "prompt"))
                })
                .collect::<FieldResult<Vec<u32>>>()
                .map(Prompt::Ids)
        };
        let prompts = match self {
            PromptInput::Text(t) => vec![Prompt::Text(t)],
            PromptInput::Texts(ts) => ts.into_iter().map(Prompt::Text).collect(),
            PromptInput::Ids(list) => vec![ids(list)?],
            PromptInput::IdLists(lists) => lists.into_iter().map(ids).collect::<FieldResult<_>>()?,
        };
        if prompts.is_empty() {
            return Err(FieldError::new("prompt must not be an empty list", "prompt"));
        }
        if prompts.iter().any(|p| matches!(p, Prompt::Text(t) if t.is_empty())) {
            return Err(FieldError::new("prompt must not be empty", "prompt"));
        }
        Ok(prompts)
    }
}

generation_request! {
    /// `POST /v1/completions`.
    pub struct CompletionRequest {
        /// The served model's name (optional).
        pub model: Option<String>,
        /// The prompt(s).
        pub prompt: PromptInput,
        /// Prefix each choice's text with its prompt.
        pub echo: Option<bool>,
        /// Return the log-probabilities of each token and of this many alternatives.
        pub logprobs: Option<u32>,
    }
}

/// A completion (`object: text_completion`), and each stream chunk of one (`usage` only on the
/// last chunk, with `stream_options.include_usage`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix time.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One per returned sequence (`prompt × n + sequence`); a chunk's: the choice it moves on.
    pub choices: Vec<CompletionChoice>,
    /// Tokens in and out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a completion or chunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Its position.
    pub index: usize,
    /// Its text (a chunk's: the new text).
    pub text: String,
    /// With `logprobs`.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why it ended (`null` on a chunk before the last).
    pub finish_reason: Option<FinishReasonOut>,
}

/// The completions shape of log-probabilities.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability (`null` for an unscored one: a prompt's first).
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token's alternatives, the token's own first (`null` where unscored).
    pub top_logprobs: Vec<Option<TopTokens>>,
    /// Where each token's text starts in the choice's text, in characters.
    pub text_offset: Vec<usize>,
}

/// Token text → log-probability, in the order given (a JSON object; a repeated text keeps its
/// first value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopTokens(pub Vec<(String, f32)>);

impl TopTokens {
    /// Adds `token` unless it is there already.
    pub fn insert(&mut self, token: String, logprob: f32) {
        if !self.0.iter().any(|(t, _)| *t == token) {
            self.0.push((token, logprob));
        }
    }
}

impl Serialize for TopTokens {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TopTokens {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TokensVisitor;
        impl<'de> Visitor<'de> for TokensVisitor {
            type Value = TopTokens;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of token texts to log-probabilities")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopTokens, A::Error> {
                let mut tokens = TopTokens::default();
                while let Some((token, logprob)) = map.next_entry::<String, f32>()? {
                    tokens.insert(token, logprob);
                }
                Ok(tokens)
            }
        }
        deserializer.deserialize_map(TokensVisitor)
    }
}
