//! The server with real clients: the official `openai` Python client and the chat page in
//! headless Chromium (both installed by `.ci/run`; `BURN_LLM_SKIP_CLIENT_TESTS=1` reports these
//! tests ignored where they are missing).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::headless_chromium;
use crate::loopback_client;
use crate::server::{KEY, Running, chat_fixture, post, start};

/// What to do when a client that `.ci/run` installs is missing.
const CLIENT_HINT: &str = "run .ci/run to install it, or set BURN_LLM_SKIP_CLIENT_TESTS=1 to skip this test";

/// The Python interpreter that has the official `openai` client: `$BURN_LLM_PYTHON`, or the venv
/// `.ci/run` makes at `~/.cache/burn-llm-venv`. Panics, saying how to get one, when it cannot
/// import `openai`.
fn openai_python() -> std::path::PathBuf {
    let python = match std::env::var_os("BURN_LLM_PYTHON") {
        Some(path) => std::path::PathBuf::from(path),
        None => {
            let home = std::env::var_os("HOME").expect("neither BURN_LLM_PYTHON nor HOME is set");
            std::path::PathBuf::from(home).join(".cache/burn-llm-venv/bin/python")
        }
    };
    let import = std::process::Command::new(&python).args(["-c", "import openai"]).output();
    match import {
        Ok(out) if out.status.success() => python,
        Ok(out) => panic!(
            "{} cannot import the `openai` client ({}): {CLIENT_HINT}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("no Python at {} ({e}): {CLIENT_HINT}", python.display()),
    }
}

#[test]
#[cfg_attr(skip_client_tests, ignore = "BURN_LLM_SKIP_CLIENT_TESTS is set")]
fn the_official_openai_python_client_works() {
    let python = openai_python();
    let dir = chat_fixture();
    let server = start(dir.path(), &["--api-key", KEY]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/openai_client_check.py");
    let base = server.url("/v1");
    let output = std::process::Command::new(python).arg(script).args([base.as_str(), "fixture", KEY]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let seen: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!((&seen["not_found"], &seen["auth"], &seen["models"]), (&json!(404), &json!(401), &json!(["fixture"])));
    assert_eq!(seen["tool_call"]["name"], "get_weather", "{seen}");
    server.runtime.block_on(async {
        let client = loopback_client::client();
        let body = json!({"prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0});
        let (_, r) = post(&client, &server.url("/v1/completions"), &body, Some(KEY)).await;
        assert_eq!(seen["completion"], r["choices"][0]["text"]);
    });
    server.shutdown();
}

#[test]
#[cfg_attr(skip_client_tests, ignore = "BURN_LLM_SKIP_CLIENT_TESTS is set")]
fn the_chat_page_streams_a_reply_in_headless_chromium() {
    let dir = chat_fixture();
    let server = start(dir.path(), &[]);
    chat_page_replies_as_the_api(&server, "fixture", "");
    server.shutdown();
}

/// Opens the chat page of `server` in headless Chromium with a message sent (`query`: more of the
/// page's query string, such as `&model=NAME`), waits for the streamed reply and checks it is
/// the greedy chat completion of `model`; returns the page's DOM.
pub(crate) fn chat_page_replies_as_the_api(server: &Running, model: &str, query: &str) -> String {
    let chromium = headless_chromium::find()
        .unwrap_or_else(|| panic!("no chromium, chromium-browser or google-chrome on PATH: {CLIENT_HINT}"));
    let message = "Hi there";
    let expected = server.runtime.block_on(async {
        let client = loopback_client::client();
        let body = json!({"model": model, "messages": [{"role": "user", "content": message}], "max_tokens": 8, "temperature": 0, "top_p": 1});
        let (_, r) = post(&client, &server.url("/v1/chat/completions"), &body, None).await;
        r["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    });
    let page = server.url(&format!("/?q={}&temperature=0&max_tokens=8{query}", message.replace(' ', "%20")));
    let profile = std::env::temp_dir().join(format!("burn-llm-chromium-{}-{model}", std::process::id()));
    // The page is polled in real time until the reply leaves the "streaming" state (a loaded
    // machine may take long; virtual-time DOM dumps cut streams short).
    let finished = |dom: &str| {
        dom.split("class=\"msg assistant\"").nth(1).is_some_and(|reply| !reply.starts_with(" data-state=\"streaming\""))
    };
    let dom = headless_chromium::Browser::open(chromium, &profile, &page)
        .and_then(|mut browser| browser.wait_for(Duration::from_secs(300), finished))
        .unwrap_or_else(|e| panic!("driving {chromium}: {e}"));
    let _ = std::fs::remove_dir_all(&profile);
    let reply = dom
        .split("class=\"msg assistant\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no assistant message in the page:\n{dom}"));
    assert!(reply.contains("data-state=\"done\""), "the reply did not finish streaming:\n{dom}");
    let text = reply.split_once('>').unwrap().1.split("</div>").next().unwrap();
    let unescaped = text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&");
    assert_eq!(unescaped, expected, "{model}");
    assert!(dom.contains(&format!("class=\"msg user\">{message}<")), "{dom}");
    dom
}
