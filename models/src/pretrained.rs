//! A pretrained model as a directory of HF files: weights, config, tokenizer and the generation
//! defaults that decide when to stop.

use std::path::Path;

use burn::tensor::Device;
use serde::Deserialize;

use burn_llm_kernels::GroupQuantized;

use crate::config::{DecoderSpec, OneOrMany};
use crate::error::{ModelError, Result};
use crate::gguf::{GgufModel, tokenizer_from_gguf};
use crate::model::CausalLm;
use crate::precision::Precision;
use crate::tokenizer::Tokenizer;
use crate::weights::{Checkpoint, TensorSource};

/// Model, tokenizer and stop ids loaded from one directory.
#[derive(Debug)]
pub struct Pretrained {
    /// The network.
    pub model: CausalLm,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Ids that end generation (`generation_config.json`, else `config.json`, else the
    /// tokenizer's EOS).
    pub eos_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct GenerationConfig {
    #[serde(default)]
    eos_token_id: OneOrMany,
}

/// A model's weight files, opened (memory-mapped) but not loaded.
#[allow(clippy::large_enum_variant)] // one per model
pub enum ModelFiles {
    /// HF safetensors, single or sharded.
    Safetensors(Checkpoint),
    /// A GGUF file.
    Gguf(GgufModel),
}

impl TensorSource for ModelFiles {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        match self {
            ModelFiles::Safetensors(c) => c.read_f32(name, expected),
            ModelFiles::Gguf(g) => g.read_f32(name, expected),
        }
    }

    fn quantized(&self, name: &str, shape: [usize; 2], device: &Device) -> Result<Option<GroupQuantized<2>>> {
        match self {
            ModelFiles::Safetensors(c) => c.quantized(name, shape, device),
            ModelFiles::Gguf(g) => g.quantized(name, shape, device),
        }
    }
}

/// Everything of a pretrained model but its weights in memory: the architecture, the opened weight
/// files, the tokenizer and the stop ids. Engines that place weights themselves (offloading) load
/// layers from `files` when they need them.
pub struct PretrainedFiles {
    /// The architecture.
    pub spec: DecoderSpec,
    /// The weights, opened.
    pub files: ModelFiles,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
}

impl PretrainedFiles {
    /// Opens an HF model directory or a GGUF file without loading its weights.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            let gguf = GgufModel::open(path)?;
            let tokenizer = tokenizer_from_gguf(gguf.file())?;
            let spec = gguf.spec().clone();
            let eos_token_ids = stop_ids(&spec, &tokenizer, Vec::new());
            return Ok(Self { spec, files: ModelFiles::Gguf(gguf), tokenizer, eos_token_ids });
        }
        if !path.is_dir() {
            return Err(ModelError::MissingFile { what: "model directory", path: path.to_path_buf() });
        }
        let tokenizer = Tokenizer::from_dir(path)?;
        let spec = DecoderSpec::from_dir(path)?;
        let eos_token_ids = stop_ids(&spec, &tokenizer, generation_eos(path)?);
        Ok(Self { spec, files: ModelFiles::Safetensors(Checkpoint::open(path)?), tokenizer, eos_token_ids })
    }

    /// The model in `precision` once loaded (weights cast from the file's dtype as they load; see
    /// [`crate::precision`]). Engines that load layers themselves read it from `spec.dtype`.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.spec.dtype = precision;
        self
    }

    /// Loads the whole model onto `device`, in `spec.dtype`.
    pub fn load(self, device: &Device) -> Result<Pretrained> {
        let model = CausalLm::from_checkpoint(self.spec, &self.files, device)?;
        Ok(Pretrained { model, tokenizer: self.tokenizer, eos_token_ids: self.eos_token_ids })
    }
}

impl Pretrained {
    /// Loads everything from an HF model directory, or from a GGUF file (quantized blocks kept as
    /// shipped, tokenizer from its metadata), onto `device`.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        PretrainedFiles::open(path)?.load(device)
    }
}

/// Stop ids: the generation config's, else the model config's, else the tokenizer's EOS.
fn stop_ids(spec: &DecoderSpec, tokenizer: &Tokenizer, generation_eos: Vec<u32>) -> Vec<u32> {
    let mut eos_token_ids = generation_eos;
    if eos_token_ids.is_empty() {
        eos_token_ids = spec.eos_token_ids.clone();
    }
    if eos_token_ids.is_empty() {
        eos_token_ids.extend(tokenizer.eos_id());
    }
    eos_token_ids
}

fn generation_eos(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let config: GenerationConfig = serde_json::from_str(&text).map_err(|e| ModelError::config(&path, e.to_string()))?;
    Ok(config.eos_token_id.to_vec())
}
