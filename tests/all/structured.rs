//! Structured outputs, `logit_bias` and `min_p` in every engine (plain, paged, offloading) on the
//! tiny fixtures: every finished output parses and validates against its schema (nested objects,
//! arrays, enums, bounded numbers, required fields, `anyOf`), regexes, choices and Lark grammars
//! hold, malformed constraints are refused with the compiler's message, and a constraint that
//! cannot finish within `max_new_tokens` stops with `length`.

use burn::tensor::Device;
use burn_llm::models::{Constraint, FinishReason, ModelError, Pretrained, Prompt, RequestOutput, SamplingParams};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine};
use serde_json::{Value, json};

use crate::common::fixture;

/// Checks `value` against the JSON-schema keywords the tests use (type, properties, required,
/// additionalProperties, items, minItems/maxItems, enum, const, minimum/maximum,
/// minLength/maxLength, anyOf); the error says which keyword failed where.
pub(crate) fn validate(value: &Value, schema: &Value, at: &str) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{at}: {what} (value {value}, schema {schema})"));
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array)
        && !options.iter().any(|s| validate(value, s, at).is_ok())
    {
        return fail("matches no anyOf branch");
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return fail("not in enum");
    }
    if let Some(c) = schema.get("const")
        && c != value
    {
        return fail("not the const");
    }
    let type_ok = match schema.get("type").and_then(Value::as_str) {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        // JSON Schema's integers are numbers without a fractional part (`-0` and `1.0` included).
        Some("integer") => value.as_f64().is_some_and(|n| n.fract() == 0.0),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("null") => value.is_null(),
        Some(other) => return fail(&format!("unknown type {other}")),
    };
    if !type_ok {
        return fail("wrong type");
    }
    if let Some(n) = value.as_f64() {
        if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| n < m) {
            return fail("below minimum");
        }
        if schema.get("maximum").and_then(Value::as_f64).is_some_and(|m| n > m) {
            return fail("above maximum");
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if schema.get("minLength").and_then(Value::as_u64).is_some_and(|m| len < m) {
            return fail("shorter than minLength");
        }
        if schema.get("maxLength").and_then(Value::as_u64).is_some_and(|m| len > m) {
            return fail("longer than maxLength");
        }
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if schema.get("minItems").and_then(Value::as_u64).is_some_and(|m| len < m) {
            return fail("fewer than minItems");
        }
        if schema.get("maxItems").and_then(Value::as_u64).is_some_and(|m| len > m) {
            return fail("more than maxItems");
        }
        if let Some(item) = schema.get("items") {
            for (i, v) in items.iter().enumerate() {
                validate(v, item, &format!("{at}[{i}]"))?;
            }
        }
    }
    if let Some(object) = value.as_object() {
        let properties = schema.get("properties").and_then(Value::as_object);
        for name in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            if !object.contains_key(name.as_str().unwrap_or_default()) {
                return fail(&format!("misses required {name}"));
            }
        }
        for (key, v) in object {
            match properties.and_then(|p| p.get(key)) {
                Some(s) => validate(v, s, &format!("{at}.{key}"))?,
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return fail(&format!("has extra property {key}"));
                }
                None => {}
            }
        }
    }
    Ok(())
}

/// Schemas covering nested objects, arrays, enums, bounded numbers, required fields and `anyOf`,
/// every string and array bounded so that a random model can finish them.
pub(crate) fn schemas() -> Vec<Value> {
    vec![
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 4},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "role": {"enum": ["admin", "user"]},
            },
            "required": ["name", "age", "role"],
            "additionalProperties": false,
        }),
        json!({
            "type": "object",
            "properties": {
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5}, "ok": {"type": "boolean"}},
                    "required": ["x", "ok"],
                    "additionalProperties": false,
                },
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
            },
            "required": ["point", "tags"],
            "additionalProperties": false,
        }),
        json!({
            "anyOf": [
                {"type": "integer", "minimum": 10, "maximum": 99},
                {"type": "object", "properties": {"id": {"const": "x"}}, "required": ["id"], "additionalProperties": false},
            ]
        }),
    ]
}

fn sampled(constraint: Constraint, seed: u64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 100,
        temperature: 1.0,
        seed: Some(seed),
        constraint: Some(constraint),
        ..SamplingParams::default()
    }
}

/// The finished output's text, checked to have stopped rather than run out of tokens.
fn stopped(out: &RequestOutput, what: &str) -> String {
    assert_eq!(out.finish_reason, FinishReason::Stop, "{what}: {:?} ran out of tokens", out.text);
    out.text.clone()
}

fn check_schema_outputs(outputs: Vec<RequestOutput>, schema: &Value, what: &str) {
    for out in outputs {
        let text = stopped(&out, what);
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {text:?} is not JSON: {e}"));
        validate(&value, schema, "$").unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// Runs `params` on every prompt in the paged engine, all requests in one batch.
fn paged_outputs(engine: &mut LlmEngine, prompts: &[Prompt], params: &[SamplingParams]) -> Vec<RequestOutput> {
    for (i, (prompt, p)) in prompts.iter().zip(params).enumerate() {
        engine.add_request(format!("r{i}"), prompt.clone(), p.clone()).unwrap();
    }
    let mut outputs: Vec<Option<RequestOutput>> = vec![None; prompts.len()];
    while engine.has_unfinished_requests() {
        for out in engine.step().unwrap() {
            if let Some(mut done) = out.finished {
                let i: usize = out.request_id[1..].parse().unwrap();
                outputs[i] = Some(done.remove(0));
            }
        }
    }
    outputs.into_iter().map(Option::unwrap).collect()
}

#[test]
fn schema_outputs_parse_and_validate_in_every_engine() {
    let device = Device::flex();
    let prompts: Vec<Prompt> = ["Hello", "The answer is", "JSON:", "x"].iter().map(|&p| p.into()).collect();
    let plain = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &device).unwrap());
    let offload =
        crate::offload::engine("opt", &device, burn_llm::offload::policy::Policy::all_on_gpu(4), "structured");
    let config = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(256), ..EngineConfig::default() };
    let mut paged = LlmEngine::new(Pretrained::load(&fixture("opt"), &device).unwrap(), config).unwrap();
    for (k, schema) in schemas().iter().enumerate() {
        for seed in 0..2u64 {
            let params = sampled(Constraint::JsonSchema(schema.clone()), seed * 10 + k as u64);
            let what = format!("schema {k}, seed {seed}");
            check_schema_outputs(
                plain.generate(&prompts, &params).unwrap().requests,
                schema,
                &format!("{what}: plain"),
            );
            check_schema_outputs(
                offload.generate(&prompts, &params).unwrap().0.requests,
                schema,
                &format!("{what}: offload"),
            );
            // Paged: constrained requests batched with unconstrained ones and with each other.
            let mut mixed = vec![params.clone(); prompts.len()];
            mixed[1] = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
            let outputs = paged_outputs(&mut paged, &prompts, &mixed);
            let constrained: Vec<RequestOutput> =
                outputs.into_iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, o)| o).collect();
            check_schema_outputs(constrained, schema, &format!("{what}: paged"));
        }
    }
    // Any JSON object, and parallel samples (each its own constraint state).
    let object = SamplingParams { n: 3, max_new_tokens: 110, ..sampled(Constraint::JsonObject, 7) };
    engine_add_n(&mut paged, &object);
}

/// `n` parallel samples of a JSON object in the paged engine: every one is an object.
fn engine_add_n(engine: &mut LlmEngine, params: &SamplingParams) {
    engine.add_request("n", Prompt::from("{"), params.clone()).unwrap();
    let mut done = None;
    while engine.has_unfinished_requests() {
        for out in engine.step().unwrap() {
            done = out.finished.or(done);
        }
    }
    let outputs = done.unwrap();
    assert_eq!(outputs.len(), 3);
    for out in outputs {
        if out.finish_reason == FinishReason::Stop {
            let value: Value = serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{:?}: {e}", out.text));
            assert!(value.is_object(), "{value}");
        }
    }
}

#[test]
fn regex_choice_and_grammar_hold_and_bad_ones_are_refused() {
    let device = Device::flex();
    let plain = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &device).unwrap());
    let prompts: Vec<Prompt> = ["Hello", "Pick one:"].iter().map(|&p| p.into()).collect();
    for seed in 0..3 {
        let regex = sampled(Constraint::Regex(r"[0-9]{3}-[a-c]{2}".into()), seed);
        for out in plain.generate(&prompts, &regex).unwrap().requests {
            let text = stopped(&out, "regex");
            assert!(text.len() == 6 && text.as_bytes()[3] == b'-', "{text:?}");
        }
        let choices = vec!["red".to_string(), "green".into(), "blue sky".into()];
        for out in plain.generate(&prompts, &sampled(Constraint::Choice(choices.clone()), seed)).unwrap().requests {
            assert!(choices.contains(&stopped(&out, "choice")), "{:?}", out.text);
        }
        let lark =
            "start: \"(\" item (\",\" item)? (\",\" item)? \")\"\nitem: /[a-z]{1,3}/ | NUMBER\nNUMBER: /[0-9]{1,2}/\n";
        for out in plain.generate(&prompts, &sampled(Constraint::Grammar(lark.into()), seed)).unwrap().requests {
            let text = stopped(&out, "grammar");
            assert!(text.starts_with('(') && text.ends_with(')'), "{text:?}");
            assert!(text[1..text.len() - 1].split(',').all(|i| (1..=3).contains(&i.len())), "{text:?}");
        }
    }
    let bad = [
        Constraint::Regex("([0-9".into()),
        Constraint::JsonSchema(json!({"type": "frobnicate"})),
        Constraint::JsonSchema(json!(12)),
        Constraint::Grammar("start: missing_rule\n".into()),
        Constraint::Choice(Vec::new()),
    ];
    for constraint in bad {
        let kind = constraint.kind();
        let err = plain.generate(&prompts, &sampled(constraint, 0)).unwrap_err();
        assert!(matches!(err, ModelError::InvalidConstraint { .. }), "{kind}: {err}");
        assert!(err.to_string().starts_with(&format!("invalid {kind}: ")), "{err}");
    }
    // Beam search takes no constraint.
    let mut beam = sampled(Constraint::JsonObject, 0);
    beam.temperature = 0.0;
    beam.beam = Some(burn_llm::models::BeamSearchParams::new(2));
    assert!(beam.validate(384).is_err());
}

#[test]
fn a_constraint_that_cannot_finish_stops_at_length_with_what_it_wrote() {
    let plain = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    let schema = json!({
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 50}},
        "required": ["s"],
        "additionalProperties": false,
    });
    let params = SamplingParams { max_new_tokens: 6, ..sampled(Constraint::JsonSchema(schema), 3) };
    let out = &plain.generate(&["Hi".into()], &params).unwrap().requests[0];
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.generated_ids.len(), 6);
    assert!("{\"s\":\"".starts_with(&out.text) || out.text.starts_with("{\"s\":\""), "{:?}", out.text);
    assert!(serde_json::from_str::<Value>(&out.text).is_err(), "{:?}", out.text);
}

#[test]
fn logit_bias_and_min_p_act_in_every_engine() {
    let device = Device::flex();
    let plain = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &device).unwrap());
    let offload = crate::offload::engine("opt", &device, burn_llm::offload::policy::Policy::all_on_gpu(4), "bias");
    let config = EngineConfig { kv_cache_memory: KvCacheMemory::Blocks(128), ..EngineConfig::default() };
    let mut paged = LlmEngine::new(Pretrained::load(&fixture("opt"), &device).unwrap(), config).unwrap();
    let prompts: Vec<Prompt> = vec!["Hello".into(), "The".into()];
    let greedy = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let ids = |outs: Vec<RequestOutput>| outs.into_iter().map(|o| o.generated_ids).collect::<Vec<_>>();
    let base = ids(plain.generate(&prompts, &greedy).unwrap().requests);
    // +100 on one token: greedy picks it every step. -100 on greedy's first token: it never comes.
    let forced = SamplingParams { logit_bias: [(77, 100.0)].into(), ..greedy.clone() };
    let banned = SamplingParams { logit_bias: [(base[0][0], -100.0)].into(), ..greedy.clone() };
    // min_p = 1 keeps only the most likely token: sampling at any temperature is greedy.
    let min_p = SamplingParams { temperature: 1.5, min_p: 1.0, seed: Some(5), ..greedy.clone() };
    for (what, outs) in [
        ("plain", [&forced, &banned, &min_p].map(|p| ids(plain.generate(&prompts, p).unwrap().requests))),
        ("offload", [&forced, &banned, &min_p].map(|p| ids(offload.generate(&prompts, p).unwrap().0.requests))),
        (
            "paged",
            [&forced, &banned, &min_p].map(|p| ids(paged_outputs(&mut paged, &prompts, &[p.clone(), p.clone()]))),
        ),
    ] {
        let [forced, banned, min_p] = outs;
        assert!(forced.iter().all(|seq| seq.iter().all(|&t| t == 77)), "{what}: {forced:?}");
        assert!(!banned[0].contains(&base[0][0]), "{what}: {banned:?}");
        assert_eq!(min_p, base, "{what}");
    }
    let bad = SamplingParams { logit_bias: [(9999, 1.0)].into(), ..greedy.clone() };
    assert!(plain.generate(&prompts, &bad).unwrap_err().to_string().contains("logit_bias"));
    let bad = SamplingParams { min_p: 1.5, ..greedy };
    assert!(plain.generate(&prompts, &bad).unwrap_err().to_string().contains("min_p"));
}
