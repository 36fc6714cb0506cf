//! Shared helpers: fixture paths, reference outputs, devices under test.

use std::path::PathBuf;

use burn::tensor::Device;

/// The fixtures, with what each exercises.
pub const FIXTURES: [&str; 5] = ["opt", "opt-postln-proj", "llama", "llama-tied-sharded", "gpt2"];

/// A fixture's directory: under `$BURN_LLM_FIXTURES` when set (the GPU bundle runs this binary
/// away from the source tree), else under the source tree's `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    std::env::var_os("BURN_LLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
        .join(name)
}

/// Devices to run numeric tests on: Flex and wgpu by default, or those `BURN_LLM_TEST_DEVICE`
/// names (`vulkan` for the GPU suite; see `burn_llm::kernels::test_devices`).
pub fn devices() -> Vec<(&'static str, Device)> {
    burn_llm::kernels::test_devices::devices_under_test().unwrap_or_else(|e| panic!("{e}"))
}

pub struct ReferencePrompt {
    pub text: String,
    pub input_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    /// `[len, vocab]` row-major.
    pub logits: Vec<f32>,
}

pub struct Reference {
    pub vocab_size: usize,
    pub prompts: Vec<ReferencePrompt>,
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().expect("id list").iter().map(|v| v.as_u64().expect("id") as u32).collect()
}

pub fn reference(name: &str) -> Reference {
    let (json, prompts) = reference_files(name, "reference", |p, logits| ReferencePrompt {
        text: p["text"].as_str().unwrap().to_string(),
        input_ids: ids(&p["input_ids"]),
        greedy_ids: ids(&p["greedy_ids"]),
        greedy_text: p["greedy_text"].as_str().unwrap().to_string(),
        logits,
    });
    Reference { vocab_size: json["vocab_size"].as_u64().unwrap() as usize, prompts }
}

/// `{stem}.json` of fixture `name` and its prompts, each built by `prompt` from its JSON entry
/// and its `logits.{i}` (f32, `[len, vocab]` row-major) of `{stem}.safetensors`.
pub fn reference_files<P>(
    name: &str,
    stem: &str,
    prompt: impl Fn(&serde_json::Value, Vec<f32>) -> P,
) -> (serde_json::Value, Vec<P>) {
    let dir = fixture(name);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{stem}.json"))).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join(format!("{stem}.safetensors"))).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let prompts = json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let view = tensors.tensor(&format!("logits.{i}")).unwrap();
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            prompt(p, view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        })
        .collect();
    (json, prompts)
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A directory under the system temp dir, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies a fixture into a fresh scratch directory the test may damage.
pub fn scratch_copy(name: &str) -> Scratch {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "burn-llm-test-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    Scratch(dir)
}
