//! What the cost model reports of a placement: the five per-layer terms, the bytes on each tier,
//! the peaks of its memory constraints and the whole estimate.

use serde::{Deserialize, Serialize};

use super::super::hardware::HardwareProfile;
use super::super::types::Tier;

/// One of the five per-layer latency terms of FlexGen's `T_pre` / `T_gen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Term {
    /// CPU → GPU reads (`ctog`): weights, activations, cache (GPU attention), dequantization.
    CpuToGpu,
    /// GPU → CPU writes (`gtoc`): cache, activations, cache quantization.
    GpuToCpu,
    /// Disk → CPU reads (`dtoc`).
    DiskToCpu,
    /// CPU → disk writes (`ctod`).
    CpuToDisk,
    /// Computation (`comp`): GPU matmuls and attention, plus CPU attention.
    Compute,
}

impl Term {
    /// The five terms in the order of [`TermBreakdown::terms`].
    pub const ALL: [Term; 5] = [Term::CpuToGpu, Term::GpuToCpu, Term::DiskToCpu, Term::CpuToDisk, Term::Compute];
}

/// The five per-layer terms of one phase, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TermBreakdown {
    /// `ctog`.
    pub cpu_to_gpu: f64,
    /// `gtoc`.
    pub gpu_to_cpu: f64,
    /// `dtoc`.
    pub disk_to_cpu: f64,
    /// `ctod`.
    pub cpu_to_disk: f64,
    /// `comp`.
    pub compute: f64,
    /// Time added after the max (or sum): prefill KV-cache quantization (LM-Offload Eq. 5).
    pub serial: f64,
    /// Of the terms above, how much is (de)quantization (informational).
    pub quantization: f64,
}

impl TermBreakdown {
    /// The five terms in [`Term::ALL`] order.
    pub fn terms(&self) -> [f64; 5] {
        [self.cpu_to_gpu, self.gpu_to_cpu, self.disk_to_cpu, self.cpu_to_disk, self.compute]
    }

    /// The largest term (the bottleneck under overlap).
    pub fn bottleneck(&self) -> Term {
        let t = self.terms();
        let mut best = 0;
        for (i, v) in t.iter().enumerate() {
            if *v > t[best] {
                best = i;
            }
        }
        Term::ALL[best]
    }

    /// Per-layer time: `max(terms) + serial` with overlap, `sum(terms) + serial` without.
    pub fn layer_time(&self, overlap: bool) -> f64 {
        let t = self.terms();
        let core = if overlap { t.iter().copied().fold(0.0, f64::max) } else { t.iter().sum() };
        core + self.serial
    }
}

/// Bytes on each tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TierBytes {
    /// GPU bytes.
    pub gpu: f64,
    /// CPU bytes.
    pub cpu: f64,
    /// Disk bytes.
    pub disk: f64,
}

impl TierBytes {
    /// Bytes on `tier`.
    pub fn on(&self, tier: Tier) -> f64 {
        match tier {
            Tier::Gpu => self.gpu,
            Tier::Cpu => self.cpu,
            Tier::Disk => self.disk,
        }
    }

    /// Capacity of `hw` minus `reserved`, per tier (never negative).
    pub fn available(hw: &HardwareProfile, reserved: &TierBytes) -> TierBytes {
        TierBytes {
            gpu: (hw.gpu_memory_bytes as f64 - reserved.gpu).max(0.0),
            cpu: (hw.cpu_memory_bytes as f64 - reserved.cpu).max(0.0),
            disk: (hw.disk_memory_bytes as f64 - reserved.disk).max(0.0),
        }
    }
}

/// One of the five peak-memory constraints of FlexGen's Eq. (1) / Appendix A.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryConstraint {
    /// GPU peak during prefill.
    GpuPrefill,
    /// GPU peak during decode.
    GpuDecode,
    /// CPU peak during prefill.
    CpuPrefill,
    /// CPU peak during decode.
    CpuDecode,
    /// Disk peak.
    Disk,
}

impl MemoryConstraint {
    /// The five constraints: GPU prefill, GPU decode, CPU prefill, CPU decode, disk.
    pub const ALL: [MemoryConstraint; 5] = [
        MemoryConstraint::GpuPrefill,
        MemoryConstraint::GpuDecode,
        MemoryConstraint::CpuPrefill,
        MemoryConstraint::CpuDecode,
        MemoryConstraint::Disk,
    ];

    /// The tier this constraint limits.
    pub fn tier(self) -> Tier {
        match self {
            MemoryConstraint::GpuPrefill | MemoryConstraint::GpuDecode => Tier::Gpu,
            MemoryConstraint::CpuPrefill | MemoryConstraint::CpuDecode => Tier::Cpu,
            MemoryConstraint::Disk => Tier::Disk,
        }
    }
}

/// Peak memory per tier in each phase, bytes (the disk peak is the same in both).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeakMemory {
    /// Peaks during prefill.
    pub prefill: TierBytes,
    /// Peaks during decode.
    pub decode: TierBytes,
}

impl PeakMemory {
    /// The larger of the two phases, per tier.
    pub fn max(&self) -> TierBytes {
        TierBytes {
            gpu: self.prefill.gpu.max(self.decode.gpu),
            cpu: self.prefill.cpu.max(self.decode.cpu),
            disk: self.prefill.disk.max(self.decode.disk),
        }
    }

    /// Value of each constraint's left-hand side, in [`MemoryConstraint::ALL`] order.
    pub fn by_constraint(&self) -> [(MemoryConstraint, f64); 5] {
        [
            (MemoryConstraint::GpuPrefill, self.prefill.gpu),
            (MemoryConstraint::GpuDecode, self.decode.gpu),
            (MemoryConstraint::CpuPrefill, self.prefill.cpu),
            (MemoryConstraint::CpuDecode, self.decode.cpu),
            (MemoryConstraint::Disk, self.decode.disk),
        ]
    }
}

/// What the cost model predicts for one policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    /// `T_pre`: seconds to prefill one layer for the whole block.
    pub t_prefill_layer: f64,
    /// `T_gen`: seconds to decode one token through one layer for the whole block.
    pub t_decode_layer: f64,
    /// `T_pre · l`.
    pub prefill_time: f64,
    /// `T_gen · (n−1) · l`.
    pub decode_time: f64,
    /// `T = T_pre·l + T_gen·(n−1)·l`: seconds per block.
    pub total_latency: f64,
    /// `bls · n / T`: generated tokens per second.
    pub throughput_tokens_per_s: f64,
    /// One-time cost at model load: CPU weight quantization (LM-Offload Eq. 3); not in `T`.
    pub init_time: f64,
    /// Peak memory per tier and phase.
    pub peak_memory: PeakMemory,
    /// Prefill terms of one layer.
    pub prefill_terms: TermBreakdown,
    /// Decode terms of one layer.
    pub decode_terms: TermBreakdown,
}

impl CostEstimate {
    /// The first constraint whose peak exceeds `available` (relative tolerance 1e-9), with
    /// (needed, available) bytes.
    pub fn memory_overflow(&self, available: &TierBytes) -> Option<(MemoryConstraint, f64, f64)> {
        self.peak_memory.by_constraint().into_iter().find_map(|(c, used)| {
            let cap = available.on(c.tier());
            (used > cap * (1.0 + 1e-9) + 1.0).then_some((c, used, cap))
        })
    }

    /// Whether every peak fits in `available`.
    pub fn fits(&self, available: &TierBytes) -> bool {
        self.memory_overflow(available).is_none()
    }
}
