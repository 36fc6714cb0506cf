//! `--stage-layers auto`: stages planned from each device's measured profile (Alpa's
//! inter-operator pass, thesis §3.5.2, with one device per stage).
//!
//! Every device of `--devices` brings its own [`Profile`] of the model (per-layer prefill and
//! decode times, per-layer bytes, embedding and LM-head costs), a memory cap, and the measured
//! link to the next device. The stages are balanced for one request of a [`StageWorkload`]: a
//! layer's cost on a device is its prefill of the prompt plus `output_tokens` decode steps; the
//! first stage adds the embeddings, the last the final norm and LM head, and every stage but the
//! last the hand-over of its output to the next device (the hidden states and rotary angles of
//! the prompt, then of one token per step; its measured time holds the synchronisation that ends
//! the stage's pass), and the last stage its pass's fixed cost (`Profile::call_ms`: the
//! synchronisation that reads the logits). [`AutoStages::plan`] hands that to the pure `stages`
//! planner ([`burn_plan::stages`]) and returns a [`StagePrediction`]: each stage's layers,
//! device, predicted prefill, decode step and per-request time, and the bottleneck.

use burn_llm_models::DecoderSpec;
use burn_llm_models::config::PositionKind;
use serde::{Deserialize, Serialize};

use super::layout::{PipelineError, Result, StageLayout};
use burn_plan::interference::Interference;
use burn_plan::profile::{CostModel, Profile};
use burn_plan::stage_pass::{StagePlace, Work, stage_pass_ms};
use burn_plan::stages::{self, StageDevice, StageExtra, StagesInput};

/// A measured link: handing `b` bytes over takes `latency_ms + b · ms_per_byte` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkProfile {
    /// The fixed cost of one hand-over, in milliseconds.
    pub latency_ms: f64,
    /// Milliseconds per byte beyond the fixed cost (0 when the larger transfer took no longer
    /// than the smaller, as between two views of one memory).
    pub ms_per_byte: f64,
}

impl LinkProfile {
    /// Milliseconds to hand `bytes` over.
    pub fn ms(&self, bytes: f64) -> f64 {
        self.latency_ms + bytes * self.ms_per_byte
    }

    /// The transfer rate in MB/s (10⁶ bytes), `None` when no size dependence was measured.
    pub fn mb_per_s(&self) -> Option<f64> {
        (self.ms_per_byte > 0.0).then(|| 1e-3 / self.ms_per_byte)
    }
}

/// The request the stages are balanced for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageWorkload {
    /// Prompt tokens, prefilled in one step.
    pub prompt_tokens: usize,
    /// Tokens generated after the prompt, one decode step each.
    pub output_tokens: usize,
}

impl StageWorkload {
    /// The prompt's prefill, in one step.
    pub fn prefill(&self) -> Work {
        Work::Prefill { tokens: self.prompt_tokens, context: 0.0 }
    }

    /// One decode step of the request, at the mean context of its steps.
    pub fn decode_step(&self) -> Work {
        Work::Decode { batch: 1, context: self.prompt_tokens as f64 + self.output_tokens as f64 / 2.0 }
    }
}

impl Default for StageWorkload {
    /// A prompt of 64 tokens and 32 generated: within the [`ProfileGrid::stages`](crate::profiler::ProfileGrid::stages) grid.
    fn default() -> Self {
        Self { prompt_tokens: 64, output_tokens: 32 }
    }
}

/// What one stage hands the next per token: the hidden state and, for rotary models, the step's
/// rotary angles (each tensor a `to_device` call of its own).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Handover {
    /// Bytes per token (all tensors).
    pub bytes_per_token: f64,
    /// Tensors moved per hand-over.
    pub tensors: usize,
}

impl Handover {
    /// What [`PipelineLm`](super::PipelineLm) hands over for a model of `spec` (`f32` states).
    pub fn of(spec: &DecoderSpec) -> Self {
        let states = (spec.hidden_size * 4) as f64;
        match spec.positions {
            PositionKind::Rotary(_) => Self { bytes_per_token: states + (2 * spec.head_dim * 4) as f64, tensors: 3 },
            PositionKind::Learned { .. } => Self { bytes_per_token: states, tensors: 1 },
        }
    }

    /// Milliseconds to hand `tokens` tokens over `link`.
    pub fn ms(&self, link: &LinkProfile, tokens: usize) -> f64 {
        link.latency_ms * self.tensors as f64 + link.ms_per_byte * self.bytes_per_token * tokens as f64
    }

    /// Hand-overs of one request of `w` over `link`: the prompt's, then one token per decode step.
    pub(super) fn request_ms(&self, link: &LinkProfile, w: StageWorkload) -> f64 {
        self.ms(link, w.prompt_tokens) + w.output_tokens as f64 * self.ms(link, 1)
    }
}

/// One entry of `--devices` with its measured costs.
#[derive(Debug, Clone)]
pub struct AutoStageDevice {
    /// The `--devices` entry.
    pub name: String,
    /// The model's profile on this device.
    pub profile: Profile,
    /// Bytes the device gives its stage.
    pub memory_bytes: u64,
    /// The measured link to the next device (`None` on the last).
    pub link_to_next: Option<LinkProfile>,
}

/// Rounds of [`AutoStages::plan_settled`]: plans, each followed by a measurement on its split.
const SETTLE_ROUNDS: usize = 3;

/// How close (in `κ`) a split's measured interference must come to the one it was planned with
/// for [`AutoStages::plan_settled`] to take the plan as settled.
const KAPPA_SETTLED: f64 = 0.1;

/// Everything `--stage-layers auto` plans from: one device per stage, in pipeline order.
#[derive(Debug, Clone)]
pub struct AutoStages {
    /// The devices.
    pub devices: Vec<AutoStageDevice>,
    /// The request the stages are balanced for.
    pub workload: StageWorkload,
    /// Tokens of KV cache each stage's layers must hold (counted in each layer's bytes).
    pub kv_tokens: usize,
    /// What a stage hands the next.
    pub handover: Handover,
    /// How much the stages slow each other down when they work at once: the measured `κ` of
    /// [`crate::profiler::pipeline_interference`] (0: not at all). The stages are split for the
    /// least `max + κ·(Σ − max)` of their per-request times.
    pub interference: f64,
}

/// One planned stage and what the profiles predict for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictedStage {
    /// First layer (inclusive).
    pub first_layer: usize,
    /// Last layer (inclusive).
    pub last_layer: usize,
    /// The device's `--devices` entry (a tensor-parallel group's entries joined by `+`).
    pub device: String,
    /// The stage's tensor-parallel degree (devices its layers are split over).
    #[serde(default = "one")]
    pub degree: usize,
    /// Prefill of the workload's prompt through this stage (hand-over included), ms.
    pub prefill_ms: f64,
    /// One decode step of one sequence through this stage (hand-over included), ms.
    pub decode_step_ms: f64,
    /// The planner's objective: the prefill plus every decode step of one request, ms.
    pub request_ms: f64,
    /// Bytes the stage holds on its device (weights, KV cache, extras).
    pub memory_bytes: u64,
    /// The measured link to the next stage's device (`None` on the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkProfile>,
}

fn one() -> usize {
    1
}

/// The plan `--stage-layers auto` made, printed before running and reported in `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagePrediction {
    /// The stages, in order.
    pub stages: Vec<PredictedStage>,
    /// The slowest stage (index).
    pub bottleneck_stage: usize,
    /// Its per-request time, ms.
    pub bottleneck_ms: f64,
    /// The request the stages were balanced for.
    pub workload: StageWorkload,
    /// The interference `κ` the stages were split with ([`AutoStages::interference`]).
    #[serde(default)]
    pub interference: f64,
}

impl StagePrediction {
    /// The prediction of `stages`, its bottleneck the slowest stage's per-request time.
    pub(super) fn new(stages: Vec<PredictedStage>, workload: StageWorkload) -> Self {
        let bottleneck_stage =
            (0..stages.len()).max_by(|&a, &b| stages[a].request_ms.total_cmp(&stages[b].request_ms)).unwrap_or(0);
        let bottleneck_ms = stages.get(bottleneck_stage).map_or(0.0, |s| s.request_ms);
        Self { stages, bottleneck_stage, bottleneck_ms, workload, interference: 0.0 }
    }

    /// A decode step of `micro_batches` micro-batches of one sequence, the stages overlapping:
    /// `Σ t + (M − 1)·(max t + κ·(Σ t − max t))` of the stages' predicted decode steps
    /// ([`Interference::pipelined_ms`]).
    pub fn micro_batched_step_ms(&self, micro_batches: usize) -> f64 {
        let steps: Vec<f64> = self.stages.iter().map(|s| s.decode_step_ms).collect();
        Interference::pipelined_ms(&steps, micro_batches, self.interference)
    }

    /// Each stage's number of layers, in order.
    pub fn layer_counts(&self) -> Vec<usize> {
        self.stages.iter().map(|s| s.last_layer + 1 - s.first_layer).collect()
    }

    /// The stages' layout.
    pub fn layout(&self) -> Result<StageLayout> {
        let text: Vec<String> = self.stages.iter().map(|s| format!("{}-{}", s.first_layer, s.last_layer)).collect();
        let layers = self.stages.last().map_or(0, |s| s.last_layer + 1);
        StageLayout::parse(&text.join(","), layers)
    }

    /// The prediction in one line, for summaries: each stage's predicted decode step and
    /// per-request time, and the bottleneck.
    pub fn one_line(&self) -> String {
        let stages: Vec<String> = self
            .stages
            .iter()
            .map(|s| match s.degree {
                1 => format!("{:.3}/{:.2}", s.decode_step_ms, s.request_ms),
                d => format!("{:.3}/{:.2} (degree {d})", s.decode_step_ms, s.request_ms),
            })
            .collect();
        format!(
            "auto stages, predicted decode step/request ms per stage {}, bottleneck stage {}",
            stages.join(", "),
            self.bottleneck_stage
        )
    }

    /// One line per stage and one for the bottleneck, for logs and start-up lines.
    pub fn summary(&self) -> String {
        let w = self.workload;
        let mut lines = vec![format!(
            "auto stages (balanced for a {}-token prompt and {} generated tokens; predicted per stage):",
            w.prompt_tokens, w.output_tokens
        )];
        for (i, s) in self.stages.iter().enumerate() {
            let link = match &s.link {
                Some(l) => match l.mb_per_s() {
                    Some(rate) => format!(", link {:.3} ms + {rate:.0} MB/s", l.latency_ms),
                    None => format!(", link {:.3} ms", l.latency_ms),
                },
                None => String::new(),
            };
            let degree = match s.degree {
                1 => String::new(),
                d => format!(" (tensor-parallel {d})"),
            };
            lines.push(format!(
                "  stage {i}: layers {}-{} on {}{degree}: prefill {:.2} ms, decode step {:.3} ms, request {:.2} ms, {}{link}",
                s.first_layer,
                s.last_layer,
                s.device,
                s.prefill_ms,
                s.decode_step_ms,
                s.request_ms,
                burn_llm_models::units::fmt_bytes(s.memory_bytes),
            ));
        }
        lines
            .push(format!("  bottleneck: stage {} at {:.2} ms per request", self.bottleneck_stage, self.bottleneck_ms));
        if self.interference > 0.0 {
            let request: Vec<f64> = self.stages.iter().map(|s| s.request_ms).collect();
            lines.push(format!(
                "  stages overlapping at interference κ = {:.2}: {:.2} ms per request in a full pipeline, a decode step of 8 micro-batches {:.2} ms",
                self.interference,
                Interference::interval_ms(&request, self.interference),
                self.micro_batched_step_ms(8)
            ));
        }
        lines.join("\n")
    }
}

/// Per-device costs the planner and the prediction share.
pub(super) struct DeviceCosts {
    cost: CostModel,
}

/// One planned stage, for [`predict_stage`].
pub(super) struct PlannedStage<'a> {
    /// Its device (or group, with the group's profile and link).
    pub device: &'a AutoStageDevice,
    /// Its half-open layer range.
    pub layers: [usize; 2],
    /// Whether it is the first, the last stage.
    pub first: bool,
    pub last: bool,
    /// Its tensor-parallel degree.
    pub degree: usize,
    /// The planner's per-request time and bytes for it.
    pub request_ms: f64,
    pub memory_bytes: u64,
}

/// What the profiles predict for `stage` under workload `w`: its layers' prefill and decode
/// step, the embeddings on the first stage, the head and the pass's fixed cost on the last, the
/// hand-over to the next stage on the others.
pub(super) fn predict_stage(
    w: StageWorkload,
    handover: &Handover,
    cost: &DeviceCosts,
    stage: PlannedStage<'_>,
) -> PredictedStage {
    let device = stage.device;
    let place = StagePlace { layers: stage.layers[1] - stage.layers[0], first: stage.first, last: stage.last };
    let handover_ms = |tokens| device.link_to_next.as_ref().map_or(0.0, |link| handover.ms(link, tokens));
    let prefill = stage_pass_ms(&cost.cost, place, w.prefill(), handover_ms(w.prompt_tokens));
    let decode = stage_pass_ms(&cost.cost, place, w.decode_step(), handover_ms(1));
    PredictedStage {
        first_layer: stage.layers[0],
        last_layer: stage.layers[1] - 1,
        device: device.name.clone(),
        degree: stage.degree,
        prefill_ms: prefill,
        decode_step_ms: decode,
        request_ms: stage.request_ms,
        memory_bytes: stage.memory_bytes,
        link: if stage.last { None } else { device.link_to_next },
    }
}

impl DeviceCosts {
    pub(super) fn new(device: &AutoStageDevice, index: usize) -> Result<Self> {
        let cost = device.profile.cost_model(&format!("devices[{index}].profile")).map_err(|e| {
            PipelineError::Device { entry: device.name.clone(), reason: format!("its profile cannot be used: {e}") }
        })?;
        Ok(Self { cost })
    }

    pub(super) fn prefill_layer(&self, w: StageWorkload) -> f64 {
        w.prefill().layer_ms(&self.cost)
    }

    pub(super) fn decode_layer(&self, w: StageWorkload) -> f64 {
        w.decode_step().layer_ms(&self.cost)
    }
}

impl AutoStages {
    /// The `stages` planner's input: each device's per-layer cost of one request, its cap and
    /// its link; the embeddings' and the head's costs (on the first and last devices) and bytes.
    pub fn stages_input(&self) -> Result<StagesInput> {
        let costs = self.costs()?;
        let first = &self.devices[0].profile;
        let layers = first.layers;
        let w = self.workload;
        let steps = w.output_tokens as f64;
        let layer_bytes = first.weight_bytes_per_layer + first.kv_bytes_per_token_per_layer * self.kv_tokens as u64;
        let last_device = self.devices.len() - 1;
        let devices = self
            .devices
            .iter()
            .zip(&costs)
            .enumerate()
            .map(|(s, (d, c))| StageDevice {
                name: Some(d.name.clone()),
                layer_latency_ms: vec![c.prefill_layer(w) + steps * c.decode_layer(w); layers],
                memory_bytes: d.memory_bytes,
                link_ms: d.link_to_next.map_or(0.0, |l| self.link_ms(&l)),
                fixed_ms: if s == last_device { (1.0 + steps) * d.profile.call_ms } else { 0.0 },
            })
            .collect();
        let last = &self.devices[self.devices.len() - 1].profile;
        Ok(StagesInput {
            layer_latency_ms: vec![1.0; layers],
            stages: self.devices.len(),
            layer_memory_bytes: Some(vec![layer_bytes; layers]),
            devices: Some(devices),
            first_stage: Some(StageExtra {
                latency_ms: first.embedding.ms_per_token * (w.prompt_tokens + w.output_tokens) as f64,
                memory_bytes: first.embedding.weight_bytes,
            }),
            last_stage: Some(StageExtra {
                latency_ms: last.lm_head.ms_per_token * (1 + w.output_tokens) as f64,
                memory_bytes: last.lm_head.weight_bytes,
            }),
            interference: self.interference,
            ..StagesInput::default()
        })
    }

    /// Plans the stages; errors name a device that cannot hold a layer, or caps that cannot hold
    /// the model, before anything loads.
    pub fn plan(&self) -> Result<StagePrediction> {
        let input = self.stages_input()?;
        let out = stages::plan(&input)?;
        let costs = self.costs()?;
        let w = self.workload;
        let last = self.devices.len() - 1;
        let memory = out.stage_memory_bytes.clone().unwrap_or_default();
        let mut predicted = Vec::with_capacity(out.stages.len());
        for (s, range) in out.stages.iter().enumerate() {
            let stage = PlannedStage {
                device: &self.devices[s],
                layers: *range,
                first: s == 0,
                last: s == last,
                degree: 1,
                request_ms: out.stage_latency_ms[s],
                memory_bytes: memory.get(s).copied().unwrap_or(0),
            };
            predicted.push(predict_stage(w, &self.handover, &costs[s], stage));
        }
        let mut prediction = StagePrediction::new(predicted, w);
        prediction.bottleneck_ms = out.bottleneck_ms;
        prediction.interference = self.interference;
        Ok(prediction)
    }

    /// Plans the stages at [`Self::interference`], then measures the interference of the split
    /// it chose (`measure`: each device running its stage's layer count) and plans again at that,
    /// until a plan was made at (within [`KAPPA_SETTLED`]) the interference measured on its own
    /// split, a split comes back, or [`SETTLE_ROUNDS`] splits were measured. Interference depends
    /// on what each stage does: a stage of one layer on a worker mostly waits on its round trip,
    /// one of half the model computes on a core the host shares. Of the splits measured, the one
    /// whose pipelined pass at its own interference is shortest (`max + κ·(Σ − max)` of its
    /// stages' per-request times) is returned, priced at that interference.
    pub fn plan_settled<E>(
        &self,
        mut measure: impl FnMut(&[usize]) -> std::result::Result<f64, E>,
    ) -> std::result::Result<StagePrediction, E>
    where
        E: From<PipelineError>,
    {
        let interval = |p: &StagePrediction| {
            let request: Vec<f64> = p.stages.iter().map(|s| s.request_ms).collect();
            Interference::interval_ms(&request, p.interference)
        };
        let mut auto = self.clone();
        let mut best = auto.plan()?;
        let mut seen = vec![best.layer_counts()];
        let mut kappa = measure(&seen[0])?;
        best.interference = kappa;
        for _ in 1..SETTLE_ROUNDS {
            if (kappa - auto.interference).abs() <= KAPPA_SETTLED {
                break;
            }
            auto.interference = kappa;
            let mut next = auto.plan()?;
            let layers = next.layer_counts();
            if seen.contains(&layers) {
                break;
            }
            kappa = measure(&layers)?;
            next.interference = kappa;
            seen.push(layers);
            // The first of equally short passes is kept.
            if interval(&next) < interval(&best) {
                best = next;
            }
        }
        Ok(best)
    }

    /// Hand-overs of one request over `link`: the prompt's, then one token per decode step.
    fn link_ms(&self, link: &LinkProfile) -> f64 {
        self.handover.request_ms(link, self.workload)
    }

    fn costs(&self) -> Result<Vec<DeviceCosts>> {
        let Some(first) = self.devices.first() else {
            return Err(PipelineError::Zero("the number of --devices entries"));
        };
        for d in &self.devices {
            if d.profile.layers != first.profile.layers {
                return Err(PipelineError::Device {
                    entry: d.name.clone(),
                    reason: format!(
                        "its profile is of a model of {} layers, `{}`'s of {}: profile one model on every device",
                        d.profile.layers, first.name, first.profile.layers
                    ),
                });
            }
        }
        self.devices.iter().enumerate().map(|(i, d)| DeviceCosts::new(d, i)).collect()
    }
}
