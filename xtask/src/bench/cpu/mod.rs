//! `cargo xtask bench cpu`: burn-llm's Flex CPU path against llama.cpp on the same GGUF file, same
//! thread count and same token ids, measured back to back in one run.
//!
//! llama.cpp runs through `llama-cpp-python` ([`driver::LLAMA_CPP_PYTHON`] from PyPI, compiled by pip with
//! cmake and gcc, `GGML_NATIVE=ON`: every instruction set of this CPU) in a virtual environment
//! cached outside the repository (`~/.cache/burn-llm/llama-cpp-venv`, beside the model cache), driven by `llama_cpp.py`
//! through its low-level bindings so that several sequences decode in one batch, its model loaded
//! with `use_extra_bufts = False` (0.3.36's extra-buffer AMX repack path segfaults on Sapphire
//! Rapids, on Gemma 3 and SmolLM2 alike). `--quantize Q4_K_M` (or another llama.cpp file type)
//! benchmarks the model re-quantized by llama.cpp first ([`quantize`]). Measured, each
//! `--runs` times (burn-llm then llama.cpp, per figure): decode tokens/s at batch 1, 8 and 32
//! (`--new-tokens` greedy tokens after a 4-token prompt per sequence), prompt processing tokens/s
//! of a `--prompt-tokens` prompt, each as a ratio; the roofline (batch × read bandwidth ÷ weight
//! bytes read per step); and whether the greedy ids are llama.cpp's, with both engines' margins
//! where they are not ([`divergence`]). As a control, llama.cpp generates the same sequences
//! again with its flash attention off (its default turns it on for this CPU): how often two
//! arithmetic orders of llama.cpp itself agree is the yardstick for burn-llm's agreement.

mod divergence;
pub mod driver;
mod quantize;

use std::path::PathBuf;

use burn_llm::models::{Pretrained, Prompt, SamplingParams};
use burn_llm::{DeviceChoice, Engine, EngineKind, EngineSpec, Purpose};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::report::{self, Align::Left, Align::Right, Header, table};
use driver::{LLAMA_CMAKE_ARGS, LlamaCpp, llama_cpp_python};

/// Flags of `bench cpu`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF model: a path or hub id, or `smollm2` / `gemma3` for the file `cargo xtask fetch-model`
    /// caches (default: `smollm2`, SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    model: Option<String>,
    /// Runs of every figure (min / median / max are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Greedy tokens generated per sequence in the decode figures.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Prompt length of the prompt-processing figure.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batch_sizes: Vec<usize>,
    /// Virtual environment holding llama-cpp-python (built there when missing).
    #[arg(long)]
    venv: Option<PathBuf>,
    /// burn-llm multiplies by `f32` input rows instead of 8-bit ones (`--exact-matmul` of the CLI).
    #[arg(long)]
    exact_matmul: bool,
    /// Benchmark the model re-quantized to this llama.cpp file type first (`Q4_K_M`, `Q6_K`,
    /// `Q5_0`, …), by llama.cpp's own `llama_model_quantize` in the venv (cached in the model
    /// cache); the report is then `cpu-<type>`.
    #[arg(long)]
    quantize: Option<String>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// One figure: burn-llm's and llama.cpp's tokens/s of each run.
#[derive(Serialize)]
struct Figure {
    what: String,
    batch: usize,
    burn_tokens_per_s: Vec<f64>,
    llama_cpp_tokens_per_s: Vec<f64>,
    /// burn-llm ÷ llama.cpp, run by run.
    ratio: Vec<f64>,
    /// Batch × read bandwidth ÷ weight bytes per step (decode figures only).
    roofline_tokens_per_s: Option<f64>,
    /// Sequences whose greedy ids equal llama.cpp's, out of `batch`.
    same_ids: Option<usize>,
    /// First position at which a sequence's ids differ, if any does.
    first_difference: Option<usize>,
    /// Control: sequences whose ids llama.cpp with flash attention off repeats (last run).
    llama_cpp_no_flash_attn_same_ids: Option<usize>,
    /// Control: first position at which llama.cpp without flash attention differs from itself.
    llama_cpp_no_flash_attn_first_difference: Option<usize>,
    /// Each differing sequence's first difference, scored by both engines (last run).
    divergences: Vec<divergence::Divergence>,
}

impl Figure {
    fn new(what: String, batch: usize, roofline_tokens_per_s: Option<f64>) -> Self {
        Self {
            what,
            batch,
            burn_tokens_per_s: vec![],
            llama_cpp_tokens_per_s: vec![],
            ratio: vec![],
            roofline_tokens_per_s,
            same_ids: None,
            first_difference: None,
            llama_cpp_no_flash_attn_same_ids: None,
            llama_cpp_no_flash_attn_first_difference: None,
            divergences: vec![],
        }
    }

    /// One run: both speeds, and how the greedy ids compare (the last run's comparison is kept).
    fn record(&mut self, ours: f64, theirs: f64, our_ids: &[Vec<u32>], their_ids: &[Vec<u32>]) {
        self.burn_tokens_per_s.push(ours);
        self.llama_cpp_tokens_per_s.push(theirs);
        self.ratio.push(ours / theirs);
        let (same, first) = compare_ids(our_ids, their_ids);
        self.same_ids = Some(same);
        self.first_difference = first;
    }

    /// The control: llama.cpp's ids without flash attention against its own (default) ones.
    fn record_control(&mut self, theirs: &[Vec<u32>], without_flash_attn: &[Vec<u32>]) {
        let (same, first) = compare_ids(without_flash_attn, theirs);
        self.llama_cpp_no_flash_attn_same_ids = Some(same);
        self.llama_cpp_no_flash_attn_first_difference = first;
    }
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    threads: usize,
    llama_cpp_python: String,
    llama_cpp_build: String,
    llama_cpp_system_info: String,
    read_bandwidth_gb_s: f64,
    weight_bytes_per_step: usize,
    /// `Int8Activations` (default) or `Exact`.
    matmul_precision: String,
    figures: Vec<Figure>,
}

/// min / median / max.
fn spread(values: &[f64]) -> [f64; 3] {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => [f64::NAN; 3],
        n => [v[0], v[n / 2], v[n - 1]],
    }
}

fn cell(values: &[f64]) -> String {
    let [lo, mid, hi] = spread(values);
    format!("{mid:.1} ({lo:.1}–{hi:.1})")
}

fn ratio_cell(values: &[f64]) -> String {
    let [lo, mid, hi] = spread(values);
    format!("{mid:.2}× ({lo:.2}–{hi:.2})")
}

/// `"same/batch (first difference at token t)"` for the report.
fn agreement(batch: usize, same: Option<usize>, first: Option<usize>) -> String {
    match (same, first) {
        (Some(same), None) => format!("{same}/{batch}"),
        (Some(same), Some(at)) => format!("{same}/{batch} (first difference at token {at})"),
        (None, _) => "–".into(),
    }
}

/// How many sequences have llama.cpp's ids, and the first position where any differs.
fn compare_ids(ours: &[Vec<u32>], theirs: &[Vec<u32>]) -> (usize, Option<usize>) {
    let same = ours.iter().zip(theirs).filter(|(a, b)| a == b).count();
    let first = ours
        .iter()
        .zip(theirs)
        .filter_map(|(a, b)| different_token(a, b).or((a.len() != b.len()).then_some(a.len().min(b.len()))))
        .min();
    (same, first)
}

/// The first position where both sequences have a token and the tokens differ.
fn different_token(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // `--model smollm2|gemma3` (or none: smollm2) names a model `cargo xtask fetch-model` caches.
    let (path, label) = crate::fetch::resolve(args.model.as_deref().unwrap_or("smollm2"))?;
    let python = llama_cpp_python(&driver::default_venv(args.venv.as_deref()))?;
    let (path, label) = match &args.quantize {
        Some(kind) => {
            let label = format!("{label} re-quantized to {} by llama.cpp", kind.to_ascii_uppercase());
            (quantize::requantized(&python, &path, kind)?, label)
        }
        None => (path, label),
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let max_batch = args.batch_sizes.iter().copied().max().unwrap_or(1);
    let n_batch = args.prompt_tokens.max(max_batch * 4).max(512);
    let mut llama = LlamaCpp::start(&python, &path, threads, max_batch, n_batch)?;
    eprintln!("llama-cpp-python {}: {}", llama.hello.version, llama.hello.system_info);

    let spec = EngineSpec {
        engine: Some(EngineKind::Plain),
        device: Some(DeviceChoice::Flex),
        exact_matmul: args.exact_matmul,
        ..EngineSpec::default()
    };
    let precision = spec.matmul_precision();
    let pretrained = Pretrained::load(&path, &DeviceChoice::Flex.device()?)?;
    // What a decode step on Flex reads (a symmetric type's minimums are derived, not read).
    let weight_bytes = pretrained.model.decode_cpu_read_bytes();
    let vocab = pretrained.model.spec().vocab_size;
    let purpose = Purpose::Generate { prompts: &[], params: &SamplingParams::default() };
    let Pretrained { model, tokenizer, eos_token_ids, .. } = pretrained;
    let mut engine = spec.init_model(model, Some(tokenizer), eos_token_ids, purpose, &mut std::io::sink())?;
    let bandwidth = super::quant::read_bandwidth();
    eprintln!("host read bandwidth: {bandwidth:.1} GB/s; weights read per step: {:.1} MB", weight_bytes as f64 / 1e6);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(15);
    let long_prompt: Vec<u32> =
        std::iter::once(1).chain((1..args.prompt_tokens).map(|_| rng.random_range(2..vocab as u32))).collect();
    let decode_prompts =
        |batch: usize| -> Vec<Vec<u32>> { (0..batch).map(|i| vec![1, 504 + i as u32, 3058, 282]).collect() };

    let mut figures = Vec::new();
    for &batch in &args.batch_sizes {
        let prompts = decode_prompts(batch);
        let mut figure =
            Figure::new("decode".into(), batch, Some(batch as f64 * bandwidth * 1e9 / weight_bytes as f64));
        let mut last = None;
        for run in 0..args.runs {
            let (ours, ids) = burn_generate(engine.as_mut(), &prompts, args.new_tokens)?;
            let theirs = llama.generate(&prompts, args.new_tokens, true)?;
            let (ours_tps, theirs_tps) = (
                batch as f64 * ours.decode_steps as f64 / ours.decode_s,
                batch as f64 * theirs.decode_steps as f64 / theirs.decode_s,
            );
            eprintln!("decode batch {batch} run {run}: burn-llm {ours_tps:.1} tokens/s, llama.cpp {theirs_tps:.1}");
            figure.record(ours_tps, theirs_tps, &ids, &theirs.ids);
            last = Some((ids, theirs.ids));
        }
        if let Some((ours, theirs)) = last {
            figure.record_control(&theirs, &llama.generate(&prompts, args.new_tokens, false)?.ids);
            figure.divergences = divergence::divergences(engine.as_mut(), &mut llama, &prompts, &ours, &theirs)?;
        }
        figures.push(figure);
    }
    let mut prompt = Figure::new(format!("prompt processing, {} tokens", args.prompt_tokens), 1, None);
    let prompts = [long_prompt.clone()];
    let mut last = None;
    for run in 0..args.runs {
        let (ours, ids) = burn_generate(engine.as_mut(), &prompts, 1)?;
        let theirs = llama.generate(&prompts, 1, true)?;
        let n = args.prompt_tokens as f64;
        let (ours_tps, theirs_tps) = (n / ours.prefill_s, n / theirs.prefill_s);
        eprintln!(
            "prompt {} run {run}: burn-llm {ours_tps:.1} tokens/s, llama.cpp {theirs_tps:.1}",
            args.prompt_tokens
        );
        prompt.record(ours_tps, theirs_tps, &ids, &theirs.ids);
        last = Some((ids, theirs.ids));
    }
    if let Some((ours, theirs)) = last {
        prompt.record_control(&theirs, &llama.generate(&prompts, 1, false)?.ids);
        prompt.divergences = divergence::divergences(engine.as_mut(), &mut llama, &prompts, &ours, &theirs)?;
    }
    figures.push(prompt);

    let command = format!(
        "cargo xtask bench cpu{} --runs {} --new-tokens {} --prompt-tokens {} --batch-sizes {}{}",
        args.model.as_ref().map_or(String::new(), |m| format!(" --model {m}")),
        args.runs,
        args.new_tokens,
        args.prompt_tokens,
        args.batch_sizes.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
        if args.exact_matmul { " --exact-matmul" } else { "" }
    ) + &args.quantize.as_ref().map_or(String::new(), |q| format!(" --quantize {q}"));
    let header = Header::new("cpu", command, Some("flex"), label);
    let mut md = header.markdown("CPU: burn-llm (Flex) vs llama.cpp, same GGUF file");
    md.push_str(&format!(
        "- threads: {threads} each (burn-llm's rayon pool, llama.cpp's `n_threads`); burn-llm's matmul precision: {precision:?}, \
         its integer kernels: {}\n\
         - llama.cpp: llama-cpp-python {} built by pip from PyPI with `CMAKE_ARGS={LLAMA_CMAKE_ARGS}`, model loaded with \
         `use_extra_bufts = False` (its AMX repack buffers segfault on Sapphire Rapids); {}\n\
         - host read bandwidth: {bandwidth:.1} GB/s; burn-llm reads {:.1} MB of weights per decode step\n\
         - figures: median (min–max) of {} runs, burn-llm then llama.cpp back to back each run; ratio = burn-llm ÷ llama.cpp per run\n\
         - decode: {} greedy tokens per sequence after a 4-token prompt (sequences of a batch decode together; llama.cpp: one `llama_decode` of all sequences per step)\n\
         - greedy ids: burn-llm's against llama.cpp's (default context: flash attention on), last run; the control column \
         generates the same sequences with llama.cpp again, flash attention off, and compares them with llama.cpp's own: \
         two arithmetic orders of one engine, the agreement to expect between any two\n\n",
        burn_llm::kernels::integer_isa(),
        llama.hello.version,
        llama.hello.system_info,
        weight_bytes as f64 / 1e6,
        args.runs,
        args.new_tokens,
    ));
    md.push_str(&table(
        &[
            ("figure", Left),
            ("batch", Right),
            ("burn-llm tokens/s", Right),
            ("llama.cpp tokens/s", Right),
            ("ratio", Right),
            ("roofline tokens/s", Right),
            ("greedy ids = llama.cpp", Left),
            ("control: llama.cpp flash attention off = on", Left),
        ],
        figures.iter().map(|f| {
            vec![
                f.what.clone(),
                f.batch.to_string(),
                cell(&f.burn_tokens_per_s),
                cell(&f.llama_cpp_tokens_per_s),
                ratio_cell(&f.ratio),
                f.roofline_tokens_per_s.map_or("–".into(), |r| format!("{r:.0}")),
                agreement(f.batch, f.same_ids, f.first_difference),
                agreement(f.batch, f.llama_cpp_no_flash_attn_same_ids, f.llama_cpp_no_flash_attn_first_difference),
            ]
        }),
    ));
    let differing: Vec<&Figure> = figures.iter().filter(|f| !f.divergences.is_empty()).collect();
    if !differing.is_empty() {
        md.push_str(
            "\nWhere greedy ids differ (last run): each sequence's first difference scored again, context alone, \
             by both engines; margin = log p(the engine's own token) − log p(the other's), in nats. Both engines \
             quantize activations to 8 bits, which moves the top logits by 0.08–0.25 nats RMS (top 20, three prompts) from the exact \
             model, so margins below that are ties within quantization noise.\n\n",
        );
        md.push_str(&table(
            &[
                ("figure", Left),
                ("batch", Right),
                ("differ", Right),
                ("burn-llm margin", Left),
                ("llama.cpp margin", Left),
            ],
            differing.iter().map(|f| {
                vec![
                    f.what.clone(),
                    f.batch.to_string(),
                    format!("{}/{}", f.divergences.len(), f.batch),
                    divergence::margin_range(f.divergences.iter().map(|d| d.burn_margin_nats)),
                    divergence::margin_range(f.divergences.iter().map(|d| Some(d.llama_cpp_margin_nats))),
                ]
            }),
        ));
    }
    let decode_of = |batch: usize| figures.iter().find(|f| f.what == "decode" && f.batch == batch);
    if let (Some(one), Some(many)) = (decode_of(1), decode_of(max_batch)) {
        let scaling = spread(&many.burn_tokens_per_s)[1] / spread(&one.burn_tokens_per_s)[1];
        md.push_str(&format!("\nburn-llm decode at batch {max_batch} ÷ batch 1: {scaling:.2}×\n"));
    }
    let report = Report {
        header,
        threads,
        llama_cpp_python: llama.hello.version.clone(),
        llama_cpp_build: LLAMA_CMAKE_ARGS.into(),
        llama_cpp_system_info: llama.hello.system_info.clone(),
        read_bandwidth_gb_s: bandwidth,
        weight_bytes_per_step: weight_bytes,
        matmul_precision: format!("{precision:?}"),
        figures,
    };
    // One report per model and quantization, so runs on other files do not overwrite the default's.
    let known = args.model.as_deref().and_then(crate::fetch::Known::parse);
    let name = match (&args.quantize, known) {
        (Some(kind), _) => format!("cpu-{}", kind.to_ascii_lowercase()),
        (None, Some(crate::fetch::Known::Gemma3)) => "cpu-gemma3".to_string(),
        _ => "cpu".to_string(),
    };
    report::write(&args.out, &name, &report, &md)?;
    Ok(())
}

/// The greedy ids of each sequence.
type GreedyIds = Vec<Vec<u32>>;

/// burn-llm's greedy generation of `new_tokens` per prompt: its timing and ids.
fn burn_generate(
    engine: &mut dyn Engine,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<(burn_llm::Timing, GreedyIds), Box<dyn std::error::Error>> {
    let prompts: Vec<Prompt> = prompts.iter().map(|p| Prompt::Ids(p.clone())).collect();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(new_tokens) };
    let generation = engine.generate(&prompts, &params)?;
    let ids = generation.output.requests.iter().map(|r| r.generated_ids.clone()).collect();
    Ok((generation.report.timing, ids))
}
