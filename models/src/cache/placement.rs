//! Where each cache layer lives: one device per cache layer, so that a model split into pipeline
//! stages (or tensor-parallel ranks) keeps every layer's keys and values next to the layer that
//! reads them. A cache built without a placement puts every layer on the model's device.

use burn::tensor::Device;

use super::KvLayout;
use crate::error::{ModelError, Result};

/// The device of every cache layer, with the distinct devices numbered in order of first use so
/// that a cache can keep one copy of per-step metadata (masks, block tables) per device.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDevices {
    /// Index into `distinct` of each layer's device.
    slot: Vec<usize>,
    /// The distinct devices, in order of first use.
    distinct: Vec<Device>,
}

impl LayerDevices {
    /// Every one of `layers` cache layers on `device`.
    pub fn uniform(device: &Device, layers: usize) -> Self {
        Self { slot: vec![0; layers], distinct: vec![device.clone()] }
    }

    /// Layer `i` on `devices[i]`.
    pub fn new(devices: &[Device]) -> Self {
        let mut distinct: Vec<Device> = Vec::new();
        let slot = devices
            .iter()
            .map(|d| match distinct.iter().position(|known| known == d) {
                Some(i) => i,
                None => {
                    distinct.push(d.clone());
                    distinct.len() - 1
                }
            })
            .collect();
        Self { slot, distinct }
    }

    /// Cache layers placed.
    pub fn len(&self) -> usize {
        self.slot.len()
    }

    /// Whether no layer is placed.
    pub fn is_empty(&self) -> bool {
        self.slot.is_empty()
    }

    /// The device of cache layer `layer`.
    pub fn device(&self, layer: usize) -> &Device {
        &self.distinct[self.slot[layer]]
    }

    /// Index of `layer`'s device among [`LayerDevices::distinct`].
    pub fn slot(&self, layer: usize) -> usize {
        self.slot[layer]
    }

    /// The distinct devices, in order of first use.
    pub fn distinct(&self) -> &[Device] {
        &self.distinct
    }

    /// Checks that there is one device per cache layer of `layout`.
    pub fn check(&self, layout: &KvLayout) -> Result<()> {
        if self.len() != layout.num_layers {
            return Err(ModelError::Device(format!(
                "a cache placement names {} devices for a cache of {} layers",
                self.len(),
                layout.num_layers
            )));
        }
        Ok(())
    }
}
