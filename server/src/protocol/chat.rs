//! `POST /v1/chat/completions`: the messages, the request, and what is sent back (a whole
//! response, or stream chunks).

use burn_llm_models::ChatMessage;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::common::{FinishReasonOut, Usage};
use super::either::{StringOr, deserialize_string_or};
use super::sampling::{MAX_LOGPROBS, generation_request};
use super::tools::{ToolCall, ToolCallDelta, ToolCallInput, ToolChoice, ToolDef};
use super::{FieldError, FieldResult};

/// A chat message's `content`: a string or a list of parts.
#[derive(Debug, Clone)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

impl StringOr for MessageContent {
    type Other = Vec<ContentPart>;
    const EXPECTING: &'static str = "a string or a list of content parts";

    fn from_string(text: String) -> Self {
        Self::Text(text)
    }

    fn from_other(parts: Vec<ContentPart>) -> Self {
        Self::Parts(parts)
    }
}

deserialize_string_or!(MessageContent);

/// One part of a message's content. The other kinds' fields are taken so that such a part is
/// refused for its kind (only text is supported), not for an unknown field.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// `text` (images, audio, files and video are not supported).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
    /// An `image_url` part's image (refused).
    pub image_url: Option<IgnoredAny>,
    /// An `input_audio` part's audio (refused).
    pub input_audio: Option<IgnoredAny>,
    /// A `file` part's file (refused).
    pub file: Option<IgnoredAny>,
    /// A `video_url` part's video (refused).
    pub video_url: Option<IgnoredAny>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// An assistant reply's refusal, sent back with it (ignored: the reply's text is `content`).
    pub refusal: Option<IgnoredAny>,
    /// An assistant reply's annotations, sent back with it (ignored).
    pub annotations: Option<IgnoredAny>,
}

generation_request! {
    /// `POST /v1/chat/completions`.
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
        /// OpenAI: calls in parallel (ignored: every well-formed call of a reply is returned).
        pub parallel_tool_calls: Option<IgnoredAny>,
        /// Variables for the chat template (vLLM's; e.g. `{"enable_thinking": false}`).
        pub chat_template_kwargs: Option<Map<String, Value>>,
    }
}

impl ChatRequest {
    /// The conversation as the chat template takes it (see [`chat_messages`]).
    pub fn messages(&self) -> FieldResult<Vec<ChatMessage>> {
        chat_messages(&self.messages)
    }

    /// The engine's number of log-probability alternatives (`logprobs` + `top_logprobs`); the
    /// engine always reports the sampled token's, so at least one alternative is asked for.
    pub fn logprobs(&self) -> FieldResult<Option<usize>> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (false, Some(_)) => Err(FieldError::new("top_logprobs needs logprobs: true", "top_logprobs")),
            (_, Some(k)) if k > MAX_LOGPROBS => {
                Err(FieldError::new(format!("top_logprobs must be at most {MAX_LOGPROBS}, got {k}"), "top_logprobs"))
            }
            (true, k) => Ok(Some(k.unwrap_or(0).max(1) as usize)),
            (false, None) => Ok(None),
        }
    }
}

/// A conversation as the chat template takes it; an empty list, an unknown role or a non-text
/// part is an error naming it (`messages[1].content[0].type`).
pub fn chat_messages(messages: &[MessageInput]) -> FieldResult<Vec<ChatMessage>> {
    if messages.is_empty() {
        return Err(FieldError::new("messages must not be empty", "messages"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(FieldError::new(
                        format!("message role `{other}` is not supported: use system, user, assistant or tool"),
                        format!("messages[{i}].role"),
                    ));
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => parts
                    .iter()
                    .enumerate()
                    .map(|(k, p)| match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => Ok(t.as_str()),
                        ("text", None) => {
                            Err(FieldError::new("a text part needs `text`", format!("messages[{i}].content[{k}].text")))
                        }
                        (kind, _) => Err(FieldError::new(
                            format!("content part `{kind}` is not supported: only text parts are"),
                            format!("messages[{i}].content[{k}].type"),
                        )),
                    })
                    .collect::<FieldResult<Vec<&str>>>()?
                    .join("\n"),
            };
            Ok(ChatMessage { role: role.into(), content })
        })
        .collect()
}

/// A chat completion (`object: chat.completion`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix time.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One per returned sequence.
    pub choices: Vec<ChatChoice>,
    /// Tokens in and out.
    pub usage: Usage,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Its position.
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// With `logprobs`.
    pub logprobs: Option<ChatLogprobs>,
    /// Why it ended.
    pub finish_reason: FinishReasonOut,
}

/// The assistant's reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: String,
    /// Its text (`null` when the reply is only tool calls).
    pub content: Option<String>,
    /// The calls it makes, when it makes some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A stream chunk (`object: chat.completion.chunk`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChunk {
    /// The completion's id (the same on every chunk).
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix time.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choice this chunk moves on (none on the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// On the last chunk, with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A choice of a stream chunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Which choice.
    pub index: usize,
    /// What is new.
    pub delta: ChatDelta,
    /// The new tokens' log-probabilities, with `logprobs`.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<FinishReasonOut>,
}

/// What a chunk adds to a choice.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant`, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls, as deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

impl ChatDelta {
    /// A delta of `text` (none when empty).
    pub fn text(text: String) -> Self {
        Self { content: (!text.is_empty()).then_some(text), ..Self::default() }
    }
}

/// The chat shape of log-probabilities.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One generated token's log-probability and its alternatives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability (`null` when the engine did not report it).
    pub logprob: Option<f32>,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopLogprob {
    /// Its text.
    pub token: String,
    /// Its log-probability.
    pub logprob: Option<f32>,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}
