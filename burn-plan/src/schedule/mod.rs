//! Constraint-aware scheduling (ExeGPT): the configuration of most throughput whose latency
//! meets a bound, searched by branch-and-bound (§5.1) over the [XSimulator](xsim) (§6).
//!
//! Control variables (§4): the strategy (RRA, WAA-C or WAA-M), the encode batch `B_E`, the
//! decode batch `B_D` (derived from `B_E` as §6 does: `B_E / Σ_U P_D(U)` for RRA, over the decode
//! batch's steady-state lengths (see [`xsim`]), `B_E·S̄_D` for WAA), decode iterations between
//! prefills `N_D` (RRA), decoder micro-batches `B_m` (WAA) and partial tensor parallelism (a
//! degree from the profile and how many stages use it, on the decoding devices) when there is more
//! than one device.
//!
//! As the paper does for the tensor-parallel degree, variables without a usable monotonicity
//! (degree, tensor-parallel stages, `B_m`, the WAA device split) are enumerated, and
//! branch-and-bound runs over `B_E` (throughput and latency grow with it) and `N_D` (latency
//! falls as it grows; its throughput bound is computed, since `⌈S/N_D⌉` makes throughput
//! non-monotone). `exhaustive: true` scans the same space point by point; both return the same
//! optimum because every pruning bound holds for every point it prunes.
//!
//! The latency is that of generating the 99th-percentile output length (ExeGPT §7.1, its
//! SLA-(b): "a sequence of a pre-specified length (e.g. 99th pctl-length) is completed within a
//! given time"; set `latency_percentile` to change it), from the start of the query's prefill to
//! its last token, in the steady state of the schedule. Queueing before the prefill is not part
//! of it (the paper's offline setting keeps every encode batch full). Because the bound is a
//! percentile over queries, the latency also counts the prompt tail of the prefills that hold
//! and interrupt the query (RRA's timeline; see [`xsim`]): the percentile query's prefills carry
//! more prompt tokens than average ones. And because steps vary, the latency's sum of steps is
//! taken at its percentile from the profile's `step_variation` (§7.9; see [`xsim`]).
//!
//! RRA's throughput is the paged engine's, [replayed](replay) on a sample of output lengths for
//! every point the search may choose (one that fits and meets the bound): on one device, and over
//! a pipeline as the engine runs it there, one virtual engine per stage; the branch-and-bound's
//! block bound is then the replay's own ([`replay::Replay::upper`]).

mod lengths;
mod replay;
mod search;
mod stage_layers;
mod xsim;

use serde::{Deserialize, Serialize};

pub use lengths::{LengthDistribution, Lengths, TruncatedNormal};
pub use stage_layers::balanced_stage_layers;
pub use xsim::decode_stage_ms;

use super::check::{self, InputError};
use super::profile::{Profile, StepVariation};
use search::{Searcher, Space};
use xsim::{Pipe, XSim};

/// Largest encode batch and decode-iteration range searched.
const MAX_RANGE: usize = 1 << 16;

/// Input of [`plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleInput {
    /// The model's costs.
    pub profile: Profile,
    /// Prompt lengths `P_E(S)`.
    pub input_lengths: LengthDistribution,
    /// Output lengths `P_D(S)`.
    pub output_lengths: LengthDistribution,
    /// Devices to use.
    pub devices: usize,
    /// Memory of each device in bytes.
    pub device_memory_bytes: u64,
    /// Latency the percentile-length output must meet, in seconds.
    pub latency_bound_s: f64,
    /// Strategies to consider (default all three; WAA needs two devices).
    #[serde(default)]
    pub strategies: Option<Vec<Strategy>>,
    /// Largest encode batch `B_E` searched (default 256).
    #[serde(default)]
    pub max_encode_batch: Option<usize>,
    /// Largest `N_D` searched (default: the longest output length).
    #[serde(default)]
    pub max_decode_iterations: Option<usize>,
    /// Largest decode batch `B_D` the engine may run (default: unbounded); the paged engine's
    /// `max_num_seqs`.
    #[serde(default)]
    pub max_decode_batch: Option<usize>,
    /// Percentile of the output length whose latency is bounded (default 99).
    #[serde(default)]
    pub latency_percentile: Option<f64>,
    /// How far steps run above their median at the 99th percentile, replacing the profile's
    /// `step_variation` (default: the profile's, or 0 where it has none).
    #[serde(default)]
    pub step_variation: Option<StepVariation>,
    /// Search every point instead of branch-and-bound (the CLI's `--exhaustive`): about
    /// `max_encode_batch × max_decode_iterations` simulations per strategy and tensor-parallel
    /// choice, so keep the ranges small.
    #[serde(default)]
    pub exhaustive: bool,
    /// How much devices that work at once slow each other down: the measured `κ` of
    /// `burn_parallel::profiler::pipeline_interference` (default 0: not at all). Pipeline stages
    /// working on different micro-batches, and WAA's encoding beside its decoding device, then
    /// take `max t + κ·(Σ t − max t)` per micro-batch, not `max t`.
    #[serde(default)]
    pub interference: f64,
    /// How much the pipeline's virtual engines slow each other down when each decodes `batch`
    /// sequences (`interference` being theirs at one sequence each): RRA's rounds over a pipeline
    /// then take `κ` interpolated linearly in the engines' decode batch between the two, held
    /// beyond them, never below `interference`, and a prefill's rounds this one (a prefill is a
    /// batch of many tokens). Default: `interference` at every batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interference_at_batch: Option<BatchInterference>,
    /// How much WAA's encoding and decoding devices slow each other down, each repeating its own
    /// kind of step at once (`burn_parallel::profiler::side_by_side`): WAA's period is then
    /// `max + κ·min` of the encoder's step and the decoder's iteration (default: `interference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waa_interference: Option<f64>,
    /// The layers of each stage where the decoding devices run a fixed split (as `--stage-layers`
    /// or Alpa's stage planner gives it), one count per stage, summing to the profile's layers: a
    /// pipeline of that many one-device stages is priced on these shares, others on equal shares
    /// (default: equal shares everywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_layers: Option<Vec<usize>>,
}

/// `κ` measured with each engine decoding `batch` sequences ([`ScheduleInput::interference_at_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchInterference {
    /// Sequences each engine decoded, at least 1.
    pub batch: f64,
    /// The `κ` measured, at least 0.
    pub kappa: f64,
}

/// ExeGPT's scheduling strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    /// Round-robin allocation: every device holds a slice of the layers; prefill then `N_D`
    /// decode iterations, repeated.
    #[serde(rename = "rra")]
    Rra,
    /// Workload-aware allocation balancing compute between encoding and decoding devices.
    #[serde(rename = "waa-c")]
    WaaC,
    /// Workload-aware allocation balancing memory.
    #[serde(rename = "waa-m")]
    WaaM,
}

impl std::fmt::Display for Strategy {
    /// The name the planner's JSON gives it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rra => "rra",
            Self::WaaC => "waa-c",
            Self::WaaM => "waa-m",
        })
    }
}

/// Output of [`plan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleOutput {
    /// Chosen strategy.
    pub strategy: Strategy,
    /// Queries prefilled together, `B_E`.
    pub encode_batch: usize,
    /// Queries decoded together, `B_D` (rounded up from the simulator's expected value).
    pub decode_batch: usize,
    /// Decode iterations between prefills, `N_D` (RRA only).
    pub decode_iterations: Option<usize>,
    /// Micro-batches a decode batch is split into, `B_m` (RRA: one per pipeline stage).
    pub decoder_micro_batches: usize,
    /// Tensor-parallel degree of the tensor-parallel stages (1: none).
    pub tensor_parallel_degree: usize,
    /// Stages that run tensor-parallel.
    pub tensor_parallel_stages: usize,
    /// Devices that prefill (RRA: all).
    pub encode_devices: usize,
    /// Devices that decode (RRA: all).
    pub decode_devices: usize,
    /// Pipeline stages of the decoding devices.
    pub pipeline_stages: usize,
    /// The layers of each of those stages, where the input's `stage_layers` priced them (absent:
    /// equal shares).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_layers: Option<Vec<usize>>,
    /// Predicted queries per second (RRA: the engine's schedule replayed).
    pub throughput_qps: f64,
    /// Predicted latency of the percentile-length output, in seconds.
    pub latency_s: f64,
    /// The percentile the latency is for.
    pub latency_percentile: f64,
    /// The step variation the latency includes (every step at `1 +` this times its median).
    pub step_variation: StepVariation,
    /// Output tokens at that percentile.
    pub latency_output_tokens: usize,
    /// The bound it meets.
    pub latency_bound_s: f64,
    /// `"branch-and-bound"` or `"exhaustive"`.
    pub search: String,
    /// Simulator calls the search made.
    pub simulations: usize,
}

/// Why no schedule could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// A field cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
    /// Some configuration fits, none meets the bound.
    #[error(
        "no configuration meets the latency bound of {bound_s} s; the lowest reachable latency is {best_latency_s} s: relax the bound or add devices"
    )]
    Infeasible {
        /// The bound asked for.
        bound_s: f64,
        /// The least latency any configuration that fits in memory reaches.
        best_latency_s: f64,
    },
    /// No configuration fits in memory (or within `max_decode_batch`).
    #[error(
        "no configuration fits in {memory} bytes per device (within max_decode_batch, if given); add memory or devices{waa}"
    )]
    DoesNotFit {
        /// Memory per device.
        memory: u64,
        /// Why WAA, the only strategy asked for, cannot fit within `max_decode_batch`, where that
        /// is why (else empty).
        waa: String,
    },
    /// The requested strategies cannot run on these devices.
    #[error("no requested strategy runs on {devices} device(s) (WAA needs at least 2); add `rra` to `strategies`")]
    NoStrategy {
        /// Devices.
        devices: usize,
    },
}

/// Plans the schedule for `input` (see the module docs).
pub fn plan(input: &ScheduleInput) -> Result<ScheduleOutput, ScheduleError> {
    let cost = input.profile.cost_model("profile")?;
    let in_lengths = Lengths::new("input_lengths", &input.input_lengths)?;
    let out_lengths = Lengths::new("output_lengths", &input.output_lengths)?;
    check::count("devices", input.devices, 4096)?;
    let bound_s = check::positive("latency_bound_s", input.latency_bound_s)?;
    let max_batch = check::count("max_encode_batch", input.max_encode_batch.unwrap_or(256), MAX_RANGE)?;
    let nd_max =
        check::count("max_decode_iterations", input.max_decode_iterations.unwrap_or(out_lengths.max()), MAX_RANGE)?;
    let percentile = input.latency_percentile.unwrap_or(99.0);
    if !(percentile > 0.0 && percentile <= 100.0) {
        return Err(InputError::new("latency_percentile", "must be in (0, 100]").into());
    }
    let strategies = input.strategies.clone().unwrap_or_else(|| vec![Strategy::Rra, Strategy::WaaC, Strategy::WaaM]);
    check::count("strategies", strategies.len(), 3)?;
    let mut degrees: Vec<usize> = vec![1];
    degrees.extend(input.profile.tensor_parallel.iter().map(|t| t.degree));

    if let Some(b) = input.max_decode_batch {
        check::count("max_decode_batch", b, 1 << 30)?;
    }
    let variation = match input.step_variation {
        Some(v) => v.check("step_variation")?,
        None => input.profile.step_variation.unwrap_or_default(),
    };
    check::non_negative("interference", input.interference)?;
    if let Some(kappa) = input.waa_interference {
        check::non_negative("waa_interference", kappa)?;
    }
    if let Some(at) = input.interference_at_batch {
        check::non_negative("interference_at_batch.kappa", at.kappa)?;
        if !(at.batch.is_finite() && at.batch >= 1.0) {
            return Err(
                InputError::new("interference_at_batch.batch", "must be a number of sequences, at least 1").into()
            );
        }
    }
    if let Some(layers) = &input.stage_layers {
        check_stage_layers(layers, input.profile.layers)?;
    }
    let sim = XSim::new(
        cost,
        in_lengths,
        out_lengths,
        input.device_memory_bytes,
        input.max_decode_batch,
        percentile,
        variation,
    )
    .with_interference(input.interference, input.interference_at_batch)
    .with_waa_interference(input.waa_interference)
    .with_stage_layers(input.stage_layers.as_deref());
    let searcher = Searcher::new(&sim, max_batch, bound_s);
    let n = input.devices;
    let mut spaces: Vec<(Strategy, Space)> = Vec::new();
    for &strategy in &strategies {
        let (encoders, decoders) = match strategy {
            Strategy::Rra => (0, n),
            _ if n < 2 => continue,
            Strategy::WaaC => {
                let e = sim.waa_c_encoders(n);
                (e, n - e)
            }
            Strategy::WaaM => {
                let e = sim.waa_m_encoders(n, max_batch);
                (e, n - e)
            }
        };
        for &degree in &degrees {
            let max_groups = if degree == 1 { 0 } else { decoders / degree };
            for tp_groups in 0..=max_groups {
                if degree > 1 && tp_groups == 0 {
                    continue;
                }
                let pipe = Pipe { plain: decoders - tp_groups * degree, tp_groups, degree };
                match strategy {
                    Strategy::Rra => spaces.push((strategy, Space::Rra { pipe, nd_max })),
                    _ => {
                        for micro in 1..=pipe.stages() {
                            spaces.push((strategy, Space::Waa { encoders, micro, pipe }));
                        }
                    }
                }
            }
        }
    }
    if spaces.is_empty() {
        return Err(ScheduleError::NoStrategy { devices: n });
    }
    let mut best: Option<(Strategy, Space, Vec<usize>, xsim::Perf)> = None;
    for (strategy, space) in &spaces {
        let found = if input.exhaustive { searcher.exhaustive(space) } else { searcher.branch_and_bound(space) };
        if let Some((c, perf)) = found
            && best.as_ref().is_none_or(|b| perf.better_than(&b.3))
        {
            best = Some((*strategy, *space, c, perf));
        }
    }
    let Some((strategy, space, c, perf)) = best else {
        // The least latency of each space is at its lowest corner (monotonicity).
        let least = spaces.iter().map(|(_, s)| searcher.least_latency(s, &[0, 0])).fold(f64::INFINITY, f64::min);
        return Err(if least.is_finite() {
            ScheduleError::Infeasible { bound_s, best_latency_s: least }
        } else {
            ScheduleError::DoesNotFit {
                memory: input.device_memory_bytes,
                waa: waa_over_max_batch(&sim, &spaces, input),
            }
        });
    };
    let point = searcher.point(&space, &c);
    let (pipe, encoders, micro, decode_batch) = match space {
        Space::Rra { pipe, .. } => {
            let n_d = point.decode_iterations.unwrap_or(1);
            (pipe, n, pipe.stages(), point.encode_batch as f64 / sim.completion(n_d))
        }
        Space::Waa { encoders, micro, pipe } => {
            (pipe, encoders, micro, sim.waa_decode_batch(point.encode_batch as f64))
        }
    };
    Ok(ScheduleOutput {
        strategy,
        encode_batch: point.encode_batch,
        decode_batch: (decode_batch - 1e-9).ceil().max(1.0) as usize,
        decode_iterations: point.decode_iterations,
        decoder_micro_batches: micro,
        tensor_parallel_degree: pipe.degree,
        tensor_parallel_stages: pipe.tp_groups,
        encode_devices: encoders,
        decode_devices: pipe.plain + pipe.tp_groups * pipe.degree,
        pipeline_stages: pipe.stages(),
        stage_layers: input
            .stage_layers
            .clone()
            .filter(|l| l.len() == pipe.stages() && pipe.tp_groups == 0 && pipe.stages() > 1),
        throughput_qps: perf.throughput_qps,
        latency_s: perf.latency_s,
        latency_percentile: percentile,
        step_variation: variation,
        latency_output_tokens: sim.target_len,
        latency_bound_s: bound_s,
        search: if input.exhaustive { "exhaustive" } else { "branch-and-bound" }.to_string(),
        simulations: searcher.simulations(),
    })
}

/// Where only WAA was asked for and its least decode batch, `B_E·(S̄_D − 1)` at `B_E = 1`
/// (ExeGPT §4.1 and §6: the decoder holds every query the encoder passes it until it completes),
/// exceeds `max_decode_batch`: a sentence saying so and what to do; else empty.
fn waa_over_max_batch(sim: &XSim, spaces: &[(Strategy, Space)], input: &ScheduleInput) -> String {
    let least = sim.waa_decode_batch(1.0);
    let only_waa = spaces.iter().all(|(s, _)| *s != Strategy::Rra);
    match input.max_decode_batch {
        Some(max) if only_waa && least > max as f64 => format!(
            "; WAA decodes B_E·(S̄_D − 1) = {least:.0} sequences at the least (encode batch 1, the outputs' mean \
             length less one), over max_decode_batch {max}: raise max_decode_batch, shorten the outputs, or plan RRA"
        ),
        _ => String::new(),
    }
}

/// `stage_layers` of a model of `layers` layers: at least one stage, every stage at least one
/// layer, all of them together the model's.
fn check_stage_layers(stage_layers: &[usize], layers: usize) -> Result<(), InputError> {
    let field = "stage_layers";
    if stage_layers.is_empty() || stage_layers.contains(&0) {
        return Err(InputError::new(field, "needs at least one stage, each of at least one layer"));
    }
    let total: usize = stage_layers.iter().sum();
    if total != layers {
        return Err(InputError::new(
            field,
            format!(
                "holds {total} layers and the profile's model has {layers}: give one count per stage summing to {layers}"
            ),
        ));
    }
    Ok(())
}
