//! Part (b): time to first token of one prompt over two pipeline stages (an even split over two
//! workers), prefilled in the `slices` planner's token slices (`--prefill-slices auto`), in `N`
//! uniform slices, and unsliced; each against TeraPipe's prediction for the slices it used.

use std::ops::Range;
use std::path::Path;

use burn::tensor::Device;
use burn_llm::models::{PrefillSlicing, PretrainedFiles, UniformSlices};
use burn_llm::paged::KvCacheMemory;
use burn_llm::parallel::pipeline::{PipelinePlan, PlannedSlices, StageLayout};
use burn_llm::spec::{PagedSpec, ParallelSpec, PrefillSlices};
use burn_llm::{EngineKind, EngineSpec, Purpose};
use rand::SeedableRng;
use serde::Serialize;

use super::drive;
use super::predict::{self, DeviceCost, Versus};
use super::stages::{first_token_ms, ranges};

/// The name of a slicing in the report.
fn label(slicing: PrefillSlices) -> String {
    match slicing {
        PrefillSlices::Auto => "planner slices".into(),
        PrefillSlices::Uniform(n) => format!("uniform ×{n}"),
        PrefillSlices::Off => "unsliced".into(),
    }
}

/// Part (b)'s settings.
#[derive(Debug, Clone, Serialize)]
pub struct TtftWorkload {
    /// Prompt lengths.
    pub prompt_lens: Vec<usize>,
    /// Slices of the uniform baseline.
    pub uniform: usize,
    /// Runs per point (the median is kept).
    pub repeats: usize,
}

/// One (slicing, prompt length) point.
#[derive(Debug, Clone, Serialize)]
pub struct TtftPoint {
    pub slicing: String,
    pub prompt_len: usize,
    /// The slices used (the planner's: planned again here as the engine plans them, from the
    /// same measurement of the stages' devices, so they match the engine's up to timing noise).
    pub slices: Vec<usize>,
    /// Time to first token: TeraPipe's `Σ t_i + (K − 1)·max t_i`, with the interference term,
    /// against the median measured.
    pub ttft: Versus,
    /// Every measured time to first token, in milliseconds.
    pub measured_ms: Vec<f64>,
}

/// Part (b)'s result.
#[derive(Debug, Clone, Serialize)]
pub struct TtftResult {
    pub workload: TtftWorkload,
    pub devices: Vec<String>,
    pub stage_layers: Vec<String>,
    /// The workers' interference `κ` on a prefill step, which the planner and every prediction
    /// use (measured when the planner was built).
    pub interference: f64,
    pub points: Vec<TtftPoint>,
    /// Planner ÷ unsliced at the longest prompt.
    pub planner_over_unsliced_longest: f64,
}

/// Measures every slicing at every prompt length over `costs`' devices (two workers).
pub fn run(
    model: &Path,
    vocab: usize,
    costs: &[DeviceCost],
    devices: &[Device],
    token: &str,
    workload: &TtftWorkload,
) -> Result<TtftResult, Box<dyn std::error::Error>> {
    let TtftWorkload { prompt_lens, uniform, repeats } = workload;
    let (uniform, repeats) = (*uniform, *repeats);
    let names: Vec<String> = costs.iter().map(|c| c.name.clone()).collect();
    let longest = prompt_lens.iter().copied().max().unwrap_or(1);
    let mut points = Vec::new();
    let mut layout = Vec::new();
    let mut engine_planner = None;
    for slicing in [PrefillSlices::Auto, PrefillSlices::Uniform(uniform), PrefillSlices::Off] {
        let spec = EngineSpec {
            engine: Some(EngineKind::Paged),
            worker_token: Some(token.to_string()),
            paged: PagedSpec {
                block_size: Some(16),
                kv_cache_memory: Some(KvCacheMemory::Blocks(longest.div_ceil(16) + 16)),
                max_num_batched_tokens: Some(longest + 16),
                no_enable_prefix_caching: true,
                no_chunked_prefill: true,
                ..PagedSpec::default()
            },
            parallel: ParallelSpec {
                devices: Some(names.clone()),
                prefill_slices: Some(slicing),
                ..ParallelSpec::default()
            },
            ..EngineSpec::default()
        };
        let mut engine = spec.init(model, Purpose::Serve, &mut std::io::sink())?;
        let placement = engine.placement().unwrap_or_default();
        layout = predict::layout_of(&placement).ok_or_else(|| format!("no stages in `{placement}`"))?;
        if engine_planner.is_none() {
            engine_planner = Some(engine_slicing(&spec, model, &layout, devices, &names)?);
        }
        let planner = engine_planner.as_ref().ok_or("no slicing planner")?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        first_token_ms(engine.as_mut(), drive::random_prompt(64, vocab, &mut rng))?; // warm-up
        for &len in prompt_lens {
            let measured_ms = (0..repeats)
                .map(|_| first_token_ms(engine.as_mut(), drive::random_prompt(len, vocab, &mut rng)))
                .collect::<Result<Vec<_>, _>>()?;
            let slices = match slicing {
                PrefillSlices::Auto => planner.plan(len, 0).slices,
                PrefillSlices::Uniform(n) => {
                    UniformSlices::new(n).map(|u| u.slices(len, 0)).unwrap_or_else(|| vec![len])
                }
                PrefillSlices::Off => vec![len],
            };
            let predicted = planner.predicted_ms(&slices, 0);
            let point = TtftPoint {
                slicing: label(slicing),
                prompt_len: len,
                ttft: Versus::new(predicted, drive::median(&measured_ms)),
                slices,
                measured_ms,
            };
            eprintln!(
                "TTFT: {:15} {len:5} tokens: {:8.0} ms (predicted {:8.0}, {} slices)",
                point.slicing,
                point.ttft.measured_ms,
                point.ttft.predicted_ms,
                point.slices.len()
            );
            points.push(point);
        }
    }
    let at =
        |label: &str| points.iter().find(|p| p.slicing == label && p.prompt_len == longest).map(|p| p.ttft.measured_ms);
    let ratio = match (at(&label(PrefillSlices::Auto)), at(&label(PrefillSlices::Off))) {
        (Some(p), Some(u)) => p / u,
        _ => f64::NAN,
    };
    Ok(TtftResult {
        workload: workload.clone(),
        devices: names,
        stage_layers: ranges(&layout),
        interference: engine_planner.as_ref().map_or(0.0, PlannedSlices::interference),
        points,
        planner_over_unsliced_longest: ratio,
    })
}

/// The slicing planner as `--prefill-slices auto` builds it at start-up, over the same cached
/// device profiles (`spec`'s profile directory) and freshly measured links; it predicts every
/// slicing's time to first token.
fn engine_slicing(
    spec: &EngineSpec,
    model: &Path,
    layout: &[Range<usize>],
    devices: &[Device],
    names: &[String],
) -> Result<PlannedSlices, Box<dyn std::error::Error>> {
    let files = PretrainedFiles::open(model)?;
    let stages = StageLayout::parse(&ranges(layout).join(","), files.spec.num_layers)?;
    let plan = PipelinePlan::new(stages, 1, devices.to_vec())?.with_names(names.to_vec());
    burn_llm::spec::planned_slices(spec, model, &files, &plan, &mut std::io::sink())
}
