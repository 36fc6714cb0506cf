//! Engine configuration: the KV-cache memory budget and the scheduler's limits.

use std::sync::Arc;

use burn::tensor::DType;
use burn_llm_kernels::{GpuTensorLimit, QuantSpec};
use burn_llm_models::cache::fit_kv_quant;
use burn_llm_models::{KvLayout, LanguageModel, PrefillSlicing};

use crate::cache::PagedKvCache;
use crate::error::{PagedError, Result};
use crate::scheduler::{PreemptionMode, SchedulingPolicy};

/// How much memory the device KV-cache pool gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheMemory {
    /// A byte budget (`--kv-cache-memory 2GiB`).
    Bytes(u64),
    /// A fraction of the device's memory, after the weights (`--kv-cache-memory 0.5`). Known for
    /// the CPU (Flex: physical RAM); GPU runtimes need a byte budget.
    Fraction(f64),
    /// An exact number of blocks (tests, benchmarks).
    Blocks(usize),
}

impl std::str::FromStr for KvCacheMemory {
    type Err = String;

    /// `2GiB`, `512MiB`, `1.5GB`, `1000000` (bytes), `0.4` (a fraction), `blocks:64`.
    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        let t = text.trim();
        if let Some(n) = t.strip_prefix("blocks:") {
            return n.parse().map(Self::Blocks).map_err(|e| format!("`{text}`: {e}"));
        }
        let units: [(&str, f64); 8] = [
            ("KiB", 1024.0),
            ("MiB", 1024.0 * 1024.0),
            ("GiB", 1024.0 * 1024.0 * 1024.0),
            ("KB", 1e3),
            ("MB", 1e6),
            ("GB", 1e9),
            ("B", 1.0),
            ("", 1.0),
        ];
        for (suffix, scale) in units {
            if let Some(number) = t.strip_suffix(suffix) {
                let Ok(value) = number.trim().parse::<f64>() else { continue };
                if !value.is_finite() || value <= 0.0 {
                    return Err(format!("`{text}`: the KV-cache memory must be positive"));
                }
                if suffix.is_empty() && value < 1.0 {
                    return Ok(Self::Fraction(value));
                }
                return Ok(Self::Bytes((value * scale) as u64));
            }
        }
        Err(format!("`{text}` is not a memory size (e.g. 2GiB, 512MiB, 0.5 for a fraction, blocks:64)"))
    }
}

/// Settings of an [`LlmEngine`](crate::LlmEngine).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block (vLLM's default is 16).
    pub block_size: usize,
    /// Device KV-cache pool size.
    pub kv_cache_memory: KvCacheMemory,
    /// Group quantization of the KV blocks (`--kv-quant`), fitted to the model's heads when the
    /// engine is built ([`fit_kv_quant`]); `None`: floats in the model's dtype. A quantized block
    /// takes fewer bytes, so a byte budget buys more blocks.
    pub kv_quant: Option<QuantSpec>,
    /// Host swap space for preempted groups, in bytes (vLLM's default is 4 GiB).
    pub swap_space: u64,
    /// Sequences running at once, at most.
    pub max_num_seqs: usize,
    /// Tokens computed in one step, at most; `None`: the model's context length (at least 2048).
    /// With `chunked_prefill`, a longer prompt is computed over several steps; without it, it is
    /// refused.
    pub max_num_batched_tokens: Option<usize>,
    /// How groups are preempted when blocks run out.
    pub preemption: PreemptionMode,
    /// Reuse the KV of full blocks whose tokens (and everything before them) were seen before.
    pub enable_prefix_caching: bool,
    /// Which steps prefill and which decode: FCFS (vLLM, the default) or ExeGPT's phased RRA
    /// schedule.
    pub scheduling: SchedulingPolicy,
    /// Micro-batches each step's sequences are split into when the model runs in pipeline
    /// stages; `None`: one per stage (a model on one device runs one).
    pub micro_batches: Option<usize>,
    /// vLLM's chunked prefill (default on): a prompt that does not fit a step's token budget is
    /// computed a chunk per step, beside the running decodes, which the budget serves first.
    /// Under ExeGPT's phased schedule and static batching prompts stay whole either way.
    pub chunked_prefill: bool,
    /// TeraPipe's token slicing of a prefill through pipeline stages: when set and the model has
    /// several stages, each sequence's prompt tokens of a step are cut into the slices this
    /// returns, each issued as its own micro-batch in order, so that stage `s + 1` runs slice `i`
    /// while stage `s` runs slice `i + 1`. `None`: prompts go through the stages unsliced.
    pub prefill_slicing: Option<Arc<dyn PrefillSlicing>>,
}

impl PartialEq for EngineConfig {
    /// Field by field; two slicings are equal when they are the same object.
    fn eq(&self, other: &Self) -> bool {
        let Self {
            block_size,
            kv_cache_memory,
            kv_quant,
            swap_space,
            max_num_seqs,
            max_num_batched_tokens,
            preemption,
            enable_prefix_caching,
            scheduling,
            micro_batches,
            chunked_prefill,
            prefill_slicing,
        } = self;
        let same_slicing = match (prefill_slicing, &other.prefill_slicing) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        };
        *block_size == other.block_size
            && *kv_cache_memory == other.kv_cache_memory
            && *kv_quant == other.kv_quant
            && *swap_space == other.swap_space
            && *max_num_seqs == other.max_num_seqs
            && *max_num_batched_tokens == other.max_num_batched_tokens
            && *preemption == other.preemption
            && *enable_prefix_caching == other.enable_prefix_caching
            && *scheduling == other.scheduling
            && *micro_batches == other.micro_batches
            && *chunked_prefill == other.chunked_prefill
            && same_slicing
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_cache_memory: KvCacheMemory::Fraction(0.4),
            kv_quant: None,
            swap_space: 4 << 30,
            max_num_seqs: 256,
            max_num_batched_tokens: None,
            preemption: PreemptionMode::Auto,
            enable_prefix_caching: true,
            scheduling: SchedulingPolicy::Fcfs,
            micro_batches: None,
            chunked_prefill: true,
            prefill_slicing: None,
        }
    }
}

impl EngineConfig {
    /// Device blocks the budget buys, given `block_bytes` per block and `weight_bytes` of model,
    /// after the float key tails of per-channel keys (`tail_bytes` each, one per sequence run at
    /// once, [`EngineConfig::tail_blocks`]); 0 `tail_bytes` for caches without them. The bytes
    /// returned are the budget (or, for a block count, what the blocks and tails take).
    pub fn device_blocks(
        &self,
        block_bytes: usize,
        tail_bytes: usize,
        weight_bytes: usize,
        on_cpu: bool,
    ) -> Result<(usize, u64)> {
        let budget = match self.kv_cache_memory {
            KvCacheMemory::Blocks(n) => {
                return Ok((n, (n * block_bytes + self.tail_blocks(n, tail_bytes) * tail_bytes) as u64));
            }
            KvCacheMemory::Bytes(b) => b,
            KvCacheMemory::Fraction(f) => {
                if !(f > 0.0 && f < 1.0) {
                    return Err(PagedError::Config(format!("a KV-cache fraction must be in (0, 1), got {f}")));
                }
                let total = if on_cpu { physical_memory() } else { None }.ok_or_else(|| {
                    PagedError::Config(
                        "the device's memory size is unknown here: give --kv-cache-memory as bytes (e.g. 2GiB)".into(),
                    )
                })?;
                ((total as f64 * f) as u64).saturating_sub(weight_bytes as u64)
            }
        };
        let (block, tail, seqs) = (block_bytes.max(1) as u64, tail_bytes as u64, self.max_num_seqs as u64);
        // Every sequence holds a block, so at most `blocks` of them run: tails for all of
        // `max_num_seqs` when the budget has more blocks than that, else one per block.
        let blocks =
            if budget >= seqs * (block + tail) { (budget - seqs * tail) / block } else { budget / (block + tail) };
        Ok((blocks as usize, budget))
    }

    /// Float key tail blocks a cache of `blocks` blocks reserves: one per sequence run at once
    /// (`max_num_seqs`, at most one per block), none without tails (`tail_bytes` 0).
    pub fn tail_blocks(&self, blocks: usize, tail_bytes: usize) -> usize {
        if tail_bytes == 0 { 0 } else { self.max_num_seqs.min(blocks) }
    }

    /// Device blocks (and the budget in bytes) the budget buys for `model`'s KV cache on its
    /// device: what an engine built with this configuration will hold (before it checks that one
    /// full-length sequence fits). Over pipeline stages the budget covers every stage's blocks
    /// together (a block id holds its slots in every layer, so every stage has the same count).
    pub fn device_blocks_for(&self, model: &impl LanguageModel) -> Result<(usize, u64)> {
        let layout = model.kv_layout();
        let quant = self.kv_quant_for(&layout)?;
        let block_bytes = PagedKvCache::block_bytes(&layout, self.block_size, quant);
        let tail_bytes =
            if PagedKvCache::key_channels(quant) { PagedKvCache::tail_bytes(&layout, self.block_size) } else { 0 };
        let placement = model.kv_devices();
        let on_cpu = placement.distinct().iter().all(burn_llm_models::device::is_host_device);
        let (blocks, budget) = self.device_blocks(block_bytes, tail_bytes, model.decode_weight_bytes(), on_cpu)?;
        // The smallest limit of the pool's devices (none for a device no CubeCL runtime drives here).
        let limit = placement.distinct().iter().filter_map(GpuTensorLimit::of).min_by_key(|l| l.max_bytes);
        if let Some(limit) = limit.filter(|_| !on_cpu) {
            check_gpu_pool(&layout, self.block_size, blocks, quant, limit)?;
        }
        Ok((blocks, budget))
    }

    /// [`EngineConfig::kv_quant`] fitted to a model of `layout` ([`fit_kv_quant`]: groups of the
    /// whole head when the requested size does not tile one).
    pub fn kv_quant_for(&self, layout: &KvLayout) -> Result<Option<QuantSpec>> {
        Ok(self.kv_quant.map(|spec| fit_kv_quant(*layout, spec)).transpose()?)
    }

    /// Host blocks of swap space.
    pub fn host_blocks(&self, block_bytes: usize) -> usize {
        (self.swap_space / block_bytes.max(1) as u64) as usize
    }
}

/// Checks that a GPU pool of `blocks` blocks can be used on a device of `limit`: each layer's
/// keys (and values) are one tensor of `blocks` blocks, and past the largest buffer the device
/// binds (or 2^32 elements, the kernels' index width) the buffer fails to allocate, which shows
/// only when a result is read.
fn check_gpu_pool(
    layout: &KvLayout,
    block_size: usize,
    blocks: usize,
    quant: Option<QuantSpec>,
    limit: GpuTensorLimit,
) -> Result<()> {
    // A quantized pool's largest tensor is its codes, `32 / bits` values to a `u32` element.
    let (dtype, per_element) = match quant {
        Some(q) => (DType::U32, q.per_word()),
        None => (layout.dtype.dtype(), 1),
    };
    let block_elements = (PagedKvCache::block_values(layout, block_size) / per_element).max(1) as u64;
    let most = limit.max_elements(dtype) / block_elements;
    if blocks as u64 <= most {
        return Ok(());
    }
    let gib = |bytes: f64| bytes / (1u64 << 30) as f64;
    let block_bytes = PagedKvCache::block_bytes(layout, block_size, quant);
    let elements = (blocks as u64).saturating_mul(block_elements);
    Err(PagedError::Config(format!(
        "a KV cache of {blocks} blocks makes each layer's key and value tensors {elements} {dtype:?} elements \
         ({:.2} GiB) each, more than one GPU buffer holds on this device ({limit}): give --kv-cache-memory of at \
         most {most} blocks ({:.2} GiB of KV cache in all)",
        gib(elements as f64 * dtype.size() as f64),
        gib(most as f64 * block_bytes as f64)
    )))
}

/// Physical RAM in bytes (Linux `/proc/meminfo`).
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use burn_llm_models::Precision;

    use super::*;

    #[test]
    fn memory_sizes_parse() {
        assert_eq!("2GiB".parse(), Ok(KvCacheMemory::Bytes(2 << 30)));
        assert_eq!("512 MiB".parse(), Ok(KvCacheMemory::Bytes(512 << 20)));
        assert_eq!("1.5GB".parse(), Ok(KvCacheMemory::Bytes(1_500_000_000)));
        assert_eq!("4096".parse(), Ok(KvCacheMemory::Bytes(4096)));
        assert_eq!("0.25".parse(), Ok(KvCacheMemory::Fraction(0.25)));
        assert_eq!("blocks:12".parse(), Ok(KvCacheMemory::Blocks(12)));
        assert!("lots".parse::<KvCacheMemory>().is_err());
        assert!("-1GiB".parse::<KvCacheMemory>().is_err());
    }

    #[test]
    fn gpu_pools_over_what_a_kernel_handles_are_an_error() {
        // wgpu's Vulkan cap of 2^31 − 1 bytes per binding. LLaMA-7B's layer: 32 KV heads of 128,
        // blocks of 16 tokens: 65536 f16 elements (128 KiB) per block and tensor, so 16383 blocks
        // stay under the cap and 16384 (2 GiB) do not.
        let limit = GpuTensorLimit { max_bytes: (1 << 31) - 1 };
        let layout = KvLayout { num_layers: 32, num_kv_heads: 32, head_dim: 128, dtype: Precision::F16 };
        assert!(check_gpu_pool(&layout, 16, 16383, None, limit).is_ok());
        let Err(PagedError::Config(message)) = check_gpu_pool(&layout, 16, 16384, None, limit) else {
            panic!("16384 blocks of 128 KiB make a 2 GiB tensor");
        };
        assert!(message.contains("1073741824 F16 elements") && message.contains("at most 16383 blocks"), "{message}");
        assert!(check_gpu_pool(&layout, 16, usize::MAX, None, limit).is_err());
        // f32: half as many blocks.
        let f32_layout = KvLayout { dtype: Precision::F32, ..layout };
        assert!(check_gpu_pool(&f32_layout, 16, 8191, None, limit).is_ok());
        assert!(check_gpu_pool(&f32_layout, 16, 8192, None, limit).is_err());
        // 8-bit codes: four values to a 4-byte `u32` element, so twice the f16 blocks fit.
        let kv8 = QuantSpec::new(8, 64, 3).unwrap();
        assert!(check_gpu_pool(&layout, 16, 32767, Some(kv8), limit).is_ok());
        assert!(check_gpu_pool(&layout, 16, 32768, Some(kv8), limit).is_err());
        // A larger byte limit leaves the 32-bit element index as the bound.
        let large = GpuTensorLimit { max_bytes: 1 << 40 };
        assert!(check_gpu_pool(&layout, 16, 65535, None, large).is_ok());
        assert!(check_gpu_pool(&layout, 16, 65536, None, large).is_err());
    }
}
