//! The sampling and streaming fields chat and completions share, how they become
//! [`SamplingParams`], and [`generation_request!`], which writes them into each route's request
//! struct.
//!
//! serde refuses unknown fields only in a struct without `#[serde(flatten)]`, so the shared
//! fields cannot be a flattened struct: the macro declares them in each request struct, and
//! [`SamplingFields`] / [`ConstraintFields`](super::ConstraintFields) are built from them.

use burn_llm_models::SamplingParams;

use super::structured::ConstraintFields;
use super::{FieldError, FieldResult, OneOrMany, StreamOptions};

/// Largest `n` / `best_of`: more sequences than this per prompt are refused up front.
pub const MAX_SEQUENCES: u64 = 128;
/// Largest `logprobs` / `top_logprobs` (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: u32 = 20;

/// The sampling and streaming fields of a generation request.
#[derive(Debug, Clone, Default)]
pub struct SamplingFields {
    /// Tokens to generate at most.
    pub max_tokens: Option<u64>,
    /// Softmax temperature (0: greedy); OpenAI's default is 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Top-K sampling; -1 or 0 keeps every token (vLLM).
    pub top_k: Option<i64>,
    /// Sequences returned per prompt.
    pub n: Option<u64>,
    /// Sequences sampled per prompt, the `n` most likely returned.
    pub best_of: Option<u64>,
    /// Seed of the request's random stream.
    pub seed: Option<i64>,
    /// Strings that end generation (cut from the text).
    pub stop: Option<OneOrMany>,
    /// Token ids that end generation.
    pub stop_token_ids: Option<Vec<i64>>,
    /// Keep going after EOS.
    pub ignore_eos: Option<bool>,
    /// OpenAI's presence penalty, [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty, [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// HF's repetition penalty, > 0.
    pub repetition_penalty: Option<f32>,
    /// Server-sent events instead of one JSON response.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
}

/// Declares a generation request: the route's own fields, then the shared ones (those of
/// [`SamplingFields`] and [`ConstraintFields`], and the fields ignored by design: who the end user
/// is, bookkeeping for OpenAI's stored completions and tiers, which structured-output backend to
/// use, there being one), all in one struct that refuses unknown fields; `sampling()` and
/// `constraints()` give the shared ones.
macro_rules! generation_request {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$field_meta:meta])* pub $field:ident: $type:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$field_meta])* pub $field: $type,)*
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub max_tokens: Option<u64>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub temperature: Option<f32>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub top_p: Option<f32>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub top_k: Option<i64>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub n: Option<u64>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub best_of: Option<u64>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub seed: Option<i64>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub stop: Option<$crate::protocol::OneOrMany>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub stop_token_ids: Option<Vec<i64>>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub ignore_eos: Option<bool>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub presence_penalty: Option<f32>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub frequency_penalty: Option<f32>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub repetition_penalty: Option<f32>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub stream: Option<bool>,
            /// See [`SamplingFields`](crate::protocol::SamplingFields).
            pub stream_options: Option<$crate::protocol::StreamOptions>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub response_format: Option<$crate::protocol::ResponseFormat>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub guided_json: Option<serde_json::Value>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub guided_regex: Option<String>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub guided_choice: Option<Vec<String>>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub guided_grammar: Option<String>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub logit_bias: Option<std::collections::HashMap<String, f32>>,
            /// See [`ConstraintFields`](crate::protocol::ConstraintFields).
            pub min_p: Option<f32>,
            /// The end user (ignored).
            pub user: Option<serde::de::IgnoredAny>,
            /// OpenAI's stored-completion metadata (ignored).
            pub metadata: Option<serde::de::IgnoredAny>,
            /// OpenAI's stored completions (ignored).
            pub store: Option<serde::de::IgnoredAny>,
            /// OpenAI's service tier (ignored).
            pub service_tier: Option<serde::de::IgnoredAny>,
            /// OpenAI's prompt-cache routing key (ignored: the prefix cache needs no key).
            pub prompt_cache_key: Option<serde::de::IgnoredAny>,
            /// OpenAI's end-user safety identifier (ignored).
            pub safety_identifier: Option<serde::de::IgnoredAny>,
            /// vLLM's structured-output backend (ignored: there is one).
            pub guided_decoding_backend: Option<serde::de::IgnoredAny>,
            /// vLLM's whitespace pattern for JSON outputs (ignored).
            pub guided_whitespace_pattern: Option<serde::de::IgnoredAny>,
        }

        impl $name {
            /// The sampling and streaming fields.
            pub fn sampling(&self) -> $crate::protocol::SamplingFields {
                $crate::protocol::SamplingFields {
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    n: self.n,
                    best_of: self.best_of,
                    seed: self.seed,
                    stop: self.stop.clone(),
                    stop_token_ids: self.stop_token_ids.clone(),
                    ignore_eos: self.ignore_eos,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                }
            }

            /// The constraint and bias fields.
            pub fn constraints(&self) -> $crate::protocol::ConstraintFields {
                $crate::protocol::ConstraintFields {
                    response_format: self.response_format.clone(),
                    guided_json: self.guided_json.clone(),
                    guided_regex: self.guided_regex.clone(),
                    guided_choice: self.guided_choice.clone(),
                    guided_grammar: self.guided_grammar.clone(),
                    logit_bias: self.logit_bias.clone(),
                    min_p: self.min_p,
                }
            }
        }
    };
}
pub(crate) use generation_request;

impl SamplingFields {
    /// Whether the response streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed response ends with a usage chunk (refused without `stream`, as vLLM does).
    pub fn include_usage(&self) -> FieldResult<bool> {
        match &self.stream_options {
            Some(_) if !self.streams() => {
                Err(FieldError::new("stream_options can only be given with stream: true", "stream_options"))
            }
            Some(o) => Ok(o.include_usage),
            None => Ok(false),
        }
    }

    /// The engine's parameters for `max_tokens` tokens and `logprobs` alternatives, with the
    /// request's `constraints`, checked against the model's vocabulary: every out-of-range value
    /// is an error naming its field.
    pub fn params(
        &self,
        max_tokens: u64,
        logprobs: Option<usize>,
        vocab_size: usize,
        constraints: &ConstraintFields,
    ) -> FieldResult<SamplingParams> {
        if max_tokens == 0 {
            return Err(FieldError::new("max_tokens must be at least 1", "max_tokens"));
        }
        let n = self.n.unwrap_or(1);
        for (name, value) in [("n", Some(n)), ("best_of", self.best_of)] {
            if let Some(v) = value.filter(|&v| v == 0 || v > MAX_SEQUENCES) {
                return Err(FieldError::new(format!("{name} must be between 1 and {MAX_SEQUENCES}, got {v}"), name));
            }
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => return Err(FieldError::new(format!("top_k must be -1 (all) or positive, got {k}"), "top_k")),
        };
        let stop_token_ids = self
            .stop_token_ids
            .iter()
            .flatten()
            .map(|&id| {
                u32::try_from(id).ok().filter(|&id| (id as usize) < vocab_size).ok_or_else(|| {
                    FieldError::new(
                        format!("stop_token_ids: {id} is not a token id of this model (vocabulary of {vocab_size})"),
                        "stop_token_ids",
                    )
                })
            })
            .collect::<FieldResult<Vec<u32>>>()?;
        let params = SamplingParams {
            max_new_tokens: max_tokens.min(usize::MAX as u64) as usize,
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            seed: self.seed.map(|s| s as u64),
            stop_token_ids,
            stop: self.stop.as_ref().map(OneOrMany::to_vec).unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            prompt_logprobs: None,
            n: n as usize,
            best_of: self.best_of.map(|b| b as usize),
            beam: None,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            min_p: constraints.min_p.unwrap_or(0.0),
            logit_bias: constraints.logit_bias()?,
            constraint: constraints.constraint()?,
        };
        params.validate(vocab_size).map_err(|e| {
            let message = e.to_string();
            match param_of(&message) {
                Some(param) => FieldError::new(message, param),
                None => FieldError::general(message),
            }
        })?;
        if self.streams() && params.best_of.is_some_and(|b| b > params.n) {
            return Err(FieldError::new(
                "best_of > n cannot stream (the best sequences are known only at the end): drop stream or best_of",
                "best_of",
            ));
        }
        Ok(params)
    }
}

/// The request field a sampling-validation message is about (the first word after the error's
/// prefix, in the API's names).
fn param_of(message: &str) -> Option<&'static str> {
    const FIELDS: [&str; 11] = [
        "min_p",
        "logit_bias",
        "temperature",
        "top_p",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "stop",
        "best_of",
        "n",
    ];
    let detail = message.split_once(": ").map_or(message, |(_, rest)| rest);
    let word = detail.split(|c: char| !(c.is_alphanumeric() || c == '_')).find(|w| !w.is_empty())?;
    if word == "max_new_tokens" {
        return Some("max_tokens");
    }
    FIELDS.into_iter().find(|f| *f == word)
}
