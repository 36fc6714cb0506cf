//! `cargo xtask eval ppl`: perplexity of a model over a text, for weights as loaded and for
//! quantized variants, written to `bench-results/ppl.{json,md}`.
//!
//! The text is tokenized once (special tokens as the model's tokenizer adds them to the start) and
//! cut into non-overlapping windows of `--context` tokens; each window is one forward pass, and
//! every token after the first of a window is scored. Perplexity is `exp(mean NLL)`.
//!
//! `--against llama.cpp` (a GGUF file) also scores the very same windows of token ids with
//! llama.cpp (the `bench cpu` driver: llama-cpp-python, one `llama_decode` per window, the
//! log-softmax in `f64`), as one more row of the table, written to `ppl-<model>-llama-cpp`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use burn_llm::DeviceChoice;
use burn_llm::kernels::QuantSpec;
use burn_llm::models::cache::{KV_QUANT_AXIS, default_kv_group_size, fit_kv_quant, kv_quant};
use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm::models::{CausalLm, ContiguousKvCache, Pretrained, Prompt, SamplingParams};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine};
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `eval ppl`.
#[derive(clap::Args)]
pub struct PplArgs {
    /// Model directory, `.gguf` file or hub id, or `smollm2` / `gemma3` for the file
    /// `cargo xtask fetch-model` caches.
    #[arg(long)]
    model: String,
    /// Score the same token ids with another engine too (`llama.cpp`: needs a GGUF file).
    #[arg(long, value_enum)]
    against: Option<Against>,
    /// Virtual environment holding llama-cpp-python (as `bench cpu`'s `--venv`).
    #[arg(long)]
    venv: Option<PathBuf>,
    /// Text file to score (default: the GNU GPL v3 shipped by the OS).
    #[arg(long, default_value = "/usr/share/common-licenses/GPL-3")]
    text: PathBuf,
    /// Variants to evaluate, comma-separated: `base` (weights as loaded: a GGUF file's quantized
    /// blocks as shipped), `f32` (every weight dequantized to f32), `w8`, `w4` (weights
    /// re-quantized in groups of `--group-size`), `kv8`, `kv4` (KV cache quantized along the head
    /// dimension in groups of `--kv-group-size`; `kv4g16`: in groups of 16), `w4kv4` (both,
    /// FlexGen's compressed setting: KV in its groups of 64);
    /// `paged`, `paged-kv8`, `paged-kv4`, `paged-kv4g16`, …: weights as loaded, scored through the
    /// paged engine with float or quantized KV blocks (put `paged` first to compare the quantized
    /// ones against it).
    #[arg(long, value_delimiter = ',', default_value = "base,f32,w8,w4,kv8,kv4,w4kv4")]
    variants: Vec<String>,
    /// Weight quantization group size (`w8`, `w4`, `w4kv4`).
    #[arg(long, default_value_t = 64)]
    group_size: usize,
    /// KV-cache quantization group size along the head (`kv8`, `kv4`, `paged-kv8`, `paged-kv4`;
    /// default: `--kv-quant`'s, 8 for 4 bits and 64 for 8).
    #[arg(long)]
    kv_group_size: Option<usize>,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Score at most this many windows (0: all).
    #[arg(long, default_value_t = 0)]
    max_windows: usize,
    /// `paged*` variants: write each window's tokens into the cache at most this many a step
    /// (`max_num_batched_tokens`, one window at a time), so that with 1 every query attends to
    /// the cache as a decode step would (an unfinished block's per-channel 4-bit keys quantized
    /// over the tokens so far). Default: whole windows a step.
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Device backend.
    #[arg(long, value_enum, default_value = "flex")]
    device: DeviceChoice,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// Engines `--against` runs.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Against {
    /// llama.cpp through llama-cpp-python, with `use_extra_bufts = False` (see `bench cpu`).
    #[value(name = "llama.cpp")]
    LlamaCpp,
}

#[derive(Serialize)]
struct Row {
    variant: String,
    perplexity: f64,
    delta_percent: f64,
    scored_tokens: usize,
    seconds: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    text: String,
    context: usize,
    group_size: usize,
    /// The KV group size asked for (`null`: `--kv-quant`'s default per bit width).
    kv_group_size: Option<usize>,
    /// The llama-cpp-python release of the `llama.cpp` row, if there is one.
    llama_cpp_python: Option<String>,
    results: Vec<Row>,
}

/// `tokens` cut into the windows every variant scores.
fn windows(tokens: &[u32], context: usize, max_windows: usize) -> Vec<&[u32]> {
    let mut windows: Vec<&[u32]> = tokens.chunks(context).filter(|w| w.len() >= 2).collect();
    if max_windows > 0 {
        windows.truncate(max_windows);
    }
    windows
}

/// Appends `variant`'s row, its change relative to the first row, and prints it.
fn push_row(results: &mut Vec<Row>, variant: &str, nll: f64, count: usize, seconds: f64) {
    let perplexity = (nll / count.max(1) as f64).exp();
    let base = results.first().map(|r| r.perplexity).unwrap_or(perplexity);
    let row = Row {
        variant: variant.to_string(),
        perplexity,
        delta_percent: (perplexity / base - 1.0) * 100.0,
        scored_tokens: count,
        seconds,
    };
    eprintln!(
        "{:>9}: perplexity {:.3} ({:+.2}%) over {} tokens in {:.1} s",
        row.variant, row.perplexity, row.delta_percent, row.scored_tokens, row.seconds
    );
    results.push(row);
}

/// llama.cpp's summed NLL and scored tokens over `windows` of the GGUF file `path`, and the
/// llama-cpp-python release it ran.
fn llama_cpp_nll(
    path: &Path,
    venv: Option<&Path>,
    windows: &[&[u32]],
) -> Result<(f64, usize, String), Box<dyn std::error::Error>> {
    use crate::bench::cpu::driver::{LlamaCpp, default_venv, llama_cpp_python};
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return Err(format!("--against llama.cpp needs a .gguf file, and {} is not one", path.display()).into());
    }
    let python = llama_cpp_python(&default_venv(venv))?;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let longest = windows.iter().map(|w| w.len()).max().unwrap_or(0);
    let mut llama = LlamaCpp::start(&python, path, threads, 1, longest.max(512))?;
    let (mut nll, mut count) = (0.0, 0);
    for window in windows {
        let [(n, c)] = llama.nll(&[window])?[..] else { return Err("llama.cpp driver: one answer per window".into()) };
        nll += n;
        count += c;
    }
    Ok((nll, count, llama.hello.version.clone()))
}

/// Sum of next-token negative log-likelihoods over one window, and how many tokens were scored.
fn window_nll(
    model: &CausalLm,
    window: &[u32],
    kv: Option<QuantSpec>,
    device: &burn::tensor::Device,
) -> Result<(f64, usize), Box<dyn std::error::Error>> {
    let mut cache = match kv {
        None => ContiguousKvCache::new(model.kv_layout(), 1, window.len(), device),
        Some(spec) => {
            // The whole head where the group does not tile it, as `--kv-quant` does.
            let spec = fit_kv_quant(model.kv_layout(), spec)?;
            ContiguousKvCache::quantized(model.kv_layout(), 1, window.len(), device, spec)?
        }
    };
    let step = cache.begin_step(&[window])?;
    let logits = model.forward_all_logits(&step, &mut cache)?;
    let [_, s, v] = logits.dims();
    let log_probs = log_softmax(logits.slice([0..1, 0..s - 1, 0..v]), 2);
    let targets: Vec<i64> = window[1..].iter().map(|&t| t as i64).collect();
    let targets = Tensor::<3, Int>::from_data(TensorData::new(targets, [1, s - 1, 1]), device);
    let nll = -log_probs.gather(2, targets).sum().into_scalar::<f32>() as f64;
    Ok((nll, s - 1))
}

/// Sum of next-token negative log-likelihoods over every window, scored through the paged engine
/// (its prompt log-probabilities: PagedAttention over blocks of 16, quantized as `kv` says), and
/// how many tokens were scored.
fn paged_nll(
    pretrained: Pretrained,
    windows: &[&[u32]],
    kv: Option<QuantSpec>,
    prefill_chunk: Option<usize>,
) -> Result<(f64, usize), Box<dyn std::error::Error>> {
    let longest = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    let defaults = EngineConfig::default();
    let config = EngineConfig {
        kv_cache_memory: KvCacheMemory::Blocks(4 * longest.div_ceil(16) + 4),
        kv_quant: kv,
        enable_prefix_caching: false,
        max_num_batched_tokens: prefill_chunk.or(defaults.max_num_batched_tokens),
        max_num_seqs: if prefill_chunk.is_some() { 1 } else { defaults.max_num_seqs },
        ..defaults
    };
    let mut engine = LlmEngine::new(pretrained, config)?;
    let params = SamplingParams { prompt_logprobs: Some(0), ..SamplingParams::greedy(1) };
    let prompts: Vec<Prompt> = windows.iter().map(|w| Prompt::Ids(w.to_vec())).collect();
    let out = engine.generate(&prompts, &params)?;
    let (mut nll, mut count) = (0.0, 0);
    for request in &out.requests {
        let scored = request.prompt_logprobs.as_ref().ok_or("the paged engine returned no prompt log-probabilities")?;
        for entry in scored.iter().flatten() {
            nll -= f64::from(entry[0].logprob);
            count += 1;
        }
    }
    Ok((nll, count))
}

/// The KV quantization a variant's `kv` part names: `kv8`, `kv4` (in groups of `default_group`,
/// else `--kv-quant`'s default) or `kv4g16` (groups of 16).
fn kv_variant(kv: &str, default_group: Option<usize>) -> Option<Result<QuantSpec, String>> {
    let rest = kv.strip_prefix("kv")?;
    let (bits, group) = match rest.split_once('g') {
        Some((bits, group)) => (bits, Some(group.parse::<usize>().ok()?)),
        None => (rest, default_group),
    };
    let bits = bits.parse::<u32>().ok()?;
    Some(kv_quant(bits, group).map_err(|e| e.to_string()))
}

pub fn run(args: PplArgs) -> Result<(), Box<dyn std::error::Error>> {
    let device = args.device.device()?;
    let (path, label) = crate::fetch::resolve(&args.model)?;
    let text = std::fs::read_to_string(&args.text).map_err(|e| format!("cannot read {}: {e}", args.text.display()))?;
    let mut results: Vec<Row> = Vec::new();
    // The token ids and window length every variant scored (one tokenizer: the model's).
    let mut scored: Option<(Vec<u32>, usize)> = None;
    for variant in &args.variants {
        let pretrained = Pretrained::load(&path, &device)?;
        let tokens = pretrained.tokenizer.encode(&text)?;
        let context = args.context.min(pretrained.model.spec().max_positions).max(2);
        let scored_windows = windows(&tokens, context, args.max_windows);
        let started = Instant::now();
        let (nll, count) = match variant.strip_prefix("paged") {
            Some(kv) => {
                let kv = match kv.strip_prefix('-').and_then(|kv| kv_variant(kv, args.kv_group_size)) {
                    _ if kv.is_empty() => None,
                    Some(spec) => Some(spec?),
                    None => {
                        return Err(format!(
                            "unknown variant `{variant}` (paged, paged-kv8, paged-kv4, paged-kv4g16, …)"
                        )
                        .into());
                    }
                };
                paged_nll(pretrained, &scored_windows, kv, args.prefill_chunk)?
            }
            None => {
                let weights = |bits| QuantSpec::new(bits, args.group_size, WEIGHT_QUANT_AXIS);
                let (model, kv) = match variant.as_str() {
                    "base" => (pretrained.model, None),
                    "f32" => (pretrained.model.dequantize_weights(), None),
                    "w8" => (pretrained.model.quantize_weights(weights(8)?)?, None),
                    "w4" => (pretrained.model.quantize_weights(weights(4)?)?, None),
                    // FlexGen's compressed setting: its cache groups of 64, whatever `--kv-group-size`.
                    "w4kv4" => {
                        (pretrained.model.quantize_weights(weights(4)?)?, Some(QuantSpec::flexgen(KV_QUANT_AXIS)))
                    }
                    other => match kv_variant(other, args.kv_group_size) {
                        Some(spec) => (pretrained.model, Some(spec?)),
                        None => {
                            return Err(format!(
                                "unknown variant `{other}` (base, f32, w8, w4, kv8, kv4, kv4g16, …, w4kv4, paged, \
                                 paged-kv8, paged-kv4, paged-kv4g16, …)"
                            )
                            .into());
                        }
                    },
                };
                let (mut nll, mut count) = (0.0, 0);
                for window in &scored_windows {
                    let (n, c) = window_nll(&model, window, kv, &device)?;
                    nll += n;
                    count += c;
                }
                (nll, count)
            }
        };
        push_row(&mut results, variant, nll, count, started.elapsed().as_secs_f64());
        scored = Some((tokens, context));
    }
    let mut llama_cpp_python = None;
    if let (Some(Against::LlamaCpp), Some((tokens, context))) = (args.against, &scored) {
        let started = Instant::now();
        let (nll, count, version) =
            llama_cpp_nll(&path, args.venv.as_deref(), &windows(tokens, *context, args.max_windows))?;
        push_row(&mut results, "llama.cpp", nll, count, started.elapsed().as_secs_f64());
        llama_cpp_python = Some(version);
    }
    let command = format!(
        "cargo xtask eval ppl --model {} --text {} --variants {} --group-size {}{} --context {} --device {}{}{}{}",
        args.model,
        args.text.display(),
        args.variants.join(","),
        args.group_size,
        args.kv_group_size.map(|g| format!(" --kv-group-size {g}")).unwrap_or_default(),
        args.context,
        args.device.name(),
        if args.max_windows > 0 { format!(" --max-windows {}", args.max_windows) } else { String::new() },
        args.prefill_chunk.map(|n| format!(" --prefill-chunk {n}")).unwrap_or_default(),
        if args.against.is_some() { " --against llama.cpp" } else { "" }
    );
    // The device is in the command line; the report keeps the shape it has always had, without it.
    let header = Header::new("ppl", command, None, &label);
    let mut md = header.markdown("Perplexity");
    md.push_str(&format!(
        "- text: {} (context {} tokens, non-overlapping windows)\n",
        args.text.display(),
        args.context
    ));
    md.push_str(&format!(
        "- KV cache (`kvB`, `paged-kvB`): 4-bit codes in groups of {} along the head, 8-bit ones in \
         groups of {} (`kvBgG`: groups of G), a scale and minimum per group; `paged-kv4` keys per \
         channel over each block's 16 tokens (KIVI, an unfinished block's keys kept as floats and \
         quantized over the tokens so far)\n",
        args.kv_group_size.unwrap_or(default_kv_group_size(4)),
        args.kv_group_size.unwrap_or(default_kv_group_size(8)),
    ));
    if let Some(n) = args.prefill_chunk {
        md.push_str(&format!("- paged variants: windows written {n} token(s) a step, one window at a time\n"));
    }
    if let Some(version) = &llama_cpp_python {
        md.push_str(&format!(
            "- llama.cpp: llama-cpp-python {version} (built as `bench cpu` builds it; model loaded with \
             `use_extra_bufts = False`), {} threads, fed the very same token ids and windows; its \
             log-softmax in `f64`\n",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        ));
    }
    md.push('\n');
    md.push_str(&table(
        &[("variant", Left), ("perplexity", Right), ("Δ vs first", Right), ("scored tokens", Right)],
        results.iter().map(|r| {
            vec![
                r.variant.clone(),
                format!("{:.3}", r.perplexity),
                format!("{:+.2}%", r.delta_percent),
                r.scored_tokens.to_string(),
            ]
        }),
    ));
    let report = Report {
        header,
        text: args.text.display().to_string(),
        context: args.context,
        group_size: args.group_size,
        kv_group_size: args.kv_group_size,
        llama_cpp_python,
        results,
    };
    let name = match (args.against, crate::fetch::Known::parse(&args.model)) {
        (None, _) => "ppl".to_string(),
        (Some(Against::LlamaCpp), Some(known)) => format!("ppl-{}-llama-cpp", known.name()),
        (Some(Against::LlamaCpp), None) => "ppl-llama-cpp".to_string(),
    };
    report::write(&args.out, &name, &report, &md)?;
    Ok(())
}
