//! One decoder layer as a pipeline stage runs it: a whole layer on one device, or (tensor
//! parallelism) a layer split over ranks on several devices whose partial sums are reduced.
//!
//! KV-cache addressing is shared by every block so that one cache serves any split: with a
//! tensor-parallel degree `tp`, rank `r` of decoder layer `l` reads and writes cache layer
//! `l * tp + r`, holding `num_kv_heads / tp` heads, on that rank's device ([`LayerBlock::kv_devices`]).
//! A whole layer is the case `tp = 1`. A pipeline whose stages have different degrees maps these
//! addresses to its cache's layers ([`crate::pipeline::kv_map`]).

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use burn_llm_models::model::DecoderLayer;
use burn_llm_models::{KvCache, ModelError};

/// A decoder layer, whole or split, as seen by the stage that runs it.
pub trait LayerBlock: Send + Sync {
    /// Runs decoder layer `layer` on `x` (`[batch, seq, hidden]` on [`LayerBlock::device`]) with
    /// the step's rotary angles (on the same device), returning the layer's output there, or the
    /// cache's error.
    fn forward(
        &self,
        x: Tensor<3>,
        layer: usize,
        rotary: Option<&(Tensor<4>, Tensor<4>)>,
        cache: &mut dyn KvCache,
    ) -> Result<Tensor<3>, ModelError>;

    /// The device that holds the block's input and output.
    fn device(&self) -> Device;

    /// The device of each cache layer the block addresses, in rank order (one entry for a
    /// whole layer, `tp` entries for a split one).
    fn kv_devices(&self) -> Vec<Device>;

    /// Bytes of projection weights one decode step reads, over all ranks (for the paged engine's
    /// preemption costs and KV budget).
    fn weight_bytes(&self) -> usize;

    /// Bytes moved between tensor-parallel ranks since the block was built (0 for a whole layer).
    fn rank_transfer_bytes(&self) -> u64 {
        0
    }

    /// How a split layer reduces its ranks' partial sums (`all_reduce` or `to_device`); `None`
    /// for a whole layer.
    fn reduce_path(&self) -> Option<&'static str> {
        None
    }
}

impl LayerBlock for DecoderLayer {
    fn forward(
        &self,
        x: Tensor<3>,
        layer: usize,
        rotary: Option<&(Tensor<4>, Tensor<4>)>,
        cache: &mut dyn KvCache,
    ) -> Result<Tensor<3>, ModelError> {
        DecoderLayer::forward(self, x, layer, rotary, cache)
    }

    fn device(&self) -> Device {
        // Every parameter of a layer is loaded onto one device; a layer always has projections.
        Module::devices(self).into_iter().next().unwrap_or_default()
    }

    fn kv_devices(&self) -> Vec<Device> {
        vec![LayerBlock::device(self)]
    }

    fn weight_bytes(&self) -> usize {
        DecoderLayer::weight_bytes(self)
    }
}
