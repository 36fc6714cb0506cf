//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::chat::MessageInput;
use super::tools::{ToolChoice, ToolDef};

/// `/tokenize`'s body: a completion prompt, or a chat rendered exactly as
/// `/v1/chat/completions` renders it (its `tools`, `tool_choice` and `chat_template_kwargs`
/// included).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// A conversation to render and tokenize.
    pub messages: Option<Vec<MessageInput>>,
    /// Add the tokenizer's special tokens (prompt: yes by default; chat: no, the template writes
    /// them).
    pub add_special_tokens: Option<bool>,
    /// Chat: open the assistant's turn (default yes).
    pub add_generation_prompt: Option<bool>,
    /// Chat: the functions, as the chat route takes them.
    pub tools: Option<Vec<ToolDef>>,
    /// Chat: the tool choice, as the chat route takes it (`none` hides the tools).
    pub tool_choice: Option<ToolChoice>,
    /// Chat: variables for the chat template, as the chat route takes them.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Also return each token's string.
    pub return_token_strs: Option<bool>,
}

/// `/tokenize`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// How many tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
    /// Each token's string, with `return_token_strs`.
    pub token_strs: Option<Vec<String>>,
}

/// `/detokenize`'s body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<i64>,
}

/// `/detokenize`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The text of the tokens.
    pub prompt: String,
}
