//! The CLI's golden outputs: for the same flags, stdout is byte-identical to the runs captured in
//! `tests/fixtures/cli-golden/` (up to what varies between runs).

use burn_llm::cli::GenerateArgs;
use clap::Parser;

use crate::cli::DEFAULTS;
use crate::common::fixture;

/// What varies between two runs of the same flags: timings, measured and predicted throughput,
/// the checkout's path. The `[load …]` summary line is dropped (it is all timing), JSON timing
/// fields are zeroed.
fn mask_varying(stdout: &str) -> String {
    let mut lines = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("[load ") {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(mut json) if json.is_object() => {
                for key in ["load_s", "prefill_s", "decode_s", "tokens_per_s"] {
                    json["timing"][key] = serde_json::json!(0);
                }
                // The model path is where the checkout is; disk bytes are file sizes, which the
                // disk tier's safetensors headers changed (the values stored are the same).
                if let Some(model) = json["model"].as_str() {
                    json["model"] = serde_json::json!(model.rsplit('/').next().unwrap_or(model));
                }
                if let Some(memory) = json.get_mut("memory").and_then(|m| m.as_object_mut()) {
                    memory.insert("disk_bytes".into(), serde_json::json!(0));
                }
                if let Some(policy) = json.get_mut("policy").and_then(|p| p.as_object_mut()) {
                    policy.insert("predicted_tokens_per_s".into(), serde_json::json!(0));
                    policy.insert("measured_tokens_per_s".into(), serde_json::json!(0));
                }
                lines.push(json.to_string());
            }
            _ => lines.push(line.to_string()),
        }
    }
    lines.join("\n").trim_end().to_string()
}

/// Equal JSON, numbers within 1e-4 (the fused Flex decode ops — RMSNorm, RoPE, attention, a
/// polynomial `eˣ` — round differently from the Burn ops the golden runs used, moving the printed
/// log-probabilities in their sixth digit; ids and text must still match exactly).
fn json_close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) if x.fract() != 0.0 || y.fract() != 0.0 => (x - y).abs() <= 1e-4,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_close(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_close(v, w)))
        }
        _ => a == b,
    }
}

/// Every engine prints through one path (`cli::run_with` over a `Box<dyn Engine>`), and for the
/// same flags stdout is what the example binaries printed before that path existed
/// (`tests/fixtures/cli-golden/*.out`, captured by `scripts/capture_cli_golden.py`; see its
/// README for the one intended difference).
#[test]
fn outputs_are_byte_identical_to_the_golden_runs() {
    let golden = fixture("cli-golden");
    let cases: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(golden.join("cases.json")).unwrap()).unwrap();
    let scratch = std::env::temp_dir().join(format!("burn-llm-cli-golden-{}", std::process::id()));
    for (name, argv) in cases {
        let argv: Vec<String> = argv.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        let model = fixture(&argv[0]);
        let mut full =
            vec!["x".to_string(), "--model".into(), model.to_str().unwrap().into(), "--device".into(), "flex".into()];
        full.extend(argv[1..].iter().cloned());
        if argv.iter().any(|a| a == "offload") {
            full.extend(["--offload-dir".into(), scratch.join("tensors").to_str().unwrap().into()]);
            full.extend(["--profile".into(), scratch.join("profile.json").to_str().unwrap().into()]);
        }
        let parsed = GenerateArgs::try_parse_from(&full).unwrap();
        let (mut out, mut log) = (Vec::new(), Vec::new());
        burn_llm::cli::run_with(&parsed, DEFAULTS, &mut out, &mut log).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = std::fs::read_to_string(golden.join(format!("{name}.out"))).unwrap();
        let (got, expected) = (mask_varying(&String::from_utf8(out).unwrap()), mask_varying(&expected));
        assert_eq!(got.lines().count(), expected.lines().count(), "{name}:\n{got}\n---\n{expected}");
        for (a, b) in got.lines().zip(expected.lines()) {
            match (serde_json::from_str::<serde_json::Value>(a), serde_json::from_str::<serde_json::Value>(b)) {
                (Ok(a), Ok(b)) if a.is_object() => assert!(json_close(&a, &b), "{name}:\n{a}\n---\n{b}"),
                _ => assert_eq!(a, b, "{name}"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
