//! `/metrics`: Prometheus text with vLLM's serving metrics (queue lengths, KV-cache usage, token
//! counters, TTFT / TPOT / end-to-end histograms, preemptions), each labelled with the `model`
//! it counts, updated by that model's engine loop.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use burn_llm::engine::EngineLoad;

/// vLLM's latency buckets (seconds), from a millisecond to a minute.
const LATENCY_BUCKETS: [f64; 17] =
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The label every metric carries: the served model's name.
const MODEL_LABEL: &str = "model";

/// The server's metric families, in their own registry (several servers in one process do not
/// collide); [`MetricsRegistry::for_model`] gives one model's series.
#[derive(Debug, Clone)]
pub struct MetricsRegistry {
    registry: Registry,
    gauges: [IntGaugeVec; 6],
    counters: [IntCounterVec; 5],
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
    /// Requests finished (completed, stopped or aborted).
    pub requests_finished: IntCounter,
    /// Preemptions (swaps and recomputations).
    pub preemptions: IntCounter,
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
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(format!("burn_llm_{name}"), help), &[MODEL_LABEL])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(format!("burn_llm_{name}"), help), &[MODEL_LABEL])?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram = |name: &str, help: &str| -> prometheus::Result<HistogramVec> {
            let opts = HistogramOpts::new(format!("burn_llm_{name}"), help).buckets(LATENCY_BUCKETS.to_vec());
            let h = HistogramVec::new(opts, &[MODEL_LABEL])?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        Ok(Self {
            gauges: [
                gauge("num_requests_running", "Requests in the running batch.")?,
                gauge("num_requests_waiting", "Requests waiting to be scheduled.")?,
                gauge("num_requests_swapped", "Requests preempted to host memory.")?,
                gauge("kv_blocks_used", "Device KV-cache blocks in use.")?,
                gauge("kv_blocks_total", "Device KV-cache blocks in the pool.")?,
                gauge("model_up", "1 while the model serves, 0 once its engine is down.")?,
            ],
            counters: [
                counter("prompt_tokens_total", "Prompt tokens of admitted requests.")?,
                counter("generation_tokens_total", "Tokens generated.")?,
                counter("requests_finished_total", "Requests finished or aborted.")?,
                counter("num_preemptions_total", "Sequence groups preempted (swap or recompute).")?,
                counter(
                    "requests_rejected_slo_total",
                    "Requests rejected at arrival as predicted to miss their SLO (--admission slo).",
                )?,
            ],
            histograms: [
                histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.")?,
                histogram("time_per_output_token_seconds", "Time between two tokens of a sequence.")?,
                histogram("e2e_request_latency_seconds", "Time from arrival to the request's end.")?,
            ],
            registry,
        })
    }

    /// The series of the model named `model` (made at 0, so `/metrics` lists every model from
    /// the start).
    pub fn for_model(&self, model: &str) -> Metrics {
        let [running, waiting, swapped, kv_blocks_used, kv_blocks_total, up] =
            self.gauges.clone().map(|g| g.with_label_values(&[model]));
        let [prompt_tokens, generation_tokens, requests_finished, preemptions, slo_rejections] =
            self.counters.clone().map(|c| c.with_label_values(&[model]));
        let [ttft, tpot, e2e] = self.histograms.clone().map(|h| h.with_label_values(&[model]));
        up.set(1);
        Metrics {
            running,
            waiting,
            swapped,
            kv_blocks_used,
            kv_blocks_total,
            up,
            prompt_tokens,
            generation_tokens,
            requests_finished,
            preemptions,
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
    }
}
