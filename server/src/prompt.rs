//! A chat as the prompt text its template makes, the one rendering that `/v1/chat/completions`
//! and `/tokenize` share (so that `/tokenize` with `messages` counts exactly what the chat route
//! would run): the messages checked, the tool plan (tools shown unless `tool_choice` is `none`,
//! earlier calls and tool results written as the template expects), and `chat_template_kwargs`
//! given to the template as variables.

use burn_llm_models::ChatTemplate;
use serde_json::{Map, Value};

use super::errors::{ApiError, ApiResult};
use super::protocol::MessageInput;
use super::protocol::chat::chat_messages;
use super::protocol::tools::{ToolChoice, ToolDef};
use super::tools::{self, ToolPlan};

/// Template variables the server sets itself, which `chat_template_kwargs` may not name.
const RESERVED_VARIABLES: [&str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/// What a chat prompt is made of, as a request gives it.
#[derive(Debug, Clone, Copy)]
pub struct ChatPrompt<'a> {
    /// The conversation.
    pub messages: &'a [MessageInput],
    /// The functions the model may call.
    pub tools: Option<&'a [ToolDef]>,
    /// How it may call them.
    pub tool_choice: Option<&'a ToolChoice>,
    /// `chat_template_kwargs`.
    pub kwargs: Option<&'a Map<String, Value>>,
    /// Open the assistant's turn.
    pub add_generation_prompt: bool,
}

/// A rendered chat: its text and the request's tool plan (`None` without tools).
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The prompt text.
    pub text: String,
    /// The tools and choice, checked.
    pub plan: Option<ToolPlan>,
}

impl ChatPrompt<'_> {
    /// The prompt text `template` makes of this chat; a malformed message, tool choice or
    /// variable, or a template that fails, is a 400 naming the field.
    pub fn render(&self, template: &ChatTemplate) -> ApiResult<Rendered> {
        let texts = chat_messages(self.messages)?;
        let plan = ToolPlan::new(self.tools, self.tool_choice)?;
        if let Some(name) =
            self.kwargs.into_iter().flat_map(Map::keys).find(|k| RESERVED_VARIABLES.contains(&k.as_str()))
        {
            return Err(ApiError::bad_request(
                format!("chat_template_kwargs: `{name}` is set by the server (from the request's own fields): drop it"),
                Some(format!("chat_template_kwargs.{name}").as_str()),
            ));
        }
        let involves_tools = plan.is_some() || self.messages.iter().any(|m| m.tool_calls.is_some() || m.role == "tool");
        let text = if involves_tools {
            tools::render(template, self.messages, &texts, plan.as_ref(), self.kwargs, self.add_generation_prompt)?
        } else {
            template
                .render_with(&texts, None, self.add_generation_prompt, self.kwargs)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?
        };
        Ok(Rendered { text, plan })
    }
}
