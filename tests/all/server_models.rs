//! Several models in one server: `--model` repeated, requests routed by `model`, each model's
//! greedy output equal to the CLI's on that model, per-model engine flags, `model`-labelled
//! metrics, the errors of bad names and unknown models, and one model failing (its engine
//! erring or panicking, or its worker dying) while the others keep serving.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use burn_llm::engine::{Capabilities, EngineLoad, EngineResult, Generation, RunReport};
use burn_llm::models::{
    DecoderSpec, Prompt, RequestOutput, SamplingParams, StepOutput, StreamEvent, Timing, Tokenizer,
};
use burn_llm::{Engine, EngineError};
use burn_llm_server::launch::ServeArgs;
use burn_llm_server::{ModelEntry, Server, ServerConfig};
use serde_json::{Value, json};

use crate::common::fixture;
use crate::loopback_client;
use crate::server::{Running, TEMPLATE, cli_json, post, start_argv};
use crate::server_clients::chat_page_replies_as_the_api;

const PROMPT: &str = "Hello, my name is";

fn path(name: &str) -> String {
    fixture(name).to_str().unwrap().to_string()
}

/// `/metrics`'s value of `name{model="MODEL"}`.
fn metric(metrics: &str, name: &str, model: &str) -> f64 {
    let prefix = format!("{name}{{model=\"{model}\"}} ");
    let line = metrics.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix}in\n{metrics}"));
    line[prefix.len()..].parse().unwrap()
}

/// A greedy completion request for `model` (none when `None`).
fn greedy(model: Option<&str>) -> Value {
    let mut body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    body
}

#[test]
fn two_models_route_by_name_and_each_answers_as_the_cli_does() {
    let (gpt2, llama) = (path("gpt2"), path("llama"));
    let cli = |model: &str| cli_json(std::path::Path::new(model), &["--prompt", PROMPT]);
    let (cli_gpt2, cli_llama) = (cli(&gpt2), cli(&llama));
    let server = start_argv(&[
        "serve",
        "--model",
        &gpt2,
        "--model",
        &llama,
        "--device",
        "flex",
        "--kv-cache-memory",
        "blocks:96",
        "--model-engine-args",
        "llama=--kv-cache-memory blocks:48",
    ]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let models = client.get(server.url("/v1/models")).send().await.unwrap().json::<Value>().await.unwrap();
        let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["gpt2", "llama"], "named after their directories");
        assert!(models["data"].as_array().unwrap().iter().all(|m| m["max_model_len"].as_u64().unwrap() > 0));

        // Both at once: each engine runs its own requests, and each answers as the CLI does.
        let (to_gpt2, to_llama) = (greedy(Some("gpt2")), greedy(Some("llama")));
        let (a, b) = tokio::join!(post(&client, &url, &to_gpt2, None), post(&client, &url, &to_llama, None));
        for ((status, r), (name, cli)) in [(a, ("gpt2", &cli_gpt2)), (b, ("llama", &cli_llama))] {
            assert_eq!(status, 200, "{name}: {r}");
            assert_eq!(r["model"], name);
            assert_eq!(r["choices"][0]["text"], cli["requests"][0]["text"], "{name}");
        }
        assert_ne!(cli_gpt2["requests"][0]["text"], cli_llama["requests"][0]["text"], "the fixtures differ");

        // With several models, `model` is required; an unknown one is a 404 naming those served.
        let (status, r) = post(&client, &url, &greedy(None), None).await;
        assert_eq!(
            (status, &r["error"]["param"], &r["error"]["type"]),
            (400, &json!("model"), &json!("invalid_request_error")),
            "{r}"
        );
        for (route, input) in [
            ("/v1/completions", json!({"prompt": PROMPT})),
            ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}]})),
        ] {
            let mut body = input;
            body["model"] = json!("gpt-9");
            let (status, r) = post(&client, &server.url(route), &body, None).await;
            assert_eq!(status, 404, "{route}: {r}");
            let error = &r["error"];
            assert_eq!(
                (&error["code"], &error["param"], &error["type"]),
                (&json!("model_not_found"), &json!("model"), &json!("invalid_request_error"))
            );
            let message = error["message"].as_str().unwrap();
            assert!(
                message.contains("gpt-9") && message.contains("`gpt2`") && message.contains("`llama`"),
                "{message}"
            );
        }

        // Metrics per model: llama's own KV budget, each model's own token counts.
        let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert_eq!(metric(&metrics, "burn_llm:kv_blocks_total", "gpt2"), 96.0);
        assert_eq!(metric(&metrics, "burn_llm:kv_blocks_total", "llama"), 48.0);
        for (name, cli) in [("gpt2", &cli_gpt2), ("llama", &cli_llama)] {
            let generated = cli["requests"][0]["generated_ids"].as_array().unwrap().len() as f64;
            assert_eq!(metric(&metrics, "burn_llm:generation_tokens_total", name), generated, "{name}");
            assert_eq!(metric(&metrics, "burn_llm:model_up", name), 1.0);
        }
        let health = client.get(server.url("/health")).send().await.unwrap();
        assert_eq!(health.status().as_u16(), 200);
        assert_eq!(health.json::<Value>().await.unwrap(), json!({"models": {"gpt2": "ok", "llama": "ok"}}));
        let page = client.get(server.url("/")).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("<select id=\"model\""), "the chat page picks the model");
    });
    server.shutdown();
}

#[test]
fn bad_model_lists_are_errors_before_anything_loads() {
    // Paths that do not exist: every check below happens before any model is looked at.
    let specs = |argv: &[&str]| {
        let argv = [&["serve", "--device", "flex"][..], argv].concat();
        ServeArgs::try_parse_from(argv).unwrap().model_specs().map(|_| ()).unwrap_err().to_string()
    };
    let err = specs(&[
        "--model",
        "/nowhere/a",
        "--model",
        "/nowhere/b",
        "--served-model-name",
        "x",
        "--served-model-name",
        "x",
    ]);
    assert!(err.contains("two models are served as `x`") && err.contains("--served-model-name"), "{err}");
    let err = specs(&["--model", "org/m", "--model", "org/m"]);
    assert!(err.contains("`org/m`"), "{err}");
    let err = specs(&["--model", "/nowhere/a", "--model", "/nowhere/b", "--served-model-name", "x"]);
    assert!(err.contains("1 time(s) for 2 --model"), "{err}");
    let two =
        ["--model", "/nowhere/a", "--model", "/nowhere/b", "--served-model-name", "a", "--served-model-name", "b"];
    let err = specs(&[&two[..], &["--model-engine-args", "c=--dtype f32"]].concat());
    assert!(err.contains("`c`, which is not served") && err.contains("`a`, `b`"), "{err}");
    let err = specs(&[&two[..], &["--model-engine-args", "b=--port 9"]].concat());
    assert!(err.contains("--model-engine-args b") && err.contains("--port"), "{err}");
    let err = specs(&[&two[..], &["--model-engine-args", "b=--engine plain"]].concat());
    assert!(err.contains("model `b`") && err.contains("--engine"), "{err}");
    let err = specs(
        &[&two[..], &["--model-engine-args", "a=--max-num-seqs 2", "--model-engine-args", "a=--dtype f32"]].concat(),
    );
    assert!(err.contains("twice for `a`"), "{err}");
    let ok =
        ServeArgs::try_parse_from([&["serve"][..], &two[..], &["--model-engine-args", "b=--max-num-seqs 2"]].concat());
    let specs = ok.unwrap().model_specs().unwrap();
    assert_eq!((specs[0].spec.paged.max_num_seqs, specs[1].spec.paged.max_num_seqs), (None, Some(2)));

    // Programmatic use checks the names too, before building any engine.
    let built = Arc::new(AtomicU8::new(0));
    let entry = |name: &str| {
        let built = built.clone();
        let build: burn_llm_server::EngineBuilder = Box::new(move || {
            built.fetch_add(1, Ordering::SeqCst);
            Err("not built".into())
        });
        ModelEntry::new(name, name, build)
    };
    let err = Server::start_models(vec![entry("m"), entry("m")], ServerConfig::default()).err().unwrap();
    assert!(err.to_string().contains("two models are served as `m`"), "{err}");
    assert_eq!(built.load(Ordering::SeqCst), 0);
    let err = Server::start_models(vec![entry("m\u{0}")], ServerConfig::default()).err().unwrap();
    assert!(err.to_string().contains("control character"), "{err}");
    assert_eq!(built.load(Ordering::SeqCst), 0);
    let err = Server::start_models(vec![entry("m")], ServerConfig::default()).err().unwrap();
    assert!(err.to_string().contains("model `m`") && err.to_string().contains("not built"), "{err}");
}

/// The chat page's model picker: with two models (and a chat template for both), `?model=`
/// picks the second, whose reply the page streams; the picker lists both.
#[test]
#[cfg_attr(skip_client_tests, ignore = "BURN_LLM_SKIP_CLIENT_TESTS is set")]
fn the_chat_page_picks_the_model() {
    let template = std::env::temp_dir().join(format!("burn-llm-template-{}.jinja", std::process::id()));
    std::fs::write(&template, TEMPLATE).unwrap();
    let (gpt2, llama) = (path("gpt2"), path("llama"));
    let server = start_argv(&[
        "serve",
        "--model",
        &gpt2,
        "--model",
        &llama,
        "--device",
        "flex",
        "--kv-cache-memory",
        "blocks:48",
        "--chat-template",
        template.to_str().unwrap(),
    ]);
    let replies: Vec<Value> = ["gpt2", "llama"]
        .iter()
        .map(|model| {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 8, "temperature": 0});
            let (_, r) = server.runtime.block_on(post(&loopback_client::client(), &server.url("/v1/chat/completions"), &body, None));
            r["choices"][0]["message"]["content"].clone()
        })
        .collect();
    assert_ne!(replies[0], replies[1], "the two models must answer differently for the pick to show");
    let dom = chat_page_replies_as_the_api(&server, "llama", "&model=llama");
    assert!(dom.contains("<option value=\"gpt2\">gpt2</option>") && dom.contains("<option value=\"llama\">"), "{dom}");
    server.shutdown();
    let _ = std::fs::remove_file(&template);
}

/// How a [`Breakable`] engine's steps go: normally, with a worker's error, with a panic, or with
/// an error of the engine itself.
const FINE: u8 = 0;
const WORKER_ERROR: u8 = 1;
const PANIC: u8 = 2;
const ENGINE_ERROR: u8 = 3;

/// An engine that runs as its inner one until told to fail.
struct Breakable {
    inner: Box<dyn Engine>,
    mode: Arc<AtomicU8>,
}

impl Engine for Breakable {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn spec(&self) -> &DecoderSpec {
        self.inner.spec()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn generate_stream(
        &mut self,
        prompts: &[Prompt],
        params: &SamplingParams,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> EngineResult<Generation> {
        self.inner.generate_stream(prompts, params, on_token)
    }
    fn add_request(&mut self, request_id: &str, prompt: Prompt, params: SamplingParams) -> EngineResult<()> {
        self.inner.add_request(request_id, prompt, params)
    }
    fn step(&mut self) -> EngineResult<Vec<StepOutput>> {
        match self.mode.load(Ordering::SeqCst) {
            WORKER_ERROR => Err(EngineError::Worker(burn_llm::device::WorkerError::Failed {
                workers: "ws://127.0.0.1:1".into(),
                what: "stepping",
                reason: "connection reset".into(),
            })),
            PANIC => panic!("injected engine panic"),
            ENGINE_ERROR => Err(EngineError::Unsupported { engine: "paged", what: "step (injected)", hint: "none" }),
            _ => self.inner.step(),
        }
    }
    fn abort(&mut self, request_id: &str) -> EngineResult<Option<Vec<RequestOutput>>> {
        self.inner.abort(request_id)
    }
    fn has_unfinished_requests(&self) -> bool {
        self.inner.has_unfinished_requests()
    }
    fn load(&self) -> Option<EngineLoad> {
        self.inner.load()
    }
    fn tokenizer(&self) -> Option<&Tokenizer> {
        self.inner.tokenizer()
    }
    fn report(&self, timing: Timing) -> RunReport {
        self.inner.report(timing)
    }
}

/// A model served from fixture `fixture` whose engine fails as `mode` says.
fn breakable(name: &str, fixture_name: &str, mode: &Arc<AtomicU8>) -> ModelEntry {
    let argv = ["serve", "--model", "unused", "--device", "flex", "--kv-cache-memory", "blocks:32"];
    let spec = ServeArgs::try_parse_from(argv).unwrap().engine_spec();
    let (dir, mode) = (fixture(fixture_name), mode.clone());
    let build: burn_llm_server::EngineBuilder = Box::new(move || {
        let inner = spec.init(&dir, burn_llm::spec::Purpose::Serve, &mut std::io::sink())?;
        Ok(Box::new(Breakable { inner, mode }) as Box<dyn Engine>)
    });
    ModelEntry::new(name, fixture_name, build)
}

#[test]
fn a_model_whose_engine_fails_goes_down_and_the_others_keep_serving() {
    let modes: [Arc<AtomicU8>; 3] = std::array::from_fn(|_| Arc::new(AtomicU8::new(FINE)));
    let entries = vec![
        breakable("good", "gpt2", &modes[0]),
        breakable("worker", "llama", &modes[1]),
        breakable("panics", "opt", &modes[2]),
    ];
    let server = Running::serve(Server::start_models(entries, ServerConfig::default()).unwrap());
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        let mut before = Vec::new();
        for name in ["good", "worker", "panics"] {
            let (status, r) = post(&client, &url, &greedy(Some(name)), None).await;
            assert_eq!(status, 200, "{name}: {r}");
            before.push(r["choices"][0]["text"].clone());
        }
        modes[1].store(WORKER_ERROR, Ordering::SeqCst);
        modes[2].store(PANIC, Ordering::SeqCst);
        for (name, cause) in [("worker", "ws://127.0.0.1:1"), ("panics", "injected engine panic")] {
            // The request running when it fails gets an error naming the model and the cause.
            let (status, r) = post(&client, &url, &greedy(Some(name)), None).await;
            assert_eq!(status, 500, "{name}: {r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains(&format!("model `{name}` is down")) && message.contains(cause), "{message}");
            // Later ones are turned away at once: 503, naming the model.
            let (status, r) = post(&client, &url, &greedy(Some(name)), None).await;
            assert_eq!(status, 503, "{name}: {r}");
            assert!(r["error"]["message"].as_str().unwrap().contains(&format!("model `{name}` is down")), "{r}");
        }
        // The healthy model still answers, as before.
        let (status, r) = post(&client, &url, &greedy(Some("good")), None).await;
        assert_eq!((status, &r["choices"][0]["text"]), (200, &before[0]), "{r}");
        // An error of the engine itself fails the running request, naming the model, and the
        // model stays up: the next request runs.
        modes[0].store(ENGINE_ERROR, Ordering::SeqCst);
        let (status, r) = post(&client, &url, &greedy(Some("good")), None).await;
        assert_eq!(status, 500, "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("model `good`: the engine failed"), "{r}");
        modes[0].store(FINE, Ordering::SeqCst);
        let (status, r) = post(&client, &url, &greedy(Some("good")), None).await;
        assert_eq!((status, &r["choices"][0]["text"]), (200, &before[0]), "{r}");
        let health = client.get(server.url("/health")).send().await.unwrap();
        assert_eq!(health.status().as_u16(), 200, "one model still serves");
        let health: Value = health.json().await.unwrap();
        assert_eq!(health["models"]["good"], "ok");
        assert!(health["models"]["panics"].as_str().unwrap().starts_with("down: "), "{health}");
        let metrics = client.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        assert_eq!(metric(&metrics, "burn_llm:model_up", "good"), 1.0);
        assert_eq!(metric(&metrics, "burn_llm:model_up", "worker"), 0.0);
        assert_eq!(metric(&metrics, "burn_llm:model_up", "panics"), 0.0);
    });
    server.shutdown();
}

/// A real worker process under one model, killed: that model's requests fail naming the model
/// and the worker, and the model on local Flex keeps serving.
#[cfg(feature = "remote")]
#[test]
fn a_dead_worker_under_one_model_leaves_the_other_serving() {
    use crate::remote::{TOKEN, Worker};
    let worker = Worker::start_with("flex", &["--threads", "1"]);
    let (gpt2, llama) = (path("gpt2"), path("llama"));
    let remote = format!("llama=--devices {} --worker-token {TOKEN} --worker-timeout-s 20", worker.url);
    let server = start_argv(&[
        "serve",
        "--model",
        &gpt2,
        "--model",
        &llama,
        "--kv-cache-memory",
        "blocks:32",
        "--model-engine-args",
        "gpt2=--device flex",
        "--model-engine-args",
        &remote,
    ]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let url = server.url("/v1/completions");
        for name in ["gpt2", "llama"] {
            let (status, r) = post(&client, &url, &greedy(Some(name)), None).await;
            assert_eq!(status, 200, "{name}: {r}");
        }
        let (_, before) = post(&client, &url, &greedy(Some("gpt2")), None).await;
        worker.signal("-KILL");
        let (status, r) = post(&client, &url, &greedy(Some("llama")), None).await;
        assert!(status == 500 || status == 503, "{r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(message.contains("model `llama`") && message.contains(&worker.url), "{message}");
        let (status, r) = post(&client, &url, &greedy(Some("gpt2")), None).await;
        assert_eq!((status, &r["choices"][0]["text"]), (200, &before["choices"][0]["text"]), "{r}");
    });
    server.shutdown();
}

/// `--chat-template` and `--max-waiting` per model in `--model-engine-args`: `gpt2` gets a
/// template (the fixtures have none), `llama` lets no request wait.
#[test]
fn a_model_may_have_its_own_chat_template_and_max_waiting() {
    let template = std::env::temp_dir().join(format!("burn-llm-own-template-{}.jinja", std::process::id()));
    std::fs::write(&template, TEMPLATE).unwrap();
    let (gpt2, llama) = (path("gpt2"), path("llama"));
    let own = format!("gpt2=--chat-template '{}'", template.display());
    let server = start_argv(&[
        "serve",
        "--model",
        &gpt2,
        "--model",
        &llama,
        "--device",
        "flex",
        "--kv-cache-memory",
        "blocks:32",
        "--model-engine-args",
        &own,
        "--model-engine-args",
        "llama=--max-waiting 0",
    ]);
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let chat =
            |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &chat("gpt2"), None).await;
        assert_eq!(status, 200, "gpt2 has its own template: {r}");
        let (status, r) = post(&client, &server.url("/v1/chat/completions"), &chat("llama"), None).await;
        assert_eq!(status, 400, "llama has none: {r}");
        let url = server.url("/v1/completions");
        let (status, r) = post(&client, &url, &greedy(Some("llama")), None).await;
        assert_eq!(status, 503, "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("--max-waiting is 0"), "{r}");
        let (status, r) = post(&client, &url, &greedy(Some("gpt2")), None).await;
        assert_eq!(status, 200, "gpt2 keeps the server's --max-waiting: {r}");
    });
    server.shutdown();
    let _ = std::fs::remove_file(&template);
    let err = ServeArgs::try_parse_from([
        "serve",
        "--model",
        "/nowhere/a",
        "--served-model-name",
        "a",
        "--model-engine-args",
        "a=--chat-template /nowhere/t.jinja",
    ])
    .unwrap()
    .model_specs()
    .unwrap_err()
    .to_string();
    assert!(err.contains("model `a`") && err.contains("/nowhere/t.jinja"), "{err}");
}
