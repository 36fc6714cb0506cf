//! The offloading runtime: FlexGen's zig-zag block schedule over weights placed per layer, KV
//! cache per (layer, GPU batch) and activations per GPU batch on the device, the host or the disk,
//! under an enforced device and host byte budget.
//!
//! One generation step of a block runs layer by layer; within a layer every GPU batch of the block
//! runs before the next layer, so each layer's weights cross the link once per block and step.
//! Each (layer, batch) step overlaps FlexGen's six tasks (Algorithm 1) on three threads (CubeCL
//! gives every thread its own device stream), with a synchronization per step:
//! - load the next layer's weights (host → device copy, or disk read, checksum and upload);
//! - store the previous step's new KV slots (to disk) and its output activations (to their tier),
//!   then load the next step's KV cache (from disk) and activations (from the host or disk): one
//!   thread, so that at most two disk-resident KV tensors are in host memory at once;
//! - compute this step.
//!
//! A KV-cache tensor on the host stays there (with CPU attention only queries, new keys/values
//! and outputs cross the link); one on disk is read before its step and only the step's new slots
//! are written back. `overlap = false` runs the same tasks one after the other (the ablation).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use burn::module::Module;
use burn::tensor::{DType, Device, TensorData};
use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::{ContiguousKvCache, KvPlacement, LayerSlots};
use burn_llm_models::generation::{prepare_prompt, record_sampled, sample, RequestState};
use burn_llm_models::model::{DecoderLayer, Hidden};
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, GenerationOutput, Prompt, SamplingParams, Timing, Tokenizer};
use serde::Serialize;

use crate::error::{OffloadError, Result};
use crate::policy::{
    estimate, search_whole, CostEstimate, HardwareProfile, ModelShape, Placement, Policy, SearchSpace, ThreadPlan, Tier, TierBytes, Workload,
};
use crate::store::{fmt_bytes, DiskStore, MemoryLedger, Reservation, ScratchDir, SlotFile};
use crate::weights::{hollow, read_layer, write_layer};

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
    pub workload: Workload,
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
    /// read (memory-mapped, checksum-verified) when used.
    Disk,
}

/// A layer ready to run on the device, with the budget it holds while loaded.
struct Loaded {
    layer: DecoderLayer,
    _budget: Option<Reservation>,
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
    template: Option<DecoderLayer>,
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

/// The cost model's view of a decoder (`f32` weights and cache, as the runtime stores them).
pub fn model_shape(spec: &DecoderSpec) -> ModelShape {
    let heads = spec.num_heads as u64;
    let mut shape = ModelShape::paper_opt(spec.num_layers as u32, spec.hidden_size as u64, spec.intermediate_size as u64, heads);
    shape.name = spec.arch.name().to_string();
    shape.num_kv_heads = spec.num_kv_heads as u64;
    shape.head_dim = spec.head_dim as u64;
    shape.vocab_size = spec.vocab_size as u64;
    shape.bytes_per_element = 4;
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
        let skeleton_bytes = (skeleton.decode_weight_bytes() + spec.vocab_size * spec.embed_dim * 4) as u64;
        let mut resident = vec![ledger.reserve(Tier::Gpu, skeleton_bytes, "embeddings and LM head")?];
        let reserved = TierBytes { gpu: skeleton_bytes as f64, cpu: 0.0, disk: 0.0 };
        let num_layers = spec.num_layers as u64;
        let (policy, layer_tiers, cache_counts, activation_counts, estimate) = match &config.policy {
            PolicyChoice::Auto(space) => {
                let mut space = space.clone();
                space.reserved_bytes = reserved;
                let rounded = search_whole(&hw, &shape, &config.workload, &space)?;
                (rounded.policy, rounded.layer_tiers, rounded.cache_tensors, rounded.activation_tensors, rounded.estimate)
            }
            PolicyChoice::Fixed(policy) => {
                // A given policy runs as given: whole layers and tensors in tier order, no
                // re-optimization.
                policy.validate()?;
                let batches = u64::from(policy.num_gpu_batches.max(1));
                let tiers = tiers_in_order(whole_counts(policy.weights, num_layers));
                let est = estimate(&hw, &shape, &config.workload, policy)?;
                (*policy, tiers, whole_counts(policy.cache, num_layers * batches), whole_counts(policy.activations, batches), est)
            }
        };

        let pool = |threads: u32| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads.max(1) as usize)
                .build()
                .map_err(|e| OffloadError::Config(format!("cannot build a thread pool: {e}")))
        };
        let (compute_pool, io_pool) = match &config.threads {
            Some(plan) => (Some(pool(plan.intra_op_compute)?), Some(pool(plan.io_threads.first().copied().unwrap_or(1))?)),
            None => (None, None),
        };
        let mut store = DiskStore::open(&config.offload_dir)?;
        let mut layers = Vec::with_capacity(spec.num_layers);
        let mut layer_bytes = Vec::with_capacity(spec.num_layers);
        let mut template = None;
        let compress = policy.compress_weights;
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
                    if template.is_none() {
                        template = Some(hollow(layer));
                    }
                    LayerHome::Disk
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
            template,
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
                LayerHome::Disk => Tier::Disk,
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
        let n = self.policy.num_gpu_batches.max(1) as usize;
        self.cache_tiers.get(layer * n + batch).copied().unwrap_or(Tier::Gpu)
    }

    fn activation_tier(&self, batch: usize) -> Tier {
        self.activation_tiers.get(batch).copied().unwrap_or(Tier::Gpu)
    }

    /// Generates for every prompt, a block of `gpu_batch_size · num_gpu_batches` prompts at a
    /// time, and reports what ran.
    pub fn generate(&self, prompts: &[Prompt], params: &SamplingParams) -> Result<(GenerationOutput, OffloadReport)> {
        params.validate(self.spec.vocab_size)?;
        let tokenizer = self.tokenizer.as_ref();
        let mut requests = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (text, ids) = prepare_prompt(i, p, tokenizer, self.spec.vocab_size, self.spec.max_positions)?;
                Ok(RequestState::new(text, ids, params, self.spec.max_positions))
            })
            .collect::<Result<Vec<_>>>()?;
        self.ledger.reset_peaks();
        let started = Instant::now();
        let mut timing = Timing { prompt_tokens: requests.iter().map(|r| r.prompt_ids().len()).sum(), ..Timing::default() };
        let gbs = self.policy.gpu_batch_size.max(1) as usize;
        let block = gbs * self.policy.num_gpu_batches.max(1) as usize;
        let mut scratch_bytes = 0;
        for chunk in requests.chunks_mut(block) {
            scratch_bytes = scratch_bytes.max(self.run_block(chunk, gbs, params, &mut timing)?);
        }
        let total = started.elapsed().as_secs_f64();
        timing.decode_s = total - timing.prefill_s;
        let output = GenerationOutput { requests: requests.into_iter().map(RequestState::into_output).collect(), timing };
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
    /// Returns the bytes its KV cache and activations took on disk.
    fn run_block(&self, block: &mut [RequestState], gbs: usize, params: &SamplingParams, timing: &mut Timing) -> Result<u64> {
        let started = Instant::now();
        let layout = self.skeleton.kv_layout();
        let longest_prompt = block.iter().map(|r| r.prompt_ids().len()).max().unwrap_or(0);
        let longest_budget = block.iter().map(RequestState::budget).max().unwrap_or(1);
        let capacity = longest_prompt + longest_budget;
        let cache_quant = self.policy.shape().effective_cache_compression();
        let needs_disk = self.cache_tiers.contains(&Tier::Disk) || self.activation_tiers.contains(&Tier::Disk);
        let mut io = BlockIo {
            scratch: needs_disk.then(|| ScratchDir::create(self.store.dir(), "run")).transpose()?,
            kv_files: HashMap::new(),
            activation_bytes: (0..block.len().div_ceil(gbs)).map(|_| AtomicU64::new(0)).collect(),
        };
        let mut caches = Vec::new();
        let mut budgets = Vec::new();
        for (k, batch) in block.chunks(gbs).enumerate() {
            let placement: Vec<KvPlacement> = (0..layout.num_layers)
                .map(|j| {
                    let tier = self.cache_tier(j, k);
                    KvPlacement {
                        device: if tier == Tier::Gpu { self.device.clone() } else { self.host.clone() },
                        attend_there: self.policy.cpu_attention,
                        detached: tier == Tier::Disk,
                    }
                })
                .collect();
            let mut cache = ContiguousKvCache::with_placement(layout, batch.len(), capacity, &self.device, cache_quant, placement)?;
            if let Some(fraction) = self.attention_sparsity {
                cache = cache.with_attention_sparsity(fraction)?;
            }
            // Charged per policy tier (on a GPU-less machine host and device are both the CPU);
            // a disk-resident layer is charged to the host only while it is loaded.
            let per_layer = cache.layer_bytes() as u64;
            for j in 0..layout.num_layers {
                match self.cache_tier(j, k) {
                    Tier::Disk => {
                        let files = kv_files(io.scratch()?, &cache, j, k)?;
                        io.kv_files.insert((j, k), Mutex::new(files));
                    }
                    tier => budgets.push(self.ledger.reserve(tier, per_layer, &format!("KV cache of layer {j}, GPU batch {k}"))?),
                }
            }
            caches.push(cache);
        }
        let disk_bytes: u64 = io.kv_files.values().flat_map(|f| f.lock().map(|f| f.iter().map(|f| f.file.len_bytes()).sum::<u64>())).sum();
        let mut rngs: Vec<_> = block.iter().map(|_| params.rng()).collect();
        let mut new_tokens: Vec<Vec<u32>> = block.iter().map(|r| r.prompt_ids().to_vec()).collect();
        let mut first = true;
        while block.iter().any(|r| !r.is_finished()) {
            let mut hidden = Vec::with_capacity(caches.len());
            let mut lasts = Vec::with_capacity(caches.len());
            for (k, cache) in caches.iter_mut().enumerate() {
                let rows = &new_tokens[k * gbs..(k * gbs + gbs).min(new_tokens.len())];
                let slices: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
                if slices.iter().all(|s| s.is_empty()) {
                    hidden.push(None);
                    lasts.push(Vec::new());
                    continue;
                }
                let step = cache.begin_step(&slices)?;
                lasts.push(step.last.clone());
                hidden.push(Some(self.skeleton.embed(&step)));
            }
            self.run_layers(&mut hidden, &mut caches, &io)?;
            for (k, h) in hidden.into_iter().enumerate() {
                let Some(h) = h else { continue };
                let states = self.skeleton.finish(h);
                let logits = self.skeleton.last_logits(states, &lasts[k]);
                let range = k * gbs..(k * gbs + gbs).min(block.len());
                let sampled = sample(logits, params, &mut rngs[range.clone()])?;
                timing.generated_tokens += record_sampled(
                    &mut block[range.clone()],
                    &mut new_tokens[range],
                    sampled,
                    params,
                    &self.eos_token_ids,
                    self.tokenizer.as_ref(),
                    |_, _, _, _| {},
                )?;
            }
            if first {
                timing.prefill_s += started.elapsed().as_secs_f64();
                first = false;
            } else {
                timing.decode_steps += 1;
            }
        }
        drop(budgets);
        Ok(disk_bytes + io.activation_bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum::<u64>())
    }

    /// Every layer over every active GPU batch of the block, one (layer, batch) step at a time,
    /// with the next step's loads and the previous step's stores running beside each step's
    /// compute (or after it, without overlap).
    fn run_layers(&self, hidden: &mut [Option<Hidden>], caches: &mut [ContiguousKvCache], io: &BlockIo) -> Result<()> {
        let layers = self.layers.len();
        let active: Vec<usize> = (0..hidden.len()).filter(|&k| hidden[k].is_some()).collect();
        let order: Vec<(usize, usize)> = (0..layers).flat_map(|j| active.iter().map(move |&k| (j, k))).collect();
        let Some(&first) = order.first() else { return Ok(()) };
        // With one batch, its activations are needed by the very next step: they never wait.
        let park = active.len() >= 2;
        let mut parked: Vec<Option<Parked>> = hidden.iter_mut().map(|h| h.take().map(Parked::Device)).collect();
        let overlap = self.policy.overlap;
        let load_weights = |j: usize| self.in_pool(&self.io_pool, || self.load(j));
        std::thread::scope(|scope| -> Result<()> {
            let mut next_weights = Some(Task::start(scope, overlap, move || load_weights(first.0)));
            let mut weights: Option<(usize, Loaded)> = None;
            let mut inputs = self.run_load(self.prepare_load(first, caches, &mut parked), io)?;
            let mut pending: Option<StoreJob> = None;
            for (t, &(j, k)) in order.iter().enumerate() {
                if weights.as_ref().is_none_or(|(at, _)| *at != j) {
                    let task = next_weights.take().ok_or_else(|| OffloadError::Config("weight prefetch missing".into()))?;
                    // The previous layer leaves the device before this one's (deferred) load.
                    drop(weights.take());
                    weights = Some((j, task.join()?));
                    if j + 1 < layers {
                        next_weights = Some(Task::start(scope, overlap, move || load_weights(j + 1)));
                    }
                }
                let layer = &weights.as_ref().ok_or_else(|| OffloadError::Config("layer not loaded".into()))?.1.layer;
                // This step's inputs are in.
                let mut kv_budget = None;
                if let Some((slots, budget)) = inputs.kv.take() {
                    caches[k].put_layer(j, slots)?;
                    kv_budget = Some(budget);
                }
                // Activations still parked here (two batches: they were being stored when this
                // step's load started) come in now.
                let state = match inputs.hidden.take() {
                    Some(h) => h,
                    None => self.unpark(parked[k].take().ok_or_else(missing_activations)?, io)?,
                };
                // The previous step's stores, then the next step's loads, run beside the compute.
                // One after the other: at most two disk-resident KV tensors are in host memory at
                // a time (this step's and one in transit), the cost model's staging buffers.
                let next = order.get(t + 1).copied();
                let load = next.map(|step| self.prepare_load(step, caches, &mut parked));
                let store = pending.take();
                let transfers = (load.is_some() || store.is_some()).then(|| {
                    Task::start(scope, overlap, move || {
                        let stored = match store {
                            Some(job) => {
                                let batch = job.batch;
                                self.run_store(job, io)?.map(|p| (batch, p))
                            }
                            None => None,
                        };
                        let loaded = load.map(|job| self.run_load(job, io)).transpose()?.unwrap_or_default();
                        Ok((stored, loaded))
                    })
                });
                let cache = &mut caches[k];
                let states = self.in_pool(&self.compute_pool, || layer.forward(state.states, j, state.rotary.as_ref(), cache));
                let out = Hidden { states, rotary: state.rotary };
                // Synchronize.
                let (stored, loaded) = match transfers {
                    Some(task) => task.join()?,
                    None => (None, Inputs::default()),
                };
                if let Some((batch, p)) = stored {
                    parked[batch] = Some(p);
                }
                inputs = loaded;
                // What this step leaves for the next one to store.
                let kv = match self.cache_tier(j, k) {
                    Tier::Disk => {
                        let slots = caches[k].take_layer(j).ok_or_else(|| OffloadError::Config(format!("KV cache of layer {j} missing")))?;
                        Some((slots, caches[k].step_slots(), kv_budget))
                    }
                    _ => None,
                };
                let tier = self.activation_tier(k);
                let out = if park && j + 1 < layers && tier != Tier::Gpu {
                    Some((out, tier))
                } else {
                    parked[k] = Some(Parked::Device(out));
                    None
                };
                if kv.is_some() || out.is_some() {
                    pending = Some(StoreJob { layer: j, batch: k, kv, hidden: out });
                }
            }
            if let Some(job) = pending.take() {
                let batch = job.batch;
                if let Some(p) = self.run_store(job, io)? {
                    parked[batch] = Some(p);
                }
            }
            Ok(())
        })?;
        for (h, p) in hidden.iter_mut().zip(parked) {
            *h = p.map(|p| self.unpark(p, io)).transpose()?;
        }
        Ok(())
    }

    /// What the load task of `step` has to bring in: its KV cache if on disk, its activations
    /// if they wait off the device (taken out of `parked`).
    fn prepare_load(&self, (layer, batch): (usize, usize), caches: &[ContiguousKvCache], parked: &mut [Option<Parked>]) -> LoadJob {
        let kv = (self.cache_tier(layer, batch) == Tier::Disk).then(|| {
            let cache = &caches[batch];
            KvLoad { used: cache.step_slots().start, quant: cache.quantization(), bytes: cache.layer_bytes() as u64 }
        });
        let hidden = match parked[batch] {
            Some(Parked::Host { .. } | Parked::Disk { .. }) => parked[batch].take(),
            _ => None,
        };
        LoadJob { layer, batch, kv, hidden }
    }

    /// Reads a KV-cache tensor from disk into host memory and brings parked activations to the
    /// device.
    fn run_load(&self, job: LoadJob, io: &BlockIo) -> Result<Inputs> {
        let kv = match job.kv {
            None => None,
            Some(load) => {
                let what = format!("KV cache of layer {}, GPU batch {} (loaded from disk)", job.layer, job.batch);
                let budget = self.ledger.reserve(Tier::Cpu, load.bytes, &what)?;
                let files = io.files(job.layer, job.batch)?;
                let files = files.lock().map_err(|_| poisoned())?;
                let parts = files
                    .iter()
                    .map(|f| Ok(TensorData::from_bytes_vec(f.file.read(load.used)?, f.shape.to_vec(), f.dtype)))
                    .collect::<Result<Vec<_>>>()?;
                Some((LayerSlots::from_slot_data(parts, load.quant, &self.host)?, budget))
            }
        };
        let hidden = job.hidden.map(|p| self.unpark(p, io)).transpose()?;
        Ok(Inputs { kv, hidden })
    }

    /// Writes a step's new KV slots to disk and moves its output activations to their tier.
    fn run_store(&self, job: StoreJob, io: &BlockIo) -> Result<Option<Parked>> {
        if let Some((slots, range, _budget)) = job.kv {
            let files = io.files(job.layer, job.batch)?;
            let mut files = files.lock().map_err(|_| poisoned())?;
            for (file, data) in files.iter_mut().zip(slots.slot_data(range.clone())) {
                file.file.write(range.start, data.as_bytes())?;
            }
        }
        let Some((hidden, tier)) = job.hidden else { return Ok(None) };
        let dims = hidden.states.dims();
        let bytes = (dims.iter().product::<usize>() * std::mem::size_of::<f32>()) as u64;
        Ok(Some(match tier {
            Tier::Gpu => Parked::Device(hidden),
            Tier::Cpu => {
                let budget = self.ledger.reserve(Tier::Cpu, bytes, &format!("activations of GPU batch {}", job.batch))?;
                Parked::Host { hidden: Hidden { states: hidden.states.to_device(&self.host), rotary: hidden.rotary }, _budget: budget }
            }
            Tier::Disk => {
                io.scratch()?.write(&activation_file(job.batch), hidden.states.into_data().as_bytes())?;
                if let Some(peak) = io.activation_bytes.get(job.batch) {
                    peak.fetch_max(bytes, Ordering::Relaxed);
                }
                Parked::Disk { batch: job.batch, dims, rotary: hidden.rotary }
            }
        }))
    }

    /// Activations back on the device.
    fn unpark(&self, parked: Parked, io: &BlockIo) -> Result<Hidden> {
        match parked {
            Parked::Device(h) => Ok(h),
            Parked::Host { hidden, _budget } => Ok(Hidden { states: hidden.states.to_device(&self.device), rotary: hidden.rotary }),
            Parked::Disk { batch, dims, rotary } => {
                let len = dims.iter().product::<usize>() * std::mem::size_of::<f32>();
                let bytes = io.scratch()?.read(&activation_file(batch), len)?;
                let states = burn::tensor::Tensor::from_data(TensorData::from_bytes_vec(bytes, dims, DType::F32), &self.device);
                Ok(Hidden { states, rotary })
            }
        }
    }

    /// Runs `f` in `pool` when thread control gave one, else on the caller's pool.
    fn in_pool<R: Send>(&self, pool: &Option<rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
        match pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Layer `j` on the device, with the device budget it holds while loaded.
    fn load(&self, j: usize) -> Result<Loaded> {
        let what = format!("layer {j} weights (loaded)");
        match &self.layers[j] {
            LayerHome::Device(layer) => Ok(Loaded { layer: layer.clone(), _budget: None }),
            LayerHome::Host(layer) => {
                let budget = self.ledger.reserve(Tier::Gpu, self.layer_bytes[j], &what)?;
                Ok(Loaded { layer: layer.clone().to_device(&self.device), _budget: Some(budget) })
            }
            LayerHome::Disk => {
                let budget = self.ledger.reserve(Tier::Gpu, self.layer_bytes[j], &what)?;
                let template = self.template.as_ref().ok_or_else(|| OffloadError::Config("no disk layer template".into()))?;
                let layer = read_layer(template, &self.store, &format!("layer{j}/"), &self.device)?;
                Ok(Loaded { layer, _budget: Some(budget) })
            }
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

/// Activations between layers, where their tier keeps them.
enum Parked {
    /// On the device.
    Device(Hidden),
    /// In host memory, holding their host budget.
    Host { hidden: Hidden, _budget: Reservation },
    /// In the block's scratch directory (the rotary angles, small, stay on the device).
    Disk { batch: usize, dims: [usize; 3], rotary: Option<(burn::tensor::Tensor<4>, burn::tensor::Tensor<4>)> },
}

/// The KV cache a load task reads from disk.
struct KvLoad {
    /// Slots written so far.
    used: usize,
    quant: Option<QuantSpec>,
    /// Host bytes the loaded layer takes.
    bytes: u64,
}

/// What a load task brings in for one (layer, batch) step.
struct LoadJob {
    layer: usize,
    batch: usize,
    kv: Option<KvLoad>,
    hidden: Option<Parked>,
}

/// What a store task takes out after one (layer, batch) step.
struct StoreJob {
    layer: usize,
    batch: usize,
    /// The layer's slots, the slots the step wrote, and the host budget they held.
    kv: Option<(LayerSlots, std::ops::Range<usize>, Option<Reservation>)>,
    hidden: Option<(Hidden, Tier)>,
}

/// A step's inputs, as its load task left them.
#[derive(Default)]
struct Inputs {
    kv: Option<(LayerSlots, Reservation)>,
    hidden: Option<Hidden>,
}

/// The disk side of a block: KV-cache files per (layer, batch) and the scratch directory.
struct BlockIo {
    scratch: Option<ScratchDir>,
    kv_files: HashMap<(usize, usize), Mutex<Vec<KvFile>>>,
    /// Largest activation file of each GPU batch.
    activation_bytes: Vec<AtomicU64>,
}

impl BlockIo {
    fn scratch(&self) -> Result<&ScratchDir> {
        self.scratch.as_ref().ok_or_else(|| OffloadError::Config("no scratch directory for a disk-resident cache or activations".into()))
    }

    fn files(&self, layer: usize, batch: usize) -> Result<&Mutex<Vec<KvFile>>> {
        self.kv_files
            .get(&(layer, batch))
            .ok_or_else(|| OffloadError::Config(format!("no disk KV cache for layer {layer}, GPU batch {batch}")))
    }
}

/// One stored part of a layer's keys or values (`f32` slots, or codes, scales, minimums).
struct KvFile {
    file: SlotFile,
    /// `[batch, kv_heads, capacity, width]`.
    shape: [usize; 4],
    dtype: DType,
}

/// The files holding layer `j` of GPU batch `k`'s cache, in [`LayerSlots::slot_data`] order.
fn kv_files(scratch: &ScratchDir, cache: &ContiguousKvCache, j: usize, k: usize) -> Result<Vec<KvFile>> {
    let layout = cache.layout();
    let d = layout.head_dim;
    let parts: Vec<(usize, DType)> = match cache.quantization() {
        None => vec![(d, DType::F32)],
        Some(spec) => vec![(d / spec.per_word(), DType::U32), (d / spec.group_size(), DType::F32), (d / spec.group_size(), DType::F32)],
    };
    let rows = cache.batch() * layout.num_kv_heads;
    ["k", "v"]
        .iter()
        .flat_map(|kv| parts.iter().enumerate().map(move |(p, part)| (kv, p, *part)))
        .map(|(kv, p, (width, dtype))| {
            let path = scratch.path(&format!("kv-l{j}-b{k}-{kv}{p}"));
            Ok(KvFile {
                file: SlotFile::create(path, rows, cache.capacity(), width * 4)?,
                shape: [cache.batch(), layout.num_kv_heads, cache.capacity(), width],
                dtype,
            })
        })
        .collect()
}

fn activation_file(batch: usize) -> String {
    format!("act-b{batch}")
}

fn missing_activations() -> OffloadError {
    OffloadError::Config("activations of a running GPU batch are missing".into())
}

fn poisoned() -> OffloadError {
    OffloadError::Config("a KV-cache file lock was poisoned by a panicking task".into())
}

/// A task of the block schedule: running on its own thread (overlap), or deferred until joined.
enum Task<'scope, T> {
    Running(ScopedJoinHandle<'scope, Result<T>>),
    Deferred(Box<dyn FnOnce() -> Result<T> + Send + 'scope>),
}

impl<'scope, T: Send + 'scope> Task<'scope, T> {
    fn start<'env>(scope: &'scope Scope<'scope, 'env>, overlap: bool, f: impl FnOnce() -> Result<T> + Send + 'scope) -> Self {
        if overlap { Task::Running(scope.spawn(f)) } else { Task::Deferred(Box::new(f)) }
    }

    fn join(self) -> Result<T> {
        match self {
            Task::Running(handle) => handle.join().unwrap_or_else(|_| Err(OffloadError::Config("an offloading task panicked".into()))),
            Task::Deferred(f) => f(),
        }
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
