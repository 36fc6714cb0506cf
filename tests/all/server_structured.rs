//! The server's structured outputs, tool calls, strict request fields, tokenizer endpoints,
//! request timeout and CORS, over loopback on the `opt` fixture (its chat template reads
//! `tools`); and 64 concurrent structured and tool-call clients with random disconnects.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::loopback_client::{self, SseEvents};
use crate::server::{chat_fixture, post, start};
use crate::structured::{schemas, validate};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": false,
        },
    }})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}})
}

/// Checks a non-streamed tool-call reply: one call of a listed function whose arguments validate.
fn check_tool_reply(r: &Value, allowed: &[&str]) {
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    let call = &choice["message"]["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{r}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap();
    assert!(allowed.contains(&name), "{r}");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let tool = if name == "get_weather" { weather_tool() } else { time_tool() };
    validate(&arguments, &tool["function"]["parameters"], "arguments").unwrap();
}

#[test]
fn structured_outputs_and_tool_calls_over_http() {
    let dir = chat_fixture();
    let server = start(dir.path(), &[]);
    let (chat, completions) = (server.url("/v1/chat/completions"), server.url("/v1/completions"));
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let messages = json!([{"role": "user", "content": "Hi"}]);
        for (k, schema) in schemas().into_iter().enumerate() {
            let format = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": true}});
            let body = json!({"messages": messages, "response_format": format, "max_tokens": 100, "seed": k, "user": "u1"});
            let (status, r) = post(&client, &chat, &body, None).await;
            assert_eq!(status, 200, "{r}");
            assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
            let text = r["choices"][0]["message"]["content"].as_str().unwrap();
            validate(&serde_json::from_str(text).unwrap(), &schema, "$").unwrap();
            let body = json!({"prompt": "JSON:", "guided_json": schema, "max_tokens": 100, "seed": k});
            let (_, r) = post(&client, &completions, &body, None).await;
            validate(&serde_json::from_str(r["choices"][0]["text"].as_str().unwrap()).unwrap(), &schema, "$").unwrap();
        }
        let body = json!({"prompt": "x", "guided_regex": "[0-9]{4}", "max_tokens": 10, "temperature": 1, "seed": 1});
        let (_, r) = post(&client, &completions, &body, None).await;
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert!(text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()), "{r}");
        let body = json!({"prompt": "x", "guided_choice": ["yes", "no"], "max_tokens": 10, "n": 3, "seed": 2});
        let (_, r) = post(&client, &completions, &body, None).await;
        for choice in r["choices"].as_array().unwrap() {
            assert!(["yes", "no"].contains(&choice["text"].as_str().unwrap()), "{r}");
        }
        let body = json!({"prompt": "x", "guided_grammar": "start: (\"ab\" | \"c\")+ \"!\"", "max_tokens": 40, "seed": 3});
        let (_, r) = post(&client, &completions, &body, None).await;
        assert!(r["choices"][0]["text"].as_str().unwrap().ends_with('!'), "{r}");
        let body = json!({"messages": messages, "response_format": {"type": "json_object"}, "max_tokens": 110, "seed": 4});
        let (_, r) = post(&client, &chat, &body, None).await;
        if r["choices"][0]["finish_reason"] == "stop" {
            let value: Value = serde_json::from_str(r["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
            assert!(value.is_object(), "{r}");
        }

        // Tools: required, named, none; then the round trip with a `tool` message.
        let tools = json!([weather_tool(), time_tool()]);
        let ask = json!([{"role": "user", "content": "Weather in Paris?"}]);
        let body = json!({"messages": ask, "tools": tools, "tool_choice": "required", "max_tokens": 70, "seed": 5});
        let (_, r) = post(&client, &chat, &body, None).await;
        check_tool_reply(&r, &["get_weather", "get_time"]);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let body = json!({"messages": ask, "tools": tools, "tool_choice": named, "max_tokens": 70, "temperature": 0});
        let (_, r) = post(&client, &chat, &body, None).await;
        check_tool_reply(&r, &["get_weather"]);
        let call = r["choices"][0]["message"]["tool_calls"][0].clone();
        assert!(r["choices"][0]["message"]["content"].is_null(), "{r}");
        let body = json!({"messages": ask, "tools": tools, "tool_choice": "none", "max_tokens": 5, "temperature": 0});
        let (_, r) = post(&client, &chat, &body, None).await;
        assert!(r["choices"][0]["message"].get("tool_calls").is_none(), "{r}");
        // Streamed: OpenAI's deltas (id, type, name first, then the arguments) build the same call.
        let stream_body = json!({"messages": ask, "tools": tools, "tool_choice": named, "max_tokens": 70, "temperature": 0, "stream": true});
        let response = client.post(&chat).json(&stream_body).send().await.unwrap();
        let chunks: Vec<Value> = SseEvents::new(response.bytes_stream())
            .collect()
            .await
            .unwrap()
            .into_iter()
            .filter_map(|d| serde_json::from_str(&d).ok())
            .collect();
        let (mut name, mut arguments, mut reason) = (String::new(), String::new(), Value::Null);
        for chunk in &chunks {
            let choice = &chunk["choices"][0];
            if let Some(calls) = choice["delta"]["tool_calls"].as_array() {
                assert_eq!(calls[0]["index"], 0);
                name += calls[0]["function"]["name"].as_str().unwrap_or("");
                arguments += calls[0]["function"]["arguments"].as_str().unwrap_or("");
            }
            if !choice["finish_reason"].is_null() {
                reason = choice["finish_reason"].clone();
            }
        }
        assert_eq!((name.as_str(), arguments.as_str()), ("get_weather", call["function"]["arguments"].as_str().unwrap()));
        assert_eq!(reason, "tool_calls");
        let round_trip = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "{\"celsius\": 21}"},
        ]);
        let body = json!({"messages": round_trip, "tools": tools, "max_tokens": 5, "temperature": 0});
        let (status, r) = post(&client, &chat, &body, None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["choices"][0]["message"]["role"], "assistant");

        // Bad input: the field or the parser's message named.
        for (body, param, says) in [
            (json!({"prompt": "x", "max_tokens": 2, "frobnicate": 1}), "frobnicate", "frobnicate"),
            (json!({"prompt": "x", "guided_regex": "([0-9"}), "", "invalid regex"),
            (json!({"prompt": "x", "guided_json": {"type": "nope"}}), "", "invalid json_schema"),
            (json!({"prompt": "x", "guided_grammar": "start: nowhere"}), "", "invalid grammar"),
            (json!({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}), "guided_choice", "one structured-output field"),
            (json!({"prompt": "x", "logit_bias": {"abc": 1}}), "logit_bias", "not a token id"),
            (json!({"prompt": "x", "logit_bias": {"5": 300}}), "logit_bias", "[-100, 100]"),
            (json!({"prompt": "x", "min_p": 2}), "min_p", "min_p"),
            (json!({"prompt": "x", "tools": [weather_tool()]}), "tools", "tools"),
        ] {
            let (status, r) = post(&client, &completions, &body, None).await;
            assert_eq!(status, 400, "{body}: {r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{body}: {message}");
            if !param.is_empty() {
                assert_eq!(r["error"]["param"], param, "{body}: {r}");
            }
        }
        for body in [
            json!({"messages": ask, "tool_choice": "required"}),
            json!({"messages": ask, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            json!({"messages": ask, "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}),
        ] {
            let (status, r) = post(&client, &chat, &body, None).await;
            assert_eq!((status, &r["error"]["param"]), (400, &json!("tool_choice")), "{body}: {r}");
        }
        // A schema that cannot finish within max_tokens: `length`, with what was written.
        let long = json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 60}}, "required": ["s"], "additionalProperties": false});
        let body = json!({"prompt": "x", "guided_json": long, "max_tokens": 5});
        let (_, r) = post(&client, &completions, &body, None).await;
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert!("{\"s\":\"".starts_with(text) || text.starts_with("{\"s\":\""), "{r}");
    });
    server.shutdown();
}

#[test]
fn tokenize_detokenize_timeout_and_cors() {
    let dir = chat_fixture();
    let server = start(dir.path(), &["--request-timeout-s", "0.001", "--allowed-origins", "http://a.example"]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let (status, t) = post(&client, &server.url("/tokenize"), &json!({"prompt": "Hello world"}), None).await;
        assert_eq!(status, 200, "{t}");
        assert_eq!(t["max_model_len"], 128);
        assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
        let body = json!({"tokens": t["tokens"]});
        let (_, d) = post(&client, &server.url("/detokenize"), &body, None).await;
        assert_eq!(d["prompt"], "Hello world");
        let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "return_token_strs": true});
        let (_, c) = post(&client, &server.url("/tokenize"), &chat, None).await;
        assert_eq!(c["token_strs"].as_array().unwrap().len(), c["count"].as_u64().unwrap() as usize, "{c}");
        for (path, body) in [
            ("/detokenize", json!({"tokens": [-1]})),
            ("/detokenize", json!({"tokens": [100000]})),
            ("/tokenize", json!({})),
            ("/tokenize", json!({"prompt": "x", "bogus": true})),
        ] {
            let (status, r) = post(&client, &server.url(path), &body, None).await;
            assert_eq!(status, 400, "{path} {body}: {r}");
        }
        // A request past the timeout: 408, and its blocks go back to the pool.
        let body = json!({"prompt": "x", "max_tokens": 120, "ignore_eos": true, "temperature": 0});
        let (status, r) = post(&client, &server.url("/v1/completions"), &body, None).await;
        assert_eq!((status, &r["error"]["code"]), (408, &json!("request_timeout")), "{r}");
        let streamed = client
            .post(server.url("/v1/completions"))
            .json(&json!({"prompt": "x", "max_tokens": 120, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        let events = SseEvents::new(streamed.bytes_stream()).collect().await.unwrap();
        assert!(events.iter().any(|e| e.contains("request_timeout")), "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        wait_idle(&client, &server.url("/metrics")).await;
        // CORS: only the allowed origin is echoed back.
        for (origin, allowed) in [("http://a.example", true), ("http://b.example", false)] {
            let response = client
                .request(reqwest::Method::OPTIONS, server.url("/v1/completions"))
                .header("Origin", origin)
                .header("Access-Control-Request-Method", "POST")
                .send()
                .await
                .unwrap();
            let echoed = response.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok());
            assert_eq!(echoed == Some(origin), allowed, "{origin}: {echoed:?}");
        }
    });
    server.shutdown();
}

/// Waits until no request runs and every KV block is free.
async fn wait_idle(client: &reqwest::Client, metrics_url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = client.get(metrics_url).send().await.unwrap().text().await.unwrap();
        let idle = ["running", "waiting", "swapped"]
            .iter()
            .all(|q| metrics.contains(&format!("burn_llm:num_requests_{q}{{model=\"fixture\"}} 0\n")))
            && metrics.contains("burn_llm:kv_blocks_used{model=\"fixture\"} 0\n");
        if idle {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the engine did not drain:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 64 concurrent clients, structured and tool-call requests mixed with plain ones, a third of
/// them hanging up mid-stream: every finished reply is valid, and the pool drains.
#[test]
fn concurrent_structured_and_tool_requests_with_disconnects() {
    let dir = chat_fixture();
    let server = start(dir.path(), &["--kv-cache-memory", "blocks:64"]);
    let url = server.url("/v1/chat/completions");
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(32);
        let all = schemas();
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let kind = i % 3;
            let disconnect = rng.random_bool(0.3);
            let mut body = json!({"messages": [{"role": "user", "content": format!("Client {i}")}], "max_tokens": 70, "seed": i, "stream": true});
            let schema = all[i as usize % all.len()].clone();
            match kind {
                0 => body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
                1 => {
                    body["tools"] = json!([weather_tool(), time_tool()]);
                    body["tool_choice"] = json!("required");
                }
                _ => body["max_tokens"] = json!(12),
            }
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let response = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let mut stream = SseEvents::new(response.bytes_stream());
                let (mut content, mut arguments, mut reason, mut chunks) = (String::new(), String::new(), Value::Null, 0);
                while let Some(data) = stream.next().await {
                    chunks += 1;
                    if disconnect && chunks >= 2 {
                        return;
                    }
                    let Ok(chunk) = serde_json::from_str::<Value>(&data.unwrap()) else { continue };
                    let choice = &chunk["choices"][0];
                    content += choice["delta"]["content"].as_str().unwrap_or("");
                    for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                        arguments += call["function"]["arguments"].as_str().unwrap_or("");
                    }
                    if !choice["finish_reason"].is_null() {
                        reason = choice["finish_reason"].clone();
                    }
                }
                match kind {
                    0 => {
                        assert_eq!(reason, "stop", "client {i}: {content:?}");
                        validate(&serde_json::from_str(&content).unwrap(), &schema, "$").unwrap();
                    }
                    1 => {
                        assert_eq!(reason, "tool_calls", "client {i}: {content:?}");
                        assert!(serde_json::from_str::<Value>(&arguments).unwrap().is_object(), "client {i}");
                    }
                    _ => assert!(reason == "length" || reason == "stop", "client {i}: {reason}"),
                }
            }));
        }
        let finished = tokio::time::timeout(Duration::from_secs(600), futures_util::future::join_all(tasks))
            .await
            .expect("64 clients within 10 minutes");
        for result in finished {
            result.unwrap();
        }
        wait_idle(&client, &server.url("/metrics")).await;
    });
    server.shutdown();
}
