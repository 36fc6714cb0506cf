//! A GGUF file's `DecoderSpec`: its per-architecture metadata keys (`{arch}.block_count`,
//! `{arch}.attention.key_length`…) written as the HF `config.json` of the same model and lowered
//! by that architecture's own parser, so GGUF models go through the same validation. What only the
//! GGUF says (baked norm offsets, `rope_freqs.weight`) is set on the spec afterwards.

use serde_json::{Value, json};

use super::{GgufFile, GgufValue};
use crate::config::{Architecture, DecoderSpec, PositionKind};
use crate::error::{ModelError, Result};
use crate::layers::rope::RopeScaling;

/// GGUF `general.architecture` values this crate loads.
const SUPPORTED: &str = "llama, qwen2, qwen3, gemma3, phi3";

/// llama.cpp's Gemma 3 defaults when the file does not say: every sixth layer global, local RoPE
/// base 10 000.
const GEMMA3_PATTERN: u64 = 6;
const GEMMA3_LOCAL_THETA: f64 = 10_000.0;

/// Reads `{arch}.*` keys of a file.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.file.meta(&format!("{}.{key}", self.arch))
    }

    fn int(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(GgufValue::as_u64).ok_or_else(|| {
            ModelError::config(
                self.file.path(),
                format!("GGUF metadata `{}.{key}` missing or not an integer", self.arch),
            )
        })
    }

    fn opt_int(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }

    fn float(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(GgufValue::as_f64)
    }
}

/// Builds the HF-style config of the file's architecture and lowers it.
pub(super) fn spec_from_metadata(file: &GgufFile) -> Result<DecoderSpec> {
    let path = file.path();
    let arch = file.meta("general.architecture").and_then(GgufValue::as_str).ok_or_else(|| {
        ModelError::CorruptGguf { path: path.to_path_buf(), message: "no general.architecture".into() }
    })?;
    let model_type = match arch {
        "llama" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        "gemma3" => "gemma3_text",
        "phi3" => "phi3",
        other => {
            return Err(ModelError::UnsupportedArchitecture(format!("{other} (GGUF; supported: {SUPPORTED})")));
        }
    };
    let keys = Keys { file, arch };
    let heads = keys.int("attention.head_count")?;
    let vocab = match keys.opt_int("vocab_size") {
        Some(v) => v,
        None => file
            .meta("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(|t| t.len() as u64)
            .ok_or_else(|| ModelError::config(path, format!("no {arch}.vocab_size and no tokenizer.ggml.tokens")))?,
    };
    let hidden = keys.int("embedding_length")?;
    let head_dim = keys
        .opt_int("attention.key_length")
        .or_else(|| keys.opt_int("rope.dimension_count"))
        .unwrap_or(hidden.checked_div(heads).unwrap_or(0));
    let rope = match keys.get("rope.scaling.type").and_then(GgufValue::as_str) {
        None | Some("none") => json!({"rope_type": "default"}),
        Some("linear") => json!({"rope_type": "linear", "factor": keys.float("rope.scaling.factor").unwrap_or(1.0)}),
        Some(other) => {
            return Err(ModelError::config(path, format!("unsupported GGUF rope scaling `{other}`")));
        }
    };
    for unsupported in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        if file.tensor_info(unsupported).is_some() {
            return Err(ModelError::config(path, format!("LongRoPE ({unsupported}) is not supported")));
        }
    }
    let mut config = json!({
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": keys.int("feed_forward_length")?,
        "num_hidden_layers": keys.int("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": keys.opt_int("attention.head_count_kv").unwrap_or(heads),
        "head_dim": head_dim,
        "max_position_embeddings": keys.int("context_length")?,
        "rms_norm_eps": keys.float("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        "rope_theta": keys.float("rope.freq_base").unwrap_or(10_000.0),
        "rope_scaling": rope,
        "tie_word_embeddings": file.tensor_info("output.weight").is_none(),
        "bos_token_id": file.meta("tokenizer.ggml.bos_token_id").and_then(GgufValue::as_u64),
        "eos_token_id": file.meta("tokenizer.ggml.eos_token_id").and_then(GgufValue::as_u64),
    });
    let window = keys.opt_int("attention.sliding_window");
    let extra = match arch {
        "llama" | "phi3" => json!({"sliding_window": window}),
        "qwen2" | "qwen3" => json!({"use_sliding_window": false}),
        "gemma3" => gemma3_extras(&keys, head_dim, window)?,
        _ => json!({}),
    };
    if let (Value::Object(config), Value::Object(extra)) = (&mut config, extra) {
        config.extend(extra);
    }
    if arch == "llama" && window.is_some() {
        // llama.cpp writes Mistral as `llama`; a window marks it.
        config["model_type"] = json!("mistral");
    }
    let mut spec = DecoderSpec::from_json(&config.to_string(), path)?;
    // llama.cpp's converter bakes Gemma's `+1` into the norm weights.
    spec.variants.norm_weight_offset = 0.0;
    if let Some(factors) = rope_factors(file, &spec)? {
        match &mut spec.positions {
            PositionKind::Rotary(rope) if rope.scaling == RopeScaling::None => {
                rope.scaling = RopeScaling::Factors(factors)
            }
            _ => {
                return Err(ModelError::config(path, "rope_freqs.weight alongside another RoPE scaling"));
            }
        }
    }
    Ok(spec)
}

/// Gemma 3's keys in HF's names: local layers (`sliding_window_pattern`: every n-th layer
/// global, or one flag per layer, `true` = local), their RoPE base, the score scale and the
/// logit softcap.
fn gemma3_extras(keys: &Keys<'_>, head_dim: u64, window: Option<u64>) -> Result<Value> {
    let pattern = match keys.get("attention.sliding_window_pattern") {
        None => json!({"sliding_window_pattern": GEMMA3_PATTERN}),
        Some(GgufValue::Array(flags)) => {
            let types: Option<Vec<&str>> = flags
                .iter()
                .map(|f| f.as_bool().map(|local| if local { "sliding_attention" } else { "full_attention" }))
                .collect();
            let types = types.ok_or_else(|| {
                ModelError::config(keys.file.path(), "gemma3.attention.sliding_window_pattern holds non-booleans")
            })?;
            json!({"layer_types": types})
        }
        Some(value) => match value.as_u64() {
            Some(n) => json!({"sliding_window_pattern": n}),
            None => {
                return Err(ModelError::config(
                    keys.file.path(),
                    "gemma3.attention.sliding_window_pattern is neither an integer nor a list of booleans",
                ));
            }
        },
    };
    let mut extra = json!({
        "hidden_activation": "gelu_pytorch_tanh",
        // llama.cpp scales scores by 1/√head_dim unless the file states its own scale.
        "query_pre_attn_scalar": keys.float("attention.scale").map_or(head_dim as f64, |s| 1.0 / (s * s)),
        "sliding_window": window,
        "rope_local_base_freq": keys.float("rope.freq_base_swa").unwrap_or(GEMMA3_LOCAL_THETA),
        "final_logit_softcapping": keys.float("final_logit_softcapping"),
    });
    if let (Value::Object(extra), Value::Object(pattern)) = (&mut extra, pattern) {
        extra.extend(pattern);
    }
    Ok(extra)
}

/// `rope_freqs.weight` (one divisor per rotary frequency, LLaMA 3.x files), checked against the
/// head width.
fn rope_factors(file: &GgufFile, spec: &DecoderSpec) -> Result<Option<Vec<f32>>> {
    if file.tensor_info("rope_freqs.weight").is_none() {
        return Ok(None);
    }
    let (values, shape) = file.read_f32("rope_freqs.weight")?;
    let half = spec.head_dim / 2;
    if shape != [half] {
        return Err(ModelError::ShapeMismatch { name: "rope_freqs.weight".into(), expected: vec![half], found: shape });
    }
    if let Some(bad) = values.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(ModelError::config(file.path(), format!("rope_freqs.weight holds {bad}, not a positive factor")));
    }
    Ok(Some(values))
}

impl Architecture {
    /// Whether llama.cpp's converter permutes this architecture's q/k rows (only its `llama`
    /// architecture, which Mistral is written as).
    pub fn gguf_rope_permuted(self) -> bool {
        matches!(self, Architecture::Llama | Architecture::Mistral)
    }
}
