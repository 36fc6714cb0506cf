//! One closed run of a system over a workload, and how runs are judged against a bound.

use std::time::Instant;

use burn_llm::models::{DecoderSpec, Prompt, SamplingParams, Timing};
use burn_llm::paged::{EngineConfig, KvCacheMemory, SchedulingPolicy};
use burn_llm::plan::profile::Profile;
use burn_llm::{Engine, EngineDetails};
use serde::Serialize;

use super::super::process_cpu::{CpuMeter, CpuShares, Process};
use super::super::workload::Request;
use super::devices::Devices;
use crate::report::percentile;

/// One closed run of the paged engine over a workload.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Run {
    /// `max_num_seqs` of the configuration.
    pub(super) max_num_seqs: usize,
    /// Wall-clock seconds from the first request queued to the last finished.
    pub(super) seconds: f64,
    /// Steady-state requests/s ([`steady_rate`]), or the whole run's when the run is too short to
    /// have a steady state (`steady: false`).
    pub(super) requests_per_s: f64,
    /// Whether `requests_per_s` is the steady-state rate.
    pub(super) steady: bool,
    /// Requests over the whole run's seconds.
    pub(super) run_requests_per_s: f64,
    /// Generated tokens per second over the whole run.
    pub(super) tokens_per_s: f64,
    /// The planner's latency (prefill start to finish) at its percentile over requests.
    pub(super) latency_s: f64,
    /// Mean of the same latency.
    pub(super) mean_latency_s: f64,
    /// Finish − arrival at the same percentile: queueing included.
    pub(super) latency_from_arrival_s: f64,
    /// Per-device busy time and KV moved (disaggregated runs).
    pub(super) devices: Option<DeviceTime>,
    /// The cores the bench (the client, with the engines' threads) and each worker process kept
    /// busy over the run (`None` where `/proc` cannot say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cpu: Option<CpuShares>,
}

/// A run judged against a bound.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Verdict {
    #[serde(flatten)]
    pub(super) run: Run,
    pub(super) meets_bound: bool,
}

/// Steady-state requests/s of a closed run: requests admitted from the first completion (before
/// it the batch is still filling) up to the last prefill step (after it the batch drains), over
/// that window's length. `None` when the window holds no admission (fewer than three batches).
pub(super) fn steady_rate(prefilled: &[f64], finished: &[f64]) -> Option<f64> {
    let first_done = finished.iter().copied().fold(f64::INFINITY, f64::min);
    let last_prefill = prefilled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let admitted = prefilled.iter().filter(|&&t| t >= first_done && t < last_prefill).count();
    (admitted > 0 && last_prefill > first_done).then(|| admitted as f64 / (last_prefill - first_done))
}

/// Runs every request of `reqs` (all queued at once) on a paged engine configured by `config`.
pub(super) fn measure(
    devices: &Devices,
    config: EngineConfig,
    reqs: &[Request],
    pct: f64,
    processes: &[Process],
) -> Result<Run, Box<dyn std::error::Error>> {
    let max_num_seqs = config.max_num_seqs;
    run_engine(devices.baseline(config)?, max_num_seqs, reqs, pct, processes)
}

/// Runs every request of `reqs` (all queued at once) on `engine`, whose `max_num_seqs` is
/// `max_num_seqs`, metering the CPU time of `processes` over the run.
pub(super) fn run_engine(
    mut engine: Box<dyn Engine>,
    max_num_seqs: usize,
    reqs: &[Request],
    pct: f64,
    processes: &[Process],
) -> Result<Run, Box<dyn std::error::Error>> {
    let meter = CpuMeter::start(processes);
    let started = Instant::now();
    for (i, (prompt, out)) in reqs.iter().enumerate() {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(*out) };
        engine.add_request(&i.to_string(), Prompt::Ids(prompt.clone()), params)?;
    }
    let (mut prefilled, mut finished) = (vec![None; reqs.len()], vec![None; reqs.len()]);
    let mut tokens = 0;
    while engine.has_unfinished_requests() {
        let step_start = started.elapsed().as_secs_f64();
        let outputs = engine.step()?;
        let step_end = started.elapsed().as_secs_f64();
        for out in outputs {
            let i: usize = out.request_id.parse()?;
            tokens += out.sequences.iter().map(|d| d.token_ids.len()).sum::<usize>();
            // The engine's own step start: virtual engines step on threads of their own, so the
            // step this loop waited on need not be the one that prefilled the request.
            let step_started = out.step_started.map_or(step_start, |t| t.duration_since(started).as_secs_f64());
            prefilled[i].get_or_insert(step_started);
            if out.finished.is_some() {
                finished[i] = Some(step_end);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = meter.read();
    let (mut starts, mut ends) = (Vec::with_capacity(reqs.len()), Vec::with_capacity(reqs.len()));
    for (i, (start, end)) in prefilled.iter().zip(&finished).enumerate() {
        let (Some(start), Some(end)) = (start, end) else {
            return Err(format!("request {i} never finished").into());
        };
        starts.push(*start);
        ends.push(*end);
    }
    let latency: Vec<f64> = starts.iter().zip(&ends).map(|(s, e)| e - s).collect();
    let from_arrival = &ends;
    let steady = steady_rate(&starts, &ends);
    let run_rate = reqs.len() as f64 / seconds;
    Ok(Run {
        max_num_seqs,
        seconds,
        requests_per_s: steady.unwrap_or(run_rate),
        steady: steady.is_some(),
        run_requests_per_s: run_rate,
        tokens_per_s: tokens as f64 / seconds,
        latency_s: percentile(&latency, pct),
        mean_latency_s: latency.iter().sum::<f64>() / latency.len().max(1) as f64,
        latency_from_arrival_s: percentile(from_arrival, pct),
        devices: DeviceTime::of(engine.as_ref(), seconds),
        cpu,
    })
}

/// Where a run's time went on two devices: each device's busy seconds and the KV moved between
/// them (WAA's prefill → decode hand-off); `None` on runs that keep no such counters.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct DeviceTime {
    /// The prefill device's busy seconds ÷ the run's.
    pub(super) prefill_busy: f64,
    /// The decode device's busy seconds ÷ the run's.
    pub(super) decode_busy: f64,
    /// Requests whose KV moved.
    pub(super) kv_transfers: usize,
    /// Bytes moved.
    pub(super) kv_transfer_bytes: u64,
    /// Seconds spent moving them.
    pub(super) kv_transfer_s: f64,
}

impl DeviceTime {
    fn of(engine: &dyn Engine, seconds: f64) -> Option<Self> {
        let EngineDetails::Paged(stats) = engine.report(Timing::default()).details else { return None };
        (stats.kv_transfers > 0).then(|| Self {
            prefill_busy: stats.prefill_busy_s / seconds,
            decode_busy: stats.decode_busy_s / seconds,
            kv_transfers: stats.kv_transfers,
            kv_transfer_bytes: stats.kv_transfer_bytes,
            kv_transfer_s: stats.kv_transfer_s,
        })
    }
}

/// Seconds the profile's measured engine steps predict for FCFS at one seat on `reqs`: one request
/// at a time, its prefill step alone, then a decode step per further output token at its context.
/// Nothing is scheduled around, so the run measures the host's speed against the profile's.
pub(super) fn one_seat_seconds(profile: &Profile, reqs: &[Request]) -> Result<f64, Box<dyn std::error::Error>> {
    let cost = profile.cost_model("profile")?;
    let ms: f64 = reqs
        .iter()
        .map(|(prompt, output)| {
            let p = prompt.len() as f64;
            cost.prefill_step_ms(1.0, p) + (1..*output).map(|t| cost.decode_step_ms(1.0, p + t as f64)).sum::<f64>()
        })
        .sum();
    Ok(ms / 1000.0)
}

pub(super) fn judge(run: &Run, bound: f64) -> Verdict {
    Verdict { run: run.clone(), meets_bound: run.latency_s <= bound }
}

/// The run of most throughput among those meeting `bound` (a grid tuned by measurement).
pub(super) fn best_meeting(grid: &[Run], bound: f64) -> Option<Verdict> {
    grid.iter()
        .filter(|r| r.latency_s <= bound)
        .max_by(|x, y| x.requests_per_s.total_cmp(&y.requests_per_s))
        .map(|r| judge(r, bound))
}

/// Static batching (FasterTransformer-style, ExeGPT's baseline) at `seqs` seats: a batch is
/// admitted when the previous one has finished, each request reserving the model's whole context.
/// The KV pool is sized to hold every seat's reservation, so memory never limits the batch (FT
/// is configured for its batch) and only the waiting for the batch's longest request is measured.
pub(super) fn static_config(base: &EngineConfig, seqs: usize, spec: &DecoderSpec) -> EngineConfig {
    let blocks = seqs * spec.max_positions.div_ceil(base.block_size) + 1;
    EngineConfig {
        max_num_seqs: seqs,
        scheduling: SchedulingPolicy::Static,
        kv_cache_memory: KvCacheMemory::Blocks(blocks),
        ..base.clone()
    }
}

/// The 1-minute load average (Linux `/proc/loadavg`).
pub(super) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}
