//! The paged KV cache as the models see it: an implementation of [`KvCache`] over per-layer block
//! pools on the device, plus the host (CPU RAM) swap pool that preempted groups are parked in.
//!
//! A step runs all its tokens (prompt chunks and decode tokens of every scheduled sequence) as one
//! flattened sequence `[1, T]`. For each layer, [`KvCache::attend`] writes the step's keys and
//! values into their slots (reshape-and-cache) and runs PagedAttention, each query reading its own
//! sequence's keys through the block table up to its own position, so causality, sequence
//! boundaries and cached prefixes all come from the metadata the engine set with
//! [`PagedKvCache::begin_step`].
//!
//! Each layer's pools may live on their own device ([`LayerDevices`], pipeline stages): the step's
//! slots and block tables are then uploaded once per device, swaps read and write each layer on its
//! device, and a step split into micro-batches keeps one layout per micro-batch
//! ([`PagedKvCache::begin_micro_batches`], [`MicroBatchCache`](burn_llm_models::MicroBatchCache)).

mod split;
mod tails;
mod transfer;
mod window;

pub use transfer::KvBlocks;

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm_kernels::QuantSpec;
use burn_llm_kernels::paged::{KvPool, PagedBatch, QuantizedBlocks, SlotMapping};
use burn_llm_models::cache::{LayerDevices, check_kv_quant};
use burn_llm_models::{KvCache, KvLayout};

use crate::error::{PagedError, Result};
use crate::memory::BlockId;

/// Block tables and slots of one step, host side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PagedStep {
    /// Slot of every token of the step.
    pub slots: Vec<u32>,
    /// Row-major `[rows, max_blocks]` block tables of the step's sequences (padded with 0).
    pub block_tables: Vec<u32>,
    /// Width of `block_tables`.
    pub max_blocks: usize,
    /// Table row of every token.
    pub query_seq: Vec<u32>,
    /// Keys every token attends to: its position + 1.
    pub context_lens: Vec<u32>,
}

/// Slots and block tables of one (micro-)batch on one device.
type DeviceStep = (SlotMapping, PagedBatch);

/// K and V block pools of every layer on its device, and their host swap space.
pub struct PagedKvCache {
    layout: KvLayout,
    block_size: usize,
    num_blocks: usize,
    /// How keys and values are stored: floats (`None`) or group-quantized codes.
    quant: Option<QuantSpec>,
    /// Per layer, updated in place by the kernels (never cloned, so never copied).
    keys: Vec<KvPool>,
    values: Vec<KvPool>,
    /// With per-channel keys ([`PagedKvCache::key_channels`]): which blocks have a float tail.
    tails: Option<tails::TailBook>,
    /// Per layer, the float keys of unfinished blocks (`[tails, kv_heads, block_size,
    /// head_dim]`; empty without per-channel keys).
    tail_pools: Vec<Tensor<4>>,
    /// The step's per-channel key writes, per micro-batch.
    key_plans: Vec<tails::KeyPlan>,
    /// Host swap space, per layer and per part of K then of V (the floats, or the codes, scales
    /// and minimums), `num_host_blocks` blocks each, as the device's bytes; allocated on first
    /// use.
    host: Vec<Vec<Vec<u8>>>,
    num_host_blocks: usize,
    /// The step's slots and block tables per micro-batch, per distinct device of `placement`,
    /// uploaded once and read by every layer there.
    steps: Vec<Vec<DeviceStep>>,
    /// The same layouts on the host (local layers read their windows through them).
    host_steps: Vec<PagedStep>,
    /// The micro-batch `attend` serves.
    current: usize,
    placement: LayerDevices,
}

impl std::fmt::Debug for PagedKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedKvCache")
            .field("layout", &self.layout)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("quant", &self.quant)
            .field("num_host_blocks", &self.num_host_blocks)
            .finish()
    }
}

impl PagedKvCache {
    /// Values in one block of one layer's K (or V): `kv_heads · block_size · head_dim`.
    pub fn block_values(layout: &KvLayout, block_size: usize) -> usize {
        layout.num_kv_heads * block_size * layout.head_dim
    }

    /// Bytes one block takes over all layers, K and V: `kv_heads · block_size · head_dim` values
    /// in the layout's dtype per layer and K/V, or with `quant` their codes (`bits / 8` bytes a
    /// value) plus a scale and a minimum in the layout's dtype per group: `group_size` values of
    /// a token along the head, or for per-channel keys ([`PagedKvCache::key_channels`]) one
    /// channel over the block's tokens (the layouts [`QuantizedBlocks`] stores). Per-channel
    /// keys also need a float tail per running sequence ([`PagedKvCache::tail_bytes`]).
    pub fn block_bytes(layout: &KvLayout, block_size: usize, quant: Option<QuantSpec>) -> usize {
        let values = Self::block_values(layout, block_size);
        let float = layout.dtype.size_bytes();
        let per_layer = match quant {
            None => 2 * values * float,
            Some(spec) => {
                let key_group = if Self::key_channels(quant) { block_size } else { spec.group_size() };
                2 * values * spec.bits() as usize / 8 + (values / spec.group_size() + values / key_group) * 2 * float
            }
        };
        layout.num_layers * per_layer
    }

    /// Whether `quant` stores keys per channel over each block's tokens (KIVI): 4-bit codes do,
    /// since a few channels carry most of a key's magnitude and groups along the head spend the
    /// 16 levels on them; 8-bit codes keep keys grouped along the head like values.
    pub fn key_channels(quant: Option<QuantSpec>) -> bool {
        quant.is_some_and(|q| q.bits() == 4)
    }

    /// Allocates `num_blocks` device blocks per layer (zeroed, in the layout's dtype) and reserves
    /// `num_host_blocks` of host swap space.
    pub fn new(
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
        device: &Device,
    ) -> Self {
        let placement = LayerDevices::uniform(device, layout.num_layers);
        Self::build(layout, block_size, num_blocks, num_host_blocks, placement, None)
            .expect("float pools fit any layout")
    }

    /// Like [`PagedKvCache::new`], with layer `i`'s pools on `placement.device(i)` (the same
    /// `num_blocks` on every layer: a block id names the same slots in every layer), and keys and
    /// values group-quantized as `quant` says (along the head dimension, see [`check_kv_quant`]).
    /// Errors when the placement does not name one device per layer or `quant` does not fit the
    /// heads.
    pub fn placed(
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
        placement: LayerDevices,
        quant: Option<QuantSpec>,
    ) -> Result<Self> {
        placement.check(&layout)?;
        if let Some(spec) = quant {
            check_kv_quant(layout, spec)?;
            if Self::key_channels(quant) && !block_size.is_multiple_of(spec.per_word()) {
                return Err(PagedError::Config(format!(
                    "--kv-quant {} stores keys per channel over each block's tokens, which needs a block size \
                     that is a multiple of {}: got --block-size {block_size}",
                    spec.bits(),
                    spec.per_word()
                )));
            }
        }
        Self::build(layout, block_size, num_blocks, num_host_blocks, placement, quant)
    }

    fn build(
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        num_host_blocks: usize,
        placement: LayerDevices,
        quant: Option<QuantSpec>,
    ) -> Result<Self> {
        let shape = [num_blocks, layout.num_kv_heads, block_size, layout.head_dim];
        let dtype = layout.dtype.dtype();
        let pool = || -> Result<Vec<KvPool>> {
            (0..layout.num_layers).map(|i| Ok(KvPool::zeros(shape, quant, dtype, placement.device(i))?)).collect()
        };
        let channels = Self::key_channels(quant);
        let keys = match quant {
            Some(spec) if channels => (0..layout.num_layers)
                .map(|i| {
                    Ok(KvPool::Quantized(QuantizedBlocks::zeros_per_channel(
                        shape,
                        spec.bits(),
                        dtype,
                        placement.device(i),
                    )?))
                })
                .collect::<Result<Vec<_>>>()?,
            _ => pool()?,
        };
        let tail_shape = [0, layout.num_kv_heads, block_size, layout.head_dim];
        let tail_pools = if channels {
            (0..layout.num_layers).map(|i| Tensor::zeros(tail_shape, (placement.device(i), dtype))).collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            layout,
            block_size,
            num_blocks,
            quant,
            keys,
            values: pool()?,
            tails: channels.then(tails::TailBook::default),
            tail_pools,
            key_plans: Vec::new(),
            host: vec![Vec::new(); layout.num_layers],
            num_host_blocks,
            steps: Vec::new(),
            host_steps: Vec::new(),
            current: 0,
            placement,
        })
    }

    /// How keys and values are stored: `None` for floats, else their group quantization.
    pub fn quantization(&self) -> Option<QuantSpec> {
        self.quant
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Device blocks per layer.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Uploads the block tables and slots the next forward pass uses.
    pub fn begin_step(&mut self, step: &PagedStep) -> Result<()> {
        self.begin_micro_batches(std::slice::from_ref(step))
    }

    /// Uploads the layouts of a step split into micro-batches (each a [`PagedStep`] of its own
    /// sequences) to every device; `attend` serves micro-batch 0 until
    /// [`MicroBatchCache::select_micro_batch`](burn_llm_models::MicroBatchCache::select_micro_batch) picks another.
    pub fn begin_micro_batches(&mut self, steps: &[PagedStep]) -> Result<()> {
        let mut uploaded = Vec::with_capacity(steps.len());
        for step in steps {
            let per_device = self
                .placement
                .distinct()
                .iter()
                .map(|device| -> Result<DeviceStep> {
                    let slots = SlotMapping::new(&step.slots, device)?;
                    let batch = PagedBatch::new(
                        &step.block_tables,
                        step.max_blocks,
                        self.block_size,
                        &step.query_seq,
                        &step.context_lens,
                        device,
                    )?;
                    Ok((slots, batch))
                })
                .collect::<Result<Vec<_>>>()?;
            uploaded.push(per_device);
        }
        self.plan_keys(steps)?;
        self.steps = uploaded;
        self.host_steps = steps.to_vec();
        self.current = 0;
        Ok(())
    }

    /// Drops the step's uploaded layouts once its forward pass is recorded. Done before the
    /// step's results are read, a lazy device (fusion) records their drops with the pass that
    /// read them, instead of at the start of the next step, where each would open a fusion block
    /// of its own.
    pub fn end_step(&mut self) {
        self.steps.clear();
    }

    /// The device of each layer's pools.
    pub fn placement(&self) -> &LayerDevices {
        &self.placement
    }

    /// Copy-on-write: copies device blocks `src → dst` in every layer (codes with their scales
    /// and minimums when quantized).
    pub fn copy_blocks(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(u32, u32)> = pairs.iter().map(|(s, d)| (s.0, d.0)).collect();
        for pool in self.keys.iter_mut().chain(self.values.iter_mut()) {
            pool.copy_blocks(&pairs)?;
        }
        self.copy_tails(&pairs)
    }

    /// Bytes one block of each part of a layer's K, then V, pool takes: its floats, or its
    /// codes, scales and minimums.
    fn part_block_bytes(&self) -> [Vec<usize>; 2] {
        let bytes = |pool: &KvPool| -> Vec<usize> {
            pool.parts().iter().map(|(block, dtype)| block.iter().product::<usize>() * dtype.size()).collect()
        };
        [bytes(&self.keys[0]), bytes(&self.values[0])]
    }

    /// Swap-out: copies device blocks into host blocks (`(device, host)` pairs), every part of
    /// every layer's K and V.
    pub fn swap_out(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let part_bytes = self.part_block_bytes();
        let ids: Vec<u32> = pairs.iter().map(|(d, _)| d.0).collect();
        // Host buffers grow to the highest host block written, not to the whole swap space:
        // zero-filling `--swap-space` (4 GiB by default) at the first preemption would stall
        // every running sequence for as long as the kernel takes to clear those pages. Host
        // blocks are handed out lowest id first, so the buffers stay as large as the peak use.
        let host_blocks = pairs.iter().map(|(_, h)| h.index() + 1).max().unwrap_or(0);
        if host_blocks > self.num_host_blocks {
            return Err(PagedError::Internal(format!(
                "host block {} is past the {} host blocks of the swap space",
                host_blocks - 1,
                self.num_host_blocks
            )));
        }
        for layer in 0..self.layout.num_layers {
            let host = &mut self.host[layer];
            host.resize(part_bytes[0].len() + part_bytes[1].len(), Vec::new());
            for (half, pool) in [&self.keys[layer], &self.values[layer]].into_iter().enumerate() {
                for (part, data) in pool.read_blocks(&ids)?.into_data().into_iter().enumerate() {
                    let per_block = part_bytes[half][part];
                    let buffer = &mut host[half * part_bytes[0].len() + part];
                    if buffer.len() < host_blocks * per_block {
                        buffer.resize(host_blocks * per_block, 0);
                    }
                    for ((_, h), chunk) in pairs.iter().zip(data.as_bytes().chunks_exact(per_block)) {
                        let at = h.index() * per_block;
                        buffer[at..at + per_block].copy_from_slice(chunk);
                    }
                }
            }
        }
        self.swap_out_tails(pairs)
    }

    /// Swap-in: copies host blocks back into device blocks (`(host, device)` pairs).
    pub fn swap_in(&mut self, pairs: &[(BlockId, BlockId)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let part_bytes = self.part_block_bytes();
        let ids: Vec<u32> = pairs.iter().map(|(_, d)| d.0).collect();
        for layer in 0..self.layout.num_layers {
            for half in 0..2 {
                let pool = if half == 0 { &self.keys[layer] } else { &self.values[layer] };
                let (parts, quant) = (pool.parts(), pool.quantization());
                let mut datas = Vec::with_capacity(parts.len());
                for (part, &(shape, dtype)) in parts.iter().enumerate() {
                    let per_block = part_bytes[half][part];
                    let buffer =
                        self.host[layer].get(half * part_bytes[0].len() + part).map(Vec::as_slice).unwrap_or(&[]);
                    let mut data = Vec::with_capacity(pairs.len() * per_block);
                    for (h, _) in pairs {
                        let at = h.index() * per_block;
                        let block = buffer
                            .get(at..at + per_block)
                            .ok_or_else(|| PagedError::Internal(format!("host block {h} was never written")))?;
                        data.extend_from_slice(block);
                    }
                    let [heads, rows, width] = shape;
                    datas.push(TensorData::from_bytes_vec(data, [pairs.len(), heads, rows, width], dtype));
                }
                let blocks = KvPool::from_data(datas, quant, self.placement.device(layer))?;
                let pool = if half == 0 { &mut self.keys[layer] } else { &mut self.values[layer] };
                pool.write_blocks(&ids, blocks)?;
            }
        }
        self.swap_in_tails(pairs)
    }
}

impl KvCache for PagedKvCache {
    /// `q` is `[1, heads, T, head_dim]`, `k`/`v` `[1, kv_heads, T, head_dim]`: the step's tokens
    /// flattened into one row.
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.whole_view().attend(layer, q, k, v, scale, window)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};
    use burn_llm_models::{KvCache, KvLayout, Precision};

    use super::{PagedKvCache, PagedStep};
    use crate::memory::BlockId;

    const LAYOUT: KvLayout = KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, dtype: Precision::F32 };

    /// What the engine's bookkeeping should never produce comes back as an error, not a panic.
    #[test]
    fn attend_reports_an_unprepared_step_as_an_error() {
        let device = Device::flex();
        let mut cache = PagedKvCache::new(LAYOUT, 4, 2, 0, &device);
        let x = || Tensor::<4>::ones([1, 1, 1, 4], &device);
        let err = cache.attend(0, x(), x(), x(), 1.0, None).unwrap_err();
        assert!(err.to_string().contains("before begin_step"), "{err}");

        let step = PagedStep {
            slots: vec![0],
            block_tables: vec![0],
            max_blocks: 1,
            query_seq: vec![0],
            context_lens: vec![1],
        };
        cache.begin_step(&step).unwrap();
        let err = cache.attend(1, x(), x(), x(), 1.0, None).unwrap_err();
        assert!(err.to_string().contains("layer 1"), "{err}");
        let out = cache.attend(0, x(), x(), x(), 1.0, None).unwrap();
        assert_eq!(out.dims(), [1, 1, 1, 4]);
    }

    /// Swap-out keeps on the host only the host blocks written (up to the highest id), not the
    /// whole swap space, and swap-in brings the block back unchanged; a host block past the swap
    /// space is an error.
    #[test]
    fn host_buffers_grow_with_the_host_blocks_written() {
        let device = Device::flex();
        let mut cache = PagedKvCache::new(LAYOUT, 4, 3, 1 << 24, &device);
        let step = PagedStep {
            slots: vec![0, 1, 2, 3],
            block_tables: vec![0],
            max_blocks: 1,
            query_seq: vec![0; 4],
            context_lens: vec![1, 2, 3, 4],
        };
        cache.begin_step(&step).unwrap();
        let x = Tensor::<4>::from_data(TensorData::new((0..16).map(|i| i as f32).collect(), [1, 1, 4, 4]), &device);
        cache.attend(0, x.clone(), x.clone(), x, 1.0, None).unwrap();
        let block = |cache: &PagedKvCache, b: u32| {
            cache.keys[0].read_blocks(&[b]).unwrap().dense().into_data().try_into_vec_as::<f32>().unwrap()
        };

        cache.swap_out(&[(BlockId(0), BlockId(1))]).unwrap();
        let block_bytes = 4 * 4 * 4;
        let host: usize = cache.host.iter().flatten().map(Vec::len).sum();
        assert_eq!(host, 2 * 2 * block_bytes, "K and V, host blocks 0 and 1 of 2^24");
        cache.swap_in(&[(BlockId(1), BlockId(2))]).unwrap();
        assert_eq!(block(&cache, 2), block(&cache, 0));
        assert_eq!(block(&cache, 2), (0..16).map(|i| i as f32).collect::<Vec<_>>());

        let err = cache.swap_out(&[(BlockId(0), BlockId(1 << 24))]).unwrap_err();
        assert!(err.to_string().contains("swap space"), "{err}");
    }
}
