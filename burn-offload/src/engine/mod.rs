//! The offloading runtime: FlexGen's zig-zag block schedule over weights placed per layer, KV
//! cache per (layer, GPU batch) and activations per GPU batch on the device, the host or the disk,
//! under an enforced device and host byte budget.
//!
//! One generation step of a block runs layer by layer; within a layer every GPU batch of the block
//! runs before the next layer, so each layer's weights cross the link once per block and step.
//! Each (layer, batch) step runs FlexGen's six tasks (Algorithm 1, [`schedule`]) overlapped on
//! three threads (CubeCL gives every thread its own device stream), with a synchronization per
//! step:
//! - `load_weight`: the next layer's weights (host → device copy, or disk read, checksum and
//!   upload);
//! - `store_cache`, `store_hidden` of the previous step (its new KV slots to disk, its output
//!   activations to their tier), then `load_cache`, `load_hidden` of the next step (its KV cache
//!   from disk, its activations from the host or disk): one thread, so that at most two
//!   disk-resident KV tensors are in host memory at once ([`io`], [`parking`]);
//! - `compute` of this step.
//!
//! A KV-cache tensor on the host stays there (with CPU attention only queries, new keys/values
//! and outputs cross the link, see [`crate::cache`]); one on disk is read before its step and
//! only the step's new slots are written back. `overlap = false` runs the same tasks one after
//! the other (the ablation).

mod io;
mod parking;
mod schedule;

use std::path::PathBuf;

use burn::tensor::{Device, Tensor};
use burn_llm_models::generation::{
    GenerationClock, GroupTokens, RequestState, StaticBatch, prepare_requests, prompt_tokens, static_kv_capacity,
};
use burn_llm_models::model::DecoderLayer;
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, GenerationOutput, Prompt, SamplingParams, Tokenizer};
use serde::Serialize;

use crate::cache::{KvPlacement, OffloadKvCache};
use crate::error::{OffloadError, Result};
use crate::policy::{
    CostEstimate, HardwareProfile, ModelShape, OffloadWorkload, Placement, Policy, QuantSpec, SearchSpace, ThreadPlan,
    Tier, TierBytes, estimate, search_whole,
};
use crate::store::{DiskStore, MemoryLedger, Reservation, ScratchDir, fmt_bytes};
use crate::weights::{hollow, write_layer};
use io::BlockIo;

/// How the policy is chosen.
#[derive(Debug, Clone)]
pub enum PolicyChoice {
    /// FlexGen's search over the cost model, for this hardware profile (its memory capacities
    /// are replaced by the budgets).
    Auto(SearchSpace),
    /// A given policy (`--percent`, baselines).
    Fixed(Policy),
}

/// Settings of an [`OffloadEngine`].
#[derive(Debug, Clone)]
pub struct OffloadConfig {
    /// Device memory budget in bytes (enforced).
    pub gpu_mem: u64,
    /// Host memory budget in bytes (enforced).
    pub cpu_mem: u64,
    /// Directory of the disk tier.
    pub offload_dir: PathBuf,
    /// The policy, searched or given.
    pub policy: PolicyChoice,
    /// Hardware constants for the cost model (measured by [`crate::profiler`] or loaded).
    pub hardware: HardwareProfile,
    /// Prompt and generation lengths the policy is planned for.
    pub workload: OffloadWorkload,
    /// Device holding the host tier (the CPU: `Device::flex()`).
    pub host: Device,
    /// Top-K sparse attention for decode (FlexGen §5): the fraction of keys each query keeps.
    pub attention_sparsity: Option<f32>,
    /// Thread counts for compute and for weight loading (LM-Offload Algorithm 3, from
    /// [`crate::profiler::profile_threads`] and [`crate::policy::choose_threads`]); `None` uses
    /// the global thread pool for both.
    pub threads: Option<ThreadPlan>,
}

/// Peak bytes per tier during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemoryReport {
    /// Device.
    pub gpu_peak_bytes: u64,
    /// Host.
    pub cpu_peak_bytes: u64,
    /// Disk (weights written to the offload directory).
    pub disk_bytes: u64,
}

/// What a generation call did, beyond the foundation's output.
#[derive(Debug, Clone, Serialize)]
pub struct OffloadReport {
    /// The policy that ran (placements rounded to whole layers).
    pub policy: Policy,
    /// The cost model's prediction for it.
    pub predicted_tokens_per_s: f64,
    /// Measured generated tokens per second.
    pub measured_tokens_per_s: f64,
    /// Peak memory per tier.
    pub memory: MemoryReport,
    /// Sequences per block (`gpu_batch_size · num_gpu_batches`).
    pub effective_batch: usize,
}

/// A layer's weights, where the policy put them.
enum LayerHome {
    /// Resident on the device.
    Device(DecoderLayer),
    /// Resident in host memory, copied to the device when used.
    Host(DecoderLayer),
    /// In the offload directory as stored (compressed codes when the policy compresses weights),
    /// read (memory-mapped, checksum-verified) when used into this hollow copy of the layer: one
    /// per layer, since layers differ in more than weights (Gemma 3's local and global layers
    /// have their own attention window and rotary table).
    Disk(DecoderLayer),
}

/// FlexGen's engine on Burn.
pub struct OffloadEngine {
    skeleton: CausalLm,
    spec: DecoderSpec,
    device: Device,
    host: Device,
    layers: Vec<LayerHome>,
    layer_bytes: Vec<u64>,
    /// The structure disk layers are read into (no weights).
    store: DiskStore,
    ledger: MemoryLedger,
    _resident: Vec<Reservation>,
    policy: Policy,
    estimate: CostEstimate,
    /// Tier of each KV-cache tensor, index `layer · num_gpu_batches + batch`.
    cache_tiers: Vec<Tier>,
    /// Tier each GPU batch's activations wait on between layers.
    activation_tiers: Vec<Tier>,
    attention_sparsity: Option<f32>,
    compute_pool: Option<rayon::ThreadPool>,
    io_pool: Option<rayon::ThreadPool>,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for OffloadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadEngine").field("policy", &self.policy).finish()
    }
}

/// The cost model's view of a decoder (weights and cache in the spec's dtype, as the runtime stores them).
pub fn model_shape(spec: &DecoderSpec) -> ModelShape {
    let heads = spec.num_heads as u64;
    let mut shape =
        ModelShape::paper_opt(spec.num_layers as u32, spec.hidden_size as u64, spec.intermediate_size as u64, heads);
    shape.name = spec.arch.name().to_string();
    shape.num_kv_heads = spec.num_kv_heads as u64;
    shape.head_dim = spec.head_dim as u64;
    shape.vocab_size = spec.vocab_size as u64;
    // Weights, activations and the uncompressed KV cache are in the model's `--dtype` (FlexGen
    // models fp16: 2 bytes).
    shape.bytes_per_element = spec.dtype.size_bytes() as u64;
    if spec.gated_mlp {
        shape.mlp = crate::policy::MlpKind::Gated;
    }
    shape
}

impl OffloadEngine {
    /// Places the model from `source` per the policy: device layers uploaded, host layers kept in
    /// host memory, disk layers written to the offload directory, each against its budget.
    pub fn new(
        spec: DecoderSpec,
        source: &impl TensorSource,
        tokenizer: Option<Tokenizer>,
        eos_token_ids: Vec<u32>,
        config: OffloadConfig,
        device: &Device,
    ) -> Result<Self> {
        if let Some(f) = config.attention_sparsity.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
            return Err(OffloadError::Config(format!("attention sparsity must be in (0, 1], got {f}")));
        }
        let mut hw = config.hardware.clone();
        hw.gpu_memory_bytes = config.gpu_mem;
        hw.cpu_memory_bytes = config.cpu_mem;
        let shape = model_shape(&spec);
        let ledger = MemoryLedger::new(Some(config.gpu_mem), Some(config.cpu_mem), None);
        let skeleton = CausalLm::skeleton(spec.clone(), source, device)?;
        let skeleton_bytes =
            (skeleton.decode_weight_bytes() + spec.vocab_size * spec.embed_dim * spec.dtype.size_bytes()) as u64;
        let mut resident = vec![ledger.reserve(Tier::Gpu, skeleton_bytes, "embeddings and LM head")?];
        let reserved = TierBytes { gpu: skeleton_bytes as f64, cpu: 0.0, disk: 0.0 };
        let num_layers = spec.num_layers as u64;
        let (policy, layer_tiers, cache_counts, activation_counts, estimate) = match &config.policy {
            PolicyChoice::Auto(space) => {
                let mut space = space.clone();
                space.reserved_bytes = reserved;
                let rounded = search_whole(&hw, &shape, &config.workload, &space)?;
                (
                    rounded.policy,
                    rounded.layer_tiers,
                    rounded.cache_tensors,
                    rounded.activation_tensors,
                    rounded.estimate,
                )
            }
            PolicyChoice::Fixed(policy) => {
                // A given policy runs as given: whole layers and tensors in tier order, no
                // re-optimization.
                policy.validate()?;
                let batches = u64::from(policy.shape.num_gpu_batches.max(1));
                let tiers = tiers_in_order(whole_counts(policy.weights, num_layers));
                let est = estimate(&hw, &shape, &config.workload, policy)?;
                (
                    *policy,
                    tiers,
                    whole_counts(policy.cache, num_layers * batches),
                    whole_counts(policy.activations, batches),
                    est,
                )
            }
        };

        let pool = |threads: u32| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads.max(1) as usize)
                .build()
                .map_err(|e| OffloadError::Config(format!("cannot build a thread pool: {e}")))
        };
        let (compute_pool, io_pool) = match &config.threads {
            Some(plan) => {
                (Some(pool(plan.intra_op_compute)?), Some(pool(plan.io_threads.first().copied().unwrap_or(1))?))
            }
            None => (None, None),
        };
        let mut store = DiskStore::open(&config.offload_dir)?;
        let mut layers = Vec::with_capacity(spec.num_layers);
        let mut layer_bytes = Vec::with_capacity(spec.num_layers);
        let compress = policy.shape.compress_weights;
        for (j, tier) in layer_tiers.iter().enumerate() {
            let what = format!("layer {j} weights");
            let on = if *tier == Tier::Gpu { device } else { &config.host };
            let layer = compressed(CausalLm::load_layer(&spec, source, j, on)?, compress)?;
            let bytes = layer.weight_bytes() as u64;
            layer_bytes.push(bytes);
            let home = match tier {
                Tier::Gpu => {
                    resident.push(ledger.reserve(Tier::Gpu, bytes, &what)?);
                    LayerHome::Device(layer)
                }
                Tier::Cpu => {
                    resident.push(ledger.reserve(Tier::Cpu, bytes, &what)?);
                    LayerHome::Host(layer)
                }
                Tier::Disk => {
                    write_layer(&layer, &mut store, &format!("layer{j}/"))?;
                    LayerHome::Disk(hollow(layer))
                }
            };
            layers.push(home);
        }
        Ok(Self {
            skeleton,
            spec,
            device: device.clone(),
            host: config.host,
            layers,
            layer_bytes,
            store,
            ledger,
            _resident: resident,
            estimate,
            policy,
            cache_tiers: tiers_in_order(cache_counts),
            activation_tiers: tiers_in_order(activation_counts),
            attention_sparsity: config.attention_sparsity,
            compute_pool,
            io_pool,
            tokenizer,
            eos_token_ids,
        })
    }

    /// The policy that runs, rounded to whole layers.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The cost model's estimate for it.
    pub fn estimate(&self) -> &CostEstimate {
        &self.estimate
    }

    /// The tokenizer, if any.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The model's description.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// Where each layer's weights live.
    pub fn layer_tiers(&self) -> Vec<Tier> {
        self.layers
            .iter()
            .map(|h| match h {
                LayerHome::Device(_) => Tier::Gpu,
                LayerHome::Host(_) => Tier::Cpu,
                LayerHome::Disk(_) => Tier::Disk,
            })
            .collect()
    }

    /// Where each KV-cache tensor lives, index `layer · num_gpu_batches + batch`.
    pub fn cache_tiers(&self) -> &[Tier] {
        &self.cache_tiers
    }

    /// Where each GPU batch's activations wait between layers.
    pub fn activation_tiers(&self) -> &[Tier] {
        &self.activation_tiers
    }

    fn cache_tier(&self, layer: usize, batch: usize) -> Tier {
        let n = self.policy.shape.num_gpu_batches.max(1) as usize;
        self.cache_tiers.get(layer * n + batch).copied().unwrap_or(Tier::Gpu)
    }

    fn activation_tier(&self, batch: usize) -> Tier {
        self.activation_tiers.get(batch).copied().unwrap_or(Tier::Gpu)
    }

    /// Generates for every prompt, a block of `gpu_batch_size · num_gpu_batches` prompts at a
    /// time, and reports what ran.
    pub fn generate(&self, prompts: &[Prompt], params: &SamplingParams) -> Result<(GenerationOutput, OffloadReport)> {
        let mut clock = GenerationClock::start();
        params.validate(self.spec.vocab_size)?;
        let mut requests = prepare_requests(prompts, params, self.tokenizer.as_ref(), &self.spec, &self.eos_token_ids)?;
        self.ledger.reset_peaks();
        let gbs = self.policy.shape.gpu_batch_size.max(1) as usize;
        let block = gbs * self.policy.shape.num_gpu_batches.max(1) as usize;
        let (mut scratch_bytes, mut generated) = (0, 0);
        for chunk in requests.chunks_mut(block) {
            let (tokens, bytes) = self.run_block(chunk, gbs, params, &mut clock)?;
            generated += tokens;
            scratch_bytes = scratch_bytes.max(bytes);
        }
        let timing = clock.finish(prompt_tokens(&requests), generated);
        let total = timing.prefill_s + timing.decode_s;
        let output =
            GenerationOutput { requests: requests.into_iter().map(RequestState::into_output).collect(), timing };
        let report = OffloadReport {
            policy: self.policy,
            predicted_tokens_per_s: self.estimate.throughput_tokens_per_s,
            measured_tokens_per_s: output.timing.generated_tokens as f64 / total.max(1e-9),
            memory: MemoryReport {
                gpu_peak_bytes: self.ledger.peak(Tier::Gpu),
                cpu_peak_bytes: self.ledger.peak(Tier::Cpu),
                disk_bytes: self.store.bytes_on_disk() + scratch_bytes,
            },
            effective_batch: block,
        };
        Ok((output, report))
    }

    /// One block: its GPU batches advance together, layer by layer (zig-zag), until all finish.
    /// Returns the tokens it generated and the bytes its KV cache and activations took on disk.
    fn run_block(
        &self,
        block: &mut [RequestState],
        gbs: usize,
        params: &SamplingParams,
        clock: &mut GenerationClock,
    ) -> Result<(usize, u64)> {
        let layout = self.skeleton.kv_layout();
        let capacity = static_kv_capacity(block);
        let needs_disk = self.cache_tiers.contains(&Tier::Disk) || self.activation_tiers.contains(&Tier::Disk);
        let scratch = needs_disk.then(|| ScratchDir::create(self.store.dir(), "run")).transpose()?;
        let mut io = BlockIo::new(scratch, block.len().div_ceil(gbs));
        let mut caches = Vec::new();
        let mut budgets = Vec::new();
        for (k, batch) in block.chunks(gbs).enumerate() {
            let cache = self.batch_cache(k, batch.len(), capacity)?;
            // Charged per policy tier (on a GPU-less machine host and device are both the CPU);
            // a disk-resident layer is charged to the host only while it is loaded.
            let per_layer = cache.layer_bytes() as u64;
            for j in 0..layout.num_layers {
                match self.cache_tier(j, k) {
                    Tier::Disk => io.add_kv_files(&cache, j, k)?,
                    tier => budgets.push(self.ledger.reserve(
                        tier,
                        per_layer,
                        &format!("KV cache of layer {j}, GPU batch {k}"),
                    )?),
                }
            }
            caches.push(cache);
        }
        let batch = StaticBatch {
            params,
            eos_token_ids: &self.eos_token_ids,
            tokenizer: self.tokenizer.as_ref(),
            group_rows: gbs,
            engine: "offload",
            // The zig-zag schedule lays each step's tokens out on the host.
            feed_on_device: false,
        };
        // The forward of a step: every running GPU batch's embeddings, the zig-zag layer
        // schedule over all of them, then each one's last-token logits.
        let generated = batch.run(block, clock, |groups, _| self.forward_block(groups, &mut caches, &io), |_| {})?;
        drop(budgets);
        Ok((generated, io.disk_bytes()))
    }

    /// One step of a block's GPU batches (`groups[k]`: batch `k`'s new tokens, `None` when it
    /// sits the step out): their last-token logits.
    fn forward_block(
        &self,
        groups: &GroupTokens<'_>,
        caches: &mut [OffloadKvCache],
        io: &BlockIo,
    ) -> Result<Vec<Option<Tensor<2>>>> {
        let mut hidden = Vec::with_capacity(caches.len());
        let mut lasts = Vec::with_capacity(caches.len());
        for (cache, rows) in caches.iter_mut().zip(groups) {
            let Some(rows) = rows else {
                hidden.push(None);
                lasts.push(Vec::new());
                continue;
            };
            let step = cache.begin_step(rows)?;
            lasts.push(step.last.clone());
            hidden.push(Some(self.skeleton.embed(&step)));
        }
        self.run_layers(&mut hidden, caches, io)?;
        Ok(hidden
            .into_iter()
            .zip(&lasts)
            .map(|(h, last)| h.map(|h| self.skeleton.last_logits(self.skeleton.finish(h), last)))
            .collect())
    }

    /// The KV cache of GPU batch `k` (`rows` sequences of `capacity` slots), each layer on its
    /// tier: the device, the host, or the disk (no slots between steps); compressed when the
    /// policy compresses the cache and attention runs on the device.
    fn batch_cache(&self, k: usize, rows: usize, capacity: usize) -> Result<OffloadKvCache> {
        let layout = self.skeleton.kv_layout();
        let quant = self.policy.shape.effective_cache_compression();
        let placement = (0..layout.num_layers)
            .map(|j| {
                let tier = self.cache_tier(j, k);
                KvPlacement {
                    device: if tier == Tier::Gpu { self.device.clone() } else { self.host.clone() },
                    attend_there: self.policy.shape.cpu_attention,
                    on_disk: tier == Tier::Disk,
                }
            })
            .collect();
        let cache = OffloadKvCache::new(layout, rows, capacity, &self.device, quant, placement)?;
        match self.attention_sparsity {
            Some(fraction) => cache.with_attention_sparsity(fraction),
            None => Ok(cache),
        }
    }

    /// Peak device bytes so far, for reports.
    pub fn describe_memory(&self) -> String {
        format!(
            "device peak {}, host peak {}, disk {}",
            fmt_bytes(self.ledger.peak(Tier::Gpu)),
            fmt_bytes(self.ledger.peak(Tier::Cpu)),
            fmt_bytes(self.store.bytes_on_disk())
        )
    }
}

/// Whole units per tier for a placement of `total` units: GPU and GPU+CPU rounded to nearest.
fn whole_counts(share: Placement, total: u64) -> [u64; 3] {
    let n = total as f64;
    let gpu = ((share.gpu * n).round() as u64).min(total);
    let gpu_cpu = (((share.gpu + share.cpu) * n).round() as u64).clamp(gpu, total);
    [gpu, gpu_cpu - gpu, total - gpu_cpu]
}

/// `counts[tier]` units of each tier, GPU first, then CPU, then disk.
fn tiers_in_order(counts: [u64; 3]) -> Vec<Tier> {
    Tier::ALL.iter().flat_map(|&t| std::iter::repeat_n(t, counts[t.index()] as usize)).collect()
}

/// The layer with its projections quantized when the policy compresses weights.
fn compressed(layer: DecoderLayer, compress: Option<QuantSpec>) -> Result<DecoderLayer> {
    Ok(match compress {
        Some(spec) => layer.quantized(spec)?,
        None => layer,
    })
}
