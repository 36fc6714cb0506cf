//! Request bodies of the OpenAI API (the fields vLLM's `protocol.py` accepts) and how they become
//! [`SamplingParams`]; a field no struct takes lands in `extra`, and is a 400 unless
//! [`structured::IGNORED_FIELDS`](super::structured::IGNORED_FIELDS) lists it.

use std::collections::BTreeMap;

use burn_llm_models::{ChatMessage, Prompt, SamplingParams};
use serde::Deserialize;
use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::structured::ConstraintFields;
use super::tools::{ToolCallInput, ToolChoice, ToolDef};

/// Largest `n` / `best_of`: more sequences than this per prompt are refused up front.
pub const MAX_SEQUENCES: u64 = 128;
/// Largest `logprobs` / `top_logprobs` (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: u32 = 20;

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and `choices: []`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and streaming fields completions and chat completions share.
#[derive(Debug, Clone, Default, Deserialize)]
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
    /// The end user (accepted, unused).
    pub user: Option<String>,
}

impl SamplingFields {
    /// Whether the response streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed response ends with a usage chunk (refused without `stream`, as vLLM does).
    pub fn include_usage(&self) -> ApiResult<bool> {
        match &self.stream_options {
            Some(_) if !self.streams() => {
                Err(ApiError::bad_request("stream_options can only be given with stream: true", Some("stream_options")))
            }
            Some(o) => Ok(o.include_usage),
            None => Ok(false),
        }
    }

    /// The engine's parameters for `max_tokens` tokens and `logprobs` alternatives, with the
    /// request's `constraints`, checked against the model's vocabulary: every out-of-range value
    /// is a 400 naming its field.
    pub fn params(
        &self,
        max_tokens: u64,
        logprobs: Option<usize>,
        vocab_size: usize,
        constraints: &ConstraintFields,
    ) -> ApiResult<SamplingParams> {
        if max_tokens == 0 {
            return Err(ApiError::bad_request("max_tokens must be at least 1", Some("max_tokens")));
        }
        let n = self.n.unwrap_or(1);
        for (name, value) in [("n", Some(n)), ("best_of", self.best_of)] {
            if let Some(v) = value.filter(|&v| v == 0 || v > MAX_SEQUENCES) {
                return Err(ApiError::bad_request(
                    format!("{name} must be between 1 and {MAX_SEQUENCES}, got {v}"),
                    Some(name),
                ));
            }
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::bad_request(
                    format!("top_k must be -1 (all) or positive, got {k}"),
                    Some("top_k"),
                ));
            }
        };
        let stop_token_ids = self
            .stop_token_ids
            .iter()
            .flatten()
            .map(|&id| {
                u32::try_from(id).ok().filter(|&id| (id as usize) < vocab_size).ok_or_else(|| {
                    ApiError::bad_request(
                        format!("stop_token_ids: {id} is not a token id of this model (vocabulary of {vocab_size})"),
                        Some("stop_token_ids"),
                    )
                })
            })
            .collect::<ApiResult<Vec<u32>>>()?;
        let params = SamplingParams {
            max_new_tokens: max_tokens.min(usize::MAX as u64) as usize,
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            seed: self.seed.map(|s| s as u64),
            stop_token_ids,
            stop: match &self.stop {
                None => Vec::new(),
                Some(OneOrMany::One(s)) => vec![s.clone()],
                Some(OneOrMany::Many(v)) => v.clone(),
            },
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
            ApiError::bad_request(message.clone(), param_of(&message))
        })?;
        if self.streams() && params.best_of.is_some_and(|b| b > params.n) {
            return Err(ApiError::bad_request(
                "best_of > n cannot stream (the best sequences are known only at the end): drop stream or best_of",
                Some("best_of"),
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

/// `prompt` of `/v1/completions`: text, texts, token ids, or lists of token ids.
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
    /// The prompts, each as text or ids; an empty list or a negative id is a 400.
    pub fn prompts(self) -> ApiResult<Vec<Prompt>> {
        let ids = |list: Vec<i64>| -> ApiResult<Prompt> {
            list.into_iter()
                .map(|id| {
                    u32::try_from(id)
                        .map_err(|_| ApiError::bad_request(format!("prompt: {id} is not a token id"), Some("prompt")))
                })
                .collect::<ApiResult<Vec<u32>>>()
                .map(Prompt::Ids)
        };
        let prompts = match self {
            PromptInput::Text(t) => vec![Prompt::Text(t)],
            PromptInput::Texts(ts) => ts.into_iter().map(Prompt::Text).collect(),
            PromptInput::Ids(list) => vec![ids(list)?],
            PromptInput::IdLists(lists) => lists.into_iter().map(ids).collect::<ApiResult<_>>()?,
        };
        if prompts.is_empty() {
            return Err(ApiError::bad_request("prompt must not be an empty list", Some("prompt")));
        }
        if prompts.iter().any(|p| matches!(p, Prompt::Text(t) if t.is_empty())) {
            return Err(ApiError::bad_request("prompt must not be empty", Some("prompt")));
        }
        Ok(prompts)
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// The prompt(s).
    pub prompt: PromptInput,
    /// Prefix each choice's text with its prompt.
    pub echo: Option<bool>,
    /// Return the log-probabilities of each token and of this many alternatives.
    pub logprobs: Option<u32>,
    /// The shared fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Structured outputs, `logit_bias` and `min_p` (flattened apart from `sampling`: serde hands
    /// `extra` only the fields that a flattened struct without flattened fields of its own took).
    #[serde(flatten)]
    pub constraints: ConstraintFields,
    /// Every other field (a 400 unless ignored by design).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (images and audio are not supported).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageInput {
    /// `system`, `developer` (as system), `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (`null` for an empty assistant turn).
    pub content: Option<MessageContent>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCallInput>>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// The author's or the tool's name.
    pub name: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<MessageInput>,
    /// Return the log-probability of each token.
    pub logprobs: Option<bool>,
    /// With `logprobs`: this many alternatives per token.
    pub top_logprobs: Option<u32>,
    /// OpenAI's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Functions the model may call.
    pub tools: Option<Vec<ToolDef>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<ToolChoice>,
    /// The shared fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Structured outputs, `logit_bias` and `min_p` (flattened apart from `sampling`: serde hands
    /// `extra` only the fields that a flattened struct without flattened fields of its own took).
    #[serde(flatten)]
    pub constraints: ConstraintFields,
    /// Every other field (a 400 unless ignored by design).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl ChatRequest {
    /// The conversation as the chat template takes it; an empty list, an unknown role or a
    /// non-text part is a 400.
    pub fn messages(&self) -> ApiResult<Vec<ChatMessage>> {
        chat_messages(&self.messages)
    }

    /// The engine's number of log-probability alternatives (`logprobs` + `top_logprobs`); the
    /// engine always reports the sampled token's, so at least one alternative is asked for.
    pub fn logprobs(&self) -> ApiResult<Option<usize>> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (false, Some(_)) => Err(ApiError::bad_request("top_logprobs needs logprobs: true", Some("top_logprobs"))),
            (_, Some(k)) if k > MAX_LOGPROBS => Err(ApiError::bad_request(
                format!("top_logprobs must be at most {MAX_LOGPROBS}, got {k}"),
                Some("top_logprobs"),
            )),
            (true, k) => Ok(Some(k.unwrap_or(0).max(1) as usize)),
            (false, None) => Ok(None),
        }
    }
}

/// A conversation as the chat template takes it; an empty list, an unknown role or a non-text
/// part is a 400.
pub fn chat_messages(messages: &[MessageInput]) -> ApiResult<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
    }
    messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(ApiError::bad_request(
                        format!("message role `{other}` is not supported: use system, user, assistant or tool"),
                        Some("messages"),
                    ));
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => parts
                    .iter()
                    .map(|p| match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => Ok(t.as_str()),
                        (kind, _) => Err(ApiError::bad_request(
                            format!("content part `{kind}` is not supported: only text parts are"),
                            Some("messages"),
                        )),
                    })
                    .collect::<ApiResult<Vec<&str>>>()?
                    .join("\n"),
            };
            Ok(ChatMessage { role: role.into(), content })
        })
        .collect()
}
