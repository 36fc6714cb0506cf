//! The llama.cpp side of `bench cpu` and `eval ppl --against llama.cpp`: llama-cpp-python in a
//! cached virtual environment (built there when missing) running `llama_cpp.py`, one process per
//! loaded model, spoken to in JSON lines.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::Deserialize;

/// The `llama-cpp-python` release the bench builds.
pub const LLAMA_CPP_PYTHON: &str = "0.3.36";
/// CMake flags for that build.
pub const LLAMA_CMAKE_ARGS: &str = "-DGGML_NATIVE=ON";
/// The driver the venv's Python runs.
const DRIVER: &str = include_str!("llama_cpp.py");

/// What the driver answers: timings as burn-llm's `Timing`, and the greedy ids.
#[derive(Deserialize)]
pub struct Reply {
    pub prefill_s: f64,
    pub decode_s: f64,
    pub decode_steps: usize,
    pub ids: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
pub struct Hello {
    pub version: String,
    pub system_info: String,
}

/// The llama.cpp driver process, model loaded.
pub struct LlamaCpp {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub hello: Hello,
}

impl LlamaCpp {
    /// Loads `model` in a driver process: `threads` threads, up to `max_seqs` sequences and
    /// `n_batch` tokens in one `llama_decode`.
    pub fn start(python: &Path, model: &Path, threads: usize, max_seqs: usize, n_batch: usize) -> Result<Self, String> {
        let config = serde_json::json!({
            "model": model.display().to_string(),
            "threads": threads,
            "n_ctx": 16384,
            "n_batch": n_batch,
            "max_seqs": max_seqs,
        });
        let mut child = Command::new(python)
            .args(["-c", DRIVER, &config.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the llama.cpp driver has no pipes".into());
        };
        let mut stdout = BufReader::new(stdout);
        let hello: Hello = serde_json::from_str(&read_line(&mut stdout)?).map_err(|e| e.to_string())?;
        Ok(Self { child, stdin, stdout, hello })
    }

    /// Sends one request line and parses the answer line.
    fn ask<T: serde::de::DeserializeOwned>(&mut self, request: serde_json::Value) -> Result<T, String> {
        writeln!(self.stdin, "{request}").map_err(|e| format!("llama.cpp driver: {e}"))?;
        serde_json::from_str(&read_line(&mut self.stdout)?).map_err(|e| format!("llama.cpp driver: {e}"))
    }

    /// Greedy generation; `flash_attn: false` runs it on the context without flash attention.
    pub fn generate(&mut self, prompts: &[Vec<u32>], new_tokens: usize, flash_attn: bool) -> Result<Reply, String> {
        self.ask(serde_json::json!({ "prompts": prompts, "new_tokens": new_tokens, "flash_attn": flash_attn }))
    }

    /// For each context alone, the log-probabilities of its candidate next tokens.
    pub fn score(&mut self, contexts: &[Vec<u32>], candidates: &[[u32; 2]]) -> Result<Vec<[f64; 2]>, String> {
        #[derive(Deserialize)]
        struct Scores {
            logprobs: Vec<[f64; 2]>,
        }
        let scores: Scores = self.ask(serde_json::json!({ "score": contexts, "candidates": candidates }))?;
        Ok(scores.logprobs)
    }

    /// For each window alone (one `llama_decode` of all its tokens), the sum of the next-token
    /// negative log-likelihoods of its tokens after the first, and how many that is.
    pub fn nll(&mut self, windows: &[&[u32]]) -> Result<Vec<(f64, usize)>, String> {
        #[derive(Deserialize)]
        struct Nll {
            nll: Vec<(f64, usize)>,
        }
        let nll: Nll = self.ask(serde_json::json!({ "nll": windows }))?;
        Ok(nll.nll)
    }
}

impl Drop for LlamaCpp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_line(stdout: &mut BufReader<ChildStdout>) -> Result<String, String> {
    let mut line = String::new();
    match stdout.read_line(&mut line) {
        Ok(0) => Err("the llama.cpp driver exited (its error is above)".into()),
        Ok(_) => Ok(line),
        Err(e) => Err(format!("llama.cpp driver: {e}")),
    }
}

/// The venv's Python with llama-cpp-python importable, building it first when missing.
pub fn llama_cpp_python(venv: &Path) -> Result<PathBuf, String> {
    let python = venv.join("bin").join("python");
    let importable = |p: &Path| {
        Command::new(p).args(["-c", "import llama_cpp"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if python.is_file() && importable(&python) {
        return Ok(python);
    }
    for tool in ["gcc", "g++", "python3"] {
        if !Command::new(tool).arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
            return Err(format!(
                "{tool} is needed to build llama-cpp-python (apt-get install build-essential python3-venv)"
            ));
        }
    }
    eprintln!("building llama-cpp-python {LLAMA_CPP_PYTHON} into {} (several minutes)", venv.display());
    let run = |cmd: &mut Command| match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{cmd:?} failed: {s}")),
        Err(e) => Err(format!("{cmd:?}: {e}")),
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(venv))?;
    // pip builds llama.cpp from the sdist with cmake (from PyPI when the host has none).
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--no-cache-dir", &format!("llama-cpp-python=={LLAMA_CPP_PYTHON}")])
        .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS))?;
    if importable(&python) { Ok(python) } else { Err(format!("llama_cpp does not import in {}", venv.display())) }
}

/// The venv `--venv` names, or the default one next to the model cache
/// (`~/.cache/burn-llm/llama-cpp-venv`, outside the repository).
pub fn default_venv(venv: Option<&Path>) -> PathBuf {
    venv.map_or_else(|| burn_llm::models::pypi::cache_dir().with_file_name("llama-cpp-venv"), Path::to_path_buf)
}
