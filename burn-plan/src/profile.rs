//! The cost profile every planner can take: what a model's layers cost on one device, as the
//! Burn profiler (`burn_parallel::profiler`, `burn-llm plan profile`) measures and writes it.
//!
//! ```json
//! {
//!   "version": 2, "model": "SmolLM2-135M", "device": "flex",
//!   "layers": 30,
//!   "prefill": {"batch": [1, 4], "tokens": [1, 16, 64, 256],
//!               "base_ms": [[0.2, 0.3, 0.6, 2.0], [0.4, 0.9, 2.1, 7.5]],
//!               "context_ms": [0.01, 0.0, 0.0001, 0.00001]},
//!   "decode": {"batch": [1, 8, 32], "context": [16, 256, 1024],
//!              "ms": [[0.2, 0.21, 0.25], [0.22, 0.26, 0.4], [0.3, 0.45, 0.9]]},
//!   "weight_bytes_per_layer": 7077888, "kv_bytes_per_token_per_layer": 1152,
//!   "embedding": {"weight_bytes": 28311552, "ms_per_token": 0.0001},
//!   "lm_head": {"weight_bytes": 28311552, "ms_per_token": 0.05},
//!   "tensor_parallel": [{"degree": 2, "time_scale": 0.55, "sync_ms_per_layer": 0.02}],
//!   "engine_step_ms": {
//!     "prefill": {"batch": [1, 2, 4], "tokens": [16, 64], "ms": [[40, 70], [60, 120], [95, 230]]},
//!     "decode": {"batch": [1, 2, 3, 4, 8], "context": [16, 64],
//!                "ms": [[30, 31], [88, 90], [92, 94], [95, 97], [108, 111]]}
//!   },
//!   "step_variation": {"prefill": 0.071, "decode": 0.024,
//!                      "runs": {"decode_steps": 4, "prefill": {"mean": 0.01, "std": 0.03},
//!                               "decode": {"mean": 0.004, "std": 0.01}}}
//! }
//! ```
//!
//! All times are for **one layer** in milliseconds:
//! - `prefill`: TeraPipe's `t_fwd(i, j) = t_fwd(i, 0) + t_ctx(i, j)` (Eq. 2.9). `base_ms[b][t]` is
//!   the time of a prefill of `batch[b]` sequences of `tokens[t]` tokens each with no context
//!   (tabulated; between token counts it is read through quadratics of three neighbouring
//!   points, exact for a layer's `c + a·i + b·i²` where the chord overstates every length between
//!   two points);
//!   `context_ms = [a0, a1, a2, a3]` is the fitted per-sequence context overhead
//!   `t_ctx(i, j) = a0 + a1·i + a2·j + a3·i·j`, added (times the batch) when `j > 0`.
//! - `decode`: `ms[b][c]`, one decode step of `batch[b]` sequences whose context is
//!   `context[c]` tokens (tabulated).
//! - `call_ms` (optional; absent means 0) is the one cost that is **not** per layer: what one
//!   pass through a stage costs on this device beyond its layers (issuing the work and the
//!   synchronisation that ends it, a network round trip on a remote worker). The profiler times
//!   several consecutive layers between two synchronisations, as a stage runs them, and separates
//!   this fixed part from the per-layer figures, so a stage of `n` layers costs `n ·` (per-layer)
//!   `+ call_ms`.
//! - `embedding.ms_per_token` is paid per input token, `lm_head.ms_per_token` per sequence and step
//!   (one row of logits). Their weights are outside the per-layer figures.
//! - `tensor_parallel`: at `degree` d a layer takes `time_scale ·` its one-device time `+
//!   sync_ms_per_layer`, and its weights and KV are split over the d devices.
//! - `engine_step` (optional; absent means zero): what one step of the serving engine costs
//!   beyond the model's layers, embedding and head as the tables above predict them — scheduling,
//!   block tables, host round trips, sampling, and whatever the engine's attention path costs
//!   beyond the profiled one. Fitted to timed steps of the paged engine
//!   ([`EngineStep`]); a step of `b` sequences pays `prefill_ms_fixed + prefill_ms_per_seq·b +
//!   prefill_ms_per_token·(new tokens)` when it prefills and `decode_ms_fixed +
//!   decode_ms_per_seq·b` when it decodes. These are **whole-model** times, not per layer.
//!   Superseded by `engine_step_ms` where a profile has both; still read from older profiles.
//! - `engine_step_ms` (optional): the serving engine's **measured** step latency, whole model, as
//!   ExeGPT profiles it (§6: latency by batch size and sequence length, interpolated between the
//!   measured points). `prefill.ms[b][t]`: one prefill step of `batch[b]` prompts of `tokens[t]`
//!   tokens each; `decode.ms[b][c]`: one decode step of `batch[b]` sequences with `context[c]`
//!   tokens cached. On one device, the simulator takes a step's time from these tables as is;
//!   in a pipeline, the part the layer tables do not predict (`ms` − the model's compute, at
//!   least 0) is paid on the first stage, like `engine_step`. An engine's step time need not grow
//!   in proportion to its batch (a CPU matmul that switches kernels between one row and two can
//!   make batch 2 cost several times batch 1), so these tables are only made non-decreasing in
//!   the batch (a running maximum), not held to a falling time per sequence.
//! - `step_variation` (optional; absent means 0): how far above its median a serving-engine step
//!   runs at the 99th percentile, as a fraction of the median, for prefill and decode steps
//!   (ExeGPT §7.9 and its Table 7: "the 99th percentile ranges of encoder/decoder's single stage
//!   execution times", ±7.1% and ±2.4% there). The profiler pools, over every timed run of a
//!   point, the run's mean step over the point's median step: a prefill run is one step, a decode
//!   run the consecutive steps a request decodes, whose latency sums them. ExeGPT "consider[s] this variance when determining control
//!   variables to satisfy latency constraints". `runs` (optional) adds the mean and standard
//!   deviation of those ratios (minus 1) and the decode steps per run ([`RunSpread`]). The
//!   schedule planner's latency sums many steps: with `runs` it takes that sum at its percentile
//!   as the central limit theorem gives it (mean excess plus `z_p` standard deviations of the
//!   sum, never more than every step at its 99th percentile); without, every step at its 99th
//!   percentile ([`StepVariation`]). Throughput, an average, takes the medians.
//!
//! Tables are interpolated piecewise-linearly (held constant below the first point, extended with
//! the last segment's slope beyond the last), except `prefill.base_ms` along its tokens, which is
//! read through quadratics as said above (beyond the last point the last three points' quadratic,
//! never below the last segment's line). Along the batch axis a table is read as
//! non-decreasing, with a time per sequence that never grows with the batch (a running maximum,
//! then a running minimum of the per-sequence time): measurement noise cannot make a larger batch
//! cheaper or a smaller one more efficient, which is the monotonicity ExeGPT's search relies on
//! (§5.1).

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};

mod grid;

use grid::{Along, Grid, Shape};

/// The profile format this crate writes. Version 2 times `engine_step_ms`' prefill steps over
/// distinct prompts with the prefix cache off; version 1's batches repeated one prompt, which the
/// paged engine's prefix cache computed once, so their batched prefills read far too cheap. A
/// version-1 profile is read only without `engine_step_ms`.
pub const PROFILE_VERSION: u32 = 2;

/// Largest axis a profile table may have.
pub(super) const MAX_POINTS: usize = 4096;

/// A model's measured costs on one device (see the module docs for the JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Format version: [`PROFILE_VERSION`] (1 where the JSON has none).
    #[serde(default = "version_one")]
    pub version: u32,
    /// Model the profile was measured on (informative).
    #[serde(default)]
    pub model: Option<String>,
    /// Device the profile was measured on (informative).
    #[serde(default)]
    pub device: Option<String>,
    /// Transformer layers of the model.
    pub layers: usize,
    /// Prefill cost of one layer.
    pub prefill: PrefillTable,
    /// Decode cost of one layer.
    pub decode: DecodeTable,
    /// Weight bytes of one layer.
    pub weight_bytes_per_layer: u64,
    /// KV-cache bytes one token occupies in one layer.
    pub kv_bytes_per_token_per_layer: u64,
    /// Token embedding.
    pub embedding: Extra,
    /// Output projection to the vocabulary.
    pub lm_head: Extra,
    /// Tensor-parallel degrees the model can run at (none: one device per layer).
    #[serde(default)]
    pub tensor_parallel: Vec<TpScaling>,
    /// Per-step cost of the serving engine beyond the model's compute (absent: none measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_step: Option<EngineStep>,
    /// The serving engine's measured step latency by batch and length (absent: not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_step_ms: Option<EngineStepTable>,
    /// How far the engine's steps run above their median (absent: not measured, taken as 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_variation: Option<StepVariation>,
    /// Fixed cost of one pass through a stage on this device, beyond its layers' times, in ms:
    /// issuing the work and the one synchronisation (a round trip to a worker) that ends it. A
    /// stage of `n` layers takes `n ·` (per-layer time) `+ call_ms` (absent: 0, not measured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub call_ms: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn version_one() -> u32 {
    1
}

/// Prefill time of one layer: tabulated without context, fitted context overhead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillTable {
    /// Batch sizes measured (strictly increasing, ≥ 1).
    pub batch: Vec<f64>,
    /// Tokens per sequence measured (strictly increasing, ≥ 1).
    pub tokens: Vec<f64>,
    /// `base_ms[b][t]`: time for `batch[b]` sequences of `tokens[t]` tokens, no context.
    pub base_ms: Vec<Vec<f64>>,
    /// `[a0, a1, a2, a3]` of `t_ctx(i, j) = a0 + a1·i + a2·j + a3·i·j` per sequence (all ≥ 0).
    pub context_ms: [f64; 4],
}

/// Decode-step time of one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeTable {
    /// Batch sizes measured (strictly increasing, ≥ 1).
    pub batch: Vec<f64>,
    /// Context lengths measured (strictly increasing, ≥ 0).
    pub context: Vec<f64>,
    /// `ms[b][c]`: one step of `batch[b]` sequences with `context[c]` tokens of context.
    pub ms: Vec<Vec<f64>>,
}

/// Embedding or LM head: weights and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extra {
    /// Weight bytes.
    pub weight_bytes: u64,
    /// Milliseconds per token it processes.
    pub ms_per_token: f64,
}

/// How one tensor-parallel degree changes a layer's time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpScaling {
    /// Devices a layer is split over (≥ 2).
    pub degree: usize,
    /// Fraction of the one-device time the split layer's compute takes.
    pub time_scale: f64,
    /// Synchronisation (all-reduce) time per layer and step.
    pub sync_ms_per_layer: f64,
}

/// What one engine step costs beyond the model's compute, in milliseconds for the whole model
/// (see the module docs). Every coefficient is ≥ 0.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStep {
    /// Fixed cost of a prefill step.
    pub prefill_ms_fixed: f64,
    /// Cost per sequence a prefill step prefills.
    pub prefill_ms_per_seq: f64,
    /// Cost per prompt token a prefill step computes.
    #[serde(default)]
    pub prefill_ms_per_token: f64,
    /// Fixed cost of a decode step.
    pub decode_ms_fixed: f64,
    /// Cost per sequence a decode step advances.
    pub decode_ms_per_seq: f64,
}

impl EngineStep {
    /// Overhead of a prefill step of `batch` sequences of `tokens` new tokens each.
    pub fn prefill_ms(&self, batch: f64, tokens: f64) -> f64 {
        self.prefill_ms_fixed + batch * (self.prefill_ms_per_seq + tokens * self.prefill_ms_per_token)
    }

    /// Overhead of a decode step of `batch` sequences.
    pub fn decode_ms(&self, batch: f64) -> f64 {
        self.decode_ms_fixed + batch * self.decode_ms_per_seq
    }
}

/// How far above its median an engine step's time runs at the 99th percentile, as a fraction
/// of the median (ExeGPT §7.9; see the module docs): a step whose median is `t` is taken to last
/// `t·(1 + prefill)` or `t·(1 + decode)` when a latency bound must hold, unless `runs` says how
/// the steps spread, so that a latency summing many of them can count their spread as a sum's.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepVariation {
    /// Prefill (encoder) steps.
    pub prefill: f64,
    /// Decode steps.
    pub decode: f64,
    /// Mean and standard deviation of the timed runs (optional; absent: every step of a latency
    /// counts at the 99th percentile above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<RunSpread>,
}

/// How the profiler's timed runs spread around their points' medians (the profile's
/// `step_variation.runs`): a prefill run is one step, a decode run `decode_steps` consecutive
/// steps. A latency that sums `m` independent runs of median time `t` each has mean
/// `m·t·(1 + mean)` and standard deviation `√m·t·std` (the central limit theorem), so its
/// percentile margin shrinks as `1/√m` where the 99th percentile of one run would not.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpread {
    /// Decode steps per timed decode run.
    pub decode_steps: usize,
    /// Prefill runs (one step each).
    pub prefill: Spread,
    /// Decode runs (their mean step).
    pub decode: Spread,
}

/// A run's time over its point's median, minus 1: the mean (at least 0) and the standard
/// deviation of that fraction over the timed runs.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// Mean excess over the median (a right-skewed step time runs above its median on average).
    pub mean: f64,
    /// Standard deviation.
    pub std: f64,
}

impl StepVariation {
    /// Largest variation a profile may give (a step at 11× its median); the profiler caps what it
    /// measures here.
    pub const MAX: f64 = 10.0;

    /// Checks every fraction (finite, 0 to 10) and the run length; `field` names the object in
    /// errors.
    pub fn check(&self, field: &str) -> Result<Self, InputError> {
        let mut values = vec![("prefill", self.prefill), ("decode", self.decode)];
        if let Some(runs) = &self.runs {
            check::count(&format!("{field}.runs.decode_steps"), runs.decode_steps, 1 << 16)?;
            values.extend([
                ("runs.prefill.mean", runs.prefill.mean),
                ("runs.prefill.std", runs.prefill.std),
                ("runs.decode.mean", runs.decode.mean),
                ("runs.decode.std", runs.decode.std),
            ]);
        }
        for (name, v) in values {
            let name = format!("{field}.{name}");
            check::non_negative(&name, v)?;
            if v > Self::MAX {
                return Err(InputError::new(
                    name,
                    format!(
                        "{v} would put a step at {}× its median; give a fraction between 0 and {}",
                        v + 1.0,
                        Self::MAX
                    ),
                ));
            }
        }
        Ok(*self)
    }
}

/// The serving engine's measured step latency in milliseconds, whole model (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStepTable {
    /// Prefill steps by batch and prompt length.
    pub prefill: PrefillStepTable,
    /// Decode steps by batch and context: the same layout as the per-layer [`DecodeTable`].
    pub decode: DecodeTable,
}

/// Measured prefill steps of the serving engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillStepTable {
    /// Prompts per step measured (strictly increasing, ≥ 1).
    pub batch: Vec<f64>,
    /// Tokens per prompt measured (strictly increasing, ≥ 1).
    pub tokens: Vec<f64>,
    /// `ms[b][t]`: one step prefilling `batch[b]` prompts of `tokens[t]` tokens each.
    pub ms: Vec<Vec<f64>>,
}

/// A checked profile with its tables ready to read.
#[derive(Debug, Clone)]
pub struct CostModel {
    profile: Profile,
    prefill: Grid,
    decode: Grid,
    /// `engine_step_ms`: measured whole steps, and what of them the layer tables do not predict.
    engine: Option<EngineGrids>,
}

/// The measured step tables of `engine_step_ms` and the overhead they imply.
#[derive(Debug, Clone)]
struct EngineGrids {
    prefill: Grid,
    decode: Grid,
    /// `max(0, measured − compute)` at the prefill table's points.
    prefill_overhead: Grid,
    /// `max(0, measured − compute)` at the decode table's points.
    decode_overhead: Grid,
}

impl Profile {
    /// Checks every field (`field` prefixes the names in errors) and builds the cost model.
    pub fn cost_model(&self, field: &str) -> Result<CostModel, InputError> {
        let f = |name: &str| format!("{field}.{name}");
        if !(1..=PROFILE_VERSION).contains(&self.version) {
            return Err(InputError::new(
                f("version"),
                format!(
                    "version {} is not supported; this planner reads versions 1 to {PROFILE_VERSION}",
                    self.version
                ),
            ));
        }
        if self.version == 1 && self.engine_step_ms.is_some() {
            return Err(InputError::new(
                f("engine_step_ms"),
                "was timed by a version-1 profiler, whose batched prefill steps repeated one prompt that the \
                 prefix cache computed once, so they read too cheap; delete the profile so that it is measured \
                 again (or drop engine_step_ms from it)",
            ));
        }
        check::count(&f("layers"), self.layers, 1 << 20)?;
        let prefill = Grid::new(
            &f("prefill"),
            ("batch", &self.prefill.batch, 1.0),
            ("tokens", &self.prefill.tokens, 1.0),
            ("base_ms", &self.prefill.base_ms),
            Shape::Sublinear,
        )?
        .along(Along::Quadratic);
        for (i, &a) in self.prefill.context_ms.iter().enumerate() {
            check::non_negative(&f(&format!("prefill.context_ms[{i}]")), a)?;
        }
        let decode = Grid::new(
            &f("decode"),
            ("batch", &self.decode.batch, 1.0),
            ("context", &self.decode.context, 0.0),
            ("ms", &self.decode.ms),
            Shape::Sublinear,
        )?;
        check::non_negative(&f("call_ms"), self.call_ms)?;
        check::non_negative(&f("embedding.ms_per_token"), self.embedding.ms_per_token)?;
        check::non_negative(&f("lm_head.ms_per_token"), self.lm_head.ms_per_token)?;
        if self.tensor_parallel.len() > 64 {
            return Err(InputError::new(f("tensor_parallel"), "lists more than 64 degrees"));
        }
        for (i, tp) in self.tensor_parallel.iter().enumerate() {
            let name = f(&format!("tensor_parallel[{i}]"));
            if tp.degree < 2 || tp.degree > 1 << 16 {
                return Err(InputError::new(format!("{name}.degree"), "must be between 2 and 65536"));
            }
            if self.tensor_parallel[..i].iter().any(|o| o.degree == tp.degree) {
                return Err(InputError::new(format!("{name}.degree"), format!("degree {} is listed twice", tp.degree)));
            }
            check::positive(&format!("{name}.time_scale"), tp.time_scale)?;
            check::non_negative(&format!("{name}.sync_ms_per_layer"), tp.sync_ms_per_layer)?;
        }
        if let Some(step) = &self.engine_step {
            let values = [
                ("prefill_ms_fixed", step.prefill_ms_fixed),
                ("prefill_ms_per_seq", step.prefill_ms_per_seq),
                ("prefill_ms_per_token", step.prefill_ms_per_token),
                ("decode_ms_fixed", step.decode_ms_fixed),
                ("decode_ms_per_seq", step.decode_ms_per_seq),
            ];
            for (name, v) in values {
                check::non_negative(&f(&format!("engine_step.{name}")), v)?;
            }
        }
        if let Some(v) = &self.step_variation {
            v.check(&f("step_variation"))?;
        }
        let mut cost = CostModel { profile: self.clone(), prefill, decode, engine: None };
        if let Some(table) = &self.engine_step_ms {
            let prefill = Grid::new(
                &f("engine_step_ms.prefill"),
                ("batch", &table.prefill.batch, 1.0),
                ("tokens", &table.prefill.tokens, 1.0),
                ("ms", &table.prefill.ms),
                Shape::NonDecreasing,
            )?;
            let decode = Grid::new(
                &f("engine_step_ms.decode"),
                ("batch", &table.decode.batch, 1.0),
                ("context", &table.decode.context, 0.0),
                ("ms", &table.decode.ms),
                Shape::NonDecreasing,
            )?;
            let prefill_overhead = prefill.minus(|b, t| cost.prefill_compute_ms(b, t));
            let decode_overhead = decode.minus(|b, c| cost.decode_compute_ms(b, c));
            cost.engine = Some(EngineGrids { prefill, decode, prefill_overhead, decode_overhead });
        }
        Ok(cost)
    }
}

impl CostModel {
    /// The profile this model reads.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// One layer's prefill of `batch` sequences, each a slice of `tokens` tokens after
    /// `context` tokens of context (TeraPipe's `t_fwd(i, j)` for a batch).
    pub fn prefill_layer_ms(&self, batch: f64, tokens: f64, context: f64) -> f64 {
        let base = self.prefill.eval(batch, tokens);
        if context > 0.0 {
            let [a0, a1, a2, a3] = self.profile.prefill.context_ms;
            base + batch * (a0 + a1 * tokens + a2 * context + a3 * tokens * context)
        } else {
            base
        }
    }

    /// One layer's decode step of `batch` sequences with `context` tokens of context.
    pub fn decode_layer_ms(&self, batch: f64, context: f64) -> f64 {
        self.decode.eval(batch, context)
    }

    /// The engine's linear per-step overhead (zero when the profile has none).
    pub fn engine_step(&self) -> EngineStep {
        self.profile.engine_step.unwrap_or_default()
    }

    /// Whether the profile has measured engine steps (`engine_step_ms`).
    pub fn has_engine_table(&self) -> bool {
        self.engine.is_some()
    }

    /// One engine prefill step of `batch` prompts of `tokens` tokens on one device: the measured
    /// table where the profile has one, else the model's compute plus the linear overhead.
    pub fn prefill_step_ms(&self, batch: f64, tokens: f64) -> f64 {
        match &self.engine {
            Some(e) => e.prefill.eval(batch, tokens),
            None => self.prefill_compute_ms(batch, tokens) + self.engine_step().prefill_ms(batch, tokens),
        }
    }

    /// One engine decode step of `batch` sequences with `context` cached tokens on one device
    /// (as [`Self::prefill_step_ms`]).
    pub fn decode_step_ms(&self, batch: f64, context: f64) -> f64 {
        match &self.engine {
            Some(e) => e.decode.eval(batch, context),
            None => self.decode_compute_ms(batch, context) + self.engine_step().decode_ms(batch),
        }
    }

    /// What a prefill step costs beyond the model's compute, paid by a pipeline's first stage:
    /// from `engine_step_ms` where the profile has it, else `engine_step`.
    pub fn prefill_overhead_ms(&self, batch: f64, tokens: f64) -> f64 {
        match &self.engine {
            Some(e) => e.prefill_overhead.eval(batch, tokens),
            None => self.engine_step().prefill_ms(batch, tokens),
        }
    }

    /// What a decode step costs beyond the model's compute (as [`Self::prefill_overhead_ms`]).
    pub fn decode_overhead_ms(&self, batch: f64, context: f64) -> f64 {
        match &self.engine {
            Some(e) => e.decode_overhead.eval(batch, context),
            None => self.engine_step().decode_ms(batch),
        }
    }

    /// Whether the engine's step times, read at prompt lengths `tokens` and decode context
    /// `context`, never cost more per sequence at a larger batch (always so without
    /// `engine_step_ms`; the layer tables are read that way). ExeGPT's search bounds throughput
    /// more tightly when they do.
    pub fn engine_sublinear(&self, tokens: &[f64], context: f64) -> bool {
        let Some(e) = &self.engine else { return true };
        tokens.iter().all(|&t| e.prefill.sublinear_at(t) && e.prefill_overhead.sublinear_at(t))
            && e.decode.sublinear_at(context)
            && e.decode_overhead.sublinear_at(context)
    }

    /// The model's compute for one prefill step on one device, as the tables predict it (no
    /// engine overhead): every layer over `batch` sequences of `tokens` tokens, their embedding,
    /// and one row of logits per sequence.
    pub fn prefill_compute_ms(&self, batch: f64, tokens: f64) -> f64 {
        let p = &self.profile;
        p.layers as f64 * self.prefill_layer_ms(batch, tokens, 0.0)
            + batch * (tokens * p.embedding.ms_per_token + p.lm_head.ms_per_token)
    }

    /// The model's compute for one decode step of `batch` sequences with `context` tokens of
    /// context on one device (no engine overhead).
    pub fn decode_compute_ms(&self, batch: f64, context: f64) -> f64 {
        let p = &self.profile;
        p.layers as f64 * self.decode_layer_ms(batch, context)
            + batch * (p.embedding.ms_per_token + p.lm_head.ms_per_token)
    }

    /// The scaling at tensor-parallel `degree` (degree 1: identity).
    pub fn tensor_parallel(&self, degree: usize) -> Option<TpScaling> {
        if degree == 1 {
            return Some(TpScaling { degree: 1, time_scale: 1.0, sync_ms_per_layer: 0.0 });
        }
        self.profile.tensor_parallel.iter().find(|t| t.degree == degree).cloned()
    }
}
