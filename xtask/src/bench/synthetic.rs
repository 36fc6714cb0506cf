//! Built-in model shapes for dummy-weight runs (FlexGen's "dummy weights"): HF `config.json` text,
//! written into reports so `scripts/hf_generate_bench.py` builds HF's model of the same shape.

use burn_llm::models::{DecoderSpec, Precision};

/// `(name, config.json)` of every built-in shape.
pub const SYNTHETIC: [(&str, &str); 8] = [
    (
        "synthetic:opt-125m",
        r#"{"model_type":"opt","vocab_size":50272,"hidden_size":768,"num_hidden_layers":12,"ffn_dim":3072,
            "num_attention_heads":12,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":768,"eos_token_id":2}"#,
    ),
    (
        "synthetic:gpt2",
        r#"{"model_type":"gpt2","vocab_size":50257,"n_embd":768,"n_layer":12,"n_head":12,"n_positions":1024,
            "eos_token_id":50256}"#,
    ),
    (
        "synthetic:smollm2-135m",
        r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
            "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"max_position_embeddings":8192,
            "rms_norm_eps":1e-5,"rope_theta":100000.0,"tie_word_embeddings":true,"eos_token_id":2}"#,
    ),
    (
        "synthetic:opt-1.3b",
        r#"{"model_type":"opt","vocab_size":50272,"hidden_size":2048,"num_hidden_layers":24,"ffn_dim":8192,
            "num_attention_heads":32,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":2048,"eos_token_id":2}"#,
    ),
    (
        "synthetic:opt-6.7b",
        r#"{"model_type":"opt","vocab_size":50272,"hidden_size":4096,"num_hidden_layers":32,"ffn_dim":16384,
            "num_attention_heads":32,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":4096,"eos_token_id":2}"#,
    ),
    (
        // FlexGen's headline setting: OPT-30B on a 16 GB GPU.
        "synthetic:opt-30b",
        r#"{"model_type":"opt","vocab_size":50272,"hidden_size":7168,"num_hidden_layers":48,"ffn_dim":28672,
            "num_attention_heads":56,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":7168,"eos_token_id":2}"#,
    ),
    (
        "synthetic:llama-7b",
        r#"{"model_type":"llama","vocab_size":32000,"hidden_size":4096,"intermediate_size":11008,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"max_position_embeddings":2048,
            "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":false,"eos_token_id":2}"#,
    ),
    (
        // Sized for a 2-core CPU: about 340 MB of `f32` layers, so small device budgets make it
        // "not fit" (`bench offload`'s default).
        "synthetic:offload-opt",
        r#"{"model_type":"opt","vocab_size":8192,"hidden_size":768,"num_hidden_layers":12,"ffn_dim":3072,
            "num_attention_heads":12,"max_position_embeddings":2048,"do_layer_norm_before":true,
            "word_embed_proj_dim":768,"eos_token_id":2}"#,
    ),
];

/// The `config.json` text of built-in shape `name`, if it is one.
pub fn config(name: &str) -> Option<&'static str> {
    SYNTHETIC.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// The names of every built-in shape, for help and error texts.
pub fn names() -> String {
    SYNTHETIC.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// The decoder of built-in shape `name` in `precision`.
pub fn spec(name: &str, precision: Precision) -> Result<DecoderSpec, Box<dyn std::error::Error>> {
    let config = config(name).ok_or_else(|| format!("`{name}` is not a built-in shape; give one of {}", names()))?;
    let mut spec = DecoderSpec::from_json(config, name.as_ref())?;
    spec.dtype = precision;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_parses_and_unknown_names_list_them() {
        for (name, _) in SYNTHETIC {
            let spec = spec(name, Precision::F16).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(spec.dtype, Precision::F16, "{name}");
        }
        let opt30 = spec("synthetic:opt-30b", Precision::F32).unwrap();
        assert_eq!((opt30.num_layers, opt30.hidden_size, opt30.vocab_size), (48, 7168, 50272));
        let err = spec("synthetic:opt-31b", Precision::F32).unwrap_err().to_string();
        assert!(err.contains("synthetic:opt-31b") && err.contains("synthetic:opt-30b"), "{err}");
    }
}
