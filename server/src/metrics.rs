//! `/metrics`: Prometheus text with vLLM's serving metrics under this project's prefix
//! (`burn_llm:` for vLLM's `vllm:`: the same names, types, `finished_reason` label and histogram
//! buckets, so a dashboard or autoscaler written for vLLM works with the prefix changed), each
//! labelled with the `model` it counts and updated by that model's engine loop. The list, with
//! what each counts here, is in docs/server.md.

use burn_llm_models::FinishReason;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use burn_llm::engine::EngineLoad;

/// The prefix of every metric name (vLLM's is `vllm:`).
pub const PREFIX: &str = "burn_llm:";

/// vLLM's buckets of `time_to_first_token_seconds`.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];

/// vLLM's buckets of `time_per_output_token_seconds`.
const TPOT_BUCKETS: [f64; 19] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];

/// vLLM's buckets of the request latencies (`e2e_request_latency_seconds`).
const REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

/// The label every metric carries: the served model's name.
const MODEL_LABEL: &str = "model";

/// The label of `request_success_total`: why the request finished (vLLM's).
const REASON_LABEL: &str = "finished_reason";

/// `finished_reason` values, as vLLM spells them.
const REASONS: [(FinishReason, &str); 3] =
    [(FinishReason::Stop, "stop"), (FinishReason::Length, "length"), (FinishReason::Abort, "abort")];

/// The server's metric families, in their own registry (several servers in one process do not
/// collide); [`MetricsRegistry::for_model`] gives one model's series.
#[derive(Debug, Clone)]
pub struct MetricsRegistry {
    registry: Registry,
    gauges: [IntGaugeVec; 6],
    kv_cache_usage: GaugeVec,
    counters: [IntCounterVec; 6],
    request_success: IntCounterVec,
    histograms: [HistogramVec; 3],
}

/// One model's series of every metric (the `model="NAME"` children of the families).
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Requests in the running batch.
    pub running: IntGauge,
    /// Requests queued in the engine.
    pub waiting: IntGauge,
    /// Requests preempted to host memory.
    pub swapped: IntGauge,
    /// Fraction of the device KV blocks in use (1: all).
    pub kv_cache_usage: Gauge,
    /// Device KV blocks in use.
    pub kv_blocks_used: IntGauge,
    /// Device KV blocks in the pool.
    pub kv_blocks_total: IntGauge,
    /// 1 while the model serves, 0 once its engine is down (a worker died, the engine panicked).
    pub up: IntGauge,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: IntCounter,
    /// Tokens generated.
    pub generation_tokens: IntCounter,
    /// Requests finished, by why: `stop`, `length`, `abort` (in [`REASONS`]' order).
    request_success: [IntCounter; 3],
    /// Preemptions (swaps and recomputations).
    pub preemptions: IntCounter,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: IntCounter,
    /// Prompt tokens the prefix cache supplied.
    pub prefix_cache_hits: IntCounter,
    /// Requests rejected at arrival as predicted to miss their SLO (`--admission slo`).
    pub slo_rejections: IntCounter,
    /// Arrival to first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of a sequence.
    pub tpot: Histogram,
    /// Arrival to the last token.
    pub e2e: Histogram,
}

impl MetricsRegistry {
    /// Fresh metric families, registered.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| Opts::new(format!("{PREFIX}{name}"), help);
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(opts(name, help), &[MODEL_LABEL])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(opts(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| -> prometheus::Result<HistogramVec> {
            let opts = HistogramOpts::new(format!("{PREFIX}{name}"), help).buckets(buckets.to_vec());
            let h = HistogramVec::new(opts, &[MODEL_LABEL])?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        let kv_cache_usage =
            GaugeVec::new(opts("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."), &[MODEL_LABEL])?;
        registry.register(Box::new(kv_cache_usage.clone()))?;
        let model = &[MODEL_LABEL][..];
        Ok(Self {
            gauges: [
                gauge("num_requests_running", "Number of requests in model execution batches.")?,
                gauge("num_requests_waiting", "Number of requests waiting to be processed.")?,
                gauge("num_requests_swapped", "Number of requests swapped to CPU.")?,
                gauge("kv_blocks_used", "Device KV-cache blocks in use.")?,
                gauge("kv_blocks_total", "Device KV-cache blocks in the pool.")?,
                gauge("model_up", "1 while the model serves, 0 once its engine is down.")?,
            ],
            kv_cache_usage,
            counters: [
                counter("prompt_tokens_total", "Number of prefill tokens processed.", model)?,
                counter("generation_tokens_total", "Number of generation tokens processed.", model)?,
                counter("num_preemptions_total", "Cumulative number of preemption from the engine.", model)?,
                counter(
                    "prefix_cache_queries_total",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    model,
                )?,
                counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", model)?,
                counter(
                    "requests_rejected_slo_total",
                    "Requests rejected at arrival as predicted to miss their SLO (--admission slo).",
                    model,
                )?,
            ],
            request_success: counter(
                "request_success_total",
                "Count of successfully processed requests.",
                &[MODEL_LABEL, REASON_LABEL],
            )?,
            histograms: [
                histogram(
                    "time_to_first_token_seconds",
                    "Histogram of time to first token in seconds.",
                    &TTFT_BUCKETS,
                )?,
                histogram(
                    "time_per_output_token_seconds",
                    "Histogram of time per output token in seconds.",
                    &TPOT_BUCKETS,
                )?,
                histogram(
                    "e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.",
                    &REQUEST_LATENCY_BUCKETS,
                )?,
            ],
            registry,
        })
    }

    /// The series of the model named `model` (made at 0, so `/metrics` lists every model from
    /// the start).
    pub fn for_model(&self, model: &str) -> Metrics {
        let [running, waiting, swapped, kv_blocks_used, kv_blocks_total, up] =
            self.gauges.clone().map(|g| g.with_label_values(&[model]));
        let [prompt_tokens, generation_tokens, preemptions, prefix_cache_queries, prefix_cache_hits, slo_rejections] =
            self.counters.clone().map(|c| c.with_label_values(&[model]));
        let request_success = REASONS.map(|(_, reason)| self.request_success.with_label_values(&[model, reason]));
        let [ttft, tpot, e2e] = self.histograms.clone().map(|h| h.with_label_values(&[model]));
        up.set(1);
        Metrics {
            running,
            waiting,
            swapped,
            kv_cache_usage: self.kv_cache_usage.with_label_values(&[model]),
            kv_blocks_used,
            kv_blocks_total,
            up,
            prompt_tokens,
            generation_tokens,
            request_success,
            preemptions,
            prefix_cache_queries,
            prefix_cache_hits,
            slo_rejections,
            ttft,
            tpot,
            e2e,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own well-formed families into a Vec cannot fail.
        if TextEncoder::new().encode(&self.registry.gather(), &mut out).is_err() {
            return String::new();
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Metrics {
    /// Sets the queue and KV-pool gauges.
    pub fn set_load(&self, load: &EngineLoad) {
        self.waiting.set(load.waiting as i64);
        self.running.set(load.running as i64);
        self.swapped.set(load.swapped as i64);
        self.kv_blocks_used.set(load.kv_blocks_used as i64);
        self.kv_blocks_total.set(load.kv_blocks_total as i64);
        let usage =
            if load.kv_blocks_total == 0 { 0.0 } else { load.kv_blocks_used as f64 / load.kv_blocks_total as f64 };
        self.kv_cache_usage.set(usage);
    }

    /// Counts a finished request under `reason`.
    pub fn request_finished(&self, reason: FinishReason) {
        if let Some(i) = REASONS.iter().position(|(r, _)| *r == reason) {
            self.request_success[i].inc();
        }
    }
}
