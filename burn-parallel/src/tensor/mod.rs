//! Tensor parallelism: one decoder layer split Megatron-style over `tp` ranks, each on its own
//! device, behind [`LayerBlock`] so that a pipeline stage runs it like a whole layer.
//!
//! # What is split how
//!
//! | part | split | rank `r` holds |
//! | --- | --- | --- |
//! | q, k, v | by heads (columns of `[in, out]`) | query heads `r·H/tp ..`; the kv heads those queries read, `r·KV/tp ..` (GQA), or, when there are fewer kv heads than ranks and `tp` is a multiple of them, one kv head replicated on `tp/KV` ranks (vLLM) |
//! | o | by rows (its input = the rank's heads) | the matching rows; a partial sum of the output |
//! | MLP up, gate | by columns | columns `r·F/tp ..` |
//! | MLP down | by rows | the matching rows; a partial sum |
//! | biases | with their projection | column-split biases are cut with the columns; the biases of the row-split o and down are kept by rank 0 only, so they are added exactly once, inside rank 0's partial sum (the same as adding after the reduction) |
//! | norms | replicated | every rank normalizes its own copy of the residual stream |
//!
//! A degree that does not divide the query heads or the MLP width, or that neither divides the kv
//! heads nor is a multiple of them, is a [`TensorParallelError`] naming the numbers, raised before
//! anything is loaded ([`ShardPlan::new`]).
//!
//! KV-cache addressing follows [`crate::block`]: rank `r` of decoder layer `l` attends through
//! cache layer `l·tp + r`, which holds [`ShardPlan::kv_heads_per_rank`] heads on rank `r`'s device
//! ([`rank_kv_layout`] gives the whole cache's layout).
//!
//! # Reduction
//!
//! Each layer has two sums across ranks (after o and after down). [`ReducePath`] says how they
//! run ([`TensorParallelLayer::reduce_path`]):
//! - [`ReducePath::AllReduce`] when every rank is a distinct CUDA device in this process:
//!   `burn::tensor::distributed::all_reduce(t, ReduceOperation::Sum, devices)`, every rank's
//!   submitted before any is resolved. Read in Burn 0.22's source (`burn-tensor`
//!   `tensor/distributed.rs`, `burn-dispatch` `ops/distributed.rs`, `cubecl-cuda`
//!   `compute/communication.rs`): only CUDA implements it (NCCL, ranks in one process); wgpu,
//!   Metal, ROCm, the CubeCL CPU runtime and Flex panic ("no transport between its devices" /
//!   "not supported"), and no `DistributedContext` is needed for a plain all-reduce. The choice
//!   of this path is compiled only with the `cuda` feature; CUDA cannot be built on this
//!   project's machines, so the path is **untested**.
//! - [`ReducePath::ToDevice`] everywhere else: the partial sums are gathered to rank 0 with
//!   `to_device` and added there; the result goes back to every rank with `to_device` when the
//!   ranks need it (after attention, for the residual that feeds the MLP). Correct on every
//!   backend and any mix of devices.
//!
//! The layer input is sent from rank 0 to each rank with `to_device` at the start of every
//! forward pass (with the rotary angles), and the output is left on rank 0.
//! [`TensorParallelLayer::transfer_stats`] counts the bytes that moved between ranks.
//!
//! # Loading
//!
//! [`TensorParallelLayer::load`] builds each rank from one checkpoint with the models' own loader
//! over a view of the checkpoint that hands out only the rank's shard of every projection, cut on
//! the host before upload (safetensors: only the shard's bytes are decoded from the memory map;
//! GGUF: the quantized blocks are cut on the host). [`TensorParallelLayer::split`] cuts an
//! already-loaded [`DecoderLayer`].
//!
//! Quantized projections (GGUF `Q4_0`/`Q4_1`/`Q8_0`, `--quantize`) keep their codes: a cut
//! across the quantization groups' rows is always whole; a cut along the grouped axis must start
//! and end on group boundaries, else loading fails with an error naming the tensor and the group
//! size. Dequantizing and re-quantizing instead would silently change the weights (and, for
//! GGUF, the bit layout that was asked for), so it is refused rather than done behind the user's
//! back. GGUF stores `[out, in]` grouped along `in`, so q/k/v/up/gate shards are always whole and
//! o/down need `in/tp` to be a multiple of 32; `--quantize` groups `[in, out]` along `out`, so
//! q/k/v/up/gate need `out/tp` to be a multiple of the group size
//! ([`TensorParallelLayer::quantized`] quantizes each rank's shard).

mod plan;
mod reduce;
mod source;
mod split;

use burn::tensor::{Device, Tensor};
use burn_llm_models::arch::QkvNames;
use burn_llm_models::model::DecoderLayer;
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, KvCache, ModelError, QuantSpec};

pub use plan::{ShardPlan, TensorParallelError, rank_kv_layout};
pub use reduce::{ReducePath, TransferStats};

use crate::block::LayerBlock;
use reduce::Reducer;
use source::ShardSource;
use split::{out_width, split_layer, without_bias};

/// One decoder layer split over `tp` ranks (see the [module docs](self)). Rank 0's device holds
/// the layer's input and output.
#[derive(Debug)]
pub struct TensorParallelLayer {
    /// Rank `r`'s share of the layer, on device `r`: a [`DecoderLayer`] of its heads and columns.
    ranks: Vec<DecoderLayer>,
    plan: ShardPlan,
    reducer: Reducer,
}

impl TensorParallelLayer {
    /// Loads decoder layer `layer` of the model `spec` describes from `ckpt`, one rank per device
    /// in `devices` (rank `r` on `devices[r]`), each rank reading only its shard.
    pub fn load(
        spec: &DecoderSpec,
        ckpt: &impl TensorSource,
        layer: usize,
        devices: &[Device],
    ) -> Result<Self, TensorParallelError> {
        if devices.is_empty() {
            return Err(TensorParallelError::NoDevices);
        }
        if layer >= spec.num_layers {
            return Err(TensorParallelError::NoSuchLayer { layer, layers: spec.num_layers });
        }
        let names = spec.arch.tensor_names();
        if matches!(names.qkv, QkvNames::FusedOutIn(_)) || names.gate_up.is_some() || spec.variants.sandwich_norms {
            // Phi-3's fused rows are not cut per rank here, and Gemma's post-norms read the whole
            // reduced output.
            return Err(ModelError::UnsupportedFeature(format!(
                "tensor parallelism of a {} checkpoint; run it on one device or in a pipeline",
                spec.arch.name()
            ))
            .into());
        }
        let plan = ShardPlan::for_spec(spec, devices.len())?;
        let rank_spec = plan.rank_spec(spec);
        let ranks = devices
            .iter()
            .enumerate()
            .map(|(r, device)| {
                let source = ShardSource::new(ckpt, spec, &plan, layer, r);
                let module = CausalLm::load_layer(&rank_spec, &source, layer, device)?;
                Ok(if r == 0 { module } else { without_row_biases(module) })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self::from_ranks(ranks, plan, devices))
    }

    /// Cuts an already-loaded layer into `devices.len()` ranks, copying each rank's share onto
    /// its device.
    pub fn split(layer: DecoderLayer, devices: &[Device]) -> Result<Self, TensorParallelError> {
        let attn = &layer.attn;
        let plan =
            ShardPlan::new(devices.len(), attn.num_heads, attn.num_kv_heads, attn.head_dim, out_width(&layer.mlp.up))?;
        let ranks = devices
            .iter()
            .enumerate()
            .map(|(r, device)| split_layer(&layer, &plan, r, device))
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self::from_ranks(ranks, plan, devices))
    }

    fn from_ranks(ranks: Vec<DecoderLayer>, plan: ShardPlan, devices: &[Device]) -> Self {
        Self { ranks, plan, reducer: Reducer::new(devices.to_vec()) }
    }

    /// The layer with every rank's projections quantized as `spec` says (each rank's shard on its
    /// own, see [`DecoderLayer::quantized`]; shards whose width is not whole groups are an error).
    pub fn quantized(self, spec: QuantSpec) -> Result<Self, TensorParallelError> {
        let Self { ranks, plan, reducer } = self;
        let ranks = ranks.into_iter().map(|r| r.quantized(spec)).collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self { ranks, plan, reducer })
    }

    /// The tensor-parallel degree (ranks).
    pub fn degree(&self) -> usize {
        self.ranks.len()
    }

    /// How the heads and columns are divided.
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// Each rank's share of the layer, in rank order.
    pub fn ranks(&self) -> &[DecoderLayer] {
        &self.ranks
    }

    /// The ranks' devices, in rank order.
    pub fn devices(&self) -> &[Device] {
        &self.reducer.devices
    }

    /// How the partial sums are reduced.
    pub fn reduce_path(&self) -> ReducePath {
        self.reducer.path
    }

    /// Forward passes run and bytes moved between ranks since the layer was built.
    pub fn transfer_stats(&self) -> TransferStats {
        self.reducer.stats()
    }

    /// Bytes of projection weights per rank, as stored.
    pub fn rank_weight_bytes(&self) -> Vec<usize> {
        self.ranks.iter().map(DecoderLayer::weight_bytes).collect()
    }
}

/// A rank other than 0: the biases of its row-split projections (o, down) dropped, so that only
/// rank 0's partial sum carries them.
fn without_row_biases(mut layer: DecoderLayer) -> DecoderLayer {
    layer.attn.o = without_bias(layer.attn.o);
    layer.mlp.down = without_bias(layer.mlp.down);
    layer
}

impl LayerBlock for TensorParallelLayer {
    fn weight_bytes(&self) -> usize {
        self.rank_weight_bytes().iter().sum()
    }

    fn rank_transfer_bytes(&self) -> u64 {
        self.transfer_stats().bytes
    }

    fn reduce_path(&self) -> Option<&'static str> {
        Some(self.reducer.path.name())
    }

    fn forward(
        &self,
        x: Tensor<3>,
        layer: usize,
        rotary: Option<&(Tensor<4>, Tensor<4>)>,
        cache: &mut dyn KvCache,
    ) -> Result<Tensor<3>, ModelError> {
        let tp = self.degree();
        let reducer = &self.reducer;
        reducer.count_forward();
        let rotary: Vec<Option<(Tensor<4>, Tensor<4>)>> = match rotary {
            Some((cos, sin)) => {
                reducer.scatter(cos.clone()).into_iter().zip(reducer.scatter(sin.clone())).map(Some).collect()
            }
            None => vec![None; tp],
        };
        let mut attend = |xs: &[Tensor<3>], norm: bool| -> Result<Vec<Tensor<3>>, ModelError> {
            let mut parts = Vec::with_capacity(tp);
            for (r, (rank, x)) in self.ranks.iter().zip(xs).enumerate() {
                let x = if norm { rank.attn_norm.forward(x.clone()) } else { x.clone() };
                parts.push(rank.attn.forward(x, layer * tp + r, rotary[r].as_ref(), &mut *cache)?);
            }
            Ok(parts)
        };
        let mlp = |xs: &[Tensor<3>], norm: bool| -> Vec<Tensor<3>> {
            let ranks = self.ranks.iter().zip(xs);
            ranks
                .map(|(rank, x)| rank.mlp.forward(if norm { rank.mlp_norm.forward(x.clone()) } else { x.clone() }))
                .collect()
        };
        let xs = reducer.scatter(x);
        if self.ranks[0].pre_norm {
            // x + attn(norm(x)), then + mlp(norm(·)).
            let sums = reducer.sum_everywhere(attend(&xs, true)?);
            let xs: Vec<Tensor<3>> = xs.into_iter().zip(sums).map(|(x, s)| x + s).collect();
            let sum = reducer.sum_at_root(mlp(&xs, true));
            Ok(xs.into_iter().next().expect("a tensor-parallel layer has at least one rank") + sum)
        } else {
            // norm(x + attn(x)), then norm(· + mlp(·)).
            let sums = reducer.sum_everywhere(attend(&xs, false)?);
            let xs: Vec<Tensor<3>> = self
                .ranks
                .iter()
                .zip(xs.into_iter().zip(sums))
                .map(|(rank, (x, s))| rank.attn_norm.forward(x + s))
                .collect();
            let sum = reducer.sum_at_root(mlp(&xs, false));
            let x = xs.into_iter().next().expect("a tensor-parallel layer has at least one rank");
            Ok(self.ranks[0].mlp_norm.forward(x + sum))
        }
    }

    fn device(&self) -> Device {
        self.reducer.devices[0].clone()
    }

    fn kv_devices(&self) -> Vec<Device> {
        self.reducer.devices.clone()
    }
}
