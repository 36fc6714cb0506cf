//! The offloading runtime: FlexGen's zig-zag block schedule over weights placed per layer on the
//! device, the host or the disk, KV cache per layer on the device or the host (with CPU
//! attention), under an enforced device and host byte budget.
//!
//! One generation step of a block runs layer by layer; within a layer every GPU batch of the block
//! runs before the next layer, so each layer's weights cross the link once per block and step.
//! With `overlap`, the next layer is loaded (host → device copy, or disk read, checksum and
//! upload) on a loader thread while the current one computes: the weight prefetch task of
//! FlexGen's Algorithm 1. KV-cache loads and stores happen inside attention (the cache stays
//! where the policy put it; with CPU attention only queries and outputs cross), and activations
//! stay on the device.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use burn_llm_models::cache::{ContiguousKvCache, KvPlacement};
use burn_llm_models::generation::{prepare_prompt, record_sampled, sample, RequestState};
use burn_llm_models::model::{DecoderLayer, Hidden};
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, GenerationOutput, Prompt, SamplingParams, Timing, Tokenizer};
use serde::Serialize;

use crate::error::{OffloadError, Result};
use crate::policy::{estimate, search_whole, CostEstimate, ThreadPlan, HardwareProfile, ModelShape, Policy, SearchSpace, Tier, TierBytes, Workload};
use crate::store::{fmt_bytes, DiskStore, MemoryLedger, Reservation};
use crate::weights::{write_recorded, DiskWeights, Recording};

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
    /// In the offload directory, read (memory-mapped, checksum-verified) when used.
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
    store: DiskStore,
    ledger: MemoryLedger,
    _resident: Vec<Reservation>,
    policy: Policy,
    estimate: CostEstimate,
    kv_on_device: Vec<bool>,
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
        let num_layers = spec.num_layers;
        let (policy, layer_tiers, kv_gpu_layers, estimate) = match &config.policy {
            PolicyChoice::Auto(space) => {
                let mut space = space.clone();
                space.reserved_bytes = reserved;
                let rounded = search_whole(&hw, &shape, &config.workload, &space)?;
                let kv = rounded.cache_tensors[0] / u64::from(rounded.policy.num_gpu_batches).max(1);
                (rounded.policy, rounded.layer_tiers, kv as usize, rounded.estimate)
            }
            PolicyChoice::Fixed(policy) => {
                // A given policy runs as given: whole layers in tier order, no re-optimization.
                policy.validate()?;
                let count = |share: f64| ((share * num_layers as f64).round() as usize).min(num_layers);
                let on_gpu = count(policy.weights.gpu);
                let on_cpu = count(policy.weights.cpu).min(num_layers - on_gpu);
                let tiers = (0..num_layers)
                    .map(|j| if j < on_gpu { Tier::Gpu } else if j < on_gpu + on_cpu { Tier::Cpu } else { Tier::Disk })
                    .collect();
                (*policy, tiers, count(policy.cache.gpu), estimate(&hw, &shape, &config.workload, policy)?)
            }
        };
        let kv_on_device: Vec<bool> = (0..num_layers).map(|j| j < kv_gpu_layers).collect();

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
        let compress = policy.compress_weights;
        for (j, tier) in layer_tiers.iter().enumerate() {
            let what = format!("layer {j} weights");
            let home = match tier {
                Tier::Gpu => {
                    let layer = compressed(CausalLm::load_layer(&spec, source, j, device)?, compress)?;
                    resident.push(ledger.reserve(Tier::Gpu, layer.weight_bytes() as u64, &what)?);
                    layer_bytes.push(layer.weight_bytes() as u64);
                    LayerHome::Device(layer)
                }
                Tier::Cpu => {
                    let layer = compressed(CausalLm::load_layer(&spec, source, j, &config.host)?, compress)?;
                    resident.push(ledger.reserve(Tier::Cpu, layer.weight_bytes() as u64, &what)?);
                    layer_bytes.push(layer.weight_bytes() as u64);
                    LayerHome::Host(layer)
                }
                Tier::Disk => {
                    let recording = Recording::new(source);
                    let layer = CausalLm::load_layer(&spec, &recording, j, &config.host)?;
                    layer_bytes.push(compressed(layer, compress)?.weight_bytes() as u64);
                    write_recorded(recording, &mut store, &format!("layer{j}/"))?;
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
            store,
            ledger,
            _resident: resident,
            estimate,
            policy,
            kv_on_device,
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
        for chunk in requests.chunks_mut(block) {
            self.run_block(chunk, gbs, params, &mut timing)?;
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
                disk_bytes: self.store.bytes_on_disk(),
            },
            effective_batch: block,
        };
        Ok((output, report))
    }

    /// One block: its GPU batches advance together, layer by layer (zig-zag), until all finish.
    fn run_block(&self, block: &mut [RequestState], gbs: usize, params: &SamplingParams, timing: &mut Timing) -> Result<()> {
        let started = Instant::now();
        let layout = self.skeleton.kv_layout();
        let longest_prompt = block.iter().map(|r| r.prompt_ids().len()).max().unwrap_or(0);
        let longest_budget = block.iter().map(RequestState::budget).max().unwrap_or(1);
        let capacity = longest_prompt + longest_budget;
        let cache_bits = if self.policy.cpu_attention { None } else { self.policy.compress_cache.map(|c| u32::from(c.bits)) };
        let placement: Vec<KvPlacement> = self
            .kv_on_device
            .iter()
            .map(|&on| KvPlacement { device: if on { self.device.clone() } else { self.host.clone() }, attend_there: self.policy.cpu_attention })
            .collect();
        let mut caches = Vec::new();
        let mut budgets = Vec::new();
        for batch in block.chunks(gbs) {
            let mut cache = ContiguousKvCache::with_placement(layout, batch.len(), capacity, &self.device, cache_bits, placement.clone())?;
            if let Some(fraction) = self.attention_sparsity {
                cache = cache.with_attention_sparsity(fraction)?;
            }
            // Charged per policy tier (on a GPU-less machine host and device are both the CPU).
            let device_layers = self.kv_on_device.iter().filter(|&&d| d).count() as u64;
            let on_device = cache.memory_bytes() as u64 / self.kv_on_device.len().max(1) as u64 * device_layers;
            budgets.push(self.ledger.reserve(Tier::Gpu, on_device, "KV cache of a GPU batch")?);
            budgets.push(self.ledger.reserve(Tier::Cpu, cache.memory_bytes() as u64 - on_device, "KV cache of a GPU batch")?);
            caches.push(cache);
        }
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
            self.run_layers(&mut hidden, &mut caches)?;
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
        Ok(())
    }

    /// Every layer over every GPU batch of the block; with overlap, layer `j + 1` loads while
    /// layer `j` computes.
    fn run_layers(&self, hidden: &mut [Option<Hidden>], caches: &mut [ContiguousKvCache]) -> Result<()> {
        let layers = self.layers.len();
        let compute = |j: usize, loaded: &Loaded, hidden: &mut [Option<Hidden>], caches: &mut [ContiguousKvCache]| {
            self.in_pool(&self.compute_pool, || {
                for (h, cache) in hidden.iter_mut().zip(caches.iter_mut()) {
                    if let Some(state) = h.take() {
                        let states = loaded.layer.forward(state.states, j, state.rotary.as_ref(), cache);
                        *h = Some(Hidden { states, rotary: state.rotary });
                    }
                }
            })
        };
        let load = |j: usize| self.in_pool(&self.io_pool, || self.load(j));
        if !self.policy.overlap {
            for j in 0..layers {
                let loaded = load(j)?;
                compute(j, &loaded, hidden, caches);
            }
            return Ok(());
        }
        std::thread::scope(|scope| -> Result<()> {
            let mut next = Some(scope.spawn(move || load(0)));
            for j in 0..layers {
                let current = next.take().map_or_else(|| load(j), |h| h.join().unwrap_or_else(|_| Err(loader_panicked())))?;
                if j + 1 < layers {
                    next = Some(scope.spawn(move || load(j + 1)));
                }
                compute(j, &current, hidden, caches);
            }
            Ok(())
        })
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
                let source = DiskWeights { store: &self.store, prefix: format!("layer{j}/") };
                let layer = compressed(CausalLm::load_layer(&self.spec, &source, j, &self.device)?, self.policy.compress_weights)?;
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

fn loader_panicked() -> OffloadError {
    OffloadError::Config("the weight loader thread panicked".into())
}

/// The layer with its projections quantized when the policy compresses weights.
fn compressed(layer: DecoderLayer, compress: Option<crate::policy::Compression>) -> Result<DecoderLayer> {
    Ok(match compress {
        Some(c) => layer.quantized(u32::from(c.bits), c.group_size as usize)?,
        None => layer,
    })
}
