//! `cargo run --release -p burn-parallel --example sliced_prefill -- [--layers N] [--prompt N]
//! [--stages K] [--threads T] [--uniform N,…] [--repeats R]`: measures TeraPipe's token slicing
//! through `K` pipeline stages on the host CPU (Flex), each stage on a thread of its own with `T`
//! rayon threads, on a model of SmolLM2-135M's shape with `N` layers of random weights. For one
//! prompt it prints (JSON lines) the wall time to the first token's logits of: one unsliced pass;
//! uniform slicings; the planner's slicing (`--prefill-slices auto`, from the stages' measured
//! profiles, here at interference κ = 0, which the threaded run then puts to the test), each with
//! its prediction `Σ t_i + (K−1)·max t_i`; and the same slices run in turn
//! on one thread (no overlap), which isolates what the threads bring. `cpu_per_wall` is the
//! process's CPU time over the wall time of the threaded run (Linux; about 1 when nothing runs
//! at once, up to the stages' threads when they all compute together): on a machine whose cores
//! other processes keep busy, it shows how much of the overlap the machine allowed.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_llm_models::language_model::forward_micro_batches_in_turn;
use burn_llm_models::{DecoderSpec, LanguageModel, PrefillSlicing, RandomWeights, StepInput, UniformSlices};
use burn_paged::cache::{PagedKvCache, PagedStep};
use burn_parallel::pipeline::slicing::{in_stage_pool, slicing_grid, stage_costs};
use burn_parallel::pipeline::{LinkProfile, PipelineLm, PipelinePlan, PlannedSlices, StageLayout};
use burn_parallel::profiler::cli::synthetic;
use burn_parallel::profiler::profile;
use clap::Parser;

const BLOCK: usize = 16;

#[derive(Parser)]
struct Args {
    /// Decoder layers (SmolLM2-135M has 30).
    #[arg(long, default_value_t = 30)]
    layers: usize,
    /// Prompt tokens.
    #[arg(long, default_value_t = 2048)]
    prompt: usize,
    /// Pipeline stages (an even split).
    #[arg(long, default_value_t = 2)]
    stages: usize,
    /// Rayon threads per stage.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Uniform slice counts to time.
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    uniform: Vec<usize>,
    /// Timed runs per slicing (the fastest is kept).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
}

/// One sequence's prompt cut into `slices`, as micro-batches over an identity block table.
fn lay_out(device: &Device, len: usize, slices: &[usize]) -> (Vec<PagedStep>, Vec<StepInput>) {
    let blocks = len.div_ceil(BLOCK) as u32;
    let mut at = 0;
    slices
        .iter()
        .map(|&n| {
            let positions: Vec<i64> = (at..at + n).map(|p| p as i64).collect();
            let ids: Vec<i64> = positions.iter().map(|p| 1 + p % 1000).collect();
            at += n;
            let step = PagedStep {
                slots: positions.iter().map(|&p| p as u32).collect(),
                block_tables: (0..blocks).collect(),
                max_blocks: blocks as usize,
                query_seq: vec![0; n],
                context_lens: positions.iter().map(|&p| p as u32 + 1).collect(),
            };
            let input = StepInput {
                tokens: Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), device),
                positions: Tensor::<2, Int>::from_data(TensorData::new(positions, [1, n]), device),
                max_position: at - 1,
                last: vec![Some(n - 1)],
            };
            (step, input)
        })
        .unzip()
}

/// The process's user + system CPU time in milliseconds (Linux `/proc/self/stat`, 100 ticks per
/// second), `None` where unreadable.
fn cpu_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 10.0)
}

/// Milliseconds to the last token's logits with `slices`, the fastest of `repeats` runs, and that
/// run's CPU time over its wall time.
fn time_ms(
    model: &PipelineLm,
    len: usize,
    slices: &[usize],
    threaded: bool,
    repeats: usize,
) -> Result<(f64, Option<f64>), String> {
    let mut best = (f64::INFINITY, None);
    for _ in 0..repeats.max(1) {
        let mut cache =
            PagedKvCache::placed(model.kv_layout(), BLOCK, len.div_ceil(BLOCK), 0, model.kv_devices(), None)
                .map_err(|e| e.to_string())?;
        let (steps, inputs) = lay_out(&model.device(), len, slices);
        cache.begin_micro_batches(&steps).map_err(|e| e.to_string())?;
        let (start, cpu) = (Instant::now(), cpu_ms());
        let states = match threaded {
            true => model.forward_micro_batches(&inputs, &mut cache),
            false => forward_micro_batches_in_turn(model, &inputs, &mut cache),
        }
        .map_err(|e| e.to_string())?;
        let last = states.last().ok_or("no slices")?.clone();
        let logits = model.last_logits(last, &inputs[inputs.len() - 1].last);
        logits.argmax(1).into_data();
        let wall = start.elapsed().as_secs_f64() * 1e3;
        if wall < best.0 {
            best = (wall, cpu.zip(cpu_ms()).map(|(a, b)| (b - a) / wall));
        }
    }
    Ok(best)
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    let config = synthetic("smollm2-135m").ok_or("no smollm2 shape")?;
    let mut spec =
        DecoderSpec::from_json(&config.to_string(), "synthetic:smollm2-135m".as_ref()).map_err(|e| e.to_string())?;
    spec.num_layers = args.layers;
    let layout = StageLayout::even(spec.num_layers, args.stages).map_err(|e| e.to_string())?;
    let plan = PipelinePlan::new(layout, 1, vec![Device::flex(); args.stages]).map_err(|e| e.to_string())?;
    let grid = slicing_grid();
    let measure = |_stage: usize, device: &Device, threads: Option<usize>| {
        in_stage_pool(threads, || profile(&spec, device, &grid, None)).map_err(|e| e.to_string())
    };
    let same_process = |_: usize, _: &Device, _: &Device| Ok(LinkProfile { latency_ms: 0.0, ms_per_byte: 0.0 });
    let costs = stage_costs(&plan, Some(args.threads), spec.hidden_size * 4, measure, same_process)?;
    let planner = PlannedSlices::new(costs).map_err(|e| e.to_string())?;
    let model = PipelineLm::from_checkpoint(spec, &RandomWeights::default(), &plan, None)
        .map_err(|e| e.to_string())?
        .with_stage_threads(args.threads);
    let len = args.prompt;
    let mut runs: Vec<(String, Vec<usize>)> = vec![("unsliced".into(), vec![len])];
    for &n in &args.uniform {
        let uniform = UniformSlices::new(n).ok_or("--uniform counts must be at least 1")?;
        runs.push((format!("uniform:{n}"), uniform.slices(len, 0)));
    }
    runs.push(("auto".into(), planner.slices(len, 0)));
    // Warm-up: allocators and pools.
    time_ms(&model, len.min(256), &[len.min(256)], true, 1)?;
    for (name, slices) in &runs {
        let (threaded, cpu_per_wall) = time_ms(&model, len, slices, true, args.repeats)?;
        let in_turn = match slices.len() > 1 {
            true => Some(time_ms(&model, len, slices, false, args.repeats)?.0),
            false => None,
        };
        let line = serde_json::json!({
            "slicing": name,
            "slices": slices,
            "measured_ms": threaded,
            "predicted_ms": planner.predicted_ms(slices, 0),
            "in_turn_ms": in_turn,
            "cpu_per_wall": cpu_per_wall,
            "layers": args.layers,
            "stages": args.stages,
            "threads_per_stage": args.threads,
            "prompt": len,
        });
        println!("{line}");
    }
    Ok(())
}
