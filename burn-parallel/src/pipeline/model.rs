//! [`PipelineLm`]: a decoder split by layers into stages, each on its own device, run as one
//! [`LanguageModel`] by the plain and the paged engines.
//!
//! The embeddings sit with the first stage, the final norm and LM head with the last; between
//! stages the residual stream (and the step's rotary angles) move with `Tensor::to_device`, and
//! each stage's KV cache layers live on its own device ([`LanguageModel::kv_devices`]). Stages may
//! have different tensor-parallel degrees; the cache's layers are then laid out by
//! [`KvMap`](super::kv_map::KvMap).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::{Module, Param};
use burn::nn::Embedding;
use burn::tensor::{Device, Tensor};
use burn_llm_models::cache::{KvLayout, LayerDevices};
use burn_llm_models::device::send_to_worker;
use burn_llm_models::layers::embedding::TokenEmbedding;
use burn_llm_models::model::{DecoderLayer, Hidden};
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, KvCache, LanguageModel, MicroBatchCache, QuantSpec, StepInput};

use super::kv_map::{KvMap, StageKv};
use super::layout::{PipelineError, Result};
use super::plan::PipelinePlan;
use super::threaded::StagePools;
use super::turns::StageTurns;
use crate::block::LayerBlock;
use crate::tensor::TensorParallelLayer;

/// Where a block's weights come from.
#[allow(clippy::large_enum_variant)] // one per layer, consumed at once
pub enum LayerWeights<'a, S: TensorSource> {
    /// Read from a checkpoint straight onto the block's devices, quantized as given.
    Checkpoint {
        /// The opened checkpoint.
        source: &'a S,
        /// `--quantize`: group-quantize the projections after loading.
        quant: Option<QuantSpec>,
    },
    /// A layer already loaded (possibly quantized), moved to the block's devices.
    Loaded(DecoderLayer),
}

/// Builds decoder layer `layer` of `spec` as a block over `devices` (one per tensor-parallel
/// rank; one device: the whole layer). The one place blocks are made, so that tensor-parallel
/// blocks slot in here.
pub fn build_block<S: TensorSource>(
    spec: &DecoderSpec,
    layer: usize,
    weights: LayerWeights<'_, S>,
    devices: &[Device],
) -> Result<Box<dyn LayerBlock>> {
    let device = match devices {
        [] => return Err(PipelineError::Zero("the tensor-parallel size")),
        [device] => device,
        ranks => {
            // Tensor parallelism: each rank loads only its shard onto its device.
            let split = match weights {
                LayerWeights::Checkpoint { source, quant } => {
                    let loaded = TensorParallelLayer::load(spec, source, layer, ranks)?;
                    match quant {
                        Some(q) => loaded.quantized(q)?,
                        None => loaded,
                    }
                }
                LayerWeights::Loaded(loaded) => TensorParallelLayer::split(loaded, ranks)?,
            };
            return Ok(Box::new(split));
        }
    };
    let block = match weights {
        LayerWeights::Checkpoint { source, quant } => {
            let loaded = CausalLm::load_layer(spec, source, layer, device)?;
            match quant {
                Some(q) => loaded.quantized(q)?,
                None => loaded,
            }
        }
        LayerWeights::Loaded(loaded) => loaded.to_device(device),
    };
    Ok(Box::new(block))
}

/// One stage: its layers' blocks on its devices.
pub struct Stage {
    layers: Range<usize>,
    blocks: Vec<Box<dyn LayerBlock>>,
    device: Device,
    degree: usize,
    name: String,
}

impl Stage {
    /// The decoder layers it runs (half-open).
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Its tensor-parallel degree (devices per layer).
    pub fn degree(&self) -> usize {
        self.degree
    }

    /// Its devices' names, `+`-joined, rank 0 first.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device its input and output live on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("layers", &self.layers)
            .field("devices", &self.name)
            .field("degree", &self.degree)
            .finish()
    }
}

/// A decoder in pipeline stages; see the [module docs](self).
pub struct PipelineLm {
    /// Embeddings (the head's parts dropped), on the first stage's device.
    embed: CausalLm,
    /// Final norm, output projection and LM head (the token table only when the head is tied to
    /// it), on the last stage's device.
    head: CausalLm,
    stages: Vec<Stage>,
    /// Where each rank's keys and values live in the cache.
    kv_map: KvMap,
    weight_bytes: usize,
    /// Bytes handed from stage to stage so far.
    moved: AtomicU64,
    /// The host stages' thread pools when stages run concurrently ([`super::threaded`]).
    pools: StagePools,
    /// Which caller issues to each stage next, when several run the model at once.
    turns: StageTurns,
    /// The planner's prediction, in one line (`--stage-layers auto`).
    predicted: Option<String>,
    /// The plan as `--json` reports it ([`PipelinePlan::to_json`]).
    plan_json: serde_json::Value,
}

impl std::fmt::Debug for PipelineLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineLm").field("arch", &self.embed.spec.arch).field("stages", &self.stages).finish()
    }
}

impl PipelineLm {
    /// Loads the model `spec` describes from `ckpt`, each stage's layers straight onto its
    /// devices (once), the embeddings onto the first stage's device and the head onto the
    /// last's; `quant` group-quantizes projections and head as `--quantize` does. Quantized
    /// checkpoints (GGUF) keep their blocks as shipped.
    pub fn from_checkpoint(
        spec: DecoderSpec,
        ckpt: &impl TensorSource,
        plan: &PipelinePlan,
        quant: Option<QuantSpec>,
    ) -> Result<Self> {
        plan.check(&spec)?;
        let (first, last) = plan.end_devices();
        let skeleton = CausalLm::skeleton(spec.clone(), ckpt, first)?;
        let head = if first == last { skeleton.clone() } else { CausalLm::skeleton(spec.clone(), ckpt, last)? };
        let head = match quant {
            Some(q) => head.quantize_weights(q)?,
            None => head,
        };
        let head = head_of(&head, last);
        Self::assemble(embeddings_of(skeleton), head, plan, |layer, devices| {
            build_block(&spec, layer, LayerWeights::Checkpoint { source: ckpt, quant }, devices)
        })
    }

    /// Splits an already loaded (possibly quantized) model: its layers move to their stages'
    /// devices with `Module::to_device`, its embeddings to the first stage's device and its head
    /// to the last's.
    pub fn from_model(mut model: CausalLm, plan: &PipelinePlan) -> Result<Self> {
        plan.check(&model.spec)?;
        let (first, last) = plan.end_devices();
        let mut layers: Vec<Option<DecoderLayer>> = std::mem::take(&mut model.layers).into_iter().map(Some).collect();
        let head = head_of(&model, last);
        let embed = embeddings_of(model).to_device(first);
        let spec = embed.spec.clone();
        Self::assemble(embed, head, plan, |layer, devices| {
            let loaded = layers[layer].take().ok_or_else(|| PipelineError::BadStageLayers {
                text: plan.layout.to_string(),
                reason: format!("layer {layer} is in two stages"),
            })?;
            build_block::<burn_llm_models::RandomWeights>(&spec, layer, LayerWeights::Loaded(loaded), devices)
        })
    }

    fn assemble(
        embed: CausalLm,
        head: CausalLm,
        plan: &PipelinePlan,
        mut make: impl FnMut(usize, &[Device]) -> Result<Box<dyn LayerBlock>>,
    ) -> Result<Self> {
        let mut weight_bytes = head.decode_weight_bytes();
        let mut stages = Vec::with_capacity(plan.layout.len());
        for (s, range) in plan.layout.stages().iter().enumerate() {
            let devices = plan.stage_devices(s);
            let blocks = range.clone().map(|layer| make(layer, devices)).collect::<Result<Vec<_>>>()?;
            weight_bytes += blocks.iter().map(|b| b.weight_bytes()).sum::<usize>();
            stages.push(Stage {
                layers: range.clone(),
                blocks,
                device: devices[0].clone(),
                degree: devices.len(),
                name: plan.stage_names(s),
            });
        }
        let stage_devices: Vec<Device> = stages.iter().map(|s| s.device.clone()).collect();
        let kv_map = plan.kv_map(embed.spec.num_kv_heads);
        let predicted = plan.prediction().map(|p| p.one_line());
        let plan_json = plan.to_json();
        Ok(Self {
            embed,
            head,
            stages,
            kv_map,
            weight_bytes,
            moved: AtomicU64::new(0),
            pools: StagePools::default(),
            turns: StageTurns::new(&stage_devices),
            predicted,
            plan_json,
        })
    }

    /// The stages, in order.
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// Each stage's tensor-parallel degree.
    pub fn degrees(&self) -> Vec<usize> {
        self.stages.iter().map(|s| s.degree).collect()
    }

    /// Where each rank's keys and values live in the cache.
    pub fn kv_map(&self) -> &KvMap {
        &self.kv_map
    }

    pub(super) fn pools(&self) -> &StagePools {
        &self.pools
    }

    pub(super) fn pools_mut(&mut self) -> &mut StagePools {
        &mut self.pools
    }

    pub(super) fn turns(&self) -> &StageTurns {
        &self.turns
    }

    /// Stage `stage`'s layers over `hidden`, already on the stage's device.
    pub(super) fn run_stage_layers(
        &self,
        stage: usize,
        hidden: Hidden,
        cache: &mut dyn KvCache,
    ) -> burn_llm_models::Result<Hidden> {
        let stage_ref = &self.stages[stage];
        let Hidden { mut states, rotary } = hidden;
        let mut cache = StageKv { inner: cache, map: &self.kv_map, degree: stage_ref.degree };
        for (block, layer) in stage_ref.blocks.iter().zip(stage_ref.layers.clone()) {
            states = block.forward(states, layer, rotary.as_ref(), &mut cache)?;
            send_to_worker(&stage_ref.device)?;
        }
        Ok(Hidden { states, rotary })
    }

    /// Moves a stage's output to the next stage's device, counting the bytes handed over.
    pub(super) fn hand_over(&self, hidden: Hidden, device: &Device) -> Hidden {
        let bytes = |t: &Tensor<3>| t.shape().num_elements() * t.dtype().size();
        let angles = |t: &Tensor<4>| t.shape().num_elements() * t.dtype().size();
        let moved = bytes(&hidden.states) + hidden.rotary.as_ref().map_or(0, |(c, s)| angles(c) + angles(s));
        self.moved.fetch_add(moved as u64, Ordering::Relaxed);
        Hidden {
            states: hidden.states.to_device(device),
            rotary: hidden.rotary.map(|(c, s)| (c.to_device(device), s.to_device(device))),
        }
    }
}

/// The embedding side of a model without layers: the head's parts dropped.
fn embeddings_of(mut model: CausalLm) -> CausalLm {
    model.final_norm = None;
    model.project_out = None;
    model.lm_head = None;
    model
}

/// The head side of a model without layers, on `device`: final norm, output projection and LM
/// head, plus the token table when the head is tied to it; an untied model's table is replaced by
/// a one-row placeholder that nothing reads (a `CausalLm` always has a table).
fn head_of(model: &CausalLm, device: &Device) -> CausalLm {
    let embed_tokens = match model.lm_head {
        None => model.embed_tokens.clone().to_device(device),
        Some(_) => TokenEmbedding::Dense(Embedding {
            weight: Param::from_tensor(Tensor::zeros([1, model.spec.embed_dim], device)),
        }),
    };
    CausalLm {
        embed_tokens,
        embed_positions: None,
        project_in: None,
        layers: Vec::new(),
        final_norm: model.final_norm.clone().map(|n| n.to_device(device)),
        project_out: model.project_out.clone().map(|p| p.to_device(device)),
        lm_head: model.lm_head.clone().map(|h| h.to_device(device)),
        spec: model.spec.clone(),
    }
}

impl LanguageModel for PipelineLm {
    fn spec(&self) -> &DecoderSpec {
        &self.embed.spec
    }

    fn kv_layout(&self) -> KvLayout {
        self.kv_map.layout(KvLayout::of(&self.embed.spec))
    }

    fn kv_devices(&self) -> LayerDevices {
        let mut devices: Vec<Device> = Vec::with_capacity(self.kv_map.num_cache_layers());
        for stage in &self.stages {
            for (block, layer) in stage.blocks.iter().zip(stage.layers.clone()) {
                let chunks = self.kv_map.chunks(layer);
                devices.extend(block.kv_devices().into_iter().flat_map(|d| std::iter::repeat_n(d, chunks)));
            }
        }
        LayerDevices::new(&devices)
    }

    fn device(&self) -> Device {
        self.embed.device()
    }

    fn decode_weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn num_stages(&self) -> usize {
        self.stages.len()
    }

    fn embed(&self, step: &StepInput) -> Hidden {
        self.embed.embed(step)
    }

    fn run_stage(&self, stage: usize, hidden: Hidden, cache: &mut dyn KvCache) -> burn_llm_models::Result<Hidden> {
        let hidden = match stage {
            0 => hidden,
            _ => self.hand_over(hidden, &self.stages[stage].device),
        };
        self.run_stage_layers(stage, hidden, cache)
    }

    /// The stages in order, each stage's turn taken ([`super::turns`]) so that callers running
    /// the model at once follow each other through the stages.
    fn forward(&self, step: &StepInput, cache: &mut dyn KvCache) -> burn_llm_models::Result<Tensor<3>> {
        self.forward_in_turns(step, cache)
    }

    /// Each stage on a thread of its own ([`super::threaded`]): the same result as the default
    /// order, with the stages' work overlapping.
    fn forward_micro_batches(
        &self,
        steps: &[StepInput],
        cache: &mut dyn MicroBatchCache,
    ) -> burn_llm_models::Result<Vec<Tensor<3>>> {
        self.forward_threaded(steps, cache)
    }

    fn finish(&self, hidden: Hidden) -> Tensor<3> {
        self.head.finish(hidden)
    }

    fn logits(&self, states: Tensor<2>) -> Tensor<2> {
        self.head.logits(states)
    }

    fn stage_transfer_bytes(&self) -> u64 {
        let ranks: u64 = self.stages.iter().flat_map(|s| &s.blocks).map(|b| b.rank_transfer_bytes()).sum();
        self.moved.load(Ordering::Relaxed) + ranks
    }

    fn placement_summary(&self) -> Option<String> {
        let stages: Vec<String> = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| format!("stage {i}: layers {}-{} on {}", s.layers.start, s.layers.end - 1, s.name))
            .collect();
        let reduce = self.stages.iter().flat_map(|s| &s.blocks).find_map(|b| b.reduce_path());
        let reduced = format!("(reduced by {})", reduce.unwrap_or("to_device"));
        let degrees = self.degrees();
        let tp = match degrees.iter().all(|&d| d == degrees[0]) {
            true if degrees[0] > 1 => format!(" × tensor-parallel {} {reduced}", degrees[0]),
            true => String::new(),
            false => {
                let list: Vec<String> = degrees.iter().map(usize::to_string).collect();
                format!(", tensor-parallel degrees {} per stage {reduced}", list.join(","))
            }
        };
        let predicted = self.predicted.as_ref().map(|p| format!("; {p}")).unwrap_or_default();
        Some(format!("{} pipeline stages{tp} ({}{predicted})", self.stages.len(), stages.join(", ")))
    }

    fn placement_plan(&self) -> Option<serde_json::Value> {
        Some(self.plan_json.clone())
    }
}
