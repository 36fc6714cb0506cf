//! The server's typed protocol over loopback: unknown fields are refused at every depth with
//! their JSON path, `/tokenize` renders a chat exactly as the chat route does (tools, earlier
//! calls and `chat_template_kwargs` included), and `/metrics` carries vLLM's metric names under
//! the `burn_llm:` prefix, with the `model` label and vLLM's histogram buckets.

use serde_json::{Value, json};

use crate::loopback_client;
use crate::server::{TEMPLATE, chat_fixture, post, series, start};

/// `TEMPLATE` that also reads a `chat_template_kwargs` variable, as Qwen3's reads
/// `enable_thinking`.
fn thinking_template() -> String {
    format!("{TEMPLATE}{{% if enable_thinking is defined and not enable_thinking %}}<no-think>{{% endif %}}")
}

#[test]
fn unknown_fields_are_refused_at_every_depth_with_their_path() {
    let dir = chat_fixture();
    let server = start(dir.path(), &[]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let user = json!({"role": "user", "content": "Hi"});
        let call = json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}});
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let chat = |extra: Value| {
            let mut body = json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "1"}], "max_tokens": 1});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            body
        };
        let cases = [
            ("/v1/chat/completions", chat(json!({"bogus": 1})), "bogus"),
            ("/v1/chat/completions", chat(json!({"messages": [{"role": "user", "content": "x", "foo": 1}]})), "messages[0].foo"),
            (
                "/v1/chat/completions",
                chat(json!({"messages": [user, {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y", "foo": 1}]}]})),
                "messages[1].content[1].foo",
            ),
            (
                "/v1/chat/completions",
                chat(json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}", "foo": 1}}]}]})),
                "messages[1].tool_calls[0].function.foo",
            ),
            ("/v1/chat/completions", chat(json!({"tools": [tool, {"type": "function", "function": {"name": "g"}, "foo": 1}]})), "tools[1].foo"),
            ("/v1/chat/completions", chat(json!({"tools": [{"type": "function", "function": {"name": "g", "foo": 1}}]})), "tools[0].function.foo"),
            ("/v1/chat/completions", chat(json!({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f", "foo": 1}}})), "tool_choice.function.foo"),
            ("/v1/chat/completions", chat(json!({"response_format": {"type": "json_object", "foo": 1}})), "response_format.foo"),
            (
                "/v1/chat/completions",
                chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}, "foo": 1}}})),
                "response_format.json_schema.foo",
            ),
            ("/v1/chat/completions", chat(json!({"stream": true, "stream_options": {"include_usage": true, "foo": 1}})), "stream_options.foo"),
            ("/v1/completions", json!({"prompt": "x", "stream": true, "stream_options": {"foo": 1}}), "stream_options.foo"),
            ("/v1/completions", json!({"prompt": "x", "bogus": true}), "bogus"),
            ("/tokenize", json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}]}), "messages[0].content[0].foo"),
            ("/tokenize", json!({"prompt": "x", "bogus": true}), "bogus"),
            ("/detokenize", json!({"tokens": [1], "bogus": true}), "bogus"),
        ];
        for (route, body, path) in cases {
            let (status, r) = post(&client, &server.url(route), &body, None).await;
            assert_eq!(status, 400, "{route} {path}: {r}");
            assert_eq!(r["error"]["param"], path, "{route}: {r}");
            assert_eq!(r["error"]["code"], "unknown_field", "{route} {path}: {r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains(&format!("`{path}`")), "{route}: {message}");
        }
        // A value of the wrong type deep inside is named by its path too.
        let wrong = chat(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}));
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &wrong, None).await;
        assert_eq!((status, &r["error"]["param"]), (400, &json!("messages[0].content[0].text")), "{r}");
        assert_eq!(r["error"]["code"], "invalid_request_body", "{r}");
        // Fields ignored by design are taken, and the known ones at depth pass.
        let fine = chat(json!({"user": "u", "metadata": {"k": "v"}, "parallel_tool_calls": false, "tools": [tool], "tool_choice": "none"}));
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &fine, None).await;
        assert_eq!(status, 200, "{r}");
    });
    server.shutdown();
}

#[test]
fn tokenize_renders_a_chat_exactly_as_the_chat_route() {
    let dir = chat_fixture();
    let template = dir.path().join("thinking.jinja");
    std::fs::write(&template, thinking_template()).unwrap();
    let server = start(dir.path(), &["--chat-template", template.to_str().unwrap()]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let conversation = json!({
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "chat_template_kwargs": {"enable_thinking": false},
        });
        let tokenize = |body: &Value| {
            let mut body = body.clone();
            body["return_token_strs"] = json!(true);
            body
        };
        let (status, t) = post(&client, &server.url("/tokenize"), &tokenize(&conversation), None).await;
        assert_eq!(status, 200, "{t}");
        let (_, text) = post(&client, &server.url("/detokenize"), &json!({"tokens": t["tokens"]}), None).await;
        let text = text["prompt"].as_str().unwrap().to_string();
        for part in ["<tools> get_weather", "<call get_weather>", "<tool> 21C", "<no-think>"] {
            assert!(text.contains(part), "{part} missing from {text:?}");
        }
        let mut chat = conversation.clone();
        chat["max_tokens"] = json!(1);
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &chat, None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["usage"]["prompt_tokens"], t["count"], "{r}\n{t}");
        // Each part changes what both render: without the variable, and with the tools hidden.
        let mut plain = conversation.clone();
        plain.as_object_mut().unwrap().remove("chat_template_kwargs");
        let mut hidden = conversation.clone();
        hidden["tool_choice"] = json!("none");
        for variant in [plain, hidden] {
            let (_, other) = post(&client, &server.url("/tokenize"), &tokenize(&variant), None).await;
            assert!(other["count"].as_u64().unwrap() < t["count"].as_u64().unwrap(), "{other}\n{t}");
            let mut chat = variant.clone();
            chat["max_tokens"] = json!(1);
            let (_, r) = post(&client, &server.url("/v1/chat/completions"), &chat, None).await;
            assert_eq!(r["usage"]["prompt_tokens"], other["count"], "{variant}: {r}");
        }
        // The variables the server sets itself cannot be overridden.
        let mut clash = conversation.clone();
        clash["chat_template_kwargs"] = json!({"add_generation_prompt": false});
        for route in ["/tokenize", "/v1/chat/completions"] {
            let (status, r) = post(&client, &server.url(route), &clash, None).await;
            assert_eq!((status, &r["error"]["param"]), (400, &json!("chat_template_kwargs.add_generation_prompt")), "{r}");
        }
    });
    server.shutdown();
}

#[test]
fn metrics_have_vllms_names_labels_and_buckets() {
    let dir = chat_fixture();
    let server = start(dir.path(), &[]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        // A prompt of several KV blocks, sent twice: the second finds its full blocks cached.
        let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(3);
        let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
        let mut prompt_tokens = 0;
        for _ in 0..2 {
            let (status, r) = post(&client, &server.url("/v1/completions"), &body, None).await;
            assert_eq!(status, 200, "{r}");
            prompt_tokens += r["usage"]["prompt_tokens"].as_u64().unwrap();
        }
        let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let model = [("model", "fixture")];
        let value = |name: &str| series(&metrics, name, &model).unwrap_or_else(|| panic!("{name} missing:\n{metrics}"));
        for gauge in ["burn_llm:num_requests_running", "burn_llm:num_requests_waiting", "burn_llm:kv_cache_usage_perc"]
        {
            assert_eq!(value(gauge), 0.0, "{gauge}");
        }
        assert_eq!(value("burn_llm:model_up"), 1.0);
        assert_eq!(value("burn_llm:prompt_tokens_total"), prompt_tokens as f64);
        assert_eq!(value("burn_llm:generation_tokens_total"), 8.0);
        assert_eq!(value("burn_llm:prefix_cache_queries_total"), prompt_tokens as f64);
        assert!(value("burn_llm:prefix_cache_hits_total") > 0.0, "{metrics}");
        assert_eq!(value("burn_llm:num_preemptions_total"), 0.0);
        let success = |reason: &str| {
            series(&metrics, "burn_llm:request_success_total", &[("model", "fixture"), ("finished_reason", reason)])
        };
        assert_eq!((success("length"), success("stop"), success("abort")), (Some(2.0), Some(0.0), Some(0.0)));
        // Histograms: vLLM's buckets, each with the model label; every observation is in the last.
        for (name, first, last, count) in [
            ("burn_llm:time_to_first_token_seconds", "0.001", "2560", 2.0),
            ("burn_llm:time_per_output_token_seconds", "0.01", "80", 6.0),
            ("burn_llm:e2e_request_latency_seconds", "0.3", "7680", 2.0),
        ] {
            assert_eq!(value(&format!("{name}_count")), count, "{name}");
            let bucket = |le: &str| series(&metrics, &format!("{name}_bucket"), &[("model", "fixture"), ("le", le)]);
            assert!(bucket(first).is_some(), "{name} has no bucket {first}:\n{metrics}");
            assert_eq!(bucket(last), Some(count), "{name}");
        }
        // No series is left under the old names.
        assert!(!metrics.contains("burn_llm_"), "{metrics}");
    });
    server.shutdown();
}
