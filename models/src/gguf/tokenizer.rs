//! A `tokenizers::Tokenizer` rebuilt from GGUF metadata (`tokenizer.ggml.*`): either a byte-level
//! BPE (`tokenizer.ggml.model = "gpt2"`: vocabulary, merges, special tokens, and the pre-tokenizer
//! llama.cpp associates with `tokenizer.ggml.pre`) or a SentencePiece BPE (`"llama"`: pieces and
//! scores, see [`super::spm`]).

use serde_json::{Value, json};

use super::spm::{SpmVocab, piece_type, spm_tokenizer};
use super::{GgufFile, GgufValue};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// GGUF token types that are not ordinary text.
const SPECIAL_TOKEN_TYPES: [u32; 2] = [piece_type::CONTROL, piece_type::USER_DEFINED];

/// llama-3's pre-tokenizer regex (`llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer regex (`qwen2`): llama-3's with single digits.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Builds the tokenizer stored in a GGUF file's metadata.
pub fn tokenizer_from_gguf(file: &GgufFile) -> Result<Tokenizer> {
    let meta = Meta(file);
    let model = meta
        .get("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| meta.fail("no tokenizer.ggml.model"))?;
    let build =
        match model {
            "gpt2" => byte_level_bpe,
            "llama" => sentencepiece,
            other => return Err(meta.fail(format!(
                "GGUF tokenizer model `{other}` is not supported (byte-level BPE `gpt2` and SentencePiece `llama` are)"
            ))),
        };
    let tokens = meta.strings("tokenizer.ggml.tokens")?;
    let types = meta.token_types(tokens.len())?;
    let (inner, special) = build(&meta, &tokens, &types)?;
    let token = |id: Option<u32>| id.map(|i| Value::String(tokens[i as usize].clone())).unwrap_or(Value::Null);
    let config = json!({
        "bos_token": token(special.bos),
        "eos_token": token(special.eos),
        "add_bos_token": special.add_bos,
        "add_eos_token": special.add_eos,
        "chat_template": chat_template(file),
    });
    Ok(Tokenizer::new(inner, &config))
}

/// BOS/EOS ids (checked to be in the vocabulary) and whether encoding adds them.
struct Special {
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

/// The byte-level BPE of `tokenizer.ggml.model = "gpt2"`.
fn byte_level_bpe(meta: &Meta<'_>, tokens: &[String], types: &[u32]) -> Result<(tokenizers::Tokenizer, Special)> {
    let merges = meta.strings("tokenizer.ggml.merges")?;
    let special = Special {
        bos: meta.id("tokenizer.ggml.bos_token_id", tokens.len())?,
        eos: meta.id("tokenizer.ggml.eos_token_id", tokens.len())?,
        add_bos: meta.flag("tokenizer.ggml.add_bos_token", false)?,
        add_eos: meta.flag("tokenizer.ggml.add_eos_token", false)?,
    };
    let pre = meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true)
        ]}),
        "llama-bpe" | "llama3" | "qwen2" | "deepseek-r1-qwen" => {
            let split = if pre.contains("qwen") { QWEN2_SPLIT } else { LLAMA3_SPLIT };
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": false},
                byte_level(false)
            ]})
        }
        other => {
            return Err(meta.fail(format!(
                "GGUF pre-tokenizer `{other}` is not supported (default, gpt2, smollm, llama-bpe, qwen2 are)"
            )));
        }
    };
    let vocab: serde_json::Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|&(i, (_, kind))| {
            let i = Some(i as u32);
            SPECIAL_TOKEN_TYPES.contains(kind) || i == special.bos || i == special.eos
        })
        .map(|(i, (t, _))| json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
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
    let inner = spec.to_string().parse().map_err(|e| meta.fail(format!("cannot build the tokenizer: {e}")))?;
    Ok((inner, special))
}

/// The SentencePiece BPE of `tokenizer.ggml.model = "llama"`, with llama.cpp's defaults for absent
/// keys: unknown id 0, BOS 1, EOS 2, BOS added, EOS not, a space prefix.
fn sentencepiece(meta: &Meta<'_>, tokens: &[String], types: &[u32]) -> Result<(tokenizers::Tokenizer, Special)> {
    let n = tokens.len();
    let id = |key: &str, default: u32| -> Result<Option<u32>> {
        Ok(match meta.get(key) {
            Some(_) => meta.id(key, n)?,
            None => Some(default).filter(|&d| (d as usize) < n),
        })
    };
    let special = Special {
        bos: id("tokenizer.ggml.bos_token_id", 1)?,
        eos: id("tokenizer.ggml.eos_token_id", 2)?,
        add_bos: meta.flag("tokenizer.ggml.add_bos_token", true)?,
        add_eos: meta.flag("tokenizer.ggml.add_eos_token", false)?,
    };
    let scores = meta.floats("tokenizer.ggml.scores")?;
    let vocab = SpmVocab {
        tokens,
        scores: &scores,
        types,
        bos: special.bos,
        eos: special.eos,
        unk: id("tokenizer.ggml.unknown_token_id", 0)?,
        add_space_prefix: meta.flag("tokenizer.ggml.add_space_prefix", true)?,
    };
    let inner = spm_tokenizer(&vocab).map_err(|e| match e {
        ModelError::Tokenizer(message) => meta.fail(message),
        other => other,
    })?;
    Ok((inner, special))
}

/// Typed reads of a GGUF file's metadata; every error names the file.
struct Meta<'a>(&'a GgufFile);

impl Meta<'_> {
    /// A tokenizer error about this file.
    fn fail(&self, message: impl std::fmt::Display) -> ModelError {
        ModelError::Tokenizer(format!("{}: {message}", self.0.path().display()))
    }

    /// The value of `key`, if present.
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.0.meta(key)
    }

    /// The required array `key`, each element read by `read` (`what` names the element type).
    fn array<T>(&self, key: &str, what: &str, read: impl Fn(&GgufValue) -> Option<T>) -> Result<Vec<T>> {
        self.get(key)
            .and_then(GgufValue::as_array)
            .ok_or_else(|| self.fail(format!("no {key} array")))?
            .iter()
            .map(|v| read(v).ok_or_else(|| self.fail(format!("{key} holds a non-{what} ({v:?})"))))
            .collect()
    }

    /// The required string array `key`.
    fn strings(&self, key: &str) -> Result<Vec<String>> {
        self.array(key, "string", |v| v.as_str().map(str::to_string))
    }

    /// The required float array `key`, as f32 (what GGUF stores for scores).
    fn floats(&self, key: &str) -> Result<Vec<f32>> {
        self.array(key, "number", |v| v.as_f64().map(|f| f as f32))
    }

    /// `tokenizer.ggml.token_type` for `n` tokens, all normal when absent.
    fn token_types(&self, n: usize) -> Result<Vec<u32>> {
        let key = "tokenizer.ggml.token_type";
        if self.get(key).is_none() {
            return Ok(vec![piece_type::NORMAL; n]);
        }
        let types = self.array(key, "token type", |v| v.as_u64().and_then(|t| u32::try_from(t).ok()))?;
        if types.len() != n {
            return Err(self.fail(format!("{key} has {} entries for {n} tokens", types.len())));
        }
        Ok(types)
    }

    /// The token id `key`, if present, checked to be below `n`.
    fn id(&self, key: &str, n: usize) -> Result<Option<u32>> {
        let Some(value) = self.get(key) else { return Ok(None) };
        match value.as_u64() {
            Some(i) if i < n as u64 => Ok(Some(i as u32)),
            _ => Err(self.fail(format!("{key} = {value:?} is not a token id of the {n}-token vocabulary"))),
        }
    }

    /// The boolean `key`, `default` when absent.
    fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.fail(format!("{key} = {v:?} is not a boolean"))),
        }
    }
}

/// The chat template a GGUF file carries, if any.
pub fn chat_template(file: &GgufFile) -> Option<&str> {
    file.meta("tokenizer.chat_template").and_then(GgufValue::as_str)
}
