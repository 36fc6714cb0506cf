//! A pretrained model as a directory of HF files: weights, config, tokenizer and the generation
//! defaults that decide when to stop.

use std::path::Path;

use burn::tensor::Device;
use serde::Deserialize;

use crate::config::OneOrMany;
use crate::error::{ModelError, Result};
use crate::gguf::{tokenizer_from_gguf, GgufModel};
use crate::model::CausalLm;
use crate::tokenizer::Tokenizer;

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

impl Pretrained {
    /// Loads everything from an HF model directory, or from a GGUF file, onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        if dir.is_file() && dir.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Self::load_gguf(dir, device);
        }
        if !dir.is_dir() {
            return Err(ModelError::MissingFile {
                what: "model directory",
                path: dir.to_path_buf(),
            });
        }
        let tokenizer = Tokenizer::from_dir(dir)?;
        let model = CausalLm::load(dir, device)?;
        Ok(Self::assemble(model, tokenizer, generation_eos(dir)?))
    }

    /// Loads a LLaMA-architecture GGUF file (weights dequantized to `f32`, tokenizer from its
    /// metadata) onto `device`.
    pub fn load_gguf(path: &Path, device: &Device) -> Result<Self> {
        let gguf = GgufModel::open(path)?;
        let tokenizer = tokenizer_from_gguf(gguf.file())?;
        let model = CausalLm::from_checkpoint(gguf.spec().clone(), &gguf, device)?;
        Ok(Self::assemble(model, tokenizer, Vec::new()))
    }

    /// Stop ids: the generation config's, else the model config's, else the tokenizer's EOS.
    fn assemble(model: CausalLm, tokenizer: Tokenizer, generation_eos: Vec<u32>) -> Self {
        let mut eos_token_ids = generation_eos;
        if eos_token_ids.is_empty() {
            eos_token_ids = model.spec().eos_token_ids.clone();
        }
        if eos_token_ids.is_empty() {
            eos_token_ids.extend(tokenizer.eos_id());
        }
        Self {
            model,
            tokenizer,
            eos_token_ids,
        }
    }
}

fn generation_eos(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let config: GenerationConfig =
        serde_json::from_str(&text).map_err(|e| ModelError::config(&path, e.to_string()))?;
    Ok(config.eos_token_id.to_vec())
}
