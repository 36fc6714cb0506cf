//! Part (c): chunked prefill on one device under mixed load. `decoders` short requests decode
//! while long prompts (`long_min..=long_max` tokens) arrive one every `gap` steps; the same
//! requests run on the paged engine with chunked prefill (a step budget of `chunk_tokens`:
//! decodes first, then prompt chunks up to the budget) and without it (each prompt prefilled in
//! one step, next to the decodes). Every sequence's inter-token latency and the run's throughput
//! are compared.

use std::path::Path;

use burn_llm::paged::KvCacheMemory;
use burn_llm::spec::PagedSpec;
use burn_llm::{DeviceChoice, EngineKind, EngineSpec, Purpose};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::drive::{self, Request, Trace};
use crate::report::percentile;

/// The workload of part (c).
#[derive(Debug, Clone, Serialize)]
pub struct MixedLoad {
    /// Sequences decoding from the start.
    pub decoders: usize,
    /// Their prompt length.
    pub decoder_prompt: usize,
    /// Tokens each decoder generates.
    pub decoder_output: usize,
    /// Long prompts arriving.
    pub long_prompts: usize,
    /// Their lengths are drawn uniformly from `long_min..=long_max`.
    pub long_min: usize,
    pub long_max: usize,
    /// Tokens each long prompt generates.
    pub long_output: usize,
    /// The first arrives before this step.
    pub first_arrival_step: usize,
    /// Steps between arrivals.
    pub gap: usize,
    /// The chunked run's token budget per step (`--max-num-batched-tokens`).
    pub chunk_tokens: usize,
}

impl MixedLoad {
    /// The requests, seeded.
    pub fn requests(&self, vocab: usize, seed: u64) -> Vec<Request> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut out: Vec<Request> = (0..self.decoders)
            .map(|_| Request {
                prompt: drive::random_prompt(self.decoder_prompt, vocab, &mut rng),
                output: self.decoder_output,
                at_step: 0,
            })
            .collect();
        for k in 0..self.long_prompts {
            let len = rng.random_range(self.long_min..=self.long_max);
            out.push(Request {
                prompt: drive::random_prompt(len, vocab, &mut rng),
                output: self.long_output,
                at_step: self.first_arrival_step + k * self.gap,
            });
        }
        out
    }

    /// Tokens of KV cache the whole workload holds at most.
    fn kv_tokens(&self) -> usize {
        self.decoders * (self.decoder_prompt + self.decoder_output)
            + self.long_prompts * (self.long_max + self.long_output)
    }
}

/// One configuration's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkedRow {
    pub config: String,
    /// `--max-num-batched-tokens` of the run.
    pub max_num_batched_tokens: usize,
    pub chunked_prefill: bool,
    pub seconds: f64,
    pub steps: usize,
    pub output_tokens: usize,
    pub output_tokens_per_s: f64,
    /// Prompt and output tokens per second.
    pub total_tokens_per_s: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub itl_max_ms: f64,
    /// Time to first token of the long prompts.
    pub long_ttft_p50_s: f64,
    pub long_ttft_max_s: f64,
    /// Every inter-token latency, sorted (for the distribution plot).
    pub itl_ms: Vec<f64>,
}

/// Part (c)'s result.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkedResult {
    pub workload: MixedLoad,
    pub rows: Vec<ChunkedRow>,
    /// Chunked p99 inter-token latency ÷ unchunked.
    pub p99_ratio: f64,
    /// Chunked throughput ÷ unchunked.
    pub throughput_ratio: f64,
}

/// Runs the workload without and with chunked prefill on the local flex device.
pub fn run(
    model: &Path,
    vocab: usize,
    load: &MixedLoad,
    seed: u64,
) -> Result<ChunkedResult, Box<dyn std::error::Error>> {
    let requests = load.requests(vocab, seed);
    let unchunked_budget = load.long_max + load.decoders + load.long_prompts;
    let mut rows = Vec::new();
    for (label, chunked, budget) in [("unchunked", false, unchunked_budget), ("chunked", true, load.chunk_tokens)] {
        let spec = EngineSpec {
            engine: Some(EngineKind::Paged),
            device: Some(DeviceChoice::Flex),
            paged: PagedSpec {
                block_size: Some(16),
                kv_cache_memory: Some(KvCacheMemory::Blocks(load.kv_tokens().div_ceil(16) + 64)),
                max_num_seqs: Some(load.decoders + load.long_prompts),
                max_num_batched_tokens: Some(budget),
                no_enable_prefix_caching: true,
                no_chunked_prefill: !chunked,
                ..PagedSpec::default()
            },
            ..EngineSpec::default()
        };
        let mut engine = spec.init(model, Purpose::Serve, &mut std::io::sink())?;
        // Warm-up: allocators and thread pools, outside the timed run.
        let warm = [Request { prompt: requests[0].prompt.clone(), output: 4, at_step: 0 }];
        drive::run(engine.as_mut(), &warm)?;
        let trace = drive::run(engine.as_mut(), &requests)?;
        let row = summarize(label, chunked, budget, &trace, load.decoders);
        eprintln!(
            "chunked prefill: {label:9} ITL p50 {:7.1} ms p99 {:7.1} ms, {:6.1} output tokens/s, {} steps",
            row.itl_p50_ms, row.itl_p99_ms, row.output_tokens_per_s, row.steps
        );
        rows.push(row);
    }
    let (off, on) = (&rows[0], &rows[1]);
    let (p99_ratio, throughput_ratio) =
        (on.itl_p99_ms / off.itl_p99_ms, on.total_tokens_per_s / off.total_tokens_per_s);
    Ok(ChunkedResult { workload: load.clone(), p99_ratio, throughput_ratio, rows })
}

/// One run's figures; the long prompts are the requests after the first `decoders`.
fn summarize(label: &str, chunked: bool, budget: usize, trace: &Trace, decoders: usize) -> ChunkedRow {
    let mut itl_ms: Vec<f64> = trace.requests.iter().flat_map(|r| r.inter_token_s()).map(|s| s * 1e3).collect();
    itl_ms.sort_by(f64::total_cmp);
    let long_ttft: Vec<f64> = trace.requests[decoders..].iter().filter_map(|r| r.ttft_s()).collect();
    let output_tokens = trace.output_tokens();
    let prompt_tokens: usize = trace.requests.iter().map(|r| r.prompt_len).sum();
    ChunkedRow {
        config: label.to_string(),
        max_num_batched_tokens: budget,
        chunked_prefill: chunked,
        seconds: trace.seconds,
        steps: trace.steps_s.len(),
        output_tokens,
        output_tokens_per_s: output_tokens as f64 / trace.seconds,
        total_tokens_per_s: (output_tokens + prompt_tokens) as f64 / trace.seconds,
        itl_p50_ms: percentile(&itl_ms, 50.0),
        itl_p99_ms: percentile(&itl_ms, 99.0),
        itl_max_ms: itl_ms.last().copied().unwrap_or(0.0),
        long_ttft_p50_s: percentile(&long_ttft, 50.0),
        long_ttft_max_s: percentile(&long_ttft, 100.0),
        itl_ms,
    }
}
