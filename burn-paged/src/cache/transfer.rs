//! Whole blocks out of one paged cache and into another on another device: the KV hand-off of
//! disaggregated prefill and decode (ExeGPT's WAA). The blocks stay tensors throughout; the
//! destination moves them with Burn's `to_device`.

use burn_llm_kernels::paged::KvPool;

use super::PagedKvCache;
use crate::error::{PagedError, Result};
use crate::memory::BlockId;

/// The K and V contents of some blocks, per layer, on the device they were read on.
#[derive(Debug, Clone)]
pub struct KvBlocks {
    /// Per layer, `[K, V]`, each `blocks` blocks stored as the source pool stores them.
    layers: Vec<[KvPool; 2]>,
    /// Float key tails of unfinished blocks (per-channel keys): index in the blocks, each
    /// layer's floats.
    tails: Vec<(usize, Vec<burn::tensor::Tensor<4>>)>,
    blocks: usize,
    bytes: u64,
}

impl KvBlocks {
    /// Blocks held.
    pub fn num_blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes held, all layers, K and V.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl PagedKvCache {
    /// Copies device blocks `ids` (in this order) out of every layer's pools.
    pub fn read_blocks(&self, ids: &[BlockId]) -> Result<KvBlocks> {
        let raw: Vec<u32> = ids.iter().map(|b| b.0).collect();
        let layers = self
            .keys
            .iter()
            .zip(&self.values)
            .map(|(k, v)| Ok([k.read_blocks(&raw)?, v.read_blocks(&raw)?]))
            .collect::<Result<Vec<_>>>()?;
        let tails = self.read_tails(&raw)?;
        let per_block = Self::block_bytes(&self.layout, self.block_size, self.quant) as u64;
        let tail_bytes = Self::tail_bytes(&self.layout, self.block_size) as u64;
        let bytes = per_block * ids.len() as u64 + tail_bytes * tails.len() as u64;
        Ok(KvBlocks { layers, tails, blocks: ids.len(), bytes })
    }

    /// Writes `kv` into device blocks `ids` (the same count, in order) of every layer, each
    /// layer's blocks moved to that layer's device first. Errors leave the blocks named so far
    /// written and the rest as they were; the caller frees them either way.
    pub fn write_blocks(&mut self, ids: &[BlockId], kv: KvBlocks) -> Result<()> {
        if kv.blocks != ids.len() || kv.layers.len() != self.keys.len() {
            return Err(PagedError::Internal(format!(
                "a KV hand-off of {} blocks over {} layers cannot fill {} blocks over {} layers",
                kv.blocks,
                kv.layers.len(),
                ids.len(),
                self.keys.len()
            )));
        }
        let raw: Vec<u32> = ids.iter().map(|b| b.0).collect();
        for (layer, [k, v]) in kv.layers.into_iter().enumerate() {
            let device = self.placement.device(layer).clone();
            self.keys[layer].write_blocks(&raw, k.to_device(&device))?;
            self.values[layer].write_blocks(&raw, v.to_device(&device))?;
        }
        self.write_tails(&raw, kv.tails)
    }
}
