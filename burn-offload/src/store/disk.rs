//! The disk tier: one checksummed file per tensor, memory-mapped on read.
//!
//! See the [module docs](super) for the file format.
//!
//! # Writing
//!
//! [`DiskStore::put`] computes the payload CRC-32 (one in-memory pass; `crc32fast` uses
//! PCLMULQDQ / ARM CRC instructions, typically well above 10 GB/s, so it costs less than the
//! write itself), writes header + payload to a fresh temp file (`.<file>.tmp-<pid>-<n>`, created
//! with `create_new`) in the same directory, then renames it over the real name. A crash never
//! leaves a half-written tensor under the real name: either the old file or the new one is there,
//! and stray temp files are ignored. A `put` of an existing name replaces it atomically; a
//! [`MappedTensor`] of the old version stays valid on Unix (it maps the old inode).
//!
//! **No fsync by default.** Offload files are scratch data: they are useless after the process
//! exits (the name → file map lives in memory), so durability buys nothing and `fsync` of
//! hundreds of MiB per layer would stall the I/O thread for the device's full write-back time.
//! If a power loss ever left a renamed file with missing data, reading it fails with
//! [`StoreError::Truncated`] / [`StoreError::Corrupted`] rather than returning garbage. Set
//! [`DiskStoreOptions::fsync`] to `fsync` the file before and the directory after the rename.
//!
//! # Reading
//!
//! [`DiskStore::get`] maps the file read-only, validates the header against itself, against the
//! file length and against what `put` recorded, and verifies the payload CRC-32. The CRC pass
//! reads every payload page once (faulting it in from disk if it is not in the page cache); as
//! the caller is about to copy the whole tensor to the GPU anyway, this mostly moves the I/O
//! earlier, and on a page-cache hit it costs roughly one extra memory-bandwidth pass.
//! [`DiskStore::get_unverified`] skips only that pass (header, lengths and the recorded
//! shape/dtype/checksum are still validated; bounds are always safe); the caller can run
//! [`MappedTensor::verify_checksum`] later, e.g. on a background thread.
//!
//! # Names
//!
//! Tensor names are arbitrary non-empty UTF-8. The file name is
//! `<fnv1a64(name) as 16 hex digits>-<escaped name prefix>.bot`: bytes outside `[A-Za-z0-9._-]`
//! become `%XX` (so `/`, `\`, NUL, `..`-components and unicode cannot escape the directory or
//! form special names), the prefix is cut at 96 bytes (names of any length work), and the hash
//! prefix keeps file names distinct (also on case-insensitive file systems; a collision is
//! detected and reported, never silently overwritten) and avoids reserved names like `CON`.
//!
//! # One store per directory
//!
//! The store only knows about files it wrote in this process. Two live stores on the same
//! directory that write the same tensor name would replace each other's files; give each its
//! own directory. Files left behind by an earlier run are overwritten on `put` and otherwise
//! ignored.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;

use super::StoreError;

/// Magic bytes at the start of every tensor file.
pub const MAGIC: [u8; 8] = *b"BOFFTNSR";
/// Tensor file format version written and accepted.
pub const FORMAT_VERSION: u16 = 1;
/// Largest supported rank (number of dimensions).
pub const MAX_RANK: usize = 16;
/// Extension of tensor files (`.bot`, "burn-offload tensor").
pub const FILE_EXTENSION: &str = "bot";

/// Bytes before the dims: magic, version, dtype, byte order, rank, payload length.
const FIXED_LEN: usize = 24;
/// Longest escaped tensor-name part of a file name.
const MAX_NAME_PREFIX: usize = 96;
const BYTE_ORDER_LITTLE: u8 = 1;
const BYTE_ORDER_BIG: u8 = 2;
#[cfg(target_endian = "little")]
const NATIVE_BYTE_ORDER: u8 = BYTE_ORDER_LITTLE;
#[cfg(target_endian = "big")]
const NATIVE_BYTE_ORDER: u8 = BYTE_ORDER_BIG;

/// Unique suffix for temp files within this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Header length for a given rank: fixed part, dims, payload CRC, header CRC.
fn header_len(rank: usize) -> usize {
    FIXED_LEN + 8 * rank + 8
}

/// Element type of a stored tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 32-bit unsigned integer (token ids, packed quantized weights, …).
    U32,
}

impl DType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        4
    }

    /// The code stored in the file header.
    fn code(self) -> u8 {
        match self {
            DType::F32 => 1,
            DType::U32 => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(DType::F32),
            2 => Some(DType::U32),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::U32 => "u32",
        })
    }
}

/// Borrowed element data of a host tensor.
#[derive(Debug, Clone, Copy)]
pub enum HostValues<'a> {
    /// f32 values, row-major.
    F32(&'a [f32]),
    /// u32 values, row-major.
    U32(&'a [u32]),
}

/// A host tensor to write: borrowed values plus shape (row-major, product of `shape` = number of
/// values; the empty shape is a scalar with one value). Borrowed so `put` needs no copy.
#[derive(Debug, Clone, Copy)]
pub struct HostData<'a> {
    /// Dimensions.
    pub shape: &'a [usize],
    /// Values.
    pub values: HostValues<'a>,
}

impl<'a> HostData<'a> {
    /// An f32 tensor.
    pub fn f32(shape: &'a [usize], values: &'a [f32]) -> Self {
        Self { shape, values: HostValues::F32(values) }
    }

    /// A u32 tensor.
    pub fn u32(shape: &'a [usize], values: &'a [u32]) -> Self {
        Self { shape, values: HostValues::U32(values) }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self.values {
            HostValues::F32(_) => DType::F32,
            HostValues::U32(_) => DType::U32,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self.values {
            HostValues::F32(v) => v.len(),
            HostValues::U32(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as raw native-endian bytes (no copy).
    fn bytes(&self) -> &'a [u8] {
        match self.values {
            HostValues::F32(v) => bytemuck::cast_slice(v),
            HostValues::U32(v) => bytemuck::cast_slice(v),
        }
    }
}

/// What [`DiskStore`] does with its files when dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cleanup {
    /// Delete the files this store wrote (and the directory, if this store created it and it
    /// is then empty). The default: offload files are scratch data.
    #[default]
    RemoveFiles,
    /// Leave everything on disk (for inspection).
    Keep,
}

/// Options of [`DiskStore::open_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskStoreOptions {
    /// What happens to the files on drop / [`DiskStore::close`].
    pub cleanup: Cleanup,
    /// `fsync` each file before its rename and the directory after it. Off by default (see the
    /// [module docs](self): offload files need atomicity, not durability).
    pub fsync: bool,
}

/// Metadata of a tensor written by [`DiskStore::put`]; what `get` validates the file against.
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
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Payload bytes (elements × 4).
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }
    /// File size: header + payload.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }
    /// CRC-32 of the payload.
    pub fn checksum(&self) -> u32 {
        self.checksum
    }
}

/// Typed view of a mapped payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorView<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// u32 values.
    U32(&'a [u32]),
}

/// A validated, memory-mapped tensor file. Owns its map: independent of the [`DiskStore`]'s
/// lifetime, `Send + Sync`, and on Unix still readable after the file is removed or replaced.
///
/// Like every memory map, it assumes nobody else truncates or rewrites the file in place while
/// it is alive (the store never does: it only replaces files by rename and deletes them); an
/// outside process doing so could make reads fault (SIGBUS) or change the viewed values.
///
/// Its name, path, type, shape and checksum are those of the [`DiskTensor`] it dereferences to
/// (the file was checked to match them).
pub struct MappedTensor {
    map: Mmap,
    info: DiskTensor,
    /// Payload offset in `map`; `offset <= map.len()`, `map.len() - offset` is a multiple of 4
    /// and `map[offset..]` is 4-byte aligned (all checked in `DiskStore::get`).
    offset: usize,
}

impl fmt::Debug for MappedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedTensor").field("info", &self.info).field("mapped_payload_bytes", &self.payload().len()).finish()
    }
}

impl std::ops::Deref for MappedTensor {
    type Target = DiskTensor;

    fn deref(&self) -> &DiskTensor {
        &self.info
    }
}

impl MappedTensor {
    /// Raw payload bytes (native byte order).
    pub fn bytes(&self) -> &[u8] {
        self.payload()
    }

    fn payload(&self) -> &[u8] {
        self.map.get(self.offset..).unwrap_or(&[])
    }

    /// The values as f32, or `None` if the tensor is u32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.view() {
            TensorView::F32(v) => Some(v),
            TensorView::U32(_) => None,
        }
    }

    /// The values as u32, or `None` if the tensor is f32.
    pub fn as_u32(&self) -> Option<&[u32]> {
        match self.view() {
            TensorView::U32(v) => Some(v),
            TensorView::F32(_) => None,
        }
    }

    /// Typed view of the values.
    pub fn view(&self) -> TensorView<'_> {
        // Alignment and length were checked in `get`, so the casts cannot fail; the fallback to
        // an empty slice only keeps this panic-free.
        let bytes = self.payload();
        match self.dtype {
            DType::F32 => TensorView::F32(bytemuck::try_cast_slice(bytes).unwrap_or(&[])),
            DType::U32 => TensorView::U32(bytemuck::try_cast_slice(bytes).unwrap_or(&[])),
        }
    }

    /// Recompute the payload CRC-32 and compare it with the header's (what [`DiskStore::get`]
    /// does; for tensors obtained with [`DiskStore::get_unverified`]).
    pub fn verify_checksum(&self) -> Result<(), StoreError> {
        let actual = crc32fast::hash(self.payload());
        if actual == self.checksum {
            Ok(())
        } else {
            Err(StoreError::Corrupted {
                name: self.name.clone(),
                path: self.path.clone(),
                expected: self.checksum,
                actual,
            })
        }
    }
}

/// The disk tier: one file per tensor under a directory. See the [module docs](self).
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    options: DiskStoreOptions,
    /// Whether `open` created `dir` (then cleanup removes it if empty).
    created_dir: bool,
    entries: HashMap<String, DiskTensor>,
    /// Lower-cased file name → tensor name, to detect (case-insensitive) file-name collisions.
    files: HashMap<String, String>,
    bytes_on_disk: u64,
}

impl DiskStore {
    /// Open a store on `dir` (created if missing) with default options: files are removed on
    /// drop, no fsync.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(dir, DiskStoreOptions::default())
    }

    /// Open a store on `dir` (created if missing) with explicit options.
    pub fn open_with(dir: impl AsRef<Path>, options: DiskStoreOptions) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let created_dir = !dir.exists();
        fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            op: "creating offload directory",
            path: dir.clone(),
            source,
        })?;
        if !dir.is_dir() {
            return Err(StoreError::Io {
                op: "opening offload directory",
                path: dir,
                source: io::Error::other("not a directory"),
            });
        }
        Ok(Self { dir, options, created_dir, entries: HashMap::new(), files: HashMap::new(), bytes_on_disk: 0 })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options the store was opened with.
    pub fn options(&self) -> DiskStoreOptions {
        self.options
    }

    /// Number of stored tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no tensor is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a tensor of this name is stored.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Metadata recorded by `put` for `name`.
    pub fn entry(&self, name: &str) -> Option<&DiskTensor> {
        self.entries.get(name)
    }

    /// Names of the stored tensors (arbitrary order).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Total size of the stored files (headers + payloads), as recorded by `put`.
    pub fn bytes_on_disk(&self) -> u64 {
        self.bytes_on_disk
    }

    /// The file path `name` is (or would be) stored at.
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.dir.join(file_name_for(name))
    }

    /// Write a tensor, replacing any tensor of the same name. Atomic: on error the previous
    /// version (if any) is untouched and no partial file is left under the real name.
    pub fn put(&mut self, name: &str, data: HostData<'_>) -> Result<DiskTensor, StoreError> {
        if name.is_empty() {
            return Err(StoreError::InvalidName { name: name.to_owned(), reason: "names must not be empty" });
        }
        let shape = data.shape;
        let invalid =
            |reason: String| StoreError::InvalidShape { name: name.to_owned(), shape: shape.to_vec(), reason };
        if shape.len() > MAX_RANK {
            return Err(invalid(format!("rank {} exceeds the maximum of {MAX_RANK}", shape.len())));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| invalid("the element count overflows usize".into()))?;
        if numel != data.len() {
            return Err(invalid(format!("{numel} elements expected, {} values given", data.len())));
        }
        let payload = data.bytes();
        let dtype = data.dtype();

        let file_name = file_name_for(name);
        let key = file_name.to_ascii_lowercase();
        let path = self.dir.join(&file_name);
        if let Some(other) = self.files.get(&key).filter(|other| other.as_str() != name) {
            return Err(StoreError::NameCollision { name: name.to_owned(), other: other.clone(), path });
        }

        let checksum = crc32fast::hash(payload);
        let header = encode_header(dtype, shape, payload.len() as u64, checksum);
        let tmp = self.dir.join(format!(
            ".{file_name}.tmp-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = write_file(&tmp, &header, payload, self.options.fsync) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        if let Err(source) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(StoreError::Io { op: "renaming temp file to", path, source });
        }
        if self.options.fsync {
            sync_dir(&self.dir)?;
        }

        let tensor = DiskTensor {
            name: name.to_owned(),
            path,
            dtype,
            shape: shape.to_vec(),
            payload_bytes: payload.len() as u64,
            file_bytes: (header.len() + payload.len()) as u64,
            checksum,
        };
        if let Some(old) = self.entries.insert(name.to_owned(), tensor.clone()) {
            self.bytes_on_disk -= old.file_bytes;
        }
        self.bytes_on_disk += tensor.file_bytes;
        self.files.insert(key, name.to_owned());
        Ok(tensor)
    }

    /// Map, validate and checksum a stored tensor.
    pub fn get(&self, name: &str) -> Result<MappedTensor, StoreError> {
        self.get_impl(name, true)
    }

    /// Like [`get`](Self::get) but without the payload CRC pass (header, file length and the
    /// recorded dtype/shape/checksum are still validated, so views are always in bounds).
    pub fn get_unverified(&self, name: &str) -> Result<MappedTensor, StoreError> {
        self.get_impl(name, false)
    }

    fn get_impl(&self, name: &str, verify: bool) -> Result<MappedTensor, StoreError> {
        let entry = self.entries.get(name).ok_or_else(|| StoreError::UnknownTensor { name: name.to_owned() })?;
        let path = &entry.path;
        let file = File::open(path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                StoreError::Missing { name: name.to_owned(), path: path.clone() }
            } else {
                StoreError::Io { op: "opening", path: path.clone(), source }
            }
        })?;
        let file_len = file
            .metadata()
            .map_err(|source| StoreError::Io { op: "reading metadata of", path: path.clone(), source })?
            .len();
        if file_len < FIXED_LEN as u64 {
            return Err(StoreError::Truncated {
                name: name.to_owned(),
                path: path.clone(),
                expected: FIXED_LEN as u64,
                actual: file_len,
            });
        }
        // SAFETY: the map is read-only and the file is private to this store: it was created
        // by `put` via rename and is never modified in place (only replaced by another rename,
        // which leaves this inode intact, or deleted). The documented contract of
        // `MappedTensor` is that no outside process truncates or rewrites it meanwhile. All
        // reads below are bounds-checked against `map.len()`, never against `file_len`.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| StoreError::Io {
            op: "memory-mapping",
            path: path.clone(),
            source,
        })?;

        let header = parse_header(&map).map_err(|e| e.into_store_error(name, path))?;
        let mismatch = |reason: String| StoreError::Mismatch { name: name.to_owned(), path: path.clone(), reason };
        if header.dtype != entry.dtype {
            return Err(mismatch(format!("dtype {} stored, file holds {}", entry.dtype, header.dtype)));
        }
        if header.shape != entry.shape {
            return Err(mismatch(format!("shape {:?} stored, file holds {:?}", entry.shape, header.shape)));
        }
        if header.checksum != entry.checksum {
            return Err(mismatch(format!(
                "payload CRC-32 {:08x} stored, file header says {:08x}",
                entry.checksum, header.checksum
            )));
        }
        let payload = map.get(header.offset..).unwrap_or(&[]);
        if bytemuck::try_cast_slice::<u8, u32>(payload).is_err() {
            return Err(StoreError::BadHeader {
                name: name.to_owned(),
                path: path.clone(),
                reason: "payload is not 4-byte aligned in memory".into(),
            });
        }
        let tensor = MappedTensor { map, info: entry.clone(), offset: header.offset };
        if verify {
            tensor.verify_checksum()?;
        }
        Ok(tensor)
    }

    /// Remove a tensor and delete its file. A file already deleted behind the store's back is
    /// not an error (the goal is reached). On an I/O error the entry is kept.
    pub fn remove(&mut self, name: &str) -> Result<DiskTensor, StoreError> {
        let path = match self.entries.get(name) {
            Some(entry) => entry.path.clone(),
            None => return Err(StoreError::UnknownTensor { name: name.to_owned() }),
        };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(StoreError::Io { op: "removing", path, source }),
        }
        let Some(entry) = self.entries.remove(name) else {
            return Err(StoreError::UnknownTensor { name: name.to_owned() });
        };
        self.bytes_on_disk -= entry.file_bytes;
        if let Some(file_name) = entry.path.file_name().and_then(|f| f.to_str()) {
            self.files.remove(&file_name.to_ascii_lowercase());
        }
        Ok(entry)
    }

    /// Apply the cleanup policy now and report errors (drop does the same, silently).
    pub fn close(mut self) -> Result<(), StoreError> {
        let result = self.cleanup();
        // Nothing left to do on drop.
        self.options.cleanup = Cleanup::Keep;
        result
    }

    /// Remove all files (if the policy says so); returns the first error, tries everything.
    fn cleanup(&mut self) -> Result<(), StoreError> {
        if self.options.cleanup == Cleanup::Keep {
            return Ok(());
        }
        let mut first_error = None;
        let names: Vec<String> = self.entries.keys().cloned().collect();
        for name in names {
            if let Err(e) = self.remove(&name) {
                first_error.get_or_insert(e);
            }
        }
        if self.created_dir && self.entries.is_empty() {
            // Fails (harmlessly) if someone else put files there.
            let _ = fs::remove_dir(&self.dir);
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        let _ = self.cleanup();
    }
}

/// 64-bit FNV-1a: stable across Rust versions and platforms (unlike `DefaultHasher`).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Safe file name for a tensor name: `<hash>-<escaped prefix>.bot` (see the module docs).
fn file_name_for(name: &str) -> String {
    use fmt::Write as _;
    let mut prefix = String::new();
    for b in name.bytes() {
        let keep = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.');
        let piece = if keep { 1 } else { 3 };
        if prefix.len() + piece > MAX_NAME_PREFIX {
            break;
        }
        if keep {
            prefix.push(char::from(b));
        } else {
            let _ = write!(prefix, "%{b:02X}");
        }
    }
    format!("{:016x}-{prefix}.{FILE_EXTENSION}", fnv1a64(name.as_bytes()))
}

fn encode_header(dtype: DType, shape: &[usize], payload_len: u64, checksum: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(header_len(shape.len()));
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.push(dtype.code());
    h.push(NATIVE_BYTE_ORDER);
    h.extend_from_slice(&(shape.len() as u32).to_le_bytes());
    h.extend_from_slice(&payload_len.to_le_bytes());
    for &d in shape {
        h.extend_from_slice(&(d as u64).to_le_bytes());
    }
    h.extend_from_slice(&checksum.to_le_bytes());
    let header_crc = crc32fast::hash(&h);
    h.extend_from_slice(&header_crc.to_le_bytes());
    debug_assert_eq!(h.len(), header_len(shape.len()));
    h
}

fn write_file(tmp: &Path, header: &[u8], payload: &[u8], fsync: bool) -> Result<(), StoreError> {
    let io_err = |op, source| StoreError::Io { op, path: tmp.to_path_buf(), source };
    let mut file =
        OpenOptions::new().write(true).create_new(true).open(tmp).map_err(|e| io_err("creating temp file", e))?;
    file.write_all(header).map_err(|e| io_err("writing", e))?;
    file.write_all(payload).map_err(|e| io_err("writing", e))?;
    if fsync {
        file.sync_all().map_err(|e| io_err("syncing", e))?;
    }
    Ok(())
}

/// Make a rename durable (Unix); a no-op elsewhere (Windows cannot open directories as files).
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|d| d.sync_all()).map_err(|source| StoreError::Io {
            op: "syncing directory",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// A parsed, self-consistent header.
#[derive(Debug)]
struct Header {
    dtype: DType,
    shape: Vec<usize>,
    checksum: u32,
    /// Payload offset (= header length).
    offset: usize,
}

/// Header problems, before a name and path are attached.
#[derive(Debug)]
enum HeaderError {
    Truncated { expected: u64, actual: u64 },
    Bad(String),
}

impl HeaderError {
    fn into_store_error(self, name: &str, path: &Path) -> StoreError {
        match self {
            HeaderError::Truncated { expected, actual } => {
                StoreError::Truncated { name: name.to_owned(), path: path.to_path_buf(), expected, actual }
            }
            HeaderError::Bad(reason) => {
                StoreError::BadHeader { name: name.to_owned(), path: path.to_path_buf(), reason }
            }
        }
    }
}

fn read_array<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}
fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    read_array(bytes, at).map(u16::from_le_bytes)
}
fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    read_array(bytes, at).map(u32::from_le_bytes)
}
fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    read_array(bytes, at).map(u64::from_le_bytes)
}

/// Validate a whole tensor file (`bytes` = the full map) except the payload checksum.
fn parse_header(bytes: &[u8]) -> Result<Header, HeaderError> {
    let actual = bytes.len() as u64;
    let short = |expected: usize| HeaderError::Truncated { expected: expected as u64, actual };
    if bytes.len() < FIXED_LEN {
        return Err(short(FIXED_LEN));
    }
    let magic: [u8; 8] = read_array(bytes, 0).ok_or_else(|| short(FIXED_LEN))?;
    if magic != MAGIC {
        return Err(HeaderError::Bad(format!("magic {magic:02x?} is not {MAGIC:02x?} (not a tensor file)")));
    }
    let version = read_u16(bytes, 8).ok_or_else(|| short(FIXED_LEN))?;
    if version != FORMAT_VERSION {
        return Err(HeaderError::Bad(format!("format version {version}, expected {FORMAT_VERSION}")));
    }
    let rank = read_u32(bytes, 12).ok_or_else(|| short(FIXED_LEN))?;
    if rank as usize > MAX_RANK {
        return Err(HeaderError::Bad(format!("rank {rank} exceeds the maximum of {MAX_RANK}")));
    }
    let rank = rank as usize;
    let hlen = header_len(rank);
    if bytes.len() < hlen {
        return Err(short(hlen));
    }
    let stored_header_crc = read_u32(bytes, hlen - 4).ok_or_else(|| short(hlen))?;
    let header_crc = crc32fast::hash(bytes.get(..hlen - 4).ok_or_else(|| short(hlen))?);
    if header_crc != stored_header_crc {
        return Err(HeaderError::Bad(format!(
            "header CRC-32 is {header_crc:08x}, header says {stored_header_crc:08x}"
        )));
    }
    // From here on the header bytes are as written (up to a 2^-32 CRC miss); the checks below
    // still guard every value used for indexing.
    let dtype_code = bytes.get(10).copied().ok_or_else(|| short(hlen))?;
    let dtype =
        DType::from_code(dtype_code).ok_or_else(|| HeaderError::Bad(format!("unknown dtype code {dtype_code}")))?;
    let order = bytes.get(11).copied().ok_or_else(|| short(hlen))?;
    if order != NATIVE_BYTE_ORDER {
        return Err(HeaderError::Bad(match order {
            BYTE_ORDER_LITTLE | BYTE_ORDER_BIG => "payload byte order differs from this machine's".into(),
            other => format!("unknown byte-order code {other}"),
        }));
    }
    let payload_len = read_u64(bytes, 16).ok_or_else(|| short(hlen))?;
    let mut shape = Vec::with_capacity(rank);
    let mut numel = 1u64;
    for i in 0..rank {
        let d = read_u64(bytes, FIXED_LEN + 8 * i).ok_or_else(|| short(hlen))?;
        let d_usize = usize::try_from(d).map_err(|_| HeaderError::Bad(format!("dimension {d} does not fit usize")))?;
        numel = numel.checked_mul(d).ok_or_else(|| HeaderError::Bad("the element count overflows".into()))?;
        shape.push(d_usize);
    }
    let expected_len = numel
        .checked_mul(dtype.size_of() as u64)
        .ok_or_else(|| HeaderError::Bad("the payload size overflows".into()))?;
    if payload_len != expected_len {
        return Err(HeaderError::Bad(format!(
            "payload length {payload_len} does not match shape {shape:?} of {dtype} ({expected_len} bytes)"
        )));
    }
    let total =
        (hlen as u64).checked_add(payload_len).ok_or_else(|| HeaderError::Bad("the file size overflows".into()))?;
    if actual < total {
        return Err(HeaderError::Truncated { expected: total, actual });
    }
    if actual > total {
        return Err(HeaderError::Bad(format!("{} trailing bytes after the payload", actual - total)));
    }
    let checksum = read_u32(bytes, hlen - 8).ok_or_else(|| short(hlen))?;
    Ok(Header { dtype, shape, checksum, offset: hlen })
}
