//! A `tokenizers::Tokenizer` rebuilt from GGUF metadata (`tokenizer.ggml.*`): the vocabulary,
//! merges and special tokens of a byte-level BPE (`tokenizer.ggml.model = "gpt2"`), with the
//! pre-tokenizer llama.cpp associates with `tokenizer.ggml.pre`.

use serde_json::{json, Value};

use super::{GgufFile, GgufValue};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// GGUF token types that are not ordinary text (`CONTROL`, `USER_DEFINED`).
const SPECIAL_TOKEN_TYPES: [u64; 2] = [3, 4];

/// llama-3's pre-tokenizer regex (`llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Builds the tokenizer stored in a GGUF file's metadata.
pub fn tokenizer_from_gguf(file: &GgufFile) -> Result<Tokenizer> {
    let fail = |m: String| ModelError::Tokenizer(format!("{}: {m}", file.path().display()));
    let model = file
        .meta("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| fail("no tokenizer.ggml.model".into()))?;
    if model != "gpt2" {
        return Err(fail(format!(
            "GGUF tokenizer model `{model}` is not supported (byte-level BPE `gpt2` is)"
        )));
    }
    let strings = |key: &str| -> Result<Vec<String>> {
        file.meta(key)
            .and_then(GgufValue::as_array)
            .ok_or_else(|| fail(format!("no {key}")))?
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| fail(format!("{key} holds a non-string"))))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<u64> = file
        .meta("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
        .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(1)).collect())
        .unwrap_or_default();
    let id = |key: &str| {
        file.meta(key)
            .and_then(GgufValue::as_u64)
            .filter(|&i| (i as usize) < tokens.len())
    };
    let (bos, eos) = (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"));

    let pre = file.meta("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true)
        ]}),
        "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level(false)
        ]}),
        other => return Err(fail(format!("GGUF pre-tokenizer `{other}` is not supported (default, gpt2, smollm, llama-bpe are)"))),
    };
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            let i = *i as u64;
            SPECIAL_TOKEN_TYPES.contains(types.get(i as usize).unwrap_or(&1)) || Some(i) == bos || Some(i) == eos
        })
        .map(|(i, t)| json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    });
    let inner: tokenizers::Tokenizer = spec
        .to_string()
        .parse()
        .map_err(|e| fail(format!("cannot build the tokenizer: {e}")))?;
    let flag = |key: &str| file.meta(key).and_then(GgufValue::as_bool).unwrap_or(false);
    let token = |id: Option<u64>| id.map(|i| Value::String(tokens[i as usize].clone())).unwrap_or(Value::Null);
    let config = json!({
        "bos_token": token(bos),
        "eos_token": token(eos),
        "add_bos_token": flag("tokenizer.ggml.add_bos_token"),
        "add_eos_token": flag("tokenizer.ggml.add_eos_token"),
    });
    Ok(Tokenizer::new(inner, &config))
}

/// The chat template a GGUF file carries, if any.
pub fn chat_template(file: &GgufFile) -> Option<&str> {
    file.meta("tokenizer.chat_template").and_then(GgufValue::as_str)
}
