//! `bench cpu --quantize TYPE`: the benchmarked GGUF re-quantized by llama.cpp itself
//! (`llama_model_quantize` with `allow_requantize`, through llama-cpp-python's low-level API in
//! the bench's venv), so both sides run the very same K-quant file. The result is cached beside
//! the source in the model cache and reused.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Quantizes `source` to llama.cpp file type `kind` (`Q4_K_M`, `Q5_K_S`, `Q6_K`, `Q5_0`, …: the
/// `LLAMA_FTYPE_MOSTLY_*` names) unless the result is cached; returns its path.
pub fn requantized(python: &Path, source: &Path, kind: &str) -> Result<PathBuf, String> {
    let kind = kind.to_ascii_uppercase();
    let stem = source.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = burn_llm::models::pypi::cache_dir();
    let target = dir.join(format!("{stem}.requant-{kind}.gguf"));
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let partial = target.with_extension("partial");
    // llama.cpp's per-tensor log is silenced; its result code is the exit status.
    let script = "import sys, ctypes, llama_cpp as L\n\
                  quiet = L.llama_log_callback(lambda level, text, data: None)\n\
                  L.llama_log_set(quiet, ctypes.c_void_p(0))\n\
                  kind = getattr(L, 'LLAMA_FTYPE_MOSTLY_' + sys.argv[3], None)\n\
                  if kind is None: sys.exit('llama.cpp has no file type ' + sys.argv[3] + ' (try Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, Q5_0, Q5_1)')\n\
                  p = L.llama_model_quantize_default_params()\n\
                  p.ftype = kind\n\
                  p.allow_requantize = True\n\
                  sys.exit(L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n";
    eprintln!("re-quantizing {} to {kind} with llama.cpp", source.display());
    let status = Command::new(python)
        .args(["-c", script])
        .arg(source)
        .arg(&partial)
        .arg(&kind)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("llama.cpp could not quantize {} to {kind} ({status})", source.display()));
    }
    std::fs::rename(&partial, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    Ok(target)
}
