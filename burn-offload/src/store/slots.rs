//! Scratch files for what the offloading runtime moves to disk while it generates: KV-cache
//! tensors written slot by slot ([`SlotFile`]) and parked activations ([`ScratchDir`]).
//!
//! Unlike weights ([`super::DiskStore`]), these are rewritten every step and never outlive the
//! run, so they carry no header or checksum (a checksum would have to be recomputed over the
//! whole tensor at every step): a [`SlotFile`] is a fixed-size file of raw slots, memory-mapped
//! read-write, and every file is removed when its owner is dropped. Sizes are checked on every
//! call, so a wrong-sized request is an error, never an out-of-bounds access.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::StoreError;

fn io_error(op: &'static str, path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io { op, path: path.to_path_buf(), source }
}

fn bad_size(path: &Path, what: String) -> StoreError {
    StoreError::InvalidShape { name: path.display().to_string(), shape: Vec::new(), reason: what }
}

/// A tensor of `rows × capacity` slots of `slot_bytes` bytes each, on disk (FlexGen's disk-resident
/// KV cache: `rows` = batch · heads, one slot per token). Writes touch only the slots of the
/// current step; reads return the slots in use.
#[derive(Debug)]
pub struct SlotFile {
    path: PathBuf,
    map: MmapMut,
    rows: usize,
    capacity: usize,
    slot_bytes: usize,
}

impl SlotFile {
    /// Creates (or truncates) the file at `path`, zero-filled.
    pub fn create(
        path: impl Into<PathBuf>,
        rows: usize,
        capacity: usize,
        slot_bytes: usize,
    ) -> Result<Self, StoreError> {
        let path = path.into();
        let len =
            rows.checked_mul(capacity).and_then(|n| n.checked_mul(slot_bytes)).filter(|&n| n > 0).ok_or_else(|| {
                bad_size(&path, format!("{rows} rows × {capacity} slots × {slot_bytes} bytes is empty or too large"))
            })?;
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_error("creating", &path, e))?;
        file.set_len(len as u64).map_err(|e| io_error("sizing", &path, e))?;
        // SAFETY: the file was just created by this process and is only accessed through this
        // map; another process truncating it would be outside the store's contract (as for any
        // memory map), and every access below stays within `len`.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| io_error("mapping", &path, e))?;
        Ok(Self { path, map, rows, capacity, slot_bytes })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the file.
    pub fn len_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// Writes slots `start..start + count` of every row from `bytes`, laid out
    /// `[rows, count, slot_bytes]`.
    pub fn write(&mut self, start: usize, bytes: &[u8]) -> Result<(), StoreError> {
        let step = self.rows * self.slot_bytes;
        if !bytes.len().is_multiple_of(step) {
            return Err(bad_size(
                &self.path,
                format!("{} bytes are not whole slots of {} rows", bytes.len(), self.rows),
            ));
        }
        let count = bytes.len() / step;
        if start + count > self.capacity {
            return Err(bad_size(
                &self.path,
                format!("slots {start}..{} past the capacity {}", start + count, self.capacity),
            ));
        }
        if count == 0 {
            return Ok(());
        }
        let (stride, chunk) = (self.capacity * self.slot_bytes, count * self.slot_bytes);
        for (r, src) in bytes.chunks_exact(chunk).enumerate() {
            let at = r * stride + start * self.slot_bytes;
            self.map[at..at + chunk].copy_from_slice(src);
        }
        Ok(())
    }

    /// The whole tensor, `[rows, capacity, slot_bytes]`, with slots `0..used` read from the file
    /// and the rest zero.
    pub fn read(&self, used: usize) -> Result<Vec<u8>, StoreError> {
        if used > self.capacity {
            return Err(bad_size(&self.path, format!("{used} slots read from a capacity of {}", self.capacity)));
        }
        let stride = self.capacity * self.slot_bytes;
        let mut out = vec![0u8; self.rows * stride];
        let chunk = used * self.slot_bytes;
        for r in 0..self.rows {
            out[r * stride..r * stride + chunk].copy_from_slice(&self.map[r * stride..r * stride + chunk]);
        }
        Ok(out)
    }
}

impl Drop for SlotFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A directory of scratch files, created for one generation and removed with everything in it
/// when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    dir: PathBuf,
}

impl ScratchDir {
    /// Creates `parent/name-<pid>-<n>` (unique within the process).
    pub fn create(parent: &Path, name: &str) -> Result<Self, StoreError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("{name}-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| io_error("creating scratch directory", &dir, e))?;
        Ok(Self { dir })
    }

    /// Path of the scratch file `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `bytes` as the file `name`, replacing it.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(name);
        fs::write(&path, bytes).map_err(|e| io_error("writing", &path, e))
    }

    /// Reads the file `name`, which must hold exactly `len` bytes.
    pub fn read(&self, name: &str, len: usize) -> Result<Vec<u8>, StoreError> {
        let path = self.path(name);
        let bytes = fs::read(&path).map_err(|e| io_error("reading", &path, e))?;
        if bytes.len() != len {
            return Err(StoreError::Truncated {
                name: name.to_string(),
                path,
                expected: len as u64,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
