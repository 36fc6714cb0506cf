//! `plan profile --model DIR_OR_GGUF | --synthetic NAME --device NAME --out FILE.json
//! [--grid small|full] [--quiet]`: measures a profile and writes it to `--out`; prints one JSON
//! object (where the profile went, the model, the device, the seconds it took), or
//! `{"error": "…"}` with exit code 2. The device is named by the caller's resolver, so this crate
//! need not know which backends the binary was built with. With an engine timer
//! ([`run_with_engine`], as the `plan` example passes the paged engine's) the profile also gets
//! the engine's measured steps over the grid's [`EngineStepGrid`]: their tables
//! (`engine_step_ms`) and the linear `engine_step` overhead fitted to them (`--no-engine-step`
//! skips both).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use burn_llm_models::DecoderSpec;
use burn_llm_models::gguf::GgufModel;
use clap::{Parser, ValueEnum};

use super::fit::{self, StepSample};
use super::{EngineStepGrid, ProfileGrid, ProgressHook, profile};
use burn_plan::json::{EXIT_ERROR, error_json, parse_args};

/// Times a model's steps in a serving engine (the model's shape, the device, the steps to time);
/// the profile's `engine_step` and `engine_step_ms` are made from them ([`fit::engine_steps`]).
pub type EngineTimer<'a> =
    Box<dyn FnOnce(&DecoderSpec, &Device, &EngineStepGrid) -> Result<Vec<StepSample>, String> + 'a>;

/// Arguments of `plan profile`.
#[derive(Debug, Parser)]
#[command(
    name = "plan profile",
    about = "Time a model's layers on a device and write the JSON profile every planner reads"
)]
struct Args {
    /// A model directory (`config.json`) or a `.gguf` file; only its shape is used (random weights).
    #[arg(long, conflicts_with = "synthetic", required_unless_present = "synthetic")]
    model: Option<PathBuf>,
    /// A built-in model shape instead of `--model`: smollm2-135m, opt-125m or gpt2.
    #[arg(long)]
    synthetic: Option<String>,
    /// The device backend (flex, wgpu, vulkan, cuda, metal: those compiled in).
    #[arg(long)]
    device: String,
    /// Where to write the profile.
    #[arg(long)]
    out: PathBuf,
    /// Which grid of points to measure.
    #[arg(long, value_enum, default_value = "small")]
    grid: GridChoice,
    /// No progress reports (the caller's progress hook is not called).
    #[arg(long)]
    quiet: bool,
    /// Do not time the serving engine's steps (the profile gets no `engine_step`).
    #[arg(long)]
    no_engine_step: bool,
}

/// The measurement grids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GridChoice {
    /// [`ProfileGrid::small`]: seconds on a CPU.
    Small,
    /// [`ProfileGrid::full`]: prompts up to 1024 tokens, contexts up to 2048.
    Full,
}

/// Built-in model shapes (`smollm2-135m`, `opt-125m`, `gpt2`), as HF `config.json` fields.
pub fn synthetic(name: &str) -> Option<serde_json::Value> {
    let config = match name.strip_prefix("synthetic:").unwrap_or(name) {
        "smollm2-135m" => serde_json::json!({
            "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "tie_word_embeddings": true,
        }),
        "opt-125m" => serde_json::json!({
            "model_type": "opt", "vocab_size": 50272, "hidden_size": 768, "ffn_dim": 3072,
            "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 2048,
            "do_layer_norm_before": true, "word_embed_proj_dim": 768,
        }),
        "gpt2" => serde_json::json!({
            "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12,
            "n_head": 12, "n_positions": 1024,
        }),
        _ => return None,
    };
    Some(config)
}

/// Runs `plan profile` with `args` (the program name, `profile`, then the flags); `device`
/// turns a `--device` name into a device or an error saying what to do. Returns the JSON text to
/// print and the exit code (0, or [`EXIT_ERROR`] with `{"error": "…"}`); `--help` gives the help
/// text and 0.
pub fn run<I, T>(args: I, device: impl FnOnce(&str) -> Result<Device, String>) -> (String, i32)
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_with_engine(args, device, None, None)
}

/// [`run`], timing the serving engine's steps with `engine` (when given) for the profile's
/// `engine_step`, and reporting each measured point to `progress` (when given and without
/// `--quiet`) for the caller to draw.
pub fn run_with_engine<I, T>(
    args: I,
    device: impl FnOnce(&str) -> Result<Device, String>,
    engine: Option<EngineTimer<'_>>,
    progress: Option<ProgressHook<'_>>,
) -> (String, i32)
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if args.get(1).is_some_and(|a| a == "profile") {
        args.remove(1);
    }
    let args = match parse_args::<Args, _, _>(args) {
        Ok(a) => a,
        Err(done) => return done,
    };
    let progress = progress.filter(|_| !args.quiet);
    match dispatch(&args, device, engine.filter(|_| !args.no_engine_step), progress) {
        Ok(json) => (json, 0),
        Err(message) => (error_json(&message), EXIT_ERROR),
    }
}

fn dispatch(
    args: &Args,
    device: impl FnOnce(&str) -> Result<Device, String>,
    engine: Option<EngineTimer<'_>>,
    progress: Option<ProgressHook<'_>>,
) -> Result<String, String> {
    let (spec, model_name) = model_spec(args)?;
    let burn_device = device(&args.device)?;
    let (grid, steps) = match args.grid {
        GridChoice::Small => (ProfileGrid::small(), EngineStepGrid::small()),
        GridChoice::Full => (ProfileGrid::full(), EngineStepGrid::full()),
    };
    let started = Instant::now();
    let mut profile = profile(&spec, &burn_device, &grid, progress).map_err(|e| e.to_string())?;
    if let Some(engine) = engine {
        let samples = engine(&spec, &burn_device, &steps)?;
        fit::engine_steps(&mut profile, &samples).map_err(|e| e.to_string())?;
    }
    let seconds = started.elapsed().as_secs_f64();
    profile.model = Some(model_name.clone());
    profile.device = Some(args.device.clone());
    let text = serde_json::to_string_pretty(&profile).map_err(|e| format!("cannot write the profile: {e}"))?;
    std::fs::write(&args.out, text + "\n").map_err(|e| format!("cannot write {}: {e}", args.out.display()))?;
    Ok(serde_json::json!({
        "profile": args.out.display().to_string(),
        "model": model_name,
        "device": args.device,
        "layers": profile.layers,
        "seconds": seconds,
    })
    .to_string())
}

/// The model's shape and a name for it, from `--model` or `--synthetic`.
fn model_spec(args: &Args) -> Result<(DecoderSpec, String), String> {
    if let Some(name) = &args.synthetic {
        let config = synthetic(name)
            .ok_or_else(|| format!("unknown synthetic model `{name}`: use smollm2-135m, opt-125m or gpt2"))?;
        let label = format!("synthetic:{}", name.strip_prefix("synthetic:").unwrap_or(name));
        let spec = DecoderSpec::from_json(&config.to_string(), Path::new(&label)).map_err(|e| e.to_string())?;
        return Ok((spec, label));
    }
    let path = args.model.as_deref().ok_or("give --model DIR_OR_GGUF or --synthetic NAME")?;
    let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let spec = if path.is_file() && is_gguf {
        GgufModel::open(path).map(|m| m.spec().clone())
    } else if path.is_dir() {
        DecoderSpec::from_dir(path)
    } else {
        return Err(format!("--model {}: no such model directory or .gguf file", path.display()));
    }
    .map_err(|e| e.to_string())?;
    let name = path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
    Ok((spec, name))
}
