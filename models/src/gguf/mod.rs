//! GGUF (llama.cpp's model format, versions 2 and 3): header, metadata, tensor infos and data,
//! memory-mapped. Every count, length and offset is checked against the file before use, so a
//! truncated or corrupted file is an error, never a panic or an out-of-bounds read.

mod metadata;
mod quant;
mod source;
mod spm;
mod tokenizer;

pub use quant::{BlockLayout, GgmlType, RepackedBlocks, dequantize, repack_blocks};
pub use source::{GgufModel, permute_rope_rows, unpermute_rope_rows};
pub use tokenizer::{chat_template, tokenizer_from_gguf};

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{ModelError, Result};

/// `"GGUF"` read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// llama.cpp's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// `f32` or `f64`.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            GgufValue::U64(v) => Some(*v),
            GgufValue::I64(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            GgufValue::F64(v) => Some(*v),
            GgufValue::U64(v) => Some(*v as f64),
            GgufValue::I64(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            GgufValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// GGML dimensions, fastest-varying first (the reverse of PyTorch's shape).
    pub dims: Vec<u64>,
    /// Storage type.
    pub kind: GgmlType,
    /// Absolute byte range of its data in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensorInfo {
    /// Elements in the tensor.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The PyTorch-order shape (slowest-varying first).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF header: version, metadata and tensor infos.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata, by key.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos, in file order.
    pub tensors: Vec<GgufTensorInfo>,
}

impl GgufHeader {
    /// Parses the header of a whole GGUF file held in `bytes`, checking that every tensor's data
    /// lies inside it.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Self, String> {
        let mut r = Reader { bytes, pos: 0 };
        if r.u32()? != MAGIC {
            return Err("not a GGUF file (bad magic)".into());
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!("GGUF version {version} is not supported (2 and 3 are)"));
        }
        let tensor_count = r.u64()?;
        let kv_count = r.u64()?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = r.string()?;
            let kind = r.u32()?;
            let value = r.value(kind, 0)?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::new();
        for _ in 0..tensor_count {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"));
            }
            let dims = (0..n_dims).map(|_| r.u64()).collect::<std::result::Result<Vec<_>, _>>()?;
            let kind = GgmlType::from_id(r.u32()?);
            let offset = r.u64()?;
            infos.push((name, dims, kind, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => return Err(format!("general.alignment {v:?} is not a power of two")),
            },
        };
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, kind, offset) in infos {
            let elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| format!("tensor `{name}`: element count overflows"))?;
            let per_block = kind.block_elements() as u64;
            if !dims[0].is_multiple_of(per_block) {
                return Err(format!(
                    "tensor `{name}`: rows of {} values do not fill whole {kind} blocks of {per_block}",
                    dims[0]
                ));
            }
            let size = kind
                .byte_size(elements)
                .ok_or_else(|| format!("tensor `{name}`: {elements} elements do not fill whole {kind} blocks"))?;
            let start = data_start
                .checked_add(offset)
                .filter(|s| offset % alignment == 0 && *s <= bytes.len() as u64)
                .ok_or_else(|| {
                    format!("tensor `{name}`: data offset {offset} is misaligned or past the end of the file")
                })?;
            let end = start
                .checked_add(size)
                .filter(|e| *e <= bytes.len() as u64)
                .ok_or_else(|| format!("tensor `{name}`: {size} bytes of data run past the end of the file"))?;
            tensors.push(GgufTensorInfo { name, dims, kind, range: start as usize..end as usize });
        }
        Ok(Self { version, metadata, tensors })
    }
}

/// A memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    header: GgufHeader,
    by_name: BTreeMap<String, usize>,
}

impl GgufFile {
    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: read-only map kept alive by `self`; the usual mmap caveat about files truncated
        // underneath us applies, as for every mmap-based model loader.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let header = GgufHeader::parse(&mmap)
            .map_err(|message| ModelError::CorruptGguf { path: path.to_path_buf(), message })?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(Self { path: path.to_path_buf(), mmap, header, by_name })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Metadata and tensor infos.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// A metadata value.
    pub fn meta(&self, key: &str) -> Option<&GgufValue> {
        self.header.metadata.get(key)
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.header.tensors[i])
    }

    /// The raw bytes of tensor `name` (validated at open to lie inside the file).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.mmap[info.range.clone()]
    }

    /// Tensor `name` dequantized to `f32`, in PyTorch order.
    pub fn read_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), dir: self.path.clone() })?;
        let values = dequantize(info.kind, self.tensor_bytes(info))
            .ok_or_else(|| ModelError::UnsupportedGgufType { name: name.to_string(), kind: info.kind.name() })?;
        Ok((values, info.shape()))
    }
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Deepest array nesting accepted (arrays of arrays are legal; bombs are not).
const MAX_NESTING: usize = 4;

impl Reader<'_> {
    fn take(&mut self, n: u64) -> std::result::Result<&[u8], String> {
        let end = (self.pos as u64)
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len() as u64)
            .ok_or_else(|| format!("unexpected end of file at byte {} (needed {n} more)", self.pos))?;
        let out = &self.bytes[self.pos..end as usize];
        self.pos = end as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        let len = self.u64()?;
        let pos = self.pos;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("string at byte {pos} is not UTF-8"))
    }

    fn value(&mut self, kind: u32, depth: usize) -> std::result::Result<GgufValue, String> {
        Ok(match kind {
            0 => GgufValue::U64(self.array::<1>()?[0] as u64),
            1 => GgufValue::I64(i8::from_le_bytes(self.array()?) as i64),
            2 => GgufValue::U64(u16::from_le_bytes(self.array()?) as u64),
            3 => GgufValue::I64(i16::from_le_bytes(self.array()?) as i64),
            4 => GgufValue::U64(self.u32()? as u64),
            5 => GgufValue::I64(i32::from_le_bytes(self.array()?) as i64),
            6 => GgufValue::F64(f32::from_le_bytes(self.array()?) as f64),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("invalid bool byte {b} at {}", self.pos - 1)),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err("metadata arrays nested too deeply".into());
                }
                let elem = self.u32()?;
                let count = self.u64()?;
                // Every element takes at least one byte: a count larger than what is left is a lie,
                // refused before allocating for it.
                let left = (self.bytes.len() - self.pos) as u64;
                if count > left {
                    return Err(format!("array of {count} elements cannot fit in the {left} bytes left"));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(format!("unknown metadata value type {other} at byte {}", self.pos - 4)),
        })
    }
}
