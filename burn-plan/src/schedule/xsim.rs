//! XSimulator (ExeGPT §6): throughput, latency and memory of one configuration from the profile
//! and the length distributions.
//!
//! Decoder-only: a query's prefill emits its first token, so an output of `S` tokens needs `S − 1`
//! decode iterations. Timelines use the [simulator's](crate::sim) flow-shop rule in closed
//! form ([`fill`], [`cyclic`]). On one device a step costs what the profile's measured engine
//! steps say; in a pipeline the first stage also pays what the layer tables do not predict
//! ([`CostModel::prefill_overhead_ms`]). RRA's throughput is the paged engine's schedule
//! [replayed](super::replay) step by step, on one device and over a pipeline's virtual engines.
//!
//! The derivation (RRA and WAA formulas, the RRA decode batch by Little's law where §6 sums
//! `P_D(U)` over arriving queries, §5.2's adjusted cycle, the prompt tail, the step variation by
//! the central limit theorem, memory per device) and why each stays monotone for the
//! branch-and-bound search is in `docs/planners.md` ("The XSimulator").

use std::cell::RefCell;
use std::collections::HashMap;

use crate::interference::Interference;
use crate::profile::{CostModel, StepVariation, TpScaling};

use super::BatchInterference;
use super::lengths::{Lengths, normal_quantile};
use super::replay::{EngineKappa, Engines, Replay};

/// A pipeline: `tp_groups` tensor-parallel stages of `degree` devices, then `plain` one-device
/// stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Pipe {
    pub plain: usize,
    pub tp_groups: usize,
    pub degree: usize,
}

impl Pipe {
    pub fn stages(&self) -> usize {
        self.plain + self.tp_groups
    }
}

/// What the simulator predicts for one configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Perf {
    /// Queries per second.
    pub throughput_qps: f64,
    /// Latency of the percentile-length output, in seconds.
    pub latency_s: f64,
    /// Whether every device's memory holds.
    pub fits: bool,
}

impl Perf {
    /// Whether `self` is a better plan than `other`: more throughput, or as much with less
    /// latency (a plan further inside its bound, for the same work). Both searches and the choice
    /// between spaces use it, so they agree on ties.
    pub fn better_than(&self, other: &Perf) -> bool {
        self.throughput_qps > other.throughput_qps
            || (self.throughput_qps == other.throughput_qps && self.latency_s < other.latency_s)
    }
}

/// One pipeline's engine steps: the stage times of a prefill of `n` queries at `prefill[n − 1]`,
/// of a decode step of `b` sequences at `decode[b − 1]`.
#[derive(Debug, Default)]
struct StepTables {
    prefill: Vec<Vec<f64>>,
    decode: Vec<Vec<f64>>,
}

/// The simulator's fixed inputs.
pub(crate) struct XSim {
    cost: CostModel,
    input: Lengths,
    output: Lengths,
    cap: f64,
    /// Largest decode batch the engine runs.
    max_decode_batch: f64,
    /// Output length whose latency is bounded (the percentile).
    pub target_len: usize,
    /// `z_p·σ_E` of the prompt tail (tokens).
    prompt_spread: f64,
    /// `S_E,p − S̄_E`, at least 0 (tokens).
    prompt_excess: f64,
    /// Marginal prefill cost of a prompt token at batch 1 (ms).
    token_ms: f64,
    layers: f64,
    mean_in: f64,
    mean_out: f64,
    /// Mean decode context, where decode steps are read.
    context: f64,
    /// How steps vary (module docs, "Step variation").
    variation: StepVariation,
    /// `z_p` of the latency percentile, at least 0.
    z: f64,
    /// Whether no step costs more per query at a larger batch ([`CostModel::engine_sublinear`]):
    /// then throughput grows with the encode batch and the search's bounds can use it.
    sublinear: bool,
    /// `Σ_U P_D(U)` by `N_D`, as computed so far (the search asks for the same values often).
    completion: RefCell<HashMap<usize, f64>>,
    /// The engine's schedule replayed on a sample of output lengths (RRA's throughput).
    replay: Replay,
    /// Each pipeline's stage times of prefill steps of `1, 2, …` queries and of decode steps of
    /// `1, 2, …` sequences, as computed so far ([`XSim::with_engine_steps`]; every replay of the
    /// search reads them).
    engine_steps: RefCell<HashMap<Pipe, StepTables>>,
    /// `κ`: how much devices working at once slow each other down (`ScheduleInput::interference`).
    interference: f64,
    /// RRA's engines' `κ` by their decode batch (`ScheduleInput::interference_at_batch`).
    engine_kappa: EngineKappa,
    /// `κ` between WAA's encoding and decoding devices (`ScheduleInput::waa_interference`;
    /// `None`: `interference`).
    waa_interference: Option<f64>,
    /// The layers of each stage of the decoding devices' pipeline, where they run a fixed split
    /// (`ScheduleInput::stage_layers`).
    layout: Option<Vec<f64>>,
}

/// `m` (a whole number) equal micro-batches through stages taking `t` each alone, interfering by
/// `kappa`: the last leaves at this time ([`Interference::pipelined_ms`]).
pub(crate) fn fill(t: &[f64], m: f64, kappa: f64) -> f64 {
    Interference::pipelined_ms(t, m as usize, kappa)
}

/// `m` micro-batches cycling through stages taking `t` each alone, interfering by `kappa`: the
/// steady-state period.
pub(crate) fn cyclic(t: &[f64], m: f64, kappa: f64) -> f64 {
    (m * Interference::interval_ms(t, kappa)).max(t.iter().sum())
}

/// The layers each of `stages` stages holds: `layout` where it lists that many stages and none
/// is tensor-parallel (a fixed split the devices run, [`XSim::with_stage_layers`]), otherwise
/// equal shares of `layers`.
fn stage_shares(layers: f64, stages: usize, tp_groups: usize, layout: Option<&[f64]>) -> Vec<f64> {
    let p = stages.max(1);
    match layout {
        Some(layout) if layout.len() == p && tp_groups == 0 => layout.to_vec(),
        _ => vec![layers / p as f64; p],
    }
}

/// Stage times (ms) of stages holding `shares` layers each, the first `tp_groups`
/// tensor-parallel: a layer takes `layer_ms.0` (`layer_ms.1` in a tensor-parallel stage); the
/// first stage has `first` extra, the last `last`.
fn split_stages(shares: &[f64], tp_groups: usize, layer_ms: (f64, f64), first: f64, last: f64) -> Vec<f64> {
    let mut t: Vec<f64> =
        shares.iter().enumerate().map(|(k, n)| n * if k < tp_groups { layer_ms.1 } else { layer_ms.0 }).collect();
    t[0] += first;
    let p = t.len();
    t[p - 1] += last;
    t
}

/// One decode step of `batch` sequences at `context` as pipeline stages see it: a layer's time,
/// the first stage's extra (the embedding and the engine's per-step overhead, which the step's
/// launch carries) and the last's (the LM head), ms.
pub(super) fn decode_parts(cost: &CostModel, batch: f64, context: f64) -> (f64, f64, f64) {
    let prof = cost.profile();
    (
        cost.decode_layer_ms(batch, context),
        batch * prof.embedding.ms_per_token + cost.decode_overhead_ms(batch, context),
        batch * prof.lm_head.ms_per_token,
    )
}

/// The planner's stage times (ms) of one decode step of `batch` sequences at `context` over
/// pipeline stages holding `stage_layers` layers each, no tensor parallelism: the times its
/// decode iterations over a pipeline are priced from
/// ([`crate::interference::Interference::kappa_of_cycle`] solves a measured cycle for `κ` against
/// them).
pub fn decode_stage_ms(cost: &CostModel, stage_layers: &[usize], batch: f64, context: f64) -> Vec<f64> {
    let (layer_ms, first, last) = decode_parts(cost, batch, context);
    let shares: Vec<f64> = stage_layers.iter().map(|&n| n as f64).collect();
    let shares = if shares.is_empty() { vec![cost.profile().layers as f64] } else { shares };
    split_stages(&shares, 0, (layer_ms, layer_ms), first, last)
}

impl XSim {
    pub fn new(
        cost: CostModel,
        input: Lengths,
        output: Lengths,
        cap: u64,
        max_decode_batch: Option<usize>,
        percentile: f64,
        variation: StepVariation,
    ) -> Self {
        let target_len = output.percentile(percentile);
        let context = input.mean() + output.mean() / 2.0;
        let prompts: Vec<f64> = input.points().iter().map(|&(s, _)| s as f64).collect();
        let mean_in = input.mean();
        let prompt_excess = (input.percentile(percentile) as f64 - mean_in).max(0.0);
        let step = prompt_excess.max(1.0);
        let token_ms =
            ((cost.prefill_step_ms(1.0, mean_in + step) - cost.prefill_step_ms(1.0, mean_in)) / step).max(0.0);
        Self {
            prompt_spread: (normal_quantile(percentile / 100.0) * input.std()).max(0.0),
            prompt_excess,
            token_ms,
            max_decode_batch: max_decode_batch.map_or(f64::INFINITY, |b| b as f64 + 1e-9),
            layers: cost.profile().layers as f64,
            mean_in: input.mean(),
            mean_out: output.mean(),
            context,
            variation,
            z: normal_quantile(percentile / 100.0).max(0.0),
            sublinear: cost.engine_sublinear(&prompts, context),
            replay: Replay::new(&output),
            engine_steps: RefCell::default(),
            interference: 0.0,
            engine_kappa: EngineKappa::default(),
            waa_interference: None,
            layout: None,
            cost,
            input,
            output,
            cap: cap as f64,
            target_len,
            completion: RefCell::default(),
        }
    }

    /// WAA's decode batch for encode batch `b_e`: `B_E·(S̄_D − 1)`.
    pub fn waa_decode_batch(&self, b_e: f64) -> f64 {
        b_e * (self.mean_out - 1.0)
    }

    /// `Σ_U P_D(U)`: the chance that a query in the decode batch completes within one phase of
    /// `n_d` iterations (§6), over the batch's steady-state lengths: `1 / E[k]` with `k` the
    /// phases a query stays (module docs; a query of `S` tokens needs `S − 1` iterations, and one
    /// that needs none is counted as one phase). Non-decreasing in `n_d`.
    pub fn completion(&self, n_d: usize) -> f64 {
        *self.completion.borrow_mut().entry(n_d).or_insert_with(|| {
            1.0 / self.output.points().iter().map(|&(s, p)| p * phases(s, n_d).max(1) as f64).sum::<f64>()
        })
    }

    /// The simulator with devices that slow each other down by `kappa` when they work at once
    /// (pipeline stages on different micro-batches, WAA's encoder beside its decoder), and RRA's
    /// engines over a pipeline by `at_batch`'s `κ` when each decodes its batch
    /// ([`super::ScheduleInput::interference_at_batch`]).
    pub fn with_interference(mut self, kappa: f64, at_batch: Option<BatchInterference>) -> Self {
        self.interference = kappa.max(0.0);
        self.engine_kappa = EngineKappa { one: self.interference, at: at_batch };
        self
    }

    /// The simulator with WAA's encoding and decoding devices slowing each other down by `kappa`
    /// (`None`: by [`XSim::with_interference`]'s).
    pub fn with_waa_interference(mut self, kappa: Option<f64>) -> Self {
        self.waa_interference = kappa.map(|k| k.max(0.0));
        self
    }

    /// The simulator with the decoding devices' pipeline of `stage_layers.len()` stages holding
    /// that many layers each, as the devices run it (other pipelines keep equal shares).
    pub fn with_stage_layers(mut self, stage_layers: Option<&[usize]>) -> Self {
        self.layout = stage_layers.map(|l| l.iter().map(|&n| n as f64).collect());
        self
    }

    /// The layers each stage of `pipe` holds.
    fn shares(&self, pipe: &Pipe) -> Vec<f64> {
        stage_shares(self.layers, pipe.stages(), pipe.tp_groups, self.layout.as_deref())
    }

    /// Tensor-parallel scaling of a pipe (identity without tensor parallelism).
    fn scaling(&self, pipe: &Pipe) -> TpScaling {
        self.cost.tensor_parallel(pipe.degree).unwrap_or(TpScaling {
            degree: 1,
            time_scale: 1.0,
            sync_ms_per_layer: 0.0,
        })
    }

    /// Stage times (ms) of a pass whose per-layer time is `layer_ms`, with `first`/`last` extra
    /// (the first stage launches the step: embedding and engine overhead; the last holds the head).
    fn stage_times(&self, pipe: &Pipe, layer_ms: f64, first: f64, last: f64) -> Vec<f64> {
        let tp = self.scaling(pipe);
        let tp_layer_ms = tp.time_scale * layer_ms + tp.sync_ms_per_layer;
        split_stages(&self.shares(pipe), pipe.tp_groups, (layer_ms, tp_layer_ms), first, last)
    }

    /// Whether every device of `pipe` holds its weights and the KV of `kv_tokens` tokens.
    fn fits(&self, pipe: &Pipe, kv_tokens: f64) -> bool {
        let prof = self.cost.profile();
        let p = pipe.stages();
        let per_layer = prof.weight_bytes_per_layer as f64 + kv_tokens * prof.kv_bytes_per_token_per_layer as f64;
        let shares = self.shares(pipe);
        (0..p).all(|k| {
            let degree = if k < pipe.tp_groups { pipe.degree as f64 } else { 1.0 };
            let mut bytes = shares[k] * per_layer / degree;
            if k == 0 {
                bytes += prof.embedding.weight_bytes as f64;
            }
            if k == p - 1 {
                bytes += prof.lm_head.weight_bytes as f64;
            }
            bytes <= self.cap
        })
    }

    /// `f(s)` expected over the input lengths `s`.
    fn over_inputs(&self, f: impl Fn(f64) -> f64) -> f64 {
        self.input.points().iter().map(|&(s, p)| p * f(s as f64)).sum()
    }

    /// `X` of the module docs: the extra prefill time of a query at the latency percentile whose
    /// prefills hold `prompts` prompts.
    fn prompt_tail_ms(&self, prompts: f64) -> f64 {
        self.token_ms * (self.prompt_spread * prompts.sqrt()).max(self.prompt_excess)
    }

    /// A latency (ms) of `prefills` prefill steps of `encode_ms` each plus the prompt tail
    /// `tail_ms`, then `decode_ms` over `steps` further steps (decode iterations, or with
    /// `encoder_bound` encoder steps), taken at the latency percentile (module docs, "Step
    /// variation"): with the runs' spread, the sum's mean plus `z_p` standard deviations, never
    /// more than every step at its 99th percentile; without, every step at its 99th percentile.
    /// Non-decreasing in `encode_ms`, `prefills`, `tail_ms` and `decode_ms`.
    fn varied(
        &self,
        encode_ms: f64,
        prefills: f64,
        tail_ms: f64,
        decode_ms: f64,
        steps: f64,
        encoder_bound: bool,
    ) -> f64 {
        let v = &self.variation;
        let prefill_ms = prefills * encode_ms + tail_ms;
        let decode_v = if encoder_bound { v.prefill } else { v.decode };
        let every_step = prefill_ms * (1.0 + v.prefill) + decode_ms * (1.0 + decode_v);
        let Some(runs) = &v.runs else {
            return every_step;
        };
        let (decode, decode_runs) =
            if encoder_bound { (runs.prefill, steps) } else { (runs.decode, steps / runs.decode_steps as f64) };
        let mean = prefill_ms * (1.0 + runs.prefill.mean) + decode_ms * (1.0 + decode.mean);
        // k independent prefills, the tail as one lump (it is the query's own long prompt, or a
        // sum whose spread it already is), and the decode runs.
        let variance = (prefills * encode_ms.powi(2) + tail_ms.powi(2)) * runs.prefill.std.powi(2)
            + (decode_ms * decode.std).powi(2) / decode_runs.max(1.0);
        (mean + self.z * variance.sqrt()).min(every_step)
    }

    /// Whether `pipe` is one device running the whole model: the engine the profile measured.
    fn one_device(pipe: &Pipe) -> bool {
        pipe.stages() == 1 && pipe.tp_groups == 0
    }

    /// Stage times of encoding `batch` queries.
    fn encode_times(&self, pipe: &Pipe, batch: f64) -> Vec<f64> {
        if Self::one_device(pipe) {
            return vec![self.over_inputs(|s| self.cost.prefill_step_ms(batch, s))];
        }
        let prof = self.cost.profile();
        let overhead = self.over_inputs(|s| self.cost.prefill_overhead_ms(batch, s));
        self.stage_times(
            pipe,
            self.over_inputs(|s| self.cost.prefill_layer_ms(batch, s, 0.0)),
            batch * self.mean_in * prof.embedding.ms_per_token + overhead,
            batch * prof.lm_head.ms_per_token,
        )
    }

    /// Stage times of one decode step of `batch` queries at the mean decode context.
    fn decode_times(&self, pipe: &Pipe, batch: f64) -> Vec<f64> {
        if Self::one_device(pipe) {
            return vec![self.cost.decode_step_ms(batch, self.context)];
        }
        let (layer_ms, first, last) = decode_parts(&self.cost, batch, self.context);
        self.stage_times(pipe, layer_ms, first, last)
    }

    /// RRA with encode batch `b_e` and `n_d` decode iterations per phase on `pipe`.
    pub fn rra(&self, b_e: f64, n_d: usize, pipe: &Pipe) -> Perf {
        let m = pipe.stages() as f64;
        let b_d = b_e / self.completion(n_d);
        let kappa = &self.engine_kappa;
        let encode = fill(&self.encode_times(pipe, b_e / m), m, kappa.prefill());
        let iteration = cyclic(&self.decode_times(pipe, b_d / m), m, kappa.at(b_d / m));
        let s = self.target_len;
        // The percentile query's prefills and the batch it decodes in: the engines' (one per
        // stage), whose cycle adjusts to the decoder (module docs, "The cycle adjusted to the
        // decoder").
        let batch = self.adjusted_batch(b_e, n_d, m);
        let latency_iteration = if Self::one_device(pipe) {
            self.decode_times(pipe, batch)[0]
        } else {
            cyclic(&self.decode_times(pipe, batch), m, kappa.at(batch))
        };
        let k = self.adjusted_prefills(n_d);
        let tail = self.prompt_tail_ms(k * b_e);
        let decode_ms = (s - 1) as f64 * latency_iteration;
        Perf {
            throughput_qps: b_e / ((encode + n_d as f64 * iteration) / 1000.0),
            latency_s: self.varied(encode, k, tail, decode_ms, (s - 1) as f64, false) / 1000.0,
            fits: b_d <= self.max_decode_batch && self.fits(pipe, m * batch * (self.mean_in + self.mean_out)),
        }
    }

    /// Prefills the percentile query sees, its own among them: its engine prefills every
    /// `g = S̄_D·Σ_U P_D(U)` decode steps, the steps in which its sequences complete as many
    /// queries as a prefill admits (`S̄_D` the mean decode iterations per query; `g ≤ N_D`), so
    /// `max(1, ⌈(S−1)/g⌉)`. Non-increasing in `n_d`, independent of `B_E`.
    fn adjusted_prefills(&self, n_d: usize) -> f64 {
        let steps = (self.target_len - 1) as f64;
        let gap = ((self.mean_out - 1.0) * self.completion(n_d)).min(n_d as f64);
        if steps > 0.0 && gap > 0.0 { (steps / gap).ceil().max(1.0) } else { 1.0 }
    }

    /// The batch the percentile query decodes in, on each of `engines` engines (one per stage):
    /// an engine refills its `⌈B_D⌉/M` seats whenever `B_E/M` are free, so between
    /// `(⌈B_D⌉ − B_E)/M + 1` and `⌈B_D⌉/M` run, on average `(⌈B_D⌉ − B_E/2)/M + 1/2` (on one
    /// device `⌈B_D⌉ − (B_E − 1)/2`), and never fewer than `B_D/M`. Non-decreasing in `b_e`
    /// (`⌈B_D⌉` grows by at least 1 per query of `B_E`), non-increasing in `n_d`.
    fn adjusted_batch(&self, b_e: f64, n_d: usize, engines: f64) -> f64 {
        let b_d = b_e / self.completion(n_d);
        ((self.seats(b_e, n_d) as f64 - b_e / 2.0) / engines + 0.5).max(b_d / engines)
    }

    /// An upper bound on [`XSim::rra_replayed`], the throughput the search reads for RRA, over
    /// `B_E ≤ b_hi`, `N_D ≥ n_lo` ([`Replay::upper`]; the most seats are at `b_hi`, `n_lo`).
    pub fn rra_upper(&self, b_hi: usize, n_lo: usize, pipe: &Pipe) -> f64 {
        let engines = pipe.stages().max(1);
        let (b_e, seats) = (b_hi.div_ceil(engines), self.seats(b_hi as f64, n_lo).div_ceil(engines));
        self.with_engine_steps(pipe, b_e, seats, |prefill, decode| self.replay.upper(prefill, decode))
    }

    /// The sequences the engine holds for encode batch `b_e` and `n_d` decode iterations: `B_D`
    /// rounded up, what the plan sets as the engine's decode batch.
    pub fn seats(&self, b_e: f64, n_d: usize) -> usize {
        (b_e / self.completion(n_d) - 1e-9).ceil().max(1.0) as usize
    }

    /// `f` of `pipe`'s stage times of prefills of `1..=b_e` queries and of decode steps of
    /// `1..=seats` sequences, as [`XSim::rra`] takes them, each computed once.
    fn with_engine_steps<R>(
        &self,
        pipe: &Pipe,
        b_e: usize,
        seats: usize,
        f: impl FnOnce(&[Vec<f64>], &[Vec<f64>]) -> R,
    ) -> R {
        let mut known = self.engine_steps.borrow_mut();
        let tables = known.entry(*pipe).or_default();
        for n in tables.prefill.len() + 1..=b_e {
            tables.prefill.push(self.encode_times(pipe, n as f64));
        }
        for b in tables.decode.len() + 1..=seats {
            tables.decode.push(self.decode_times(pipe, b as f64));
        }
        f(&tables.prefill[..b_e], &tables.decode[..seats])
    }

    /// RRA's throughput as the engine runs it ([`Replay`]): on one device one engine; over `P`
    /// stages `P` virtual engines, each with `⌈B_E/P⌉` queries a prefill and `⌈⌈B_D⌉/P⌉` seats
    /// (the facade's `schedule::pipelined_engines`).
    pub fn rra_replayed(&self, b_e: usize, n_d: usize, pipe: &Pipe) -> f64 {
        let engines = pipe.stages().max(1);
        let (encode_batch, seats) = (b_e.div_ceil(engines), self.seats(b_e as f64, n_d).div_ceil(engines));
        self.with_engine_steps(pipe, encode_batch, seats, |prefill_ms, decode_ms| {
            self.replay.throughput(&Engines {
                engines,
                encode_batch,
                decode_iterations: n_d,
                seats,
                prefill_ms,
                decode_ms,
                // One engine alone takes each step's pass, whatever `κ` (`replay::round_ms`).
                interference: self.engine_kappa,
            })
        })
    }

    /// WAA with `encoders` encoding devices, encode batch `b_e`, `micro` decoder micro-batches and
    /// the decoding devices arranged as `decode`.
    pub fn waa(&self, b_e: f64, micro: usize, encoders: usize, decode: &Pipe) -> Perf {
        let enc_pipe = Pipe { plain: encoders, tp_groups: 0, degree: 1 };
        let b_d = self.waa_decode_batch(b_e);
        let enc = self.encode_times(&enc_pipe, b_e);
        let m = micro as f64;
        let iteration = cyclic(&self.decode_times(decode, b_d / m), m, self.interference);
        let slowest_encoder = enc.iter().copied().fold(0.0, f64::max);
        // The encoding and the decoding devices work at once, and slow each other by their `κ`.
        let kappa = self.waa_interference.unwrap_or(self.interference);
        let period = Interference::interval_ms(&[slowest_encoder, iteration], kappa);
        let pass: f64 = enc.iter().sum();
        let periods = (self.target_len - 1) as f64;
        // The period is set by its slowest side: encoder steps vary as prefills do.
        let tail = self.prompt_tail_ms(b_e);
        let latency = self.varied(pass, 1.0, tail, periods * period, periods, slowest_encoder > iteration);
        Perf {
            throughput_qps: b_e / (period / 1000.0),
            latency_s: latency / 1000.0,
            fits: b_d <= self.max_decode_batch
                && self.fits(&enc_pipe, b_e * self.mean_in)
                && self.fits(decode, b_d * (self.mean_in + self.mean_out)),
        }
    }

    /// An upper bound on WAA's throughput over `b_lo ≤ B_E ≤ b_hi`: the throughput at `b_hi` when
    /// it grows with `B_E` (no step costs more per query at a larger batch), else `b_hi` over
    /// the period at `b_lo` (the period never shrinks with the batch).
    pub fn waa_upper(&self, b_lo: f64, b_hi: f64, micro: usize, encoders: usize, decode: &Pipe) -> f64 {
        if self.sublinear {
            self.waa(b_hi, micro, encoders, decode).throughput_qps
        } else {
            b_hi / b_lo * self.waa(b_lo, micro, encoders, decode).throughput_qps
        }
    }

    /// WAA-C's encoder share: devices in proportion to one query's encode and decode time.
    pub fn waa_c_encoders(&self, devices: usize) -> usize {
        let one = Pipe { plain: 1, tp_groups: 0, degree: 1 };
        let encode: f64 = self.encode_times(&one, 1.0).iter().sum();
        let decode: f64 = self.decode_times(&one, self.mean_out).iter().sum();
        split(devices, encode, decode)
    }

    /// WAA-M's encoder share: devices in proportion to each side's memory at encode batch
    /// `max_b_e` (one weight copy each, the decoders also the KV cache).
    pub fn waa_m_encoders(&self, devices: usize, max_b_e: usize) -> usize {
        let prof = self.cost.profile();
        let weights = self.layers * prof.weight_bytes_per_layer as f64;
        let kv = max_b_e as f64
            * self.mean_out
            * (self.mean_in + self.mean_out)
            * self.layers
            * prof.kv_bytes_per_token_per_layer as f64;
        split(devices, weights, weights + kv)
    }
}

/// Decode phases of `n_d` iterations a query of `s` output tokens spends in the decode batch (its
/// prefill emits the first token; 0 when that is all).
fn phases(s: usize, n_d: usize) -> usize {
    (s - 1).div_ceil(n_d)
}

/// Devices for the first of two sides in proportion `a : b`, at least one each.
fn split(devices: usize, a: f64, b: f64) -> usize {
    let share = if a + b > 0.0 { a / (a + b) } else { 0.5 };
    ((devices as f64 * share).round() as usize).clamp(1, devices - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Pipeline;

    #[test]
    fn schedule_closed_forms_match_the_event_simulator() {
        let t = [1.0, 3.0, 2.0];
        let mut p = Pipeline::new(3);
        let finish = (0..4).map(|_| p.run(0.0, &t)).fold(0.0, f64::max);
        assert_eq!(finish, fill(&t, 4.0, 0.0));
        // Cycling micro-batches: each re-enters when it leaves the last stage.
        for m in [1usize, 2, 5] {
            let mut p = Pipeline::new(3);
            let mut ready = vec![0.0; m];
            let mut ends = Vec::new();
            for _ in 0..50 {
                for r in ready.iter_mut() {
                    *r = p.run(*r, &t);
                }
                ends.push(ready[m - 1]);
            }
            let period = ends[49] - ends[48];
            assert!((period - cyclic(&t, m as f64, 0.0)).abs() < 1e-9, "m={m} period={period}");
        }
    }

    #[test]
    fn interfering_stages_lengthen_a_pass_up_to_taking_turns() {
        let t = [1.0, 3.0, 2.0];
        // κ = 1: every micro-batch pays every stage, `m·Σ t`.
        assert_eq!(fill(&t, 4.0, 1.0), 24.0);
        assert_eq!(cyclic(&t, 3.0, 1.0), 18.0);
        // In between: `max + κ·(Σ − max)` per later micro-batch.
        assert_eq!(fill(&t, 3.0, 0.5), 6.0 + 2.0 * 4.5);
        assert_eq!(cyclic(&t, 1.0, 0.5), 6.0);
        assert!(fill(&t, 4.0, 0.25) > fill(&t, 4.0, 0.0) && cyclic(&t, 3.0, 0.25) > cyclic(&t, 3.0, 0.0));
    }
}
