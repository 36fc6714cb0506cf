//! `/metrics`: Prometheus text with vLLM's serving metrics (queue lengths, KV-cache usage, token
//! counters, TTFT / TPOT / end-to-end histograms, preemptions), updated by the engine loop.

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, IntGauge, Registry, TextEncoder};

use crate::engine::EngineLoad;

/// vLLM's latency buckets (seconds), from a millisecond to a minute.
const LATENCY_BUCKETS: [f64; 17] =
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The server's metrics, in their own registry (several servers in one process do not collide).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
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
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: IntCounter,
    /// Tokens generated.
    pub generation_tokens: IntCounter,
    /// Requests finished (completed, stopped or aborted).
    pub requests_finished: IntCounter,
    /// Preemptions (swaps and recomputations).
    pub preemptions: IntCounter,
    /// Arrival to first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of a sequence.
    pub tpot: Histogram,
    /// Arrival to the last token.
    pub e2e: Histogram,
}

impl Metrics {
    /// Fresh metrics, registered.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(format!("burn_llm_{name}"), help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(format!("burn_llm_{name}"), help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let histogram = |name: &str, help: &str| -> prometheus::Result<Histogram> {
            let opts = HistogramOpts::new(format!("burn_llm_{name}"), help).buckets(LATENCY_BUCKETS.to_vec());
            let h = Histogram::with_opts(opts)?;
            registry.register(Box::new(h.clone()))?;
            Ok(h)
        };
        Ok(Self {
            running: gauge("num_requests_running", "Requests in the running batch.")?,
            waiting: gauge("num_requests_waiting", "Requests waiting to be scheduled.")?,
            swapped: gauge("num_requests_swapped", "Requests preempted to host memory.")?,
            kv_blocks_used: gauge("kv_blocks_used", "Device KV-cache blocks in use.")?,
            kv_blocks_total: gauge("kv_blocks_total", "Device KV-cache blocks in the pool.")?,
            prompt_tokens: counter("prompt_tokens_total", "Prompt tokens of admitted requests.")?,
            generation_tokens: counter("generation_tokens_total", "Tokens generated.")?,
            requests_finished: counter("requests_finished_total", "Requests finished or aborted.")?,
            preemptions: counter("num_preemptions_total", "Sequence groups preempted (swap or recompute).")?,
            ttft: histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.")?,
            tpot: histogram("time_per_output_token_seconds", "Time between two tokens of a sequence.")?,
            e2e: histogram("e2e_request_latency_seconds", "Time from arrival to the request's end.")?,
            registry,
        })
    }

    /// Sets the queue and KV-pool gauges.
    pub fn set_load(&self, load: &EngineLoad) {
        self.waiting.set(load.waiting as i64);
        self.running.set(load.running as i64);
        self.swapped.set(load.swapped as i64);
        self.kv_blocks_used.set(load.kv_blocks_used as i64);
        self.kv_blocks_total.set(load.kv_blocks_total as i64);
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
