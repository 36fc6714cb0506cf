//! The disk tier: one [safetensors] file per tensor, checksummed, memory-mapped on read.
//!
//! Each file holds a single tensor under the key `tensor`, and the CRC-32 (IEEE, `crc32fast`) of
//! its bytes in the header's `__metadata__` as `"crc32": "<8 lowercase hex digits>"`, so any
//! safetensors reader can open it. The files are scratch data: the tensor name → file map lives
//! in memory, a file is named `<pid>-<n>.safetensors` (unique among live processes and stores, so
//! several stores and processes can share a directory), and the store removes its files when
//! dropped.
//!
//! # Writing
//!
//! [`DiskStore::put`] computes the payload CRC (one in-memory pass; `crc32fast` uses PCLMULQDQ /
//! ARM CRC instructions, well above 10 GB/s, less than the write costs), writes the file as
//! `<file>.tmp` and renames it over the real name. A failed `put` never leaves a half-written
//! tensor under the real name, and a [`MappedTensor`] of a replaced version stays valid on Unix
//! (it maps the old inode). There is no `fsync`: the files are useless after the process exits,
//! so durability would buy nothing but a stall of the I/O thread.
//!
//! # Reading
//!
//! [`DiskStore::get`] maps the file read-only and checks, in order: its length against what
//! `put` wrote ([`StoreError::Truncated`], [`StoreError::Mismatch`]); the header, with the
//! safetensors parser, which bounds-checks every offset against the mapped length
//! ([`StoreError::BadHeader`]); dtype, shape and checksum against what `put` recorded
//! ([`StoreError::Mismatch`]); and the payload CRC ([`StoreError::Corrupted`]). The header is
//! compact JSON that must say exactly what `put` recorded, and the payload is covered by the
//! CRC, so every flipped bit of a file is an error, never a panic or an out-of-bounds read.
//!
//! The values are written in the machine's byte order, which is little-endian, as safetensors
//! requires, on every target Burn runs on.
//!
//! [safetensors]: https://github.com/huggingface/safetensors

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

use super::StoreError;

/// Key of the tensor in its file.
const TENSOR_KEY: &str = "tensor";
/// Key of the payload CRC-32 in the file's `__metadata__`.
const CHECKSUM_KEY: &str = "crc32";
/// Number of the next file any store of this process creates.
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half precision (`--dtype f16` weights and caches), kept as raw bits.
    F16,
    /// bfloat16 (`--dtype bf16`), kept as raw bits.
    BF16,
    /// 32-bit unsigned integer (token ids, packed quantized weights, …).
    U32,
}

impl DType {
    fn safetensors(self) -> Dtype {
        match self {
            DType::F32 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            DType::U32 => Dtype::U32,
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The store's type for a Burn element type, `None` for types the store does not keep.
    pub fn of(dtype: burn::tensor::DType) -> Option<Self> {
        match dtype {
            burn::tensor::DType::F32 => Some(DType::F32),
            burn::tensor::DType::F16 => Some(DType::F16),
            burn::tensor::DType::BF16 => Some(DType::BF16),
            burn::tensor::DType::U32 => Some(DType::U32),
            _ => None,
        }
    }

    /// Burn's element type.
    pub fn burn(self) -> burn::tensor::DType {
        match self {
            DType::F32 => burn::tensor::DType::F32,
            DType::F16 => burn::tensor::DType::F16,
            DType::BF16 => burn::tensor::DType::BF16,
            DType::U32 => burn::tensor::DType::U32,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
        })
    }
}

/// Typed values of a tensor, row-major: what [`HostData`] writes and [`MappedTensor::view`]
/// reads back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorView<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// 16-bit float values (f16 or bf16, the [`DType`] says which) as raw bits.
    Half(DType, &'a [u16]),
    /// u32 values.
    U32(&'a [u32]),
}

impl<'a> TensorView<'a> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorView::F32(_) => DType::F32,
            TensorView::Half(dtype, _) => *dtype,
            TensorView::U32(_) => DType::U32,
        }
    }

    /// Number of values.
    fn len(&self) -> usize {
        match self {
            TensorView::F32(v) => v.len(),
            TensorView::Half(_, v) => v.len(),
            TensorView::U32(v) => v.len(),
        }
    }

    /// The values as raw native-endian bytes (no copy).
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            TensorView::F32(v) => bytemuck::cast_slice(v),
            TensorView::Half(_, v) => bytemuck::cast_slice(v),
            TensorView::U32(v) => bytemuck::cast_slice(v),
        }
    }
}

/// A host tensor to write: borrowed values plus shape (product of `shape` = number of values;
/// the empty shape is a scalar with one value). Borrowed so `put` needs no copy.
#[derive(Debug, Clone, Copy)]
pub struct HostData<'a> {
    /// Dimensions.
    pub shape: &'a [usize],
    /// Values.
    pub values: TensorView<'a>,
}

impl<'a> HostData<'a> {
    /// An f32 tensor.
    pub fn f32(shape: &'a [usize], values: &'a [f32]) -> Self {
        Self { shape, values: TensorView::F32(values) }
    }

    /// A u32 tensor.
    pub fn u32(shape: &'a [usize], values: &'a [u32]) -> Self {
        Self { shape, values: TensorView::U32(values) }
    }

    /// A 16-bit float tensor (`dtype` [`DType::F16`] or [`DType::BF16`]) given as raw bits.
    pub fn half(shape: &'a [usize], dtype: DType, bits: &'a [u16]) -> Self {
        Self { shape, values: TensorView::Half(dtype, bits) }
    }
}

/// What [`DiskStore::put`] wrote for a tensor; what `get` validates the file against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskTensor {
    name: String,
    path: PathBuf,
    dtype: DType,
    shape: Vec<usize>,
    payload_bytes: u64,
    file_bytes: u64,
    checksum: u32,
}

impl DiskTensor {
    /// Tensor name as given to `put`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Path of the tensor's file.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Payload bytes (elements × element size).
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }
    /// File size: header + payload.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }
}

/// A validated, memory-mapped tensor file. Owns its map: independent of the [`DiskStore`]'s
/// lifetime, `Send + Sync`, and on Unix still readable after the file is removed or replaced.
///
/// Like every memory map, it assumes nobody else truncates or rewrites the file in place while
/// it is alive (the store never does: it only replaces files by rename and deletes them); an
/// outside process doing so could make reads fault (SIGBUS) or change the viewed values.
///
/// It dereferences to the [`DiskTensor`] the file was checked to match.
pub struct MappedTensor {
    map: Mmap,
    info: DiskTensor,
    /// Where the values are in `map`: in bounds, aligned to the element size and `payload_bytes` long (all
    /// checked in `DiskStore::get`).
    payload: Range<usize>,
}

impl fmt::Debug for MappedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedTensor").field("info", &self.info).field("payload", &self.payload).finish()
    }
}

impl std::ops::Deref for MappedTensor {
    type Target = DiskTensor;

    fn deref(&self) -> &DiskTensor {
        &self.info
    }
}

impl MappedTensor {
    fn bytes(&self) -> &[u8] {
        self.map.get(self.payload.clone()).unwrap_or(&[])
    }

    /// The values as f32, or `None` if the tensor is u32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.view() {
            TensorView::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Typed view of the values.
    pub fn view(&self) -> TensorView<'_> {
        // Bounds and alignment were checked in `get`, so the casts cannot fail; the fallback to
        // an empty slice only keeps this panic-free.
        let bytes = self.bytes();
        match self.dtype {
            DType::F32 => TensorView::F32(bytemuck::try_cast_slice(bytes).unwrap_or(&[])),
            DType::F16 | DType::BF16 => TensorView::Half(self.dtype, bytemuck::try_cast_slice(bytes).unwrap_or(&[])),
            DType::U32 => TensorView::U32(bytemuck::try_cast_slice(bytes).unwrap_or(&[])),
        }
    }
}

/// The disk tier: one file per tensor under a directory. See the [module docs](self).
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    /// Whether `open` created `dir` (then dropping the store removes it if empty).
    created_dir: bool,
    entries: HashMap<String, DiskTensor>,
    bytes_on_disk: u64,
}

impl DiskStore {
    /// Opens a store on `dir`, created if missing. Dropping the store removes its files, and
    /// `dir` too if the store created it and nothing else is in it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let created_dir = !dir.exists();
        let io_error = |op, source| StoreError::Io { op, path: dir.clone(), source };
        fs::create_dir_all(&dir).map_err(|e| io_error("creating offload directory", e))?;
        if !dir.is_dir() {
            return Err(io_error("opening offload directory", io::Error::other("not a directory")));
        }
        Ok(Self { dir, created_dir, entries: HashMap::new(), bytes_on_disk: 0 })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of stored tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no tensor is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total size of the stored files (headers + payloads).
    pub fn bytes_on_disk(&self) -> u64 {
        self.bytes_on_disk
    }

    /// Writes a tensor, replacing any tensor of the same name (any string is a valid name).
    /// Atomic: on error the previous version, if any, is untouched.
    pub fn put(&mut self, name: &str, data: HostData<'_>) -> Result<DiskTensor, StoreError> {
        let shape = data.shape;
        let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if numel != Some(data.values.len()) {
            let reason = match numel {
                Some(n) => format!("{n} elements expected, {} values given", data.values.len()),
                None => "the element count overflows usize".into(),
            };
            return Err(StoreError::InvalidShape { name: name.to_owned(), shape: shape.to_vec(), reason });
        }
        let (dtype, payload) = (data.values.dtype(), data.values.bytes());
        let checksum = crc32fast::hash(payload);
        let path = match self.entries.get(name) {
            Some(old) => old.path.clone(),
            None => self.dir.join(format!(
                "{}-{}.safetensors",
                std::process::id(),
                NEXT_FILE.fetch_add(1, Ordering::Relaxed)
            )),
        };
        let tmp = path.with_extension("tmp");
        let written = write_file(&tmp, dtype, shape, payload, checksum).and_then(|file_bytes| {
            fs::rename(&tmp, &path).map(|()| file_bytes).map_err(|source| StoreError::Io {
                op: "renaming temp file to",
                path: path.clone(),
                source,
            })
        });
        let file_bytes = written.inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })?;

        let tensor = DiskTensor {
            name: name.to_owned(),
            path,
            dtype,
            shape: shape.to_vec(),
            payload_bytes: payload.len() as u64,
            file_bytes,
            checksum,
        };
        if let Some(old) = self.entries.insert(name.to_owned(), tensor.clone()) {
            self.bytes_on_disk -= old.file_bytes;
        }
        self.bytes_on_disk += file_bytes;
        Ok(tensor)
    }

    /// Maps a stored tensor and validates it against what `put` wrote, checksum included.
    pub fn get(&self, name: &str) -> Result<MappedTensor, StoreError> {
        let entry = self.entries.get(name).ok_or_else(|| StoreError::UnknownTensor { name: name.to_owned() })?;
        let path = &entry.path;
        let bad_header = |reason: String| StoreError::BadHeader { name: name.to_owned(), path: path.clone(), reason };
        let mismatch = |reason: String| StoreError::Mismatch { name: name.to_owned(), path: path.clone(), reason };
        let file = File::open(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => StoreError::Missing { name: name.to_owned(), path: path.clone() },
            _ => StoreError::Io { op: "opening", path: path.clone(), source },
        })?;
        let file_len = file
            .metadata()
            .map_err(|source| StoreError::Io { op: "reading metadata of", path: path.clone(), source })?
            .len();
        if file_len < entry.file_bytes {
            let (expected, actual) = (entry.file_bytes, file_len);
            return Err(StoreError::Truncated { name: name.to_owned(), path: path.clone(), expected, actual });
        }
        if file_len > entry.file_bytes {
            return Err(mismatch(format!("the file has {file_len} bytes, {} were written", entry.file_bytes)));
        }
        // SAFETY: the map is read-only and the file is private to this store: `put` created it
        // by rename and never modifies it in place (it only replaces it by another rename,
        // which leaves this inode intact, or deletes it). The documented contract of
        // `MappedTensor` is that no outside process truncates or rewrites it meanwhile. Every
        // read below is bounds-checked against `map.len()`.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| StoreError::Io {
            op: "memory-mapping",
            path: path.clone(),
            source,
        })?;

        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| bad_header(format!("safetensors header: {e}")))?;
        let info = metadata.info(TENSOR_KEY).ok_or_else(|| bad_header(format!("no tensor `{TENSOR_KEY}`")))?;
        let stored_checksum = metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get(CHECKSUM_KEY))
            .ok_or_else(|| bad_header(format!("no `{CHECKSUM_KEY}` in `__metadata__`")))?;
        if info.dtype != entry.dtype.safetensors() {
            return Err(mismatch(format!("dtype {} stored, file holds {}", entry.dtype, info.dtype)));
        }
        if info.shape != entry.shape {
            return Err(mismatch(format!("shape {:?} stored, file holds {:?}", entry.shape, info.shape)));
        }
        if *stored_checksum != format!("{:08x}", entry.checksum) {
            return Err(mismatch(format!(
                "payload CRC-32 {:08x} stored, file header says {stored_checksum:?}",
                entry.checksum
            )));
        }
        // `read_metadata` checked that the offsets lie within the file, after the header.
        let start = 8 + header_len;
        let payload = start + info.data_offsets.0..start + info.data_offsets.1;
        let bytes = map.get(payload.clone()).unwrap_or(&[]);
        let size = entry.dtype.size_bytes();
        let aligned = match size {
            2 => bytemuck::try_cast_slice::<u8, u16>(bytes).is_ok(),
            _ => bytemuck::try_cast_slice::<u8, u32>(bytes).is_ok(),
        };
        if bytes.len() as u64 != entry.payload_bytes || !aligned {
            return Err(bad_header(format!("payload {payload:?} is out of bounds or not {size}-byte aligned")));
        }
        let actual = crc32fast::hash(bytes);
        if actual != entry.checksum {
            let expected = entry.checksum;
            return Err(StoreError::Corrupted { name: name.to_owned(), path: path.clone(), expected, actual });
        }
        Ok(MappedTensor { map, info: entry.clone(), payload })
    }

    /// Removes a tensor and deletes its file. A file already deleted behind the store's back is
    /// not an error (the goal is reached). On an I/O error the entry is kept.
    pub fn remove(&mut self, name: &str) -> Result<DiskTensor, StoreError> {
        let entry = self.entries.get(name).ok_or_else(|| StoreError::UnknownTensor { name: name.to_owned() })?;
        match fs::remove_file(&entry.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(StoreError::Io { op: "removing", path: entry.path.clone(), source: e });
            }
            _ => {}
        }
        let entry = self.entries.remove(name).ok_or_else(|| StoreError::UnknownTensor { name: name.to_owned() })?;
        self.bytes_on_disk -= entry.file_bytes;
        Ok(entry)
    }
}

impl Drop for DiskStore {
    /// Removes every file the store wrote, and the directory if the store created it and it is
    /// now empty (best effort: errors are ignored, as nothing could report them).
    fn drop(&mut self) {
        let names: Vec<String> = self.entries.keys().cloned().collect();
        for name in names {
            let _ = self.remove(&name);
        }
        if self.created_dir && self.entries.is_empty() {
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

/// Writes one tensor as a safetensors file at `path`; returns the file's size.
fn write_file(path: &Path, dtype: DType, shape: &[usize], payload: &[u8], checksum: u32) -> Result<u64, StoreError> {
    let io_error = |source| StoreError::Io { op: "writing", path: path.to_path_buf(), source };
    let as_io = |e: SafeTensorError| match e {
        SafeTensorError::IoError(e) => e,
        other => io::Error::other(other),
    };
    let view = safetensors::tensor::TensorView::new(dtype.safetensors(), shape.to_vec(), payload)
        .map_err(|e| io_error(as_io(e)))?;
    let metadata = HashMap::from([(CHECKSUM_KEY.to_owned(), format!("{checksum:08x}"))]);
    safetensors::serialize_to_file([(TENSOR_KEY, view)], Some(metadata), path).map_err(|e| io_error(as_io(e)))?;
    fs::metadata(path).map(|m| m.len()).map_err(io_error)
}
