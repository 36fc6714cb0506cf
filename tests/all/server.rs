//! The OpenAI-compatible server over loopback: a real server on a fixture model (paged engine on
//! the CPU) and `reqwest` with an SSE reader (`loopback_client`); the official `openai` Python
//! client and the chat page are in `server_clients`, several models in `server_models`.

use std::path::Path;
use std::time::Duration;

use burn_llm::cli::{ExampleDefaults, GenerateArgs, run_with};
use burn_llm_server::Server;
use burn_llm_server::launch::ServeArgs;
use clap::Parser;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::{Scratch, fixture, scratch_copy};
use crate::loopback_client::{self, SseEvents};
use reqwest::Client;

/// A minimal chat template (none of the fixtures ships one) that reads `tools` as tool-call
/// models' templates do (briefly: the fixtures' context is 128 positions); without tools it
/// renders each message as `<role> content`.
pub(crate) const TEMPLATE: &str = "{% if tools %}<tools>{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}{% for m in messages %}<{{ m.role }}> {{ m.content }}{% for c in m.tool_calls or [] %} <call {{ c.function.name }}>{% endfor %}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
const PROMPT: &str = "Hello, my name is";
pub(crate) const KEY: &str = "test-key-123";

/// The `opt` fixture with a chat template in its `tokenizer_config.json`.
pub(crate) fn chat_fixture() -> Scratch {
    let dir = scratch_copy("opt");
    let path = dir.path().join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["chat_template"] = json!(TEMPLATE);
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    dir
}

/// A server on a loopback port, on its own runtime.
pub(crate) struct Running {
    base: String,
    pub(crate) runtime: tokio::runtime::Runtime,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub(crate) fn start(model: &Path, extra: &[&str]) -> Running {
    let model = model.to_str().unwrap();
    let mut argv = vec!["serve", "--model", model, "--device", "flex", "--served-model-name", "fixture"];
    if !extra.contains(&"--kv-cache-memory") {
        argv.extend_from_slice(&["--kv-cache-memory", "blocks:96"]);
    }
    argv.extend_from_slice(extra);
    start_argv(&argv)
}

/// A server started as `serve` would be with `argv` (its first item the program name).
pub(crate) fn start_argv(argv: &[&str]) -> Running {
    let args = ServeArgs::try_parse_from(argv).unwrap();
    let server = Server::start_models(args.model_entries().unwrap(), args.server_config().unwrap()).unwrap();
    Running::serve(server)
}

impl Running {
    /// Serves `server` on a free loopback port, on a runtime of its own.
    pub(crate) fn serve(server: Server) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = runtime.spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        Running { base, runtime, stop, task }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Graceful shutdown: the serve future returns Ok once open responses are done.
    pub(crate) fn shutdown(self) {
        let _ = self.stop.send(());
        let result = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(60), self.task).await });
        result.expect("shutdown within a minute").expect("serve task").expect("serve result");
    }
}

/// The CLI's JSON output for the paged engine on `model`, 8 greedy tokens.
pub(crate) fn cli_json(model: &Path, extra: &[&str]) -> Value {
    let defaults = ExampleDefaults {
        name: "test_generate",
        model: "unused",
        engine: burn_llm::cli::EngineKind::Paged,
        fallback: None,
    };
    let mut argv = vec!["x", "--model", model.to_str().unwrap(), "--device", "flex", "--json"];
    argv.extend_from_slice(&["--engine", "paged", "--max-new-tokens", "8"]);
    argv.extend_from_slice(extra);
    let args = GenerateArgs::try_parse_from(argv).unwrap();
    let (mut out, mut log) = (Vec::new(), Vec::new());
    run_with(&args, defaults, &mut out, &mut log).unwrap();
    serde_json::from_slice(&out).unwrap()
}

pub(crate) async fn post(client: &Client, url: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut request = client.post(url).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// An SSE event's `data:` payload as JSON, `[DONE]` as a string.
fn event_value(data: String) -> Value {
    serde_json::from_str(&data).unwrap_or(Value::String(data))
}

/// A streamed response's events (see [`event_value`]).
async fn events(response: reqwest::Response) -> Vec<Value> {
    SseEvents::new(response.bytes_stream()).collect().await.unwrap().into_iter().map(event_value).collect()
}

async fn stream(client: &Client, url: &str, body: &Value, key: Option<&str>) -> Vec<Value> {
    let mut request = client.post(url).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    events(response).await
}

/// Concatenated texts of a completion stream's choice 0 (`text`) or a chat stream's (`delta.content`).
fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| c["text"].as_str().or(c["delta"]["content"].as_str()).unwrap_or(""))
        .collect()
}

fn with(body: &Value, extra: Value) -> Value {
    let mut out = body.clone();
    for (k, v) in extra.as_object().unwrap() {
        out[k] = v.clone();
    }
    out
}

#[test]
fn greedy_completions_and_chat_equal_the_cli_and_stream_the_same_text() {
    let dir = chat_fixture();
    let cli = cli_json(dir.path(), &["--prompt", PROMPT]);
    let cli_chat = cli_json(dir.path(), &["--prompt", PROMPT, "--chat"]);
    let server = start(dir.path(), &[]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let body = json!({"model": "fixture", "prompt": PROMPT, "max_tokens": 8, "temperature": 0});
        let (status, r) = post(&client, &url, &body, None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "text_completion");
        assert_eq!(r["model"], "fixture");
        assert!(r["id"].as_str().unwrap().starts_with("cmpl-"));
        let expected = &cli["requests"][0];
        assert_eq!(r["choices"][0]["text"], expected["text"]);
        assert_eq!(r["choices"][0]["finish_reason"], expected["finish_reason"]);
        let prompt_tokens = expected["prompt_ids"].as_array().unwrap().len();
        let completion_tokens = expected["generated_ids"].as_array().unwrap().len();
        assert_eq!(
            r["usage"],
            json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
        );

        let streamed = json!({"stream": true, "stream_options": {"include_usage": true}});
        let chunks = stream(&client, &url, &with(&body, streamed.clone()), None).await;
        assert_eq!(chunks.last().unwrap(), "[DONE]");
        let usage_chunk = &chunks[chunks.len() - 2];
        assert_eq!(usage_chunk["choices"], json!([]));
        assert_eq!(usage_chunk["usage"], r["usage"]);
        let content = &chunks[..chunks.len() - 2];
        assert!(content.iter().all(|c| c["object"] == "text_completion" && c["id"] == content[0]["id"]));
        assert_eq!(streamed_text(content), r["choices"][0]["text"].as_str().unwrap());
        let reasons: Vec<&Value> = content.iter().map(|c| &c["choices"][0]["finish_reason"]).collect();
        assert_eq!(reasons.last().unwrap(), &&r["choices"][0]["finish_reason"]);
        assert!(reasons[..reasons.len() - 1].iter().all(|r| r.is_null()), "{reasons:?}");

        let url = server.url("/v1/chat/completions");
        let chat = json!({"model": "fixture", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0});
        let (status, r) = post(&client, &url, &chat, None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"]["role"], "assistant");
        assert_eq!(r["choices"][0]["message"]["content"], cli_chat["requests"][0]["text"]);
        assert_eq!(r["usage"]["prompt_tokens"], cli_chat["requests"][0]["prompt_ids"].as_array().unwrap().len());
        let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]});
        let (_, same) = post(&client, &url, &with(&chat, parts), None).await;
        assert_eq!(same["choices"][0]["message"], r["choices"][0]["message"]);
        let chunks = stream(&client, &url, &with(&chat, streamed), None).await;
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(chunks[chunks.len() - 2]["usage"], r["usage"]);
        assert_eq!(streamed_text(&chunks[..chunks.len() - 2]), r["choices"][0]["message"]["content"].as_str().unwrap());

        let models = client.get(server.url("/v1/models")).send().await.unwrap().json::<Value>().await.unwrap();
        assert_eq!(models["data"][0]["id"], "fixture");
        assert_eq!(models["data"][0]["max_model_len"], 128);
        assert_eq!(client.get(server.url("/health")).send().await.unwrap().status().as_u16(), 200);
        let version = client.get(server.url("/version")).send().await.unwrap().json::<Value>().await.unwrap();
        assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
        let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        for name in [
            "burn_llm:num_requests_running{model=\"fixture\"} 0",
            "burn_llm:num_requests_waiting{model=\"fixture\"} 0",
            "burn_llm:num_requests_swapped{model=\"fixture\"} 0",
            "burn_llm:kv_blocks_used{model=\"fixture\"} 0",
            "burn_llm:kv_blocks_total{model=\"fixture\"} 96",
            "burn_llm:model_up{model=\"fixture\"} 1",
            "burn_llm:time_to_first_token_seconds_count{model=\"fixture\"} 5",
            "burn_llm:e2e_request_latency_seconds_count{model=\"fixture\"} 5",
            "burn_llm:time_per_output_token_seconds_bucket{model=\"fixture\",",
            "burn_llm:num_preemptions_total{model=\"fixture\"} 0",
        ] {
            assert!(metrics.contains(name), "{name} missing from\n{metrics}");
        }
        // Two completions and three chat completions ran.
        let counter = |name: &str| -> u64 {
            let line = metrics.lines().find(|l| l.starts_with(&format!("{name}{{model=\"fixture\"}} "))).unwrap();
            line.split(' ').nth(1).unwrap().parse().unwrap()
        };
        let (chat_prompt, chat_completion) =
            (r["usage"]["prompt_tokens"].as_u64().unwrap(), r["usage"]["completion_tokens"].as_u64().unwrap());
        let (prompt_tokens, completion_tokens) = (prompt_tokens as u64, completion_tokens as u64);
        assert_eq!(counter("burn_llm:generation_tokens_total"), 2 * completion_tokens + 3 * chat_completion);
        assert_eq!(counter("burn_llm:prompt_tokens_total"), 2 * prompt_tokens + 3 * chat_prompt);
        let page = client.get(server.url("/")).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("/v1/chat/completions"));
    });
    server.shutdown();
}

#[test]
fn n_best_of_logprobs_stop_echo_and_seed_behave_as_in_the_engine() {
    let dir = chat_fixture();
    let server = start(dir.path(), &[]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let greedy = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0});
        let (_, r) = post(&client, &url, &greedy, None).await;
        let text = r["choices"][0]["text"].as_str().unwrap().to_string();
        let completion_tokens = r["usage"]["completion_tokens"].as_u64().unwrap() as usize;

        // Logprobs: one entry per token, the sampled (argmax) token first and most likely.
        let (status, r) = post(&client, &url, &with(&greedy, json!({"logprobs": 2})), None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["choices"][0]["text"], text);
        let lp = &r["choices"][0]["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), completion_tokens);
        let mut offset = 0;
        for (i, token) in tokens.iter().enumerate() {
            let logprob = lp["token_logprobs"][i].as_f64().unwrap();
            assert!(logprob <= 0.0);
            let top = lp["top_logprobs"][i].as_object().unwrap();
            assert!(top.len() <= 3 && top.contains_key(token.as_str().unwrap()), "{top:?}");
            assert!(top.values().all(|v| v.as_f64().unwrap() <= logprob + 1e-5), "greedy picks the argmax: {top:?}");
            assert_eq!(lp["text_offset"][i], offset);
            offset += token.as_str().unwrap().chars().count();
        }
        let streamed = stream(&client, &url, &with(&greedy, json!({"logprobs": 2, "stream": true})), None).await;
        let streamed_tokens: Vec<Value> = streamed
            .iter()
            .filter(|c| c.is_object())
            .flat_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array().cloned().unwrap_or_default())
            .collect();
        assert_eq!(&streamed_tokens, tokens);

        // Chat logprobs: token, logprob, bytes and top_logprobs per token.
        let chat = json!({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2});
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &chat, None).await;
        assert_eq!(status, 200, "{r}");
        let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap());
        for entry in content {
            let token = entry["token"].as_str().unwrap();
            let bytes: Vec<u8> = entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
            assert_eq!(bytes, token.as_bytes());
            assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
        }

        // Stop strings cut the text where they first appear.
        let chars: Vec<char> = text.chars().collect();
        assert!(chars.len() >= 4, "the fixture's greedy text is too short for a stop test: {text:?}");
        let stop: String = chars[2..4].iter().collect();
        let (_, r) = post(&client, &url, &with(&greedy, json!({"stop": [stop.clone(), "\u{1}never"]})), None).await;
        assert_eq!(r["choices"][0]["text"].as_str().unwrap(), &text[..text.find(&stop).unwrap()]);
        assert_eq!(r["choices"][0]["finish_reason"], "stop");

        // Echo, token-id prompts, several prompts.
        let (_, r) = post(&client, &url, &with(&greedy, json!({"echo": true})), None).await;
        assert_eq!(r["choices"][0]["text"].as_str().unwrap(), format!("{PROMPT}{text}"));
        let ids = burn_llm::models::Tokenizer::from_dir(dir.path()).unwrap().encode(PROMPT).unwrap();

        // Echo with logprobs scores the prompt: its tokens come first, the first unscored (null),
        // then the generated tokens as without echo; streaming sends the same entries.
        let echo_lp = with(&greedy, json!({"echo": true, "logprobs": 2}));
        let (status, r) = post(&client, &url, &echo_lp, None).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["choices"][0]["text"].as_str().unwrap(), format!("{PROMPT}{text}"));
        let echoed = &r["choices"][0]["logprobs"];
        let echoed_tokens = echoed["tokens"].as_array().unwrap();
        assert_eq!(echoed_tokens.len(), ids.len() + completion_tokens);
        assert_eq!(&echoed_tokens[ids.len()..], tokens.as_slice(), "generated tokens as without echo");
        assert!(echoed["token_logprobs"][0].is_null() && echoed["top_logprobs"][0].is_null());
        for i in 1..ids.len() {
            let logprob = echoed["token_logprobs"][i].as_f64().unwrap();
            assert!(logprob <= 0.0, "prompt token {i}: {logprob}");
            let top = echoed["top_logprobs"][i].as_object().unwrap();
            assert!(top.contains_key(echoed_tokens[i].as_str().unwrap()) && top.len() <= 3, "{top:?}");
        }
        assert_eq!(echoed["text_offset"][0], 0);
        let streamed = stream(&client, &url, &with(&echo_lp, json!({"stream": true})), None).await;
        let streamed_text: String =
            streamed.iter().filter(|c| c.is_object()).filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(streamed_text, format!("{PROMPT}{text}"));
        let streamed_logprobs: Vec<Value> = streamed
            .iter()
            .filter(|c| c.is_object())
            .flat_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array().cloned().unwrap_or_default())
            .collect();
        assert_eq!(&streamed_logprobs, echoed["token_logprobs"].as_array().unwrap());
        let (_, r) = post(&client, &url, &with(&greedy, json!({"prompt": ids})), None).await;
        assert_eq!(r["choices"][0]["text"], text);
        let (_, r) = post(&client, &url, &with(&greedy, json!({"prompt": [PROMPT, "Another one"]})), None).await;
        let choices = r["choices"].as_array().unwrap();
        assert_eq!((choices.len(), &choices[0]["text"], &choices[1]["index"]), (2, &json!(text), &json!(1)));

        // n / best_of with a seed: n choices, reproducible, token counts in usage.
        let sampled =
            json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "n": 2, "best_of": 3, "seed": 7, "logprobs": 1});
        let (status, a) = post(&client, &url, &sampled, None).await;
        assert_eq!(status, 200, "{a}");
        let (_, b) = post(&client, &url, &sampled, None).await;
        assert_eq!(a["choices"], b["choices"], "the same seed gives the same samples");
        let choices = a["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        let tokens: usize = choices.iter().map(|c| c["logprobs"]["tokens"].as_array().unwrap().len()).sum();
        assert_eq!(a["usage"]["completion_tokens"], tokens);
        let streamed_n = stream(&client, &url, &with(&sampled, json!({"best_of": 2, "stream": true})), None).await;
        let mut finished = [0, 0];
        for chunk in streamed_n.iter().filter(|c| c.is_object()) {
            let choice = &chunk["choices"][0];
            if !choice["finish_reason"].is_null() {
                finished[choice["index"].as_u64().unwrap() as usize] += 1;
            }
        }
        assert_eq!(finished, [1, 1], "each of n streamed choices finishes once");
        let different_seed = with(&sampled, json!({"seed": 8}));
        let (_, c) = post(&client, &url, &different_seed, None).await;
        assert_eq!(c["choices"].as_array().unwrap().len(), 2);
    });
    server.shutdown();
}

#[test]
fn bad_inputs_get_openai_errors_while_a_good_request_finishes() {
    let dir = chat_fixture();
    let server = start(dir.path(), &["--api-key", KEY, "--max-body-bytes", "4096"]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let good = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stream": true});
        let pending = client.post(&url).bearer_auth(KEY).json(&good).send();
        let good_response = tokio::spawn(pending);

        let base = json!({"model": "fixture", "prompt": PROMPT, "max_tokens": 4});
        let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
            ("unknown model", with(&base, json!({"model": "gpt-9"})), 404, Some("model")),
            ("empty prompt", with(&base, json!({"prompt": ""})), 400, Some("prompt")),
            ("empty prompt list", with(&base, json!({"prompt": []})), 400, Some("prompt")),
            ("empty id list", with(&base, json!({"prompt": [[]]})), 400, Some("prompt")),
            ("max_tokens over the context", with(&base, json!({"max_tokens": 1000})), 400, Some("max_tokens")),
            ("max_tokens 0", with(&base, json!({"max_tokens": 0})), 400, Some("max_tokens")),
            ("n > best_of", with(&base, json!({"n": 3, "best_of": 2})), 400, Some("best_of")),
            ("huge n", with(&base, json!({"n": 100000})), 400, Some("n")),
            ("negative temperature", with(&base, json!({"temperature": -0.5})), 400, Some("temperature")),
            ("top_p over 1", with(&base, json!({"top_p": 1.5})), 400, Some("top_p")),
            ("top_p 0", with(&base, json!({"top_p": 0})), 400, Some("top_p")),
            ("token id out of vocabulary", with(&base, json!({"prompt": [1, 2, 99999]})), 400, Some("prompt")),
            ("negative token id", with(&base, json!({"prompt": [1, -2]})), 400, Some("prompt")),
            ("bad stop token id", with(&base, json!({"stop_token_ids": [100000]})), 400, Some("stop_token_ids")),
            ("wrong type", with(&base, json!({"max_tokens": "many"})), 400, None),
            ("missing prompt", json!({"max_tokens": 4}), 400, None),
            ("logprobs too large", with(&base, json!({"logprobs": 500})), 400, Some("logprobs")),
            ("presence penalty range", with(&base, json!({"presence_penalty": 3.0})), 400, Some("presence_penalty")),
            ("best_of > n streamed", with(&base, json!({"best_of": 2, "stream": true})), 400, Some("best_of")),
            (
                "stream_options without stream",
                with(&base, json!({"stream_options": {"include_usage": true}})),
                400,
                Some("stream_options"),
            ),
        ];
        for (what, body, status, param) in cases {
            let (got, r) = post(&client, &url, &body, Some(KEY)).await;
            assert_eq!(got, status, "{what}: {r}");
            check_error(&r, what);
            if let Some(param) = param {
                assert_eq!(r["error"]["param"], param, "{what}: {r}");
            }
        }
        let chat_url = server.url("/v1/chat/completions");
        for (what, body) in [
            ("no messages", json!({"messages": []})),
            ("unknown role", json!({"messages": [{"role": "wizard", "content": "x"}]})),
            ("image part", json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            (
                "top_logprobs without logprobs",
                json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            ),
        ] {
            let (got, r) = post(&client, &chat_url, &body, Some(KEY)).await;
            assert_eq!(got, 400, "{what}: {r}");
            check_error(&r, what);
        }
        let raw = |body: Vec<u8>| {
            client.post(&url).bearer_auth(KEY).header("content-type", "application/json").body(body).send()
        };
        for (what, body, status) in [
            ("malformed JSON", b"{\"prompt\": ".to_vec(), 400),
            ("non-UTF-8 body", b"{\"prompt\": \"\xff\xfe\"}".to_vec(), 400),
            ("body over the limit", format!("{{\"prompt\": \"{}\"}}", "a".repeat(10_000)).into_bytes(), 413),
        ] {
            let response = raw(body).await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{what}");
            check_error(&response.json().await.unwrap(), what);
        }
        // The API key: missing or wrong is 401 on /v1, /health stays open.
        let (got, r) = post(&client, &url, &base, None).await;
        assert_eq!((got, r["error"]["code"].as_str()), (401, Some("invalid_api_key")));
        let (got, _) = post(&client, &url, &base, Some("wrong-key-123")).await;
        assert_eq!(got, 401);
        let models = client.get(server.url("/v1/models")).send().await.unwrap();
        assert_eq!(models.status().as_u16(), 401);
        assert_eq!(client.get(server.url("/health")).send().await.unwrap().status().as_u16(), 200);
        let missing = client.get(server.url("/v2/nothing")).send().await.unwrap();
        assert_eq!(missing.status().as_u16(), 404);
        check_error(&missing.json().await.unwrap(), "unknown route");

        // The good request started first and still streams to its end.
        let response = good_response.await.unwrap().unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let chunks = events(response).await;
        assert_eq!(chunks.last().unwrap(), "[DONE]");
        let last = &chunks[chunks.len() - 2];
        assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
        let (_, whole) = post(&client, &url, &with(&good, json!({"stream": false})), Some(KEY)).await;
        assert_eq!(streamed_text(&chunks), whole["choices"][0]["text"].as_str().unwrap());
    });
    server.shutdown();

    // --max-waiting 0: every generation request is turned away with 503.
    let server = start(dir.path(), &["--max-waiting", "0"]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let (got, r) = post(&client, &server.url("/v1/completions"), &json!({"prompt": PROMPT}), None).await;
        assert_eq!(got, 503, "{r}");
        check_error(&r, "max waiting");
    });
    server.shutdown();
}

/// The value of series `name` with exactly `labels` in Prometheus text `metrics` (labels in any
/// order), if it is there.
pub(crate) fn series(metrics: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (head, value) = line.rsplit_once(' ')?;
        let (series_name, rest) = head.split_once('{').unwrap_or((head, "}"));
        let mut found: Vec<(&str, &str)> = rest
            .strip_suffix('}')?
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').map(|(k, v)| (k, v.trim_matches('"'))))
            .collect::<Option<_>>()?;
        let mut wanted = labels.to_vec();
        found.sort();
        wanted.sort();
        (series_name == name && found == wanted).then(|| value.parse().ok()).flatten()
    })
}

/// Requests finished for any reason (`burn_llm:request_success_total` summed over
/// `finished_reason`).
fn finished_requests(metrics: &str) -> f64 {
    ["stop", "length", "abort"]
        .iter()
        .map(|reason| {
            let labels = [("model", "fixture"), ("finished_reason", *reason)];
            series(metrics, "burn_llm:request_success_total", &labels).unwrap_or_else(|| panic!("{reason} missing"))
        })
        .sum()
}

/// OpenAI's error object: message, type, param and code, nothing else.
fn check_error(r: &Value, what: &str) {
    let error = r["error"].as_object().unwrap_or_else(|| panic!("{what}: no error object in {r}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{what}: {r}");
    assert!(!error["message"].as_str().unwrap().is_empty(), "{what}");
    assert!(error["type"].is_string(), "{what}");
}

#[test]
fn many_streaming_clients_with_disconnects_finish_in_order_and_free_the_pool() {
    let dir = scratch_copy("opt");
    let server = start(dir.path(), &["--kv-cache-memory", "blocks:48"]);
    let url = server.url("/v1/completions");
    let metrics_url = server.url("/metrics");
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(14);
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let max_tokens = rng.random_range(4..24usize);
            let disconnect_after = rng.random_bool(0.3).then(|| rng.random_range(1..4usize));
            let body = json!({
                "prompt": format!("Client {i} says"), "max_tokens": max_tokens, "temperature": 0.8, "seed": i,
                "ignore_eos": true, "logprobs": 1, "stream": true, "stream_options": {"include_usage": true},
            });
            let (client, url) = (client.clone(), url.clone());
            tasks.push(tokio::spawn(async move {
                let response = client.post(&url).json(&body).send().await.unwrap();
                assert_eq!(response.status().as_u16(), 200);
                let mut stream = SseEvents::new(response.bytes_stream());
                let mut chunks = Vec::new();
                while let Some(data) = stream.next().await {
                    chunks.push(event_value(data.unwrap()));
                    if disconnect_after.is_some_and(|n| chunks.len() >= n) {
                        return None; // drops the connection mid-stream
                    }
                }
                Some((max_tokens, chunks))
            }));
        }
        let finished = tokio::time::timeout(Duration::from_secs(600), futures_util::future::join_all(tasks))
            .await
            .expect("64 clients within 10 minutes");
        let mut complete = 0;
        for result in finished {
            let Some((max_tokens, chunks)) = result.unwrap() else { continue };
            complete += 1;
            assert_eq!(chunks.last().unwrap(), "[DONE]");
            let usage = &chunks[chunks.len() - 2]["usage"];
            assert_eq!(usage["completion_tokens"], max_tokens, "every token arrived");
            let content = &chunks[..chunks.len() - 2];
            // Token offsets run contiguously from 0: in order, nothing lost or repeated.
            let mut offset = 0;
            let mut tokens = 0;
            for (k, chunk) in content.iter().enumerate() {
                let choice = &chunk["choices"][0];
                assert_eq!(choice["index"], 0);
                assert_eq!(choice["finish_reason"].is_null(), k + 1 < content.len(), "finish only on the last chunk");
                let lp = &choice["logprobs"];
                for (t, token) in lp["tokens"].as_array().unwrap().iter().enumerate() {
                    assert_eq!(lp["text_offset"][t], offset);
                    offset += token.as_str().unwrap().chars().count();
                    tokens += 1;
                }
            }
            assert_eq!(tokens, max_tokens);
            assert_eq!(content.last().unwrap()["choices"][0]["finish_reason"], "length");
        }
        assert!(complete > 20, "only {complete} streams completed");
        // Aborted and finished requests are gone and every block is back.
        let client = loopback_client::client();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let metrics = client.get(&metrics_url).send().await.unwrap().text().await.unwrap();
            let idle = ["running", "waiting", "swapped"]
                .iter()
                .all(|q| metrics.contains(&format!("burn_llm:num_requests_{q}{{model=\"fixture\"}} 0\n")))
                && metrics.contains("burn_llm:kv_blocks_used{model=\"fixture\"} 0\n")
                && finished_requests(&metrics) == 64.0;
            if idle {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the engine did not drain:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    server.shutdown();
}

/// A KV pool too small for a request is a clear error, never partial text marked `abort`: a
/// prompt whose blocks outnumber the pool is a 400 at once, one whose tokens outgrow it while it
/// generates fails naming the pool, and a request that fits is served.
#[test]
fn requests_a_tiny_kv_pool_cannot_hold_are_errors_naming_the_pool() {
    let server = start(&fixture("opt"), &["--kv-cache-memory", "blocks:3", "--block-size", "4"]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let ask = |prompt: usize, tokens: usize| {
            let ids: Vec<usize> = (10..10 + prompt).collect();
            json!({"model": "fixture", "prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": true})
        };
        let (status, r) = post(&client, &url, &ask(13, 2), None).await;
        assert_eq!(status, 400, "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("holds 3 blocks: raise --kv-cache-memory"), "{r}");
        let (status, r) = post(&client, &url, &ask(10, 8), None).await;
        assert_eq!(status, 500, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains("generated tokens") && message.contains("pool (3 blocks)"), "{r}");
        assert!(message.contains("raise --kv-cache-memory"), "{r}");
        let (status, r) = post(&client, &url, &ask(6, 4), None).await;
        assert_eq!((status, r["usage"]["completion_tokens"].as_u64()), (200, Some(4)), "{r}");
    });
    server.shutdown();
}
