//! One device's profile of one model, cached on disk per (device, model, dtype): what
//! `--stage-layers auto` plans stages from (Alpa) and what TeraPipe's slice planner reads
//! (`prefill.base_ms`, `prefill.context_ms`: `t_ctx(i, j)` per layer on that device).
//!
//! The profile is measured on a model of the checkpoint's first few layers ([`super::run_layers`]), loaded
//! onto the device as the pipeline would load it (GGUF blocks kept, `--quantize` applied), with
//! the checkpoint's embeddings and head: timings and bytes are those of the weights as stored.
//! The cache file names a hash of the identity and the grid, and holds both: a file whose
//! identity or grid differs from the one asked for (copied, edited, a hash collision) is measured
//! again and overwritten, never reused.

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::Device;
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{CausalLm, DecoderSpec, QuantSpec};
use serde::{Deserialize, Serialize};

use super::{ProfileError, ProfileGrid, ProgressHook, profile_model};
use burn_plan::profile::Profile;

/// Who a profile was measured for. A cached profile is reused only for the same three.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileIdentity {
    /// The device: its `--devices` entry and what tells two such devices apart (threads).
    pub device: String,
    /// The model: its file and shape.
    pub model: String,
    /// How its weights are stored and multiplied (`f32`, GGUF blocks, `--quantize`, matmul
    /// precision).
    pub dtype: String,
}

impl ProfileIdentity {
    /// The cache file of this identity measured over `grid`, in `dir`.
    pub fn cache_file(&self, dir: &Path, grid: &ProfileGrid) -> PathBuf {
        let key = serde_json::to_string(&(self, grid)).unwrap_or_default();
        let name = self.device.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>();
        dir.join(format!("stage-profile-{name}-{:016x}.json", fnv1a(key.as_bytes())))
    }
}

impl std::fmt::Display for ProfileIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}, model {}, {}", self.device, self.model, self.dtype)
    }
}

/// A stable 64-bit hash (FNV-1a) for cache file names; `std`'s hasher may change between releases.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The version of what the profiler measures and how; a cache file of another version (or of
/// none: before versions) is measured again. 2: consecutive layers per step and `call_ms`. 3: an
/// untimed decode step before the decode table.
pub const CACHE_FORMAT: u32 = 3;

/// What a cache file holds.
#[derive(Debug, Serialize, Deserialize)]
struct CachedProfile {
    /// [`CACHE_FORMAT`] when written (absent in files older than versions: 0).
    #[serde(default)]
    format: u32,
    identity: ProfileIdentity,
    grid: ProfileGrid,
    profile: Profile,
}

/// Where a [`DeviceProfile`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// Read from the cache.
    Cached(PathBuf),
    /// Measured now (no cache directory, or no file yet).
    Measured,
    /// Measured now because the cache file was measured for something else (named).
    Remeasured {
        /// The file.
        path: PathBuf,
        /// What it had been measured for.
        found: String,
    },
}

/// One device's profile of a model.
#[derive(Debug, Clone)]
pub struct DeviceProfile {
    /// Who it was measured for.
    pub identity: ProfileIdentity,
    /// The profile (`layers` is the model's depth).
    pub profile: Profile,
    /// Cached or measured.
    pub source: ProfileSource,
}

/// Where a profiled layer's weights come from.
pub enum ProfileWeights<'a, S: TensorSource> {
    /// Seeded random weights of the spec's shape (dense).
    Random,
    /// The checkpoint's first layer, embeddings and head, `quant` applied as `--quantize` does.
    Checkpoint {
        /// The opened checkpoint.
        source: &'a S,
        /// Group quantization applied after loading.
        quant: Option<QuantSpec>,
    },
}

/// `spec`'s profile on `device` (see the [module docs](self)): read from `cache_dir` when a file
/// there was measured for `identity` over `grid`, else measured now (progress lines to `log`)
/// and written there, each point reported to `progress` as it starts. A device that fails while
/// being measured (a worker that died) is an error naming the device; nothing is cached then.
#[allow(clippy::too_many_arguments)] // the model, the device, the cache, and who watches
pub fn device_profile<S: TensorSource>(
    spec: &DecoderSpec,
    weights: ProfileWeights<'_, S>,
    device: &Device,
    identity: &ProfileIdentity,
    grid: &ProfileGrid,
    cache_dir: Option<&Path>,
    progress: Option<ProgressHook<'_>>,
    log: &mut dyn Write,
) -> Result<DeviceProfile, ProfileError> {
    let path = cache_dir.map(|dir| identity.cache_file(dir, grid));
    let mut source = ProfileSource::Measured;
    if let Some(path) = path.as_ref().filter(|p| p.exists()) {
        match read_cached(path) {
            Some(cached) if cached.format == CACHE_FORMAT && cached.identity == *identity && cached.grid == *grid => {
                return Ok(DeviceProfile {
                    identity: identity.clone(),
                    profile: cached.profile,
                    source: ProfileSource::Cached(path.clone()),
                });
            }
            other => {
                let found = match other {
                    Some(c) if c.format != CACHE_FORMAT => {
                        format!("the profiler's format {} (this one writes {CACHE_FORMAT})", c.format)
                    }
                    Some(c) if c.identity != *identity => c.identity.to_string(),
                    Some(_) => "another grid".to_string(),
                    None => "nothing readable".to_string(),
                };
                let _ =
                    writeln!(log, "{} holds a profile of {found}, not of {identity}: measuring again", path.display());
                source = ProfileSource::Remeasured { path: path.clone(), found };
            }
        }
    }
    let _ = writeln!(log, "profiling {identity} ...");
    let started = std::time::Instant::now();
    let model = first_layers_model(spec, weights, device, super::run_layers(spec.num_layers))?;
    let mut profile = profile_model(&model, spec.num_layers, grid, progress).map_err(|e| match e {
        ProfileError::Device(reason) => ProfileError::Device(format!("device `{}`: {reason}", identity.device)),
        other => other,
    })?;
    profile.model = Some(identity.model.clone());
    profile.device = Some(identity.device.clone());
    let _ = writeln!(log, "  measured in {:.1} s", started.elapsed().as_secs_f64());
    if let Some(path) = &path {
        write_cached(
            path,
            &CachedProfile {
                format: CACHE_FORMAT,
                identity: identity.clone(),
                grid: grid.clone(),
                profile: profile.clone(),
            },
        )?;
    }
    Ok(DeviceProfile { identity: identity.clone(), profile, source })
}

/// `spec`'s model with only its first layer, on `device`.
pub fn one_layer_model<S: TensorSource>(
    spec: &DecoderSpec,
    weights: ProfileWeights<'_, S>,
    device: &Device,
) -> Result<CausalLm, ProfileError> {
    first_layers_model(spec, weights, device, 1)
}

/// `spec`'s model with only its first `layers` layers (at most its depth), on `device`.
pub fn first_layers_model<S: TensorSource>(
    spec: &DecoderSpec,
    weights: ProfileWeights<'_, S>,
    device: &Device,
    layers: usize,
) -> Result<CausalLm, ProfileError> {
    let first = DecoderSpec { num_layers: layers.clamp(1, spec.num_layers.max(1)), ..spec.clone() };
    Ok(match weights {
        ProfileWeights::Random => CausalLm::random(first, device)?,
        ProfileWeights::Checkpoint { source, quant } => {
            let mut model = CausalLm::skeleton(first.clone(), source, device)?;
            for layer in 0..first.num_layers {
                model.layers.push(CausalLm::load_layer(&first, source, layer, device)?);
            }
            match quant {
                Some(q) => model.quantize_weights(q)?,
                None => model,
            }
        }
    })
}

fn read_cached(path: &Path) -> Option<CachedProfile> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Written whole through a temporary file, so that a cut-off run leaves no half profile.
fn write_cached(path: &Path, cached: &CachedProfile) -> Result<(), ProfileError> {
    let io = |e: std::io::Error| ProfileError::Cache { path: path.to_owned(), reason: e.to_string() };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = serde_json::to_string_pretty(cached)
        .map_err(|e| ProfileError::Cache { path: path.to_owned(), reason: e.to_string() })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text + "\n").and_then(|()| std::fs::rename(&tmp, path)).map_err(io)
}
