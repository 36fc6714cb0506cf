//! Finding a model: a local directory, or a Hugging Face hub id fetched into the standard HF
//! cache (`~/.cache/huggingface/hub`, `HF_HOME`), with a progress bar. Already-cached models load
//! without the network.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// Files of an HF model repository that burn-llm reads.
#[cfg(feature = "hub")]
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
#[cfg(feature = "hub")]
const OPTIONAL: [&str; 2] = ["tokenizer_config.json", "generation_config.json"];

/// Resolves `model` (a directory, a `.gguf` file, or a hub id such as `facebook/opt-125m`) to a
/// local path.
pub fn resolve_model(model: &str) -> Result<PathBuf> {
    let path = Path::new(model);
    let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if path.is_dir() || (is_gguf && path.is_file()) {
        return Ok(path.to_path_buf());
    }
    if path.exists() {
        return Err(ModelError::MissingFile {
            what: "model directory (config.json, *.safetensors, tokenizer.json) or .gguf file; this is another kind of file",
            path: path.to_path_buf(),
        });
    }
    if !looks_like_hub_id(model) {
        return Err(ModelError::MissingFile { what: "model directory", path: path.to_path_buf() });
    }
    fetch(model)
}

/// `owner/name` with no path-like parts.
fn looks_like_hub_id(model: &str) -> bool {
    let mut parts = model.split('/');
    matches!((parts.next(), parts.next(), parts.next()), (Some(a), Some(b), None)
        if !a.is_empty() && !b.is_empty() && !a.starts_with('.') && !model.contains('\\'))
}

#[cfg(feature = "hub")]
fn fetch(id: &str) -> Result<PathBuf> {
    use hf_hub::api::sync::ApiBuilder;

    let hub_err = |e: &dyn std::fmt::Display| ModelError::Hub { id: id.to_string(), message: e.to_string() };
    if let Some(dir) = cached(id) {
        return Ok(dir);
    }
    let api = ApiBuilder::from_env().with_progress(true).build().map_err(|e| hub_err(&e))?;
    let repo = api.model(id.to_string());
    let config = repo.get(REQUIRED[0]).map_err(|e| hub_err(&e))?;
    repo.get(REQUIRED[1]).map_err(|e| hub_err(&e))?;
    for file in OPTIONAL {
        // Optional files: absent from many repositories.
        let _ = repo.get(file);
    }
    match repo.get(crate::weights::INDEX_FILE) {
        Ok(index) => {
            for shard in crate::weights::index_shards(&index)? {
                repo.get(&shard).map_err(|e| hub_err(&e))?;
            }
        }
        Err(_) => {
            repo.get("model.safetensors").map_err(|e| hub_err(&e))?;
        }
    }
    config.parent().map(Path::to_path_buf).ok_or_else(|| hub_err(&"the cache returned a file without a directory"))
}

/// The snapshot directory of `id` when everything it needs is already in the HF cache.
#[cfg(feature = "hub")]
fn cached(id: &str) -> Option<PathBuf> {
    let repo = hf_hub::Cache::from_env().model(id.to_string());
    let config = repo.get(REQUIRED[0])?;
    repo.get(REQUIRED[1])?;
    match repo.get(crate::weights::INDEX_FILE) {
        Some(index) => {
            for shard in crate::weights::index_shards(&index).ok()? {
                repo.get(&shard)?;
            }
        }
        None => {
            repo.get("model.safetensors")?;
        }
    }
    config.parent().map(Path::to_path_buf)
}

#[cfg(not(feature = "hub"))]
fn fetch(id: &str) -> Result<PathBuf> {
    Err(ModelError::Hub {
        id: id.to_string(),
        message: "this build has no hub support (enable the `hub` feature)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_recognized() {
        assert!(looks_like_hub_id("facebook/opt-125m"));
        assert!(!looks_like_hub_id("./models/opt"));
        assert!(!looks_like_hub_id("/abs/path/x"));
        assert!(!looks_like_hub_id("opt-125m"));
    }

    #[test]
    fn missing_local_directory_is_an_error() {
        let err = resolve_model("./definitely/not/here").unwrap_err();
        assert!(err.to_string().contains("not found"), "{err}");
    }
}
