//! Seeded random weights, a [`TensorSource`] like any checkpoint: FlexGen's "dummy weights" for
//! benchmarks that only need the shape of a model. The model loader asks for every tensor by
//! name and shape and builds the model exactly as from a file.
//!
//! Values are a hash of (seed, name, index), not a sequential stream, so a tensor is filled in
//! parallel chunks and comes out the same on any thread count: an OPT-30B-shaped model's 30
//! billion values take seconds on a many-core host instead of minutes.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use rayon::prelude::*;

use crate::error::Result;
use crate::weights::TensorSource;

/// Values per parallel task: large enough that scheduling costs nothing, small enough to spread
/// one layer's matrices over every core.
const CHUNK: usize = 1 << 16;

/// Seeded random weights by tensor name: norms get weight 1 and bias 0, other tensors uniform
/// values of ±`scale`, so activations stay in range across many layers. The values of a tensor
/// depend only on the seed and its name, so the same model comes out every time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomWeights {
    /// Seed mixed into every tensor's stream.
    pub seed: u64,
    /// Half-width of the uniform distribution.
    pub scale: f32,
}

impl Default for RandomWeights {
    /// Seed 0, values in ±0.02 (HF's `initializer_range` for OPT, LLaMA and GPT-2).
    fn default() -> Self {
        Self { seed: 0, scale: 0.02 }
    }
}

/// Whether `name` is a norm's parameter in any supported architecture (OPT `*layer_norm`, LLaMA
/// `*layernorm` / `model.norm`, GPT-2 `ln_*`).
fn is_norm(name: &str) -> bool {
    name.contains("norm") || name.contains("ln_")
}

/// SplitMix64's finalizer: a bijective mix of all 64 bits, so consecutive counters give
/// independent-looking outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl TensorSource for RandomWeights {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let n: usize = expected.iter().product();
        if is_norm(name) {
            let value = if name.ends_with("bias") { 0.0 } else { 1.0 };
            return Ok(vec![value; n]);
        }
        let mut hasher = DefaultHasher::new();
        (self.seed, name).hash(&mut hasher);
        let key = hasher.finish();
        let scale = self.scale;
        let mut values = vec![0f32; n];
        values.par_chunks_mut(CHUNK).enumerate().for_each(|(chunk, out)| {
            let start = (chunk * CHUNK) as u64;
            for (i, v) in out.iter_mut().enumerate() {
                let bits = mix(key.wrapping_add((start + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))) >> 40;
                *v = (bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            }
        });
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::{Device, Int, Tensor};

    use super::*;
    use crate::config::DecoderSpec;
    use crate::model::CausalLm;

    #[test]
    fn random_values_are_seeded_per_name_and_bounded() {
        let w = RandomWeights::default();
        let a = w.read_f32("model.layers.0.mlp.up_proj.weight", &[4, 8]).unwrap();
        assert_eq!(a.len(), 32);
        assert_eq!(a, w.read_f32("model.layers.0.mlp.up_proj.weight", &[4, 8]).unwrap());
        assert_ne!(a, w.read_f32("model.layers.1.mlp.up_proj.weight", &[4, 8]).unwrap());
        let other_seed = RandomWeights { seed: 1, ..w };
        assert_ne!(a, other_seed.read_f32("model.layers.0.mlp.up_proj.weight", &[4, 8]).unwrap());
        assert!(a.iter().all(|v| v.abs() <= w.scale));
        assert!(a.iter().any(|v| *v != a[0]));
        // Across parallel chunks: no repeats at the chunk boundary, values spread over the range.
        let big = w.read_f32("model.layers.0.mlp.up_proj.weight", &[3, CHUNK]).unwrap();
        assert_ne!(big[..16], big[CHUNK..CHUNK + 16]);
        let mean = big.iter().sum::<f32>() / big.len() as f32;
        assert!(mean.abs() < w.scale * 0.01, "mean {mean}");
        assert!(big.iter().any(|v| *v > w.scale * 0.99) && big.iter().any(|v| *v < -w.scale * 0.99));
        assert_eq!(w.read_f32("model.norm.weight", &[3]).unwrap(), vec![1.0; 3]);
        assert_eq!(w.read_f32("transformer.h.0.ln_1.bias", &[3]).unwrap(), vec![0.0; 3]);
    }

    /// Every parameter's shape, in visiting order.
    #[derive(Default)]
    struct Shapes(Vec<Vec<usize>>);

    impl ModuleVisitor for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().dims().to_vec());
        }

        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
            self.0.push(param.val().dims().to_vec());
        }
    }

    fn shapes(model: &CausalLm) -> Vec<Vec<usize>> {
        let mut shapes = Shapes::default();
        model.visit(&mut shapes);
        shapes.0
    }

    /// A random model is the checkpoint's model with other values: same modules, same shapes,
    /// for every architecture (OPT with and without projections, LLaMA tied and untied, GPT-2's
    /// fused attention).
    #[test]
    fn random_model_has_the_checkpoint_structure() {
        let device = Device::flex();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        for name in ["opt", "opt-postln-proj", "llama", "llama-tied-sharded", "gpt2"] {
            let dir = fixtures.join(name);
            let loaded = CausalLm::load(&dir, &device).unwrap();
            let random = CausalLm::random(DecoderSpec::from_dir(&dir).unwrap(), &device).unwrap();
            assert_eq!(shapes(&random), shapes(&loaded), "{name}");
            assert_eq!(random.layers.len(), loaded.spec.num_layers, "{name}");
        }
    }
}
