//! Where a model's tensors come from ([`TensorSource`]), and HF safetensors checkpoints: one
//! `model.safetensors`, or shards listed in `model.safetensors.index.json`. Files are
//! memory-mapped and fully validated (header, offsets, sizes) before any tensor is read, so a
//! truncated or corrupt file is an error, never garbage. Seeded [`RandomWeights`] stand in for a
//! checkpoint in benchmarks.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, Tensor, TensorData};
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

    /// Reads the window `rows` x `cols` of the HF `[r, c]` matrix `name` (whose shape must be
    /// `shape`) as row-major `f32` values: a tensor-parallel rank's shard, read without building
    /// the rest on a device. The default reads the whole matrix on the host and copies the window
    /// out; [`Checkpoint`] decodes only the window's bytes from its memory map.
    fn read_f32_window(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> Result<Vec<f32>> {
        check_window(name, shape, &rows, &cols)?;
        Ok(window(&self.read_f32(name, &shape)?, shape[1], rows, cols))
    }

    /// The window `rows` x `cols` of the HF `[r, c]` matrix `name` in the quantized form the file
    /// stores it in (groups along `cols`, which must start and end on group boundaries), or `None`
    /// when the file stores it in floating point. The default quantizes nothing more than
    /// [`TensorSource::quantized`] does: it loads the whole matrix onto `device` and copies the
    /// window into its own buffers ([`quantized_window`]); GGUF files cut their blocks on the host.
    fn quantized_window(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: Range<usize>,
        cols: Range<usize>,
        device: &Device,
    ) -> Result<Option<GroupQuantized<2>>> {
        check_window(name, shape, &rows, &cols)?;
        match self.quantized(name, shape, device)? {
            Some(q) => quantized_window(&q, name, rows, cols, device).map(Some),
            None => Ok(None),
        }
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

/// The window `rows` x `cols` of a row-major matrix `width` values wide, row-major.
pub fn window<T: Copy>(values: &[T], width: usize, rows: Range<usize>, cols: Range<usize>) -> Vec<T> {
    rows.flat_map(|r| values[r * width + cols.start..r * width + cols.end].iter().copied()).collect()
}

/// Checks that the window `rows` x `cols` lies inside a `shape` matrix named `name`.
pub fn check_window(name: &str, shape: [usize; 2], rows: &Range<usize>, cols: &Range<usize>) -> Result<()> {
    if rows.start <= rows.end && rows.end <= shape[0] && cols.start <= cols.end && cols.end <= shape[1] {
        return Ok(());
    }
    Err(ModelError::Window {
        name: name.to_string(),
        shape,
        rows: rows.clone(),
        cols: cols.clone(),
        why: "the window lies outside the tensor".into(),
    })
}

/// The window `rows` x `cols` of a `[r, c]` matrix quantized along its columns, still quantized
/// and copied into buffers of its own on `device` (a view would keep the whole matrix alive and
/// make kernels walk it with strides). `cols` must start and end on group boundaries; `name`
/// identifies the tensor in errors.
pub fn quantized_window(
    q: &GroupQuantized<2>,
    name: &str,
    rows: Range<usize>,
    cols: Range<usize>,
    device: &Device,
) -> Result<GroupQuantized<2>> {
    check_window(name, q.shape, &rows, &cols)?;
    let group = q.spec.group_size();
    let error = |why: String| ModelError::Window {
        name: name.to_string(),
        shape: q.shape,
        rows: rows.clone(),
        cols: cols.clone(),
        why,
    };
    if q.spec.axis() != 1 {
        return Err(error(format!("it is quantized along axis {}, not along its columns", q.spec.axis())));
    }
    if !cols.start.is_multiple_of(group) || !cols.end.is_multiple_of(group) {
        return Err(error(format!(
            "the columns do not start and end on its quantization groups of {group} values; choose a split \
             whose shards are whole groups"
        )));
    }
    let per_word = q.spec.per_word();
    let (r, n) = (rows.start, rows.len());
    let codes = q.codes.clone().narrow(0, r, n).narrow(1, cols.start / per_word, cols.len() / per_word);
    let part = |t: &Tensor<2>| {
        Tensor::from_data(
            t.clone().narrow(0, r, n).narrow(1, cols.start / group, cols.len() / group).into_data(),
            device,
        )
    };
    Ok(GroupQuantized {
        codes: Tensor::from_data(codes.into_data(), (device, DType::U32)),
        scale: part(&q.scale),
        min: part(&q.min),
        shape: [n, cols.len()],
        spec: q.spec,
    })
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

impl Checkpoint {
    /// The stored bytes and dtype of `name` (resolved, see [`Checkpoint::resolve`]), checking that
    /// its shape is `expected`.
    fn raw(&self, name: &str, expected: &[usize]) -> Result<(&[u8], Dtype, String)> {
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
        Ok((bytes, info.dtype, resolved))
    }
}

impl TensorSource for Checkpoint {
    /// Reads `name` as `f32` values, checking that its shape is `expected`.
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let (bytes, dtype, resolved) = self.raw(name, expected)?;
        decode_floats(bytes, dtype)
            .ok_or_else(|| ModelError::UnsupportedDtype { name: resolved, dtype: format!("{dtype:?}") })
    }

    /// Decodes only the window's rows and columns from the memory map.
    fn read_f32_window(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> Result<Vec<f32>> {
        check_window(name, shape, &rows, &cols)?;
        let (bytes, dtype, resolved) = self.raw(name, &shape)?;
        let unsupported = || ModelError::UnsupportedDtype { name: resolved.clone(), dtype: format!("{dtype:?}") };
        let size = match dtype {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            _ => return Err(unsupported()),
        };
        let mut values = Vec::with_capacity(rows.len() * cols.len());
        for r in rows {
            let at = |c: usize| (r * shape[1] + c) * size;
            let row = bytes.get(at(cols.start)..at(cols.end)).ok_or_else(|| ModelError::CorruptWeights {
                path: self.dir.clone(),
                message: format!("tensor `{resolved}` is shorter than its shape"),
            })?;
            values.extend(decode_floats(row, dtype).ok_or_else(unsupported)?);
        }
        Ok(values)
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
