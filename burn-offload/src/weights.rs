//! Where layer weights come from: the model's checkpoint, the disk tier (`--offload-dir`), or
//! seeded dummy weights for benchmarks (FlexGen's "dummy weights").
//!
//! Every source is a [`TensorSource`], so one loader (`CausalLm::load_layer`) builds a layer from
//! any of them whatever the architecture.

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use burn_llm_models::weights::TensorSource;
use burn_llm_models::{ModelError, Result};

use crate::store::{DiskStore, HostData};

/// Seeded random weights by tensor name: norms get weight 1 and bias 0, other tensors uniform
/// values of ±`scale`, so activations stay in range across many layers.
#[derive(Debug, Clone, Copy)]
pub struct DummyWeights {
    /// Seed mixed into every tensor's stream.
    pub seed: u64,
    /// Half-width of the uniform distribution.
    pub scale: f32,
}

impl Default for DummyWeights {
    fn default() -> Self {
        Self { seed: 0, scale: 0.02 }
    }
}

fn is_norm(name: &str) -> bool {
    name.contains("norm") || name.contains("ln_")
}

impl TensorSource for DummyWeights {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let n: usize = expected.iter().product();
        if is_norm(name) {
            let value = if name.ends_with("bias") { 0.0 } else { 1.0 };
            return Ok(vec![value; n]);
        }
        let mut hasher = DefaultHasher::new();
        (self.seed, name).hash(&mut hasher);
        let mut state = hasher.finish() | 1;
        Ok((0..n)
            .map(|_| {
                // xorshift64*: cheap, deterministic, good enough for dummy weights.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                (bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * self.scale
            })
            .collect())
    }
}

/// `(name, shape, values)` of a tensor read through a [`Recording`].
pub type RecordedTensor = (String, Vec<usize>, Vec<f32>);

/// Reads through to `inner` and keeps a copy of every tensor read, so that a layer loaded once can
/// be written to the disk tier under the same names.
pub struct Recording<'a, S: TensorSource> {
    inner: &'a S,
    /// Every tensor read, in order.
    pub read: RefCell<Vec<RecordedTensor>>,
}

impl<'a, S: TensorSource> Recording<'a, S> {
    /// Wraps `inner`.
    pub fn new(inner: &'a S) -> Self {
        Self { inner, read: RefCell::new(Vec::new()) }
    }
}

impl<S: TensorSource> TensorSource for Recording<'_, S> {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let values = self.inner.read_f32(name, expected)?;
        self.read.borrow_mut().push((name.to_string(), expected.to_vec(), values.clone()));
        Ok(values)
    }
}

/// The disk tier as a tensor source: tensors written under `prefix` + their HF name, memory-mapped
/// and checksum-verified on every read.
pub struct DiskWeights<'a> {
    /// The store.
    pub store: &'a DiskStore,
    /// Name prefix of one layer (`layer7/`).
    pub prefix: String,
}

impl TensorSource for DiskWeights<'_> {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let key = format!("{}{name}", self.prefix);
        let tensor = self
            .store
            .get(&key)
            .map_err(|e| ModelError::CorruptWeights { path: self.store.dir().join(&key), message: e.to_string() })?;
        if tensor.shape() != expected {
            return Err(ModelError::ShapeMismatch { name: key, expected: expected.to_vec(), found: tensor.shape().to_vec() });
        }
        let values = tensor
            .as_f32()
            .ok_or_else(|| ModelError::CorruptWeights { path: self.store.dir().join(&key), message: "not an f32 tensor".into() })?;
        Ok(values.to_vec())
    }
}

/// Writes what `recording` read to `store` under `prefix`.
pub fn write_recorded<S: TensorSource>(recording: Recording<'_, S>, store: &mut DiskStore, prefix: &str) -> crate::error::Result<u64> {
    let mut bytes = 0u64;
    for (name, shape, values) in recording.read.into_inner() {
        bytes += (values.len() * 4) as u64;
        store.put(&format!("{prefix}{name}"), HostData::f32(&shape, &values))?;
    }
    Ok(bytes)
}
