//! `cargo xtask bench pipeline`: Alpa's automatic stages, TeraPipe's token slices and chunked
//! prefill, measured against their predictions and their baselines (issue #29, section 3).
//!
//! The machine is one CPU with two `worker` processes on loopback, each limited to one thread
//! (`--threads 1`), started by the benchmark and ended when it finishes, also on error. The model
//! is SmolLM2-135M-Instruct (Q4_1 GGUF, `cargo xtask fetch-model smollm2`) on the default
//! quantized CPU path (8-bit input rows). Three parts, each selectable with `--parts`:
//! - **(a) stages** ([`stages`]): `--stage-layers auto` against an even split over an unequal pair,
//!   the local flex device (the benchmark's own process, every core) and a one-thread worker:
//!   a decode step and a prompt's prefill, each measured and predicted per stage;
//! - **(b) ttft** ([`ttft`]): time to first token of 256-, 1024- and 2048-token prompts at PP=2 over
//!   the two one-thread workers, in the planner's slices, in uniform slices and unsliced, each
//!   against TeraPipe's `Σ t_i + (K − 1)·max t_i` plus the workers' interference on the overlap;
//! - **(c) chunked** ([`chunked`]): chunked prefill on the local flex device while 16 sequences
//!   decode and long prompts arrive: inter-token latency (p50, p99) and throughput, chunked
//!   against unchunked.
//!
//! Predictions come from each device's profile (the Burn profiler, [`profiles`]) and measured
//! link rates ([`predict`]). Writes `bench-results/pipeline.{json,md}`, `pipeline-ttft.png` and
//! `pipeline-itl.png` ([`report`]).

mod chunked;
mod drive;
mod predict;
mod profiles;
mod report;
mod stages;
mod ttft;
pub(super) mod workers;

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burn_llm::models::PretrainedFiles;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm::plan::interference::Interference;
use burn_llm::plan::profile::Profile;

use chunked::MixedLoad;
use stages::StagesWorkload;
use workers::Workers;

/// The parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// (a) `--stage-layers auto` vs an even split on an unequal pair of devices.
    Stages,
    /// (b) Time to first token at PP=2: planner slices, uniform slices, unsliced.
    Ttft,
    /// (c) Chunked prefill on one device under mixed load.
    Chunked,
}

/// Flags of `bench pipeline`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Parts to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "stages,ttft,chunked")]
    parts: Vec<Part>,
    /// Smoke test: short prompts, few sequences, one repeat (figures not comparable to a full run).
    #[arg(long)]
    quick: bool,
    /// (b): prompt lengths (default 256,1024,2048; --quick 64,128).
    #[arg(long, value_delimiter = ',')]
    prompt_lens: Option<Vec<usize>>,
    /// (b): slices of the uniform baseline.
    #[arg(long, default_value_t = 4)]
    uniform_slices: usize,
    /// (a), (b): times each prompt is prefilled (the median is kept; default 2, --quick 1).
    #[arg(long)]
    repeats: Option<usize>,
    /// (c): sequences decoding while the long prompts arrive (default 16, --quick 4).
    #[arg(long)]
    decoders: Option<usize>,
    /// (c): long prompts arriving (default 4, --quick 2).
    #[arg(long)]
    long_prompts: Option<usize>,
    /// (c): shortest and longest long prompt, `MIN-MAX` tokens (default 1024-2048, --quick 128-256).
    #[arg(long)]
    long_lens: Option<String>,
    /// (c): the chunked run's token budget per step, `--max-num-batched-tokens` (default 512,
    /// --quick 64).
    #[arg(long)]
    chunk_tokens: Option<usize>,
    /// The worker executable (default: the `worker` example, built in xtask's profile).
    #[arg(long)]
    worker_bin: Option<PathBuf>,
    /// Random seed of the prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// The settings a run resolves from the flags.
#[derive(Debug, Clone)]
struct Settings {
    prompt_lens: Vec<usize>,
    repeats: usize,
    stages: StagesWorkload,
    load: MixedLoad,
}

impl Args {
    /// The run's settings, checked before any work.
    fn settings(&self) -> Result<Settings, String> {
        let quick = self.quick;
        let prompt_lens = self.prompt_lens.clone().unwrap_or(if quick { vec![64, 128] } else { vec![256, 1024, 2048] });
        if prompt_lens.is_empty() || prompt_lens.contains(&0) {
            return Err("--prompt-lens: give one or more lengths of at least 1 token".into());
        }
        if self.uniform_slices == 0 {
            return Err("--uniform-slices must be at least 1".into());
        }
        let repeats = self.repeats.unwrap_or(if quick { 1 } else { 2 });
        let decoders = self.decoders.unwrap_or(if quick { 4 } else { 16 });
        let long_prompts = self.long_prompts.unwrap_or(if quick { 2 } else { 4 });
        let chunk_tokens = self.chunk_tokens.unwrap_or(if quick { 64 } else { 512 });
        let (long_min, long_max) = match &self.long_lens {
            Some(text) => parse_range(text)?,
            None if quick => (128, 256),
            None => (1024, 2048),
        };
        if repeats == 0 || decoders == 0 || long_prompts == 0 || chunk_tokens == 0 {
            return Err("--repeats, --decoders, --long-prompts and --chunk-tokens must be at least 1".into());
        }
        if chunk_tokens <= decoders {
            return Err(format!(
                "--chunk-tokens {chunk_tokens} leaves no room for prompt chunks next to {decoders} decodes: give more than --decoders"
            ));
        }
        let (first, gap, long_output) = (4, if quick { 6 } else { 16 }, 8);
        // The decoders run until the last long prompt has been prefilled in chunks and decoded.
        let chunk_steps = long_max.div_ceil(chunk_tokens - decoders);
        let decoder_output = first + (long_prompts - 1) * gap + chunk_steps + long_output + 8;
        Ok(Settings {
            stages: StagesWorkload {
                batch: if quick { 4 } else { 8 },
                prompt: 16,
                steps: if quick { 6 } else { 16 },
                long_prompt: if quick { 128 } else { 512 },
                repeats,
            },
            load: MixedLoad {
                decoders,
                decoder_prompt: 32,
                decoder_output,
                long_prompts,
                long_min,
                long_max,
                long_output,
                first_arrival_step: first,
                gap,
                chunk_tokens,
            },
            prompt_lens,
            repeats,
        })
    }

    /// The command line that reproduces the run.
    fn command(&self) -> String {
        let mut cmd = String::from("cargo xtask bench pipeline");
        let parts: Vec<&str> = self.parts.iter().map(|p| part_name(*p)).collect();
        if parts.len() < 3 {
            cmd.push_str(&format!(" --parts {}", parts.join(",")));
        }
        if self.quick {
            cmd.push_str(" --quick");
        }
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let options = [
            ("--prompt-lens", self.prompt_lens.as_deref().map(list)),
            ("--repeats", self.repeats.map(|v| v.to_string())),
            ("--decoders", self.decoders.map(|v| v.to_string())),
            ("--long-prompts", self.long_prompts.map(|v| v.to_string())),
            ("--long-lens", self.long_lens.clone()),
            ("--chunk-tokens", self.chunk_tokens.map(|v| v.to_string())),
        ];
        for (flag, value) in options {
            if let Some(value) = value {
                cmd.push_str(&format!(" {flag} {value}"));
            }
        }
        if self.uniform_slices != 4 {
            cmd.push_str(&format!(" --uniform-slices {}", self.uniform_slices));
        }
        if self.seed != 0 {
            cmd.push_str(&format!(" --seed {}", self.seed));
        }
        cmd
    }
}

fn part_name(part: Part) -> &'static str {
    match part {
        Part::Stages => "stages",
        Part::Ttft => "ttft",
        Part::Chunked => "chunked",
    }
}

/// `MIN-MAX` with `1 ≤ MIN ≤ MAX`.
fn parse_range(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--long-lens `{text}`: give MIN-MAX tokens, e.g. 1024-2048");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let (a, b): (usize, usize) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
    if a == 0 || a > b {
        return Err(bad());
    }
    Ok((a, b))
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let settings = args.settings()?;
    let model = SMOLLM2_GGUF.cached_path();
    if !model.is_file() {
        return Err(format!("{} is not cached: run `cargo xtask fetch-model smollm2` first", model.display()).into());
    }
    let name = file_name(&model);
    let needs_workers = args.parts.iter().any(|p| matches!(p, Part::Stages | Part::Ttft));
    std::fs::create_dir_all(&args.out)?;
    let mut results = report::Results::default();
    if needs_workers {
        let logs = std::env::temp_dir();
        // Dropped at the end of this block, or on any error inside it: the workers end either way.
        let mut workers = Workers::start(&[1, 1], args.worker_bin.as_deref(), &logs)?;
        if let Err(e) = remote_parts(&args, &settings, &model, &workers, &mut results) {
            return Err(match workers.check_alive() {
                Ok(()) => e,
                Err(dead) => format!("{e} ({dead}; its log is worker-N.log in {})", logs.display()).into(),
            });
        }
    }
    if args.parts.contains(&Part::Chunked) {
        let vocab = PretrainedFiles::open(&model)?.spec.vocab_size;
        results.chunked = Some(chunked::run(&model, vocab, &settings.load, args.seed)?);
    }
    report::write(&args.out, &args.command(), &name, results)
}

/// Parts (a) and (b), over the local flex device and the two one-thread `workers`: each device
/// profiled once (cached in the temporary directory; a worker's cache entry is named by its
/// address, which changes every run), then each part run.
fn remote_parts(
    args: &Args,
    settings: &Settings,
    model: &Path,
    workers: &Workers,
    results: &mut report::Results,
) -> Result<(), Box<dyn std::error::Error>> {
    let [w1, w2] = workers.all() else { return Err("two workers were asked for".into()) };
    let files = PretrainedFiles::open(model)?;
    let (model_name, vocab) = (file_name(model), files.spec.vocab_size);
    let token = workers.token.as_str();
    let connect = |w: &workers::Worker| -> Result<(String, Device), Box<dyn std::error::Error>> {
        Ok((w.url.clone(), burn_llm::device::remote_device(&w.url, Some(token))?))
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let flex = (("flex".to_string(), Device::flex()), cores);
    let (one, two) = ((connect(w1)?, w1.threads), (connect(w2)?, w2.threads));
    let longest = settings.prompt_lens.iter().copied().max().unwrap_or(1).max(settings.stages.long_prompt);
    let grid = profiles::grid(longest);
    let cache = std::env::temp_dir().join("burn-llm-bench-profiles");
    let mut profiled: Vec<(String, Profile)> = Vec::new();
    let mut profile =
        |((name, device), threads): &((String, Device), usize)| -> Result<(), Box<dyn std::error::Error>> {
            if !profiled.iter().any(|(n, _)| n == name) {
                let p = profiles::profile_device(&files, &model_name, (name, device), *threads, &grid, &cache)?;
                profiled.push((name.clone(), p));
            }
            Ok(())
        };
    let (stages_part, ttft_part) = (args.parts.contains(&Part::Stages), args.parts.contains(&Part::Ttft));
    for (device, wanted) in [(&flex, stages_part), (&one, true), (&two, ttft_part)] {
        if wanted {
            profile(device)?;
        }
    }
    if stages_part {
        let costs = profiles::pipeline(&files.spec, &[flex.0.clone(), one.0.clone()], &profiled)?;
        let unequal = format!(
            "flex: this process's CPU backend with {cores} threads; {}: a worker process with --threads 1, reached over loopback WebSocket",
            w1.url
        );
        let names = [flex.0.0.clone(), one.0.0.clone()];
        let spec = burn_llm::EngineSpec { worker_token: Some(token.to_string()), ..burn_llm::EngineSpec::default() };
        let devices = [flex.0.1.clone(), one.0.1.clone()];
        let mut on_split = |layers: &[usize]| -> Result<Interference, Box<dyn std::error::Error>> {
            let mut log = Vec::new();
            let measured = burn_llm::spec::split_interference(&spec, model, &names, &devices, layers, &mut log)?;
            eprint!("{}", String::from_utf8_lossy(&log));
            Ok(measured)
        };
        results.stages = Some(stages::run(model, vocab, &costs, token, &settings.stages, &unequal, &mut on_split)?);
    }
    if ttft_part {
        let costs = profiles::pipeline(&files.spec, &[one.0.clone(), two.0.clone()], &profiled)?;
        let devices = [one.0.1.clone(), two.0.1.clone()];
        results.ttft = Some(ttft::run(
            model,
            vocab,
            &costs,
            &devices,
            token,
            &ttft::TtftWorkload {
                prompt_lens: settings.prompt_lens.clone(),
                uniform: args.uniform_slices,
                repeats: settings.repeats,
            },
        )?);
    }
    Ok(())
}

/// The output directory's file name of `path`, for links in the Markdown report.
fn file_name(path: &Path) -> String {
    path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("pipeline").chain(argv.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn defaults_are_the_issue_workload_and_quick_is_small() {
        let full = parse(&[]).ok().map(|a| a.settings()).and_then(Result::ok).expect("defaults parse");
        assert_eq!(full.prompt_lens, [256, 1024, 2048]);
        assert_eq!((full.load.decoders, full.load.long_min, full.load.long_max), (16, 1024, 2048));
        assert_eq!(full.load.chunk_tokens, 512);
        // The decoders outlive the last arrival's chunked prefill: 4 + 3·16 + ⌈2048/496⌉ + 8 + 8.
        assert_eq!(full.load.decoder_output, 4 + 48 + 5 + 16);
        let quick = parse(&["--quick"]).ok().map(|a| a.settings()).and_then(Result::ok).expect("quick parses");
        assert_eq!(quick.prompt_lens, [64, 128]);
        assert!(quick.load.long_max <= 256 && quick.repeats == 1);
    }

    #[test]
    fn bad_flags_are_refused_before_any_work() {
        assert!(parse(&["--parts", "stages,bogus"]).is_err());
        let refused = |argv: &[&str]| parse(argv).map(|a| a.settings().is_err()).unwrap_or(true);
        assert!(refused(&["--long-lens", "2048-1024"]));
        assert!(refused(&["--long-lens", "lots"]));
        assert!(refused(&["--prompt-lens", "0"]));
        assert!(refused(&["--chunk-tokens", "16"]));
        assert!(refused(&["--uniform-slices", "0"]));
    }

    #[test]
    fn command_reproduces_the_flags_given() {
        let args = parse(&["--parts", "ttft", "--prompt-lens", "64,128", "--quick"]).expect("parses");
        assert_eq!(args.command(), "cargo xtask bench pipeline --parts ttft --quick --prompt-lens 64,128");
        assert_eq!(parse(&[]).expect("parses").command(), "cargo xtask bench pipeline");
    }
}
