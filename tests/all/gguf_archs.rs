//! Bad GGUF files of the newer architectures: corrupted bytes never panic, and metadata that
//! contradicts the tensors (head counts, widths, layer patterns) or tensors that are missing
//! (norms) are clear errors naming the problem.

use burn::tensor::Device;
use burn_llm::models::gguf::GgufValue;
use burn_llm::models::{ModelError, Pretrained};

use crate::archs::ARCH_FIXTURES;
use crate::common::fixture;
use crate::gguf::fuzz;
use crate::gguf_writer::{Meta, Writer};

fn gguf_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name).join("model.gguf")).unwrap()
}

/// Loads `bytes` as a GGUF file; the error it gives.
fn load_error(bytes: &[u8], tag: &str) -> ModelError {
    let path = std::env::temp_dir().join(format!("burn-llm-{}-arch-{tag}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let result = Pretrained::load(&path, &Device::flex());
    std::fs::remove_file(&path).ok();
    match result {
        Ok(_) => panic!("{tag}: the contradictory file loaded"),
        Err(e) => e,
    }
}

/// 2 500 corrupted variants of each architecture's file parse to errors or to headers whose
/// tensors lie inside the file and decode.
#[test]
fn corrupted_arch_files_never_panic() {
    for name in ARCH_FIXTURES.iter().copied().chain(["llama3"]) {
        let bytes = match name {
            "llama3" => std::fs::read(fixture("llama").join("llama3.gguf")).unwrap(),
            _ => gguf_bytes(name),
        };
        fuzz(&bytes, 2_500);
    }
}

/// Metadata that contradicts the tensors, and missing tensors, are errors that name them.
#[test]
fn contradicting_metadata_is_a_clear_error() {
    let u = |v: u64| Meta::Value(GgufValue::U64(v));
    type Edit = Box<dyn Fn(&mut Writer)>;
    let cases: Vec<(&str, &str, Edit, &str)> = vec![
        ("gemma3", "more heads", Box::new(move |w: &mut Writer| w.set("gemma3.attention.head_count", u(8))), "attn_q"),
        (
            "gemma3",
            "kv heads not dividing",
            Box::new(move |w: &mut Writer| w.set("gemma3.attention.head_count_kv", u(3))),
            "multiple",
        ),
        ("gemma3", "head width", Box::new(move |w: &mut Writer| w.set("gemma3.attention.key_length", u(16))), "attn_q"),
        (
            "gemma3",
            "no QK-norm",
            Box::new(|w: &mut Writer| w.drop_tensor("blk.1.attn_k_norm.weight")),
            "blk.1.attn_k_norm",
        ),
        (
            "gemma3",
            "no post-MLP norm",
            Box::new(|w: &mut Writer| w.drop_tensor("blk.2.post_ffw_norm.weight")),
            "blk.2.post_ffw_norm",
        ),
        (
            "gemma3",
            "layer pattern too short",
            Box::new(|w: &mut Writer| {
                let flags = GgufValue::Array(vec![GgufValue::Bool(true); 2]);
                w.set("gemma3.attention.sliding_window_pattern", Meta::Value(flags))
            }),
            "layer_types",
        ),
        (
            "gemma3",
            "zero window",
            Box::new(move |w: &mut Writer| w.set("gemma3.attention.sliding_window", u(0))),
            "sliding_window",
        ),
        ("qwen2", "no q bias", Box::new(|w: &mut Writer| w.drop_tensor("blk.0.attn_q.bias")), "blk.0.attn_q.bias"),
        (
            "qwen3",
            "no heads",
            Box::new(move |w: &mut Writer| w.set("qwen3.attention.head_count", u(0))),
            "num_attention_heads",
        ),
        ("qwen3", "no final norm", Box::new(|w: &mut Writer| w.drop_tensor("output_norm.weight")), "output_norm"),
        ("phi3", "wider MLP", Box::new(move |w: &mut Writer| w.set("phi3.feed_forward_length", u(256))), "ffn_up"),
        ("mistral", "fewer layers named", Box::new(move |w: &mut Writer| w.set("llama.block_count", u(3))), "blk.2."),
        (
            "mistral",
            "unknown architecture",
            Box::new(|w: &mut Writer| w.set("general.architecture", Meta::Str("mamba".into()))),
            "mamba",
        ),
    ];
    for (name, what, edit, expected) in cases {
        let mut writer = Writer::from_file(&gguf_bytes(name));
        edit(&mut writer);
        let err = load_error(&writer.bytes(), &format!("{name}-{}", what.replace(' ', "-")));
        assert!(err.to_string().contains(expected), "{name}, {what}: `{err}` does not mention `{expected}`");
    }
}

/// A `rope_freqs.weight` of the wrong length, or with a zero factor, is refused.
#[test]
fn bad_rope_freqs_are_errors() {
    let bytes = std::fs::read(fixture("llama").join("llama3.gguf")).unwrap();
    let mut short = Writer::from_file(&bytes);
    let at = short.tensors.iter().position(|t| t.0 == "rope_freqs.weight").unwrap();
    short.tensors[at].1 = vec![4];
    short.tensors[at].3.truncate(16);
    let err = load_error(&short.bytes(), "rope-freqs-short");
    assert!(err.to_string().contains("rope_freqs.weight"), "{err}");
    let mut zero = Writer::from_file(&bytes);
    zero.tensors[at].3[..4].copy_from_slice(&0f32.to_le_bytes());
    let err = load_error(&zero.bytes(), "rope-freqs-zero");
    assert!(err.to_string().contains("not a positive factor"), "{err}");
}
