//! Part (b): time to first token of one prompt over two pipeline stages (an even split over two
//! workers), prefilled in the `slices` planner's token slices (`--prefill-slices auto`), in `N`
//! uniform slices, and unsliced; each against TeraPipe's prediction for the slices it used.

use std::path::Path;

use burn_llm::models::{PrefillSlicing, UniformSlices};
use burn_llm::paged::KvCacheMemory;
use burn_llm::spec::{PagedSpec, ParallelSpec};
use burn_llm::{EngineKind, EngineSpec, Purpose};
use rand::SeedableRng;
use serde::Serialize;

use super::drive;
use super::predict::{self, DeviceCost, Versus};
use super::stages::{first_token_ms, ranges};

/// How a run cuts the prompt.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum Slicing {
    /// The `slices` planner's choice.
    Planner,
    /// `N` equal slices.
    Uniform(usize),
    /// One pass.
    Unsliced,
}

impl Slicing {
    /// `--prefill-slices`.
    fn flag(self) -> String {
        match self {
            Slicing::Planner => "auto".into(),
            Slicing::Uniform(n) => format!("uniform:{n}"),
            Slicing::Unsliced => "off".into(),
        }
    }

    /// The name in the report.
    pub fn label(self) -> String {
        match self {
            Slicing::Planner => "planner slices".into(),
            Slicing::Uniform(n) => format!("uniform ×{n}"),
            Slicing::Unsliced => "unsliced".into(),
        }
    }
}

/// One (slicing, prompt length) point.
#[derive(Debug, Clone, Serialize)]
pub struct TtftPoint {
    pub slicing: String,
    pub prompt_len: usize,
    /// The slices predicted for (the planner's: as planned from the benchmark's profiles of the
    /// stages' devices; the engine plans from its own measurement of the same devices).
    pub slices: Vec<usize>,
    /// Time to first token: TeraPipe's `Σ t_i + (K − 1)·max t_i` against the median measured.
    pub ttft: Versus,
    /// Every measured time to first token, in milliseconds.
    pub measured_ms: Vec<f64>,
}

/// Part (b)'s result.
#[derive(Debug, Clone, Serialize)]
pub struct TtftResult {
    pub devices: Vec<String>,
    pub stage_layers: Vec<String>,
    pub points: Vec<TtftPoint>,
    /// Planner ÷ unsliced at the longest prompt.
    pub planner_over_unsliced_longest: f64,
}

/// Measures every slicing at every prompt length over `costs`' devices (two workers).
pub fn run(
    model: &Path,
    vocab: usize,
    costs: &[DeviceCost],
    token: &str,
    prompt_lens: &[usize],
    uniform: usize,
    repeats: usize,
) -> Result<TtftResult, Box<dyn std::error::Error>> {
    let names: Vec<String> = costs.iter().map(|c| c.name.clone()).collect();
    let longest = prompt_lens.iter().copied().max().unwrap_or(1);
    let mut points = Vec::new();
    let mut layout = Vec::new();
    for slicing in [Slicing::Planner, Slicing::Uniform(uniform), Slicing::Unsliced] {
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
                prefill_slices: Some(slicing.flag()),
                ..ParallelSpec::default()
            },
            ..EngineSpec::default()
        };
        let mut engine = spec.init(model, Purpose::Serve, &mut std::io::sink())?;
        let placement = engine.placement().unwrap_or_default();
        layout = predict::layout_of(&placement).ok_or_else(|| format!("no stages in `{placement}`"))?;
        let planner = predict::slicing(costs, &layout)?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        first_token_ms(engine.as_mut(), drive::random_prompt(64, vocab, &mut rng))?; // warm-up
        for &len in prompt_lens {
            let measured_ms = (0..repeats)
                .map(|_| first_token_ms(engine.as_mut(), drive::random_prompt(len, vocab, &mut rng)))
                .collect::<Result<Vec<_>, _>>()?;
            let slices = match slicing {
                Slicing::Planner => planner.plan(len, 0).slices,
                Slicing::Uniform(n) => UniformSlices::new(n).map(|u| u.slices(len, 0)).unwrap_or_else(|| vec![len]),
                Slicing::Unsliced => vec![len],
            };
            let predicted = planner.predicted_ms(&slices, 0);
            let point = TtftPoint {
                slicing: slicing.label(),
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
    let at = |label: &str| {
        points.iter().find(|p| p.slicing == label && p.prompt_len == longest).map(|p| p.ttft.measured_ms)
    };
    let ratio = match (at(&Slicing::Planner.label()), at(&Slicing::Unsliced.label())) {
        (Some(p), Some(u)) => p / u,
        _ => f64::NAN,
    };
    Ok(TtftResult { devices: names, stage_layers: ranges(&layout), points, planner_over_unsliced_longest: ratio })
}
