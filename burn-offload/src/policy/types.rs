//! Policy data types: memory tiers, placements and the [`Policy`] itself, whose compression
//! settings are the kernels crate's [`QuantSpec`] (see [`super::compression`]).

use std::fmt;

use burn_llm_kernels::QuantSpec;
use serde::{Deserialize, Serialize};

use super::compression::{self, check_cache, check_weights};
use super::error::PolicyError;

/// Tolerance on placement percentages (bounds and per-kind sums).
pub(crate) const FRACTION_TOLERANCE: f64 = 1e-6;

/// One level of the GPU / CPU / disk memory hierarchy (FlexGen §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Device (GPU) memory: fastest, smallest.
    Gpu,
    /// Host (CPU) memory.
    Cpu,
    /// Disk (NVMe / SSD) storage: largest, slowest, cannot compute.
    Disk,
}

impl Tier {
    /// The three tiers, fastest first.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Disk];

    /// Index in `[gpu, cpu, disk]` arrays.
    pub fn index(self) -> usize {
        match self {
            Tier::Gpu => 0,
            Tier::Cpu => 1,
            Tier::Disk => 2,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Gpu => "GPU (device)",
            Tier::Cpu => "CPU (host)",
            Tier::Disk => "disk",
        })
    }
}

/// Fractions of one tensor kind stored on each tier (FlexGen's `wg, wc, wd` for weights,
/// `cg, cc, cd` for the KV cache, `hg, hc, hd` for activations). Each in `[0, 1]`, summing to 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// Fraction on the GPU.
    pub gpu: f64,
    /// Fraction on the CPU.
    pub cpu: f64,
    /// Fraction on disk.
    pub disk: f64,
}

impl Placement {
    /// Everything on one tier.
    pub fn all_on(tier: Tier) -> Self {
        let mut p = [0.0; 3];
        p[tier.index()] = 1.0;
        Self::from_array(p)
    }

    /// Build from `[gpu, cpu, disk]`.
    pub fn from_array(p: [f64; 3]) -> Self {
        Self { gpu: p[0], cpu: p[1], disk: p[2] }
    }

    /// As `[gpu, cpu, disk]`.
    pub fn to_array(self) -> [f64; 3] {
        [self.gpu, self.cpu, self.disk]
    }

    /// Fraction on `tier`.
    pub fn on(self, tier: Tier) -> f64 {
        self.to_array()[tier.index()]
    }

    /// Fraction off the GPU (`cpu + disk`).
    pub fn off_gpu(self) -> f64 {
        self.cpu + self.disk
    }

    /// Check every fraction is finite, in `[0, 1]` and that they sum to 1 (within 1e-6).
    pub fn validate(self, kind: &str) -> Result<(), PolicyError> {
        let a = self.to_array();
        if a.iter().any(|x| !x.is_finite() || *x < -FRACTION_TOLERANCE || *x > 1.0 + FRACTION_TOLERANCE) {
            return Err(PolicyError::InvalidPolicy(format!("{kind} placement {a:?} has a fraction outside [0, 1]")));
        }
        let sum: f64 = a.iter().sum();
        if (sum - 1.0).abs() > FRACTION_TOLERANCE {
            return Err(PolicyError::InvalidPolicy(format!("{kind} placement {a:?} sums to {sum}, not 1")));
        }
        Ok(())
    }

    /// Clamp into `[0, 1]` and renormalise to sum 1 (used on LP solutions, which carry solver
    /// round-off). An all-zero input becomes all-on-CPU.
    pub(crate) fn normalized(self) -> Self {
        let a = self.to_array().map(|x| if x.is_finite() { x.clamp(0.0, 1.0) } else { 0.0 });
        let sum: f64 = a.iter().sum();
        if sum <= 0.0 {
            return Self::all_on(Tier::Cpu);
        }
        Self::from_array(a.map(|x| x / sum))
    }
}

/// The scalar part of a policy: everything except the nine placement percentages. The LP of
/// FlexGen's Eq. (1) is solved once per [`PolicyShape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyShape {
    /// GPU batch size `gbs` (sequences computed together in one kernel launch).
    pub gpu_batch_size: u32,
    /// GPU batches per block; the block (effective batch) size is `bls = gbs · num_gpu_batches`.
    pub num_gpu_batches: u32,
    /// Compute decode attention on the CPU for the part of the KV cache that is not on the GPU
    /// (FlexGen's computation delegation, §4.2).
    pub cpu_attention: bool,
    /// Overlap weight/cache/activation I/O with compute (FlexGen Algorithm 1).
    pub overlap: bool,
    /// Quantize weights (all tiers, along each weight's output channel); `None` keeps them at the
    /// model's precision.
    #[serde(default, serialize_with = "compression::serialize", deserialize_with = "compression::weights")]
    pub compress_weights: Option<QuantSpec>,
    /// Quantize the KV cache (all tiers, along the head dimension). Ignored when `cpu_attention` is
    /// on (LM-Offload §3.2).
    #[serde(default, serialize_with = "compression::serialize", deserialize_with = "compression::cache")]
    pub compress_cache: Option<QuantSpec>,
}

impl PolicyShape {
    /// `bls = gbs · num_gpu_batches`.
    pub fn block_size(&self) -> u64 {
        u64::from(self.gpu_batch_size) * u64::from(self.num_gpu_batches)
    }

    /// The cache compression that actually applies: none when attention runs on the CPU, because
    /// the CPU-resident cache then never crosses PCIe (LM-Offload §3.2: "load_cache = 0 and
    /// store_cache = 0", so quantization has no benefit and no cost).
    pub fn effective_cache_compression(&self) -> Option<QuantSpec> {
        if self.cpu_attention { None } else { self.compress_cache }
    }

    /// Check batch sizes and the compression axes (bits and group sizes are checked when a
    /// [`QuantSpec`] is built).
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.gpu_batch_size == 0 {
            return Err(PolicyError::InvalidPolicy("gpu_batch_size = 0".into()));
        }
        if self.num_gpu_batches == 0 {
            return Err(PolicyError::InvalidPolicy("num_gpu_batches = 0".into()));
        }
        check_weights(self.compress_weights)?;
        check_cache(self.compress_cache)
    }
}

/// A complete offloading policy: FlexGen's 11 variables (`bls`, `gbs` and the nine placement
/// percentages) plus CPU delegation, overlapping and LM-Offload's per-tensor compression: the
/// scalar [`PolicyShape`] and the three placements. In JSON the shape's fields sit beside the
/// placements, in one flat object (the placements first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Weight placement `(wg, wc, wd)`.
    pub weights: Placement,
    /// KV-cache placement `(cg, cc, cd)`.
    pub cache: Placement,
    /// Activation placement `(hg, hc, hd)`.
    pub activations: Placement,
    /// Batch sizes, delegation, overlap and compression.
    #[serde(flatten)]
    pub shape: PolicyShape,
}

impl Policy {
    /// Assemble a policy from its scalar part and the three placements.
    pub fn from_parts(shape: PolicyShape, weights: Placement, cache: Placement, activations: Placement) -> Self {
        Self { weights, cache, activations, shape }
    }

    /// `bls = gbs · num_gpu_batches`.
    pub fn block_size(&self) -> u64 {
        self.shape.block_size()
    }

    /// The nine placement variables in the LP's order
    /// `[wg, wc, wd, cg, cc, cd, hg, hc, hd]`.
    pub fn placement_vector(&self) -> [f64; 9] {
        let w = self.weights.to_array();
        let c = self.cache.to_array();
        let h = self.activations.to_array();
        [w[0], w[1], w[2], c[0], c[1], c[2], h[0], h[1], h[2]]
    }

    /// Check batch sizes, compression and the three placements.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.shape.validate()?;
        self.weights.validate("weight")?;
        self.cache.validate("cache")?;
        self.activations.validate("activation")?;
        Ok(())
    }

    /// Everything on the GPU, one GPU batch, no delegation, overlap on.
    pub fn all_on_gpu(gpu_batch_size: u32) -> Self {
        let shape = PolicyShape {
            gpu_batch_size,
            num_gpu_batches: 1,
            cpu_attention: false,
            overlap: true,
            compress_weights: None,
            compress_cache: None,
        };
        let gpu = Placement::all_on(Tier::Gpu);
        Self { weights: gpu, cache: gpu, activations: gpu, shape }
    }

    /// DeepSpeed ZeRO-Inference as FlexGen benchmarks it (§6, Appendix A.4 "Ablation Study"):
    /// all weights on `weight_tier` (CPU, or disk for models that do not fit in CPU memory),
    /// KV cache and activations on the GPU, one GPU batch per block (row-by-row schedule), weights
    /// prefetched with overlap, attention on the GPU, no quantization.
    pub fn deepspeed_like(gpu_batch_size: u32, weight_tier: Tier) -> Self {
        Self { weights: Placement::all_on(weight_tier), ..Self::all_on_gpu(gpu_batch_size) }
    }

    /// Hugging Face Accelerate as FlexGen benchmarks it: a fraction of the weights offloaded
    /// (`weights`), cache and activations on the GPU, one GPU batch per block, no overlap of
    /// weight loading with compute (Accelerate's hooks load a layer right before running it),
    /// attention on the GPU, no quantization.
    pub fn accelerate_like(gpu_batch_size: u32, weights: Placement) -> Self {
        let mut policy = Self { weights, ..Self::all_on_gpu(gpu_batch_size) };
        policy.shape.overlap = false;
        policy
    }
}
