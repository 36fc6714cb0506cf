//! Tool calls on `/v1/chat/completions`: `tools` and `tool_choice` (`none`, `auto`,
//! `required`, or one named function), how they reach the prompt, and how a reply becomes
//! `tool_calls`.
//!
//! A chat template that reads `tools` (a model trained for tool calls) gets them as
//! transformers passes them, with the messages' `tool_calls` and `tool_call_id`. Any other
//! template gets the default format, Hermes-style: a system prompt listing the functions as JSON
//! inside `<tools></tools>` and asking for `<tool_call>{"name": …, "arguments": {…}}</tool_call>`;
//! earlier calls are written back the same way and `tool` messages become user turns inside
//! `<tool_response></tool_response>`.
//!
//! `required` and a named function constrain the whole reply to the call's JSON
//! (`{"name": …, "arguments": …}`, the arguments valid against the function's `parameters`
//! schema) with the structured-output engine, so the reply is always a valid call unless it runs
//! out of `max_tokens`. With `auto` the model chooses; every well-formed `<tool_call>` block of its
//! reply becomes a call and the rest stays `content`.

use burn_llm_models::{ChatMessage, ChatTemplate, Constraint, FinishReason};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::errors::{ApiError, ApiResult};
use super::protocol::tools::{
    FunctionCall, FunctionCallDelta, FunctionDef, ToolCall, ToolCallDelta, ToolCallInput, ToolChoice, ToolDef,
};
use super::protocol::{FinishReasonOut, MessageInput};

/// What the reply may or must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    /// Text only (the tools are not shown to the model).
    None,
    /// Text or calls, as the model chooses.
    Auto,
    /// One call of any of the tools.
    Required,
    /// One call of this function.
    Named(String),
}

/// A request's tools and choice, checked.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The functions.
    pub functions: Vec<FunctionDef>,
    /// The choice.
    pub mode: ToolMode,
}

impl ToolPlan {
    /// The plan of a request (`None` without tools); a choice without tools, an unknown mode or
    /// a named function that is not among the tools is a 400.
    pub fn new(tools: Option<&[ToolDef]>, choice: Option<&ToolChoice>) -> ApiResult<Option<Self>> {
        let bad = |m: String| ApiError::bad_request(m, Some("tool_choice"));
        let Some(tools) = tools.filter(|t| !t.is_empty()) else {
            return match choice {
                None => Ok(None),
                Some(ToolChoice::Mode(m)) if m == "none" => Ok(None),
                _ => Err(bad("tool_choice needs tools".into())),
            };
        };
        if let Some((i, tool)) = tools.iter().enumerate().find(|(_, t)| t.kind != "function") {
            return Err(ApiError::bad_request(
                format!("tool type `{}` is not supported: only `function` is", tool.kind),
                Some(format!("tools[{i}].type").as_str()),
            ));
        }
        let functions: Vec<FunctionDef> = tools.iter().map(|t| t.function.clone()).collect();
        let mode = match choice {
            None => ToolMode::Auto,
            Some(ToolChoice::Mode(m)) => match m.as_str() {
                "none" => ToolMode::None,
                "auto" => ToolMode::Auto,
                "required" => ToolMode::Required,
                other => return Err(bad(format!("tool_choice `{other}` is not one of none, auto, required"))),
            },
            Some(ToolChoice::Named(named)) => {
                let name = &named.function.name;
                if !functions.iter().any(|f| &f.name == name) {
                    return Err(bad(format!("tool_choice names `{name}`, which is not among the tools")));
                }
                ToolMode::Named(name.clone())
            }
        };
        Ok(Some(Self { functions, mode }))
    }

    /// Whether the reply is read for calls.
    pub fn calls_possible(&self) -> bool {
        self.mode != ToolMode::None
    }

    /// The constraint that makes the reply one call (`required` or named), else `None`.
    pub fn constraint(&self) -> Option<Constraint> {
        let call_schema = |f: &FunctionDef| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": f.name},
                    "arguments": f.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        match &self.mode {
            ToolMode::Required => Some(Constraint::JsonSchema(json!({
                "anyOf": self.functions.iter().map(call_schema).collect::<Vec<_>>(),
            }))),
            ToolMode::Named(name) => {
                self.functions.iter().find(|f| &f.name == name).map(|f| Constraint::JsonSchema(call_schema(f)))
            }
            ToolMode::None | ToolMode::Auto => None,
        }
    }

    /// The calls in a finished reply and the text left around them (`None` when it holds no
    /// call).
    pub fn parse(&self, text: &str) -> Option<ParsedReply> {
        match &self.mode {
            ToolMode::None => None,
            ToolMode::Required | ToolMode::Named(_) => call_of(text.trim()).map(|call| (None, vec![call])),
            ToolMode::Auto => {
                let (mut content, mut calls, mut rest) = (String::new(), Vec::new(), text);
                while let Some(start) = rest.find(OPEN) {
                    content.push_str(&rest[..start]);
                    let body = &rest[start + OPEN.len()..];
                    let (inside, after) =
                        body.find(CLOSE).map_or((body, ""), |end| (&body[..end], &body[end + CLOSE.len()..]));
                    match call_of(inside.trim()) {
                        Some(call) => calls.push(call),
                        None => content.push_str(&rest[start..rest.len() - after.len()]),
                    }
                    rest = after;
                }
                content.push_str(rest);
                let content = content.trim();
                (!calls.is_empty()).then(|| ((!content.is_empty()).then(|| content.to_string()), calls))
            }
        }
    }
}

/// A reply read for calls: the text left around them (if any) and each call's
/// `(name, arguments as a JSON string)`.
pub type ParsedReply = (Option<String>, Vec<(String, String)>);

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// `(name, arguments as a JSON string)` of `{"name": …, "arguments": {…}}`.
fn call_of(text: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(text).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "{}".into(),
    };
    Some((name, arguments))
}

/// The id of call `k` of choice `choice` of response `response_id` (`call_…`, unique per server).
fn call_id(response_id: &str, choice: usize, k: usize) -> String {
    let stem = response_id.rsplit('-').next().unwrap_or(response_id);
    format!("call_{stem}{choice:x}{k:x}")
}

/// The calls of a finished reply (a reply cut by `max_tokens` or aborted holds none).
fn finished_calls(plan: Option<&ToolPlan>, text: &str, reason: FinishReason) -> Option<ParsedReply> {
    if reason != FinishReason::Stop {
        return None;
    }
    plan?.parse(text)
}

/// The calls of a reply, with their ids.
fn calls(parsed: Vec<(String, String)>, response_id: &str, choice: usize) -> impl Iterator<Item = ToolCall> + '_ {
    parsed.into_iter().enumerate().map(move |(k, (name, arguments))| ToolCall {
        id: call_id(response_id, choice, k),
        kind: "function".into(),
        function: FunctionCall { name, arguments },
    })
}

/// A finished choice's text (none when the reply is only calls), its calls (when it makes some),
/// and its `finish_reason` (`tool_calls` when it makes calls).
pub fn reply(
    plan: Option<&ToolPlan>,
    text: &str,
    reason: FinishReason,
    response_id: &str,
    choice: usize,
) -> (Option<String>, Option<Vec<ToolCall>>, FinishReasonOut) {
    match finished_calls(plan, text, reason) {
        Some((content, parsed)) => {
            (content, Some(calls(parsed, response_id, choice).collect()), FinishReasonOut::ToolCalls)
        }
        None => (Some(text.to_string()), None, reason.into()),
    }
}

/// A stream's view of a finished reply's calls: the text left around them (sent first, when
/// there is some), then per call the deltas OpenAI sends (its index, id, type and name with empty
/// arguments, then the arguments); `None` when it holds no call.
pub fn stream_calls(
    plan: Option<&ToolPlan>,
    text: &str,
    reason: FinishReason,
    response_id: &str,
    choice: usize,
) -> Option<(Option<String>, Vec<ToolCallDelta>)> {
    let (content, parsed) = finished_calls(plan, text, reason)?;
    let mut deltas = Vec::new();
    for (index, call) in calls(parsed, response_id, choice).enumerate() {
        let ToolCall { id, kind, function } = call;
        deltas.push(ToolCallDelta {
            index,
            id: Some(id),
            kind: Some(kind),
            function: FunctionCallDelta { name: Some(function.name), arguments: String::new() },
        });
        deltas.push(ToolCallDelta {
            index,
            id: None,
            kind: None,
            function: FunctionCallDelta { name: None, arguments: function.arguments },
        });
    }
    Some((content, deltas))
}

/// A function as a chat template and the default tool prompt list it (`tools` entries).
#[derive(Serialize)]
struct TemplateTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: &'a FunctionDef,
}

/// A message as a template that reads `tools` takes it (transformers' shape).
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<TemplateCall<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// An earlier call as a template takes it.
#[derive(Serialize)]
struct TemplateCall<'a> {
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: TemplateFunction<'a>,
}

/// An earlier call's function, its arguments as a JSON value when they parse (templates index
/// into them), else the string; also the body of a default-format `<tool_call>`.
#[derive(Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    arguments: Value,
}

impl<'a> TemplateFunction<'a> {
    fn of(call: &'a ToolCallInput) -> Self {
        let arguments = &call.function.arguments;
        let arguments = serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()));
        Self { name: &call.function.name, arguments }
    }
}

/// Compact JSON of a value that always serializes (plain structs of strings and JSON values).
fn compact(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The default tool prompt (Hermes-style), for templates that do not read `tools`.
fn default_tools_prompt(functions: &[FunctionDef]) -> String {
    let listed: Vec<String> =
        functions.iter().map(|function| compact(&TemplateTool { kind: "function", function })).collect();
    format!(
        "You may call functions to answer. The functions are listed as JSON inside <tools></tools>:\n<tools>\n{}\n</tools>\n\
         To call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\n\
         <tool_call>\n{{\"name\": <function name>, \"arguments\": <arguments object>}}\n</tool_call>",
        listed.join("\n")
    )
}

/// The prompt text of a conversation that involves tools (`plan`, earlier calls or tool
/// results), rendered with `template` and the template variables `kwargs`, the assistant's turn
/// opened when `add_generation_prompt`.
pub fn render(
    template: &ChatTemplate,
    inputs: &[MessageInput],
    texts: &[ChatMessage],
    plan: Option<&ToolPlan>,
    kwargs: Option<&Map<String, Value>>,
    add_generation_prompt: bool,
) -> ApiResult<String> {
    let shown = plan.filter(|p| p.calls_possible());
    let fail = |e: burn_llm_models::ModelError| ApiError::bad_request(e.to_string(), Some("messages"));
    if template.handles_tools() {
        let messages: Vec<TemplateMessage> = inputs
            .iter()
            .zip(texts)
            .map(|(input, text)| TemplateMessage {
                role: &text.role,
                content: &text.content,
                tool_calls: input.tool_calls.as_ref().map(|calls| {
                    calls
                        .iter()
                        .map(|c| TemplateCall {
                            id: c.id.as_deref(),
                            kind: "function",
                            function: TemplateFunction::of(c),
                        })
                        .collect()
                }),
                tool_call_id: input.tool_call_id.as_deref(),
                name: input.name.as_deref(),
            })
            .collect();
        let tools = shown.map(|p| {
            let listed: Vec<TemplateTool> =
                p.functions.iter().map(|function| TemplateTool { kind: "function", function }).collect();
            serde_json::to_value(listed).unwrap_or_default()
        });
        return template.render_with(&messages, tools.as_ref(), add_generation_prompt, kwargs).map_err(fail);
    }
    let mut messages: Vec<ChatMessage> = inputs
        .iter()
        .zip(texts)
        .map(|(input, text)| match text.role.as_str() {
            "tool" => ChatMessage::user(format!("<tool_response>\n{}\n</tool_response>", text.content)),
            _ => {
                let mut content = text.content.clone();
                for call in input.tool_calls.iter().flatten() {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&format!("{OPEN}\n{}\n{CLOSE}", compact(&TemplateFunction::of(call))));
                }
                ChatMessage { role: text.role.clone(), content }
            }
        })
        .collect();
    if let Some(plan) = shown {
        let prompt = default_tools_prompt(&plan.functions);
        match messages.first_mut().filter(|m| m.role == "system") {
            Some(system) => system.content = format!("{}\n\n{prompt}", system.content),
            None => messages.insert(0, ChatMessage::system(prompt)),
        }
    }
    template.render_with(&messages, None, add_generation_prompt, kwargs).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tools::{FunctionCallInput, NamedChoice, NamedFunction};

    fn plan(mode: ToolMode) -> ToolPlan {
        let f = FunctionDef { name: "get_weather".into(), description: None, parameters: None, strict: None };
        ToolPlan { functions: vec![f], mode }
    }

    #[test]
    fn auto_reads_tagged_calls_and_keeps_the_rest() {
        let p = plan(ToolMode::Auto);
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = p.parse(text).unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls, vec![("get_weather".to_string(), "{\"city\":\"Paris\"}".to_string())]);
        assert!(p.parse("no call here").is_none());
        assert!(p.parse("<tool_call>{not json}</tool_call>").is_none());
    }

    #[test]
    fn required_reads_the_whole_reply_and_constrains_it() {
        let p = plan(ToolMode::Required);
        let (content, calls) = p.parse("{\"name\": \"get_weather\", \"arguments\": {}}").unwrap();
        assert_eq!((content, calls.len()), (None, 1));
        assert!(matches!(p.constraint(), Some(Constraint::JsonSchema(_))));
        assert!(plan(ToolMode::Auto).constraint().is_none());
    }

    #[test]
    fn templates_without_tools_get_the_default_format() {
        let template = ChatTemplate::new("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", "", "");
        assert!(!template.handles_tools());
        let call = ToolCallInput {
            id: Some("call_1".into()),
            kind: Some("function".into()),
            function: FunctionCallInput { name: "get_weather".into(), arguments: "{\"city\": \"Paris\"}".into() },
        };
        let message = |role: &str, content: &str, tool_calls: Option<Vec<ToolCallInput>>| MessageInput {
            role: role.into(),
            content: Some(crate::protocol::MessageContent::Text(content.into())),
            tool_calls,
            tool_call_id: None,
            name: None,
            refusal: None,
            annotations: None,
        };
        let inputs = vec![
            message("user", "Weather?", None),
            message("assistant", "", Some(vec![call])),
            message("tool", "21C", None),
        ];
        let texts = crate::protocol::chat::chat_messages(&inputs).unwrap();
        let text = render(&template, &inputs, &texts, Some(&plan(ToolMode::Auto)), None, true).unwrap();
        assert!(text.starts_with("[system] You may call functions"), "{text}");
        let listed = text.split("<tools>\n").nth(1).and_then(|t| t.split("\n</tools>").next()).unwrap();
        assert_eq!(serde_json::from_str::<Value>(listed).unwrap()["function"]["name"], "get_weather", "{text}");
        let earlier =
            text.split("[assistant] <tool_call>\n").nth(1).and_then(|t| t.split("\n</tool_call>").next()).unwrap();
        let earlier: Value = serde_json::from_str(earlier).unwrap();
        assert_eq!(earlier, json!({"name": "get_weather", "arguments": {"city": "Paris"}}), "{text}");
        assert!(text.contains("[user] <tool_response>\n21C\n</tool_response>"), "{text}");
        // `none`: the tools are not shown.
        let hidden = render(&template, &inputs[..1], &texts[..1], Some(&plan(ToolMode::None)), None, true).unwrap();
        assert_eq!(hidden, "[user] Weather?\n");
    }

    #[test]
    fn choices_are_checked() {
        let tools = vec![ToolDef { kind: "function".into(), function: plan(ToolMode::Auto).functions[0].clone() }];
        let named = ToolChoice::Named(NamedChoice { kind: None, function: NamedFunction { name: "other".into() } });
        assert!(ToolPlan::new(Some(&tools), Some(&named)).is_err());
        assert!(ToolPlan::new(None, Some(&ToolChoice::Mode("required".into()))).is_err());
        assert!(ToolPlan::new(None, Some(&ToolChoice::Mode("none".into()))).unwrap().is_none());
        assert!(ToolPlan::new(Some(&tools), Some(&ToolChoice::Mode("sometimes".into()))).is_err());
        let auto = ToolPlan::new(Some(&tools), None).unwrap().unwrap();
        assert_eq!(auto.mode, ToolMode::Auto);
    }
}
