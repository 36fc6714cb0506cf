//! Where a model's tensors come from ([`TensorSource`]), and HF safetensors checkpoints: one
//! `model.safetensors`, or shards listed in `model.safetensors.index.json`. Files are
//! memory-mapped and fully validated (header, offsets, sizes) before any tensor is read, so a
//! truncated or corrupt file is an error, never garbage. Seeded [`RandomWeights`] stand in for a
//! checkpoint in benchmarks.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm_kernels::GroupQuantized;
use memmap2::Mmap;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, Metadata};

use crate::error::{ModelError, Result};

pub mod random;

pub use random::RandomWeights;

/// One memory-mapped safetensors file with its parsed header.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// A checkpoint's tensors, looked up by HF name and converted to `f32` on request.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    location: HashMap<String, usize>,
}

/// Where a model's tensors come from (safetensors checkpoints, GGUF files, [`RandomWeights`]).
/// Names and shapes are those of the HF checkpoint (`[out, in]` for `nn.Linear`); each source
/// maps them to its own layout, so the model is built by one loader whatever the source.
pub trait TensorSource {
    /// Reads `name` as `f32` values, checking that its HF shape is `expected`.
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>>;

    /// Reads an HF `[rows, cols]` matrix in the quantized form the file stores it in (groups along
    /// `cols`), so that quantized checkpoints load without an `f32` detour; `None` when the file
    /// stores it in floating point (then [`TensorSource::read_f32`] reads it).
    fn quantized(&self, name: &str, shape: [usize; 2], device: &Device) -> Result<Option<GroupQuantized<2>>> {
        let _ = (name, shape, device);
        Ok(None)
    }

    /// Reads `name` into a device tensor of shape `expected`.
    fn tensor<const D: usize>(&self, name: &str, expected: [usize; D], device: &Device) -> Result<Tensor<D>>
    where
        Self: Sized,
    {
        let values = self.read_f32(name, &expected)?;
        Ok(Tensor::from_data(TensorData::new(values, expected), device))
    }

    /// Reads an HF `[rows, cols]` matrix transposed to `[cols, rows]` (HF `Linear` stores
    /// `[out, in]`, Burn's `Linear` wants `[in, out]`).
    fn tensor_transposed(&self, name: &str, [rows, cols]: [usize; 2], device: &Device) -> Result<Tensor<2>>
    where
        Self: Sized,
    {
        let values = self.read_f32(name, &[rows, cols])?;
        Ok(Tensor::from_data(TensorData::new(transpose(&values, rows, cols), [cols, rows]), device))
    }
}

/// `[rows, cols]` row-major to `[cols, rows]` row-major.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; values.len()];
    for (r, row) in values.chunks_exact(cols.max(1)).enumerate() {
        for (c, v) in row.iter().enumerate() {
            out[c * rows + r] = *v;
        }
    }
    out
}

/// Name of the index that lists the shards of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

impl Checkpoint {
    /// Opens the safetensors files of the model in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let files = shard_files(dir)?;
        let mut shards = Vec::with_capacity(files.len());
        let mut location = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| ModelError::io(&path, e))?;
            // SAFETY: the map is read-only and lives as long as `Checkpoint`; a file truncated
            // underneath us is the usual mmap caveat, the same one burn-store and candle accept.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(&path, e))?;
            let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| ModelError::CorruptWeights { path: path.clone(), message: e.to_string() })?;
            for name in metadata.tensors().keys() {
                location.insert(name.clone(), shards.len());
            }
            shards.push(Shard { path, mmap, header_len, metadata });
        }
        Ok(Self { dir: dir.to_path_buf(), shards, location })
    }

    /// The directory the checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// All tensor names in the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// Resolves `name`, also accepting checkpoints saved from the bare model, whose names lack the
    /// first component (`transformer.h.0…` saved as `h.0…`, `model.decoder…` as `decoder…`).
    pub fn resolve(&self, name: &str) -> Option<String> {
        if self.location.contains_key(name) {
            return Some(name.to_string());
        }
        let stripped = name.split_once('.').map(|(_, rest)| rest)?;
        self.location.contains_key(stripped).then(|| stripped.to_string())
    }

    /// Whether the checkpoint holds `name` (see [`Checkpoint::resolve`]).
    pub fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }
}

impl TensorSource for Checkpoint {
    /// Reads `name` as `f32` values, checking that its shape is `expected`.
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let resolved = self
            .resolve(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), dir: self.dir.clone() })?;
        let shard = &self.shards[self.location[&resolved]];
        let info = shard
            .metadata
            .info(&resolved)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), dir: self.dir.clone() })?;
        if info.shape != expected {
            return Err(ModelError::ShapeMismatch {
                name: resolved,
                expected: expected.to_vec(),
                found: info.shape.clone(),
            });
        }
        let start = 8 + shard.header_len + info.data_offsets.0;
        let end = 8 + shard.header_len + info.data_offsets.1;
        let bytes = shard.mmap.get(start..end).ok_or_else(|| ModelError::CorruptWeights {
            path: shard.path.clone(),
            message: format!("tensor `{resolved}` lies outside the file"),
        })?;
        decode_floats(bytes, info.dtype)
            .ok_or_else(|| ModelError::UnsupportedDtype { name: resolved, dtype: format!("{:?}", info.dtype) })
    }
}

/// The shard file names listed in a `model.safetensors.index.json`, sorted and deduplicated;
/// names that are not plain file names are refused.
pub fn index_shards(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::config(index, e.to_string()))?;
    let mut files: Vec<String> = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::config(index, "no `weight_map` object"))?
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    files.sort();
    files.dedup();
    if let Some(bad) = files.iter().find(|f| f.contains('/') || f.contains("..")) {
        return Err(ModelError::config(index, format!("shard `{bad}` is not a file name")));
    }
    Ok(files)
}

/// The safetensors files of a model directory: the index's shards when there is an index, else
/// `model.safetensors`, else any `model*.safetensors` (other safetensors files, adapters or
/// references, are not weights of the model).
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let files = index_shards(&index)?;
        let mut paths = Vec::with_capacity(files.len());
        for file in files {
            let path = dir.join(&file);
            if !path.is_file() {
                return Err(ModelError::MissingFile { what: "weight shard", path });
            }
            paths.push(path);
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(ModelError::MissingFile {
            what: "weights (model.safetensors or model.safetensors.index.json)",
            path: single,
        });
    }
    Ok(found)
}

/// Little-endian F32/F16/BF16 bytes to `f32`; `None` for other dtypes.
fn decode_floats(bytes: &[u8], dtype: Dtype) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => return None,
    })
}
