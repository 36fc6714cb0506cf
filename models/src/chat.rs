//! Chat prompts rendered with the model's own Jinja chat template (HF `apply_chat_template`), the
//! one in `tokenizer_config.json` or in a GGUF file's `tokenizer.chat_template`.

use minijinja::{Environment, Error, ErrorKind, context};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from the user.
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: "user".into(), content: content.into() }
    }

    /// A system prompt.
    pub fn system(content: impl Into<String>) -> Self {
        Self { role: "system".into(), content: content.into() }
    }
}

/// A model's chat template with the special tokens it may refer to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// A template from its Jinja source, with the model's BOS/EOS token strings (templates use
    /// `{{ bos_token }}`).
    pub fn new(source: impl Into<String>, bos_token: impl Into<String>, eos_token: impl Into<String>) -> Self {
        Self { source: source.into(), bos_token: bos_token.into(), eos_token: eos_token.into() }
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, ending with the assistant's turn opened when `add_generation_prompt`,
    /// as transformers' `apply_chat_template(..., tokenize=False)` does (Python string methods
    /// such as `.strip()` and the `raise_exception` helper are available to the template).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, None, add_generation_prompt, None)
    }

    /// Whether the template reads a `tools` list (a model trained for tool calls formats them
    /// itself; others get a default format from the caller).
    pub fn handles_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders any serializable message list (messages with `tool_calls`, `tool_call_id`, …) with
    /// the `tools` variable set (`None`: undefined, as transformers leaves it without tools) and
    /// the variables of `kwargs` beside them (vLLM's `chat_template_kwargs`, such as
    /// `enable_thinking`; the caller keeps them from naming the variables set here).
    pub fn render_with(
        &self,
        messages: &(impl Serialize + ?Sized),
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let fail = |e: Error| {
            let mut message = e.to_string();
            if let Some(detail) = e.detail() {
                message = format!("{message}: {detail}");
            }
            ModelError::ChatTemplate(message)
        };
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template("chat", &self.source).map_err(fail)?;
        let template = env.get_template("chat").map_err(fail)?;
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
                ..minijinja::Value::from_serialize(kwargs.cloned().unwrap_or_default()),
            })
            .map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template (ChatML with a default system prompt).
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_a_generation_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>");
        let out = t.render(&[ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn kwargs_are_template_variables() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}[no think]{% endif %}{{ messages[0].content }}",
            "",
            "",
        );
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        let messages = [ChatMessage::user("hi")];
        assert_eq!(t.render_with(&messages, None, true, Some(&kwargs)).unwrap(), "[no think]hi");
        assert_eq!(t.render_with(&messages, None, true, None).unwrap(), "hi");
    }

    #[test]
    fn python_methods_bos_and_exceptions() {
        let source = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}[{{ m.content.strip() }}]{% endfor %}";
        let t = ChatTemplate::new(source, "<s>", "</s>");
        assert_eq!(t.render(&[ChatMessage::user("  hi  ")], false).unwrap(), "<s>[hi]");
        let err = t.render(&[ChatMessage::system("x")], false).unwrap_err();
        assert!(err.to_string().contains("no system"), "{err}");
        let broken = ChatTemplate::new("{% for %}", "", "");
        assert!(matches!(broken.render(&[], false), Err(ModelError::ChatTemplate(_))));
    }
}
