//! [`HardwareProfile`]: the machine constants of FlexGen's cost model (Table 7) plus LM-Offload's
//! (de)quantization throughputs, with JSON load/save.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ProfileError;
use super::types::Tier;

/// Bytes in a GiB.
const GIB: u64 = 1 << 30;

/// The hardware constants the cost model needs. Bandwidths and throughputs are in bytes per
/// second, compute rates in FLOP per second, capacities in bytes.
///
/// FlexGen fits these constants from profiling runs (§4.3 "we run profiling on the hardware to
/// sample some data points and fit the hardware parameters"); the runtime is expected to measure
/// them and save them with [`HardwareProfile::save_json`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// Free-form description of the machine.
    #[serde(default)]
    pub name: String,
    /// Device (GPU) memory capacity, bytes (`gmem`).
    pub gpu_memory_bytes: u64,
    /// Host (CPU) memory capacity, bytes (`cmem`).
    pub cpu_memory_bytes: u64,
    /// Disk capacity usable for offloading, bytes (`nmem`).
    pub disk_memory_bytes: u64,
    /// Host → device bandwidth, bytes/s (`ctog_bdw`).
    pub cpu_to_gpu_bandwidth: f64,
    /// Device → host bandwidth, bytes/s (`gtoc_bdw`).
    pub gpu_to_cpu_bandwidth: f64,
    /// Disk → host read bandwidth, bytes/s (`dtoc_bdw`).
    pub disk_to_cpu_bandwidth: f64,
    /// Host → disk write bandwidth, bytes/s (`ctod_bdw`).
    pub cpu_to_disk_bandwidth: f64,
    /// Device matrix-multiplication throughput, FLOP/s (`mm_flops`).
    pub gpu_matmul_flops: f64,
    /// Device matmul throughput measured at several row counts, `(rows, FLOP/s)` sorted by rows
    /// (FlexGen fits such piecewise rates: a matmul of a few rows runs far below peak). Empty:
    /// `gpu_matmul_flops` for every size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_matmul_flops_by_rows: Vec<(f64, f64)>,
    /// Device batched-matmul (attention) throughput, FLOP/s (`bmm_flops`).
    pub gpu_bmm_flops: f64,
    /// CPU attention throughput, FLOP/s (`cpu_flops`).
    pub cpu_flops: f64,
    /// Optional device memory (HBM) bandwidth, bytes/s. When set, GPU kernels are costed with a
    /// roofline: the larger of the FLOP time and the time to read their operands once (a decode
    /// matmul reads the layer's weights once per GPU batch, GPU attention reads the batch's
    /// cache). `None` keeps FlexGen's pure FLOP-rate terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bandwidth: Option<f64>,
    /// Optional CPU attention throughput in bytes of KV cache read per second. CPU attention in
    /// decode is memory-bound; when set, CPU attention time is the larger of the FLOP-based and
    /// the byte-based estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_attention_bandwidth: Option<f64>,
    /// Device quantization throughput, bytes of uncompressed input per second (LM-Offload
    /// Eq. 20–23 collapsed into one measured rate).
    pub gpu_quantize_bandwidth: f64,
    /// Device dequantization throughput, bytes of uncompressed output per second (LM-Offload
    /// Eq. 16 and 24).
    pub gpu_dequantize_bandwidth: f64,
    /// CPU quantization throughput, bytes of uncompressed input per second (LM-Offload Eq. 12–15:
    /// the one-time weight quantization at load).
    pub cpu_quantize_bandwidth: f64,
}

impl HardwareProfile {
    /// Device matmul FLOP/s for a product with `rows` rows: piecewise-linear in `log(rows)` through
    /// [`HardwareProfile::gpu_matmul_flops_by_rows`], constant beyond its ends, or
    /// `gpu_matmul_flops` without a table.
    pub fn matmul_flops(&self, rows: f64) -> f64 {
        let table = &self.gpu_matmul_flops_by_rows;
        let (Some(first), Some(last)) = (table.first(), table.last()) else {
            return self.gpu_matmul_flops;
        };
        if rows <= first.0 {
            return first.1;
        }
        if rows >= last.0 {
            return last.1;
        }
        for pair in table.windows(2) {
            let ((r0, f0), (r1, f1)) = (pair[0], pair[1]);
            if rows <= r1 {
                let t = (rows.ln() - r0.ln()) / (r1.ln() - r0.ln()).max(f64::EPSILON);
                return f0 + t * (f1 - f0);
            }
        }
        last.1
    }

    /// Capacity of `tier` in bytes.
    pub fn capacity(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Gpu => self.gpu_memory_bytes,
            Tier::Cpu => self.cpu_memory_bytes,
            Tier::Disk => self.disk_memory_bytes,
        }
    }

    /// The setup of FlexGen's evaluation (§6, Table 1): one 16 GB NVIDIA T4, 208 GB of CPU
    /// memory, 1.5 TB NVMe with about 2 GB/s read and 1 GB/s write, PCIe 3.0 x16 (about 12 GB/s).
    /// Compute rates are rough effective values, not peak numbers.
    pub fn t4_like() -> Self {
        Self {
            name: "T4-like (FlexGen Table 1)".into(),
            gpu_memory_bytes: 16 * GIB,
            cpu_memory_bytes: 208 * GIB,
            disk_memory_bytes: 1536 * GIB,
            cpu_to_gpu_bandwidth: 12e9,
            gpu_to_cpu_bandwidth: 12e9,
            disk_to_cpu_bandwidth: 2e9,
            cpu_to_disk_bandwidth: 1e9,
            gpu_matmul_flops: 20e12,
            gpu_bmm_flops: 10e12,
            cpu_flops: 100e9,
            gpu_memory_bandwidth: Some(300e9),
            cpu_attention_bandwidth: Some(20e9),
            gpu_quantize_bandwidth: 100e9,
            gpu_matmul_flops_by_rows: Vec::new(),
            gpu_dequantize_bandwidth: 100e9,
            cpu_quantize_bandwidth: 2e9,
        }
    }

    /// The single-GPU setup of LM-Offload's evaluation (Table 4): one 40 GB A100, 240 GB of CPU
    /// memory, PCIe 4.0 x16 (about 25 GB/s per direction). Compute rates are rough effective
    /// values.
    pub fn a100_40g_like() -> Self {
        Self {
            name: "A100-40GB-like (LM-Offload Table 4)".into(),
            gpu_memory_bytes: 40 * GIB,
            cpu_memory_bytes: 240 * GIB,
            disk_memory_bytes: 2048 * GIB,
            cpu_to_gpu_bandwidth: 25e9,
            gpu_to_cpu_bandwidth: 25e9,
            disk_to_cpu_bandwidth: 3e9,
            cpu_to_disk_bandwidth: 2e9,
            gpu_matmul_flops: 200e12,
            gpu_bmm_flops: 100e12,
            cpu_flops: 500e9,
            gpu_memory_bandwidth: Some(1.5e12),
            cpu_attention_bandwidth: Some(60e9),
            gpu_quantize_bandwidth: 400e9,
            gpu_matmul_flops_by_rows: Vec::new(),
            gpu_dequantize_bandwidth: 400e9,
            cpu_quantize_bandwidth: 5e9,
        }
    }

    /// Check every rate is finite and positive and the GPU has some memory.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let rates: [(&'static str, f64); 12] = [
            ("cpu_to_gpu_bandwidth", self.cpu_to_gpu_bandwidth),
            ("gpu_to_cpu_bandwidth", self.gpu_to_cpu_bandwidth),
            ("disk_to_cpu_bandwidth", self.disk_to_cpu_bandwidth),
            ("cpu_to_disk_bandwidth", self.cpu_to_disk_bandwidth),
            ("gpu_matmul_flops", self.gpu_matmul_flops),
            ("gpu_bmm_flops", self.gpu_bmm_flops),
            ("cpu_flops", self.cpu_flops),
            ("gpu_quantize_bandwidth", self.gpu_quantize_bandwidth),
            ("gpu_dequantize_bandwidth", self.gpu_dequantize_bandwidth),
            ("cpu_quantize_bandwidth", self.cpu_quantize_bandwidth),
            ("cpu_attention_bandwidth", self.cpu_attention_bandwidth.unwrap_or(1.0)),
            ("gpu_memory_bandwidth", self.gpu_memory_bandwidth.unwrap_or(1.0)),
        ];
        for (field, value) in rates {
            if !value.is_finite() || value <= 0.0 {
                return Err(ProfileError::Invalid {
                    field,
                    value,
                    reason: "must be a finite number greater than zero",
                });
            }
        }
        let mut previous_rows = 0.0;
        for &(rows, flops) in &self.gpu_matmul_flops_by_rows {
            let bad = |value| ProfileError::Invalid {
                field: "gpu_matmul_flops_by_rows",
                value,
                reason: "needs positive finite rows in increasing order and positive finite FLOP/s",
            };
            if !rows.is_finite() || rows <= previous_rows {
                return Err(bad(rows));
            }
            if !flops.is_finite() || flops <= 0.0 {
                return Err(bad(flops));
            }
            previous_rows = rows;
        }
        if self.gpu_memory_bytes == 0 {
            return Err(ProfileError::Invalid {
                field: "gpu_memory_bytes",
                value: 0.0,
                reason: "the GPU must have some memory",
            });
        }
        Ok(())
    }

    /// Parse and validate a profile from a JSON string.
    pub fn from_json_str(json: &str) -> Result<Self, ProfileError> {
        let profile: Self = serde_json::from_str(json)
            .map_err(|source| ProfileError::Parse { path: PathBuf::from("<string>"), source })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Serialize to pretty-printed JSON.
    pub fn to_json_string(&self) -> Result<String, ProfileError> {
        serde_json::to_string_pretty(self)
            .map_err(|source| ProfileError::Parse { path: PathBuf::from("<string>"), source })
    }

    /// Read and validate a profile from a JSON file.
    pub fn load_json(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| ProfileError::Io { path: path.to_path_buf(), source })?;
        let profile: Self =
            serde_json::from_str(&text).map_err(|source| ProfileError::Parse { path: path.to_path_buf(), source })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Validate, then write the profile as pretty-printed JSON.
    pub fn save_json(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let path = path.as_ref();
        self.validate()?;
        let text = serde_json::to_string_pretty(self)
            .map_err(|source| ProfileError::Parse { path: path.to_path_buf(), source })?;
        std::fs::write(path, text).map_err(|source| ProfileError::Io { path: path.to_path_buf(), source })
    }
}
