//! GGUF: a tiny LLaMA converted the way llama.cpp converts (q/k rows permuted, dims reversed)
//! reproduces HF's logits; corrupted and truncated files are errors, never panics.

use burn::tensor::Device;
use burn_llm::models::gguf::{GgufHeader, dequantize, permute_rope_rows};
use burn_llm::models::weights::TensorSource;
use burn_llm::models::{Checkpoint, ContiguousKvCache, DecoderSpec, ModelError, Pretrained};
use rand::{Rng, SeedableRng};

use crate::common::{fixture, max_abs_diff, reference};
use crate::gguf_writer::{Meta, Writer};

/// The `llama-tied-sharded` fixture as llama.cpp would convert it (f32 tensors, plus its
/// tokenizer as `tokenizer.ggml.*` metadata).
fn convert_fixture() -> Vec<u8> {
    let dir = fixture("llama-tied-sharded");
    let spec = DecoderSpec::from_dir(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let (h, ffn, heads, kv) = (spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads);
    let kv_dim = kv * spec.head_dim;
    let mut w = Writer::default();
    w.meta("general.architecture", Meta::Str("llama".into()));
    for (key, v) in [
        ("llama.block_count", spec.num_layers),
        ("llama.context_length", spec.max_positions),
        ("llama.embedding_length", h),
        ("llama.feed_forward_length", ffn),
        ("llama.attention.head_count", heads),
        ("llama.attention.head_count_kv", kv),
        ("llama.rope.dimension_count", spec.head_dim),
    ] {
        w.meta(key, Meta::U32(v as u32));
    }
    w.meta("llama.rope.freq_base", Meta::F32(10_000.0));
    w.meta("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5));
    w.meta("llama.rope.scaling.type", Meta::Str("linear".into()));
    w.meta("llama.rope.scaling.factor", Meta::F32(2.0));

    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    let merges: Vec<String> = tokenizer["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::Array(pair) => format!("{} {}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap()),
            other => other.as_str().unwrap().to_string(),
        })
        .collect();
    let types = (0..tokens.len()).map(|i| if i < 3 { 3 } else { 1 }).collect();
    w.meta("tokenizer.ggml.model", Meta::Str("gpt2".into()));
    w.meta("tokenizer.ggml.pre", Meta::Str("default".into()));
    w.meta("tokenizer.ggml.tokens", Meta::Strs(tokens));
    w.meta("tokenizer.ggml.merges", Meta::Strs(merges));
    w.meta("tokenizer.ggml.token_type", Meta::I32s(types));
    w.meta("tokenizer.ggml.bos_token_id", Meta::U32(1));
    w.meta("tokenizer.ggml.eos_token_id", Meta::U32(2));
    w.meta("tokenizer.ggml.add_bos_token", Meta::Bool(true));

    let put = |w: &mut Writer, gguf: &str, hf: &str, shape: Vec<usize>, rope_heads: Option<usize>| {
        let values = ckpt.read_f32(hf, &shape).unwrap();
        let values = match rope_heads {
            Some(n) => permute_rope_rows(&values, n, shape[0], shape[1]),
            None => values,
        };
        w.f32_tensor(gguf, shape, &values);
    };
    put(&mut w, "token_embd.weight", "model.embed_tokens.weight", vec![spec.vocab_size, h], None);
    put(&mut w, "output_norm.weight", "model.norm.weight", vec![h], None);
    for i in 0..spec.num_layers {
        let hf = |s: &str| format!("model.layers.{i}.{s}.weight");
        let g = |s: &str| format!("blk.{i}.{s}.weight");
        put(&mut w, &g("attn_norm"), &hf("input_layernorm"), vec![h], None);
        put(&mut w, &g("attn_q"), &hf("self_attn.q_proj"), vec![heads * spec.head_dim, h], Some(heads));
        put(&mut w, &g("attn_k"), &hf("self_attn.k_proj"), vec![kv_dim, h], Some(kv));
        put(&mut w, &g("attn_v"), &hf("self_attn.v_proj"), vec![kv_dim, h], None);
        put(&mut w, &g("attn_output"), &hf("self_attn.o_proj"), vec![h, heads * spec.head_dim], None);
        put(&mut w, &g("ffn_norm"), &hf("post_attention_layernorm"), vec![h], None);
        put(&mut w, &g("ffn_gate"), &hf("mlp.gate_proj"), vec![ffn, h], None);
        put(&mut w, &g("ffn_up"), &hf("mlp.up_proj"), vec![ffn, h], None);
        put(&mut w, &g("ffn_down"), &hf("mlp.down_proj"), vec![h, ffn], None);
    }
    // Quantized tensors the model does not use, so the corruption cases also reach block data.
    let q41: Vec<u8> = (0..4 * 20).map(|i| (i * 37 % 251) as u8).collect();
    w.tensors.push(("extra.q4_1".into(), vec![2, 64], 3, q41));
    let q80: Vec<u8> = (0..2 * 34).map(|i| (i * 11 % 253) as u8).collect();
    w.tensors.push(("extra.q8_0".into(), vec![64], 8, q80));
    // One row of every other quantized type, blocks from the `gguf` package's test vectors.
    for (name, id) in QUANT_TYPES {
        let blocks = std::fs::read(fixture("gguf-quants").join(format!("{name}.blocks"))).unwrap();
        let row = blocks[..blocks.len() / 3].to_vec();
        w.tensors.push((format!("extra.{}", name.to_lowercase()), vec![512], id, row));
    }
    w.bytes()
}

/// GGML names and ids of the quantized types with test vectors in `tests/fixtures/gguf-quants`
/// besides `Q4_1` and `Q8_0` (which the fixture writes itself).
const QUANT_TYPES: [(&str, u32); 8] =
    [("Q4_0", 2), ("Q5_0", 6), ("Q5_1", 7), ("Q2_K", 10), ("Q3_K", 11), ("Q4_K", 12), ("Q5_K", 13), ("Q6_K", 14)];

fn write_temp(bytes: &[u8], name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("burn-llm-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn converted_llama_matches_hf() {
    let path = write_temp(&convert_fixture(), "tiny-llama");
    let device = Device::flex();
    let pretrained = Pretrained::load(&path, &device).unwrap();
    let reference = reference("llama-tied-sharded");
    for (i, prompt) in reference.prompts.iter().enumerate() {
        assert_eq!(pretrained.tokenizer.encode(&prompt.text).unwrap(), prompt.input_ids, "prompt {i} ids");
        let ids = &prompt.input_ids;
        let mut cache = ContiguousKvCache::new(pretrained.model.kv_layout(), 1, ids.len(), &device);
        let step = cache.begin_step(&[ids]).unwrap();
        let logits = pretrained.model.forward_all_logits(&step, &mut cache).unwrap();
        let diff = max_abs_diff(&logits.into_data().try_into_vec_as::<f32>().unwrap(), &prompt.logits);
        assert!(diff <= 1e-4, "prompt {i}: max |Δlogit| = {diff}");
    }
    assert_eq!(pretrained.eos_token_ids, vec![2]);
    std::fs::remove_file(path).ok();
}

/// 10 000 corrupted variants (byte flips anywhere, header-biased flips, truncations): each parses
/// to an error or to a header whose tensors all lie inside the file and decode; none panics.
#[test]
fn corrupted_files_never_panic() {
    fuzz(&convert_fixture(), 10_000);
}

/// `cases` corrupted variants of the GGUF file `original` (byte flips anywhere, header-biased
/// flips, truncations, huge 64-bit fields): each parses to an error or to a header whose tensors
/// all lie inside the file and decode; none panics.
pub fn fuzz(original: &[u8], cases: usize) {
    let header_len = 4096.min(original.len());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let (mut errors, mut parsed) = (0, 0);
    for case in 0..cases {
        let mut bytes = original.to_vec();
        match case % 4 {
            0 => bytes.truncate(rng.random_range(0..original.len())),
            1 => {
                for _ in 0..rng.random_range(1..8) {
                    let at = rng.random_range(0..header_len);
                    bytes[at] = rng.random();
                }
            }
            2 => {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
            _ => {
                // Overwrite a 64-bit little-endian field near the front with a huge value.
                let at = rng.random_range(0..header_len.saturating_sub(8));
                bytes[at..at + 8].copy_from_slice(&u64::MAX.wrapping_sub(rng.random_range(0..1000)).to_le_bytes());
            }
        }
        match GgufHeader::parse(&bytes) {
            Err(_) => errors += 1,
            Ok(header) => {
                parsed += 1;
                for t in &header.tensors {
                    let data = &bytes[t.range.clone()];
                    if let Some(values) = dequantize(t.kind, data) {
                        assert_eq!(values.len() as u64, t.elements(), "{}", t.name);
                    }
                }
            }
        }
    }
    assert!(errors > cases / 5 && parsed > 0, "errors {errors}, parsed {parsed}");
}

#[test]
fn corrupt_gguf_files_are_errors() {
    let bytes = convert_fixture();
    let path = write_temp(&bytes[..bytes.len() / 3], "truncated");
    let err = Pretrained::load(&path, &Device::flex()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptGguf { .. }), "{err}");
    assert!(err.to_string().contains("truncated") || err.to_string().contains("end of the file"), "{err}");
    let mut wrong = bytes.clone();
    wrong[4] = 7;
    std::fs::write(&path, &wrong).unwrap();
    let err = Pretrained::load(&path, &Device::flex()).unwrap_err();
    assert!(err.to_string().contains("version 7"), "{err}");
    std::fs::remove_file(path).ok();
}

/// A K-quant tensor whose rows are not whole super-blocks, or whose data is cut short, is a
/// clear error naming the tensor and the type; a weight of a type burn-llm does not read names
/// the type (not its id) and lists the supported ones.
#[test]
fn bad_quantized_tensors_are_named_errors() {
    let blocks = std::fs::read(fixture("gguf-quants").join("Q4_K.blocks")).unwrap();
    let header = |shape: Vec<usize>, kind: u32, data: Vec<u8>| {
        let mut w = Writer::default();
        w.meta("general.architecture", Meta::Str("llama".into()));
        w.tensors.push(("blk.0.ffn_down.weight".into(), shape, kind, data));
        GgufHeader::parse(&w.bytes())
    };
    let err = header(vec![2, 128], 12, blocks[..144].to_vec()).unwrap_err();
    assert!(err.contains("blk.0.ffn_down.weight") && err.contains("Q4_K blocks of 256"), "{err}");
    let err = header(vec![2, 256], 12, blocks[..144].to_vec()).unwrap_err();
    assert!(err.contains("blk.0.ffn_down.weight") && err.contains("past the end"), "{err}");
    assert!(header(vec![2, 256], 12, blocks[..288].to_vec()).is_ok());

    // IQ4_XS (id 23) in place of a weight the model needs.
    let mut bytes = convert_fixture();
    let mut w = Writer::default();
    w.meta("general.architecture", Meta::Str("llama".into()));
    w.tensors.push(("t".into(), vec![256], 23, vec![0; 136]));
    let parsed = GgufHeader::parse(&w.bytes()).unwrap();
    assert_eq!(parsed.tensors[0].kind.to_string(), "IQ4_XS");
    let at = find_type_field(&bytes, "blk.0.ffn_up.weight");
    bytes[at..at + 4].copy_from_slice(&23u32.to_le_bytes());
    let path = write_temp(&bytes, "iq4-xs");
    let Err(err) = Pretrained::load(&path, &Device::flex()) else { panic!("an IQ4_XS weight is refused") };
    let err = err.to_string();
    std::fs::remove_file(path).ok();
    assert!(err.contains("blk.0.ffn_up.weight") && err.contains("IQ4_XS"), "{err}");
    assert!(err.contains("Q4_K") && err.contains("Q6_K") && err.contains("Q5_0"), "{err}");
}

/// The offset of tensor `name`'s type id in a GGUF file's tensor infos (after its name, its
/// dimension count and its dimensions).
fn find_type_field(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key.as_slice()).unwrap() + key.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * dims
}
