//! Tests of the disk tier and the memory ledger.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{SystemTime, UNIX_EPOCH};

use super::*;

/// A unique directory under `std::env::temp_dir()`, removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "burn-offload-store-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// A not-yet-existing subdirectory (so the store creates it).
    fn sub(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn f32_data(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 3.25).collect()
}

fn u32_data(n: usize) -> Vec<u32> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect()
}

/// Stores a small f32 tensor and returns (store, its file path, its full bytes).
fn small_store(dir: &TestDir) -> (DiskStore, PathBuf, Vec<u8>) {
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    let values = f32_data(6);
    let t = store.put("blk.0.w", HostData::f32(&[2, 3], &values)).unwrap();
    let bytes = fs::read(t.path()).unwrap();
    (store, t.path().to_path_buf(), bytes)
}

/// Bytes before the payload of a tensor file: the 8-byte header length, then the header.
fn header_len(file: &[u8]) -> usize {
    8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize
}

#[test]
fn round_trip_both_dtypes_and_shapes() {
    let dir = TestDir::new("roundtrip");
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    let shapes: &[&[usize]] = &[&[], &[0], &[1], &[7], &[2, 3], &[3, 0, 5], &[2, 3, 4, 5], &[1; 20], &[4096, 33]];
    for (i, shape) in shapes.iter().enumerate() {
        let n: usize = shape.iter().product();
        let fv = f32_data(n);
        let uv = u32_data(n);
        let ft = store.put(&format!("f{i}"), HostData::f32(shape, &fv)).unwrap();
        let ut = store.put(&format!("u{i}"), HostData::u32(shape, &uv)).unwrap();
        assert_eq!(ft.shape(), *shape);
        assert_eq!(ft.payload_bytes(), 4 * n as u64);
        assert_eq!(ft.file_bytes(), fs::metadata(ft.path()).unwrap().len());
        assert_eq!(ut.dtype(), DType::U32);

        let m = store.get(&format!("f{i}")).unwrap();
        assert_eq!((m.dtype(), m.shape()), (DType::F32, *shape));
        assert_eq!(m.as_f32().unwrap(), &fv[..]);
        assert_eq!(m.view(), TensorView::F32(&fv));
        let m = store.get(&format!("u{i}")).unwrap();
        assert_eq!(m.view(), TensorView::U32(&uv));
        assert!(m.as_f32().is_none());
    }
    // Special float values survive bit-exactly.
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE / 2.0];
    store.put("special", HostData::f32(&[5], &special)).unwrap();
    let m = store.get("special").unwrap();
    let got: Vec<u32> = m.as_f32().unwrap().iter().map(|x| x.to_bits()).collect();
    let want: Vec<u32> = special.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want);
}

/// 16-bit floats (`--dtype f16|bf16` weights and caches) keep their bits and take 2 bytes each,
/// odd element counts included; the file says which 16-bit type it holds.
#[test]
fn half_precision_round_trips_in_two_bytes() {
    let dir = TestDir::new("half");
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    let bits: Vec<u16> = (0..7u16).map(|i| i.wrapping_mul(0x3c01)).collect();
    for dtype in [DType::F16, DType::BF16] {
        let name = format!("{dtype}");
        let t = store.put(&name, HostData::half(&[7], dtype, &bits)).unwrap();
        assert_eq!((t.dtype(), t.payload_bytes()), (dtype, 14));
        let m = store.get(&name).unwrap();
        assert_eq!(m.view(), TensorView::Half(dtype, &bits));
        assert!(m.as_f32().is_none());
        let header = safetensors::SafeTensors::read_metadata(&fs::read(m.path()).unwrap()).unwrap().1;
        let want = if dtype == DType::F16 { safetensors::Dtype::F16 } else { safetensors::Dtype::BF16 };
        assert_eq!(header.info("tensor").unwrap().dtype, want);
    }
}

/// The files are plain safetensors: any reader sees the tensor and its CRC-32.
#[test]
fn files_are_safetensors_with_a_checksum() {
    let dir = TestDir::new("format");
    let (_store, path, bytes) = small_store(&dir);
    assert_eq!(path.extension().unwrap(), "safetensors");
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensor = file.tensor("tensor").unwrap();
    assert_eq!((tensor.dtype(), tensor.shape()), (safetensors::Dtype::F32, &[2, 3][..]));
    assert_eq!(tensor.data(), bytemuck::cast_slice::<f32, u8>(&f32_data(6)));
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let crc = metadata.metadata().as_ref().unwrap()["crc32"].clone();
    assert_eq!(crc, format!("{:08x}", crc32fast::hash(tensor.data())));
    assert_eq!(header_len(&bytes) % 8, 0, "the payload is 8-byte aligned");
}

#[test]
fn put_replaces_and_accounts_bytes() {
    let dir = TestDir::new("replace");
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    assert!(store.is_empty());
    let a = store.put("a", HostData::f32(&[4], &f32_data(4))).unwrap();
    let b = store.put("b", HostData::u32(&[2, 2], &u32_data(4))).unwrap();
    assert_eq!(store.bytes_on_disk(), a.file_bytes() + b.file_bytes());
    let a2 = store.put("a", HostData::u32(&[10], &u32_data(10))).unwrap();
    assert_eq!(store.len(), 2);
    assert_eq!(store.bytes_on_disk(), a2.file_bytes() + b.file_bytes());
    assert_eq!(store.get("a").unwrap().view(), TensorView::U32(&u32_data(10)));
    // Only the two tensor files: no temp files left behind.
    assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 2);

    let removed = store.remove("a").unwrap();
    assert_eq!(removed.name(), "a");
    assert!(!removed.path().exists());
    assert_eq!(store.bytes_on_disk(), b.file_bytes());
    assert!(matches!(store.get("a"), Err(StoreError::UnknownTensor { .. })));
    assert!(matches!(store.remove("a"), Err(StoreError::UnknownTensor { .. })));
    store.remove("b").unwrap();
    assert_eq!(store.bytes_on_disk(), 0);
}

#[test]
fn shape_errors() {
    let dir = TestDir::new("shape");
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    let v = f32_data(6);
    let e = store.put("x", HostData::f32(&[2, 2], &v)).unwrap_err();
    assert!(matches!(e, StoreError::InvalidShape { .. }), "{e}");
    assert!(e.to_string().contains("4 elements expected, 6 values given"), "{e}");
    let e = store.put("x", HostData::f32(&[usize::MAX, 2], &v)).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    assert!(store.is_empty());
    assert_eq!(fs::read_dir(store.dir()).unwrap().count(), 0);
}

#[test]
fn every_bit_flip_is_detected() {
    let dir = TestDir::new("bitflip");
    let (store, path, good) = small_store(&dir);
    let header_len = header_len(&good);
    assert_eq!(good.len(), header_len + 24);
    for pos in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[pos] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            match store.get("blk.0.w") {
                Ok(_) => panic!("byte {pos} bit {bit}: corrupted file accepted"),
                Err(e) if pos >= header_len => {
                    assert!(matches!(e, StoreError::Corrupted { .. }), "byte {pos} bit {bit}: {e}");
                    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
                }
                Err(e) => assert!(
                    matches!(e, StoreError::BadHeader { .. } | StoreError::Mismatch { .. }),
                    "byte {pos} bit {bit}: {e}"
                ),
            }
        }
    }
    fs::write(&path, &good).unwrap();
    assert_eq!(store.get("blk.0.w").unwrap().as_f32().unwrap(), &f32_data(6)[..]);
}

#[test]
fn every_truncation_and_extension_is_detected() {
    let dir = TestDir::new("truncate");
    let (store, path, good) = small_store(&dir);
    for len in 0..good.len() {
        fs::write(&path, &good[..len]).unwrap();
        let e = store.get("blk.0.w").unwrap_err();
        assert!(matches!(e, StoreError::Truncated { .. }), "len {len}: {e}");
    }
    fs::write(&path, &good[..30]).unwrap();
    let msg = store.get("blk.0.w").unwrap_err().to_string();
    let needs = format!("truncated: needs {} bytes, has 30", good.len());
    assert!(msg.contains(&needs) && msg.contains("blk.0.w"), "{msg}");
    let mut long = good.clone();
    long.push(0);
    fs::write(&path, &long).unwrap();
    let e = store.get("blk.0.w").unwrap_err();
    assert!(matches!(e, StoreError::Mismatch { .. }) && e.to_string().contains("were written"), "{e}");
}

#[test]
fn other_valid_file_is_a_mismatch() {
    let dir = TestDir::new("mismatch");
    let mut store = DiskStore::open(dir.sub("store")).unwrap();
    let a = store.put("a", HostData::f32(&[2, 3], &f32_data(6))).unwrap();
    let b = store.put("b", HostData::f32(&[3, 2], &f32_data(6))).unwrap();
    let c = store.put("c", HostData::u32(&[2, 3], &u32_data(6))).unwrap();
    let d = store.put("d", HostData::f32(&[2, 3], &f32_data(7)[1..])).unwrap();
    for (other, what) in [(&b, "shape"), (&c, "dtype"), (&d, "CRC")] {
        fs::copy(other.path(), a.path()).unwrap();
        let e = store.get("a").unwrap_err();
        assert!(matches!(e, StoreError::Mismatch { .. }) && e.to_string().contains(what), "{e}");
    }
    fs::write(a.path(), vec![b'x'; a.file_bytes() as usize]).unwrap();
    let e = store.get("a").unwrap_err();
    assert!(matches!(e, StoreError::BadHeader { .. }) && e.to_string().contains("not a valid tensor file"), "{e}");
}

#[test]
fn file_deleted_behind_the_stores_back() {
    let dir = TestDir::new("deleted");
    let (mut store, path, _) = small_store(&dir);
    let mapped = store.get("blk.0.w").unwrap();
    fs::remove_file(&path).unwrap();
    let e = store.get("blk.0.w").unwrap_err();
    assert!(matches!(e, StoreError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("missing") && e.to_string().contains("blk.0.w"), "{e}");
    // The existing map stays readable on Unix (it holds the inode).
    #[cfg(unix)]
    assert_eq!(mapped.as_f32().unwrap(), &f32_data(6)[..]);
    drop(mapped);
    // Removing an already-deleted file is fine.
    store.remove("blk.0.w").unwrap();
    assert!(store.is_empty());
}

/// Tensor names never reach the file system: any string is a name, and every file lands
/// directly in the store's directory.
#[test]
fn hostile_and_unusual_names_stay_inside_the_directory() {
    let dir = TestDir::new("names");
    let store_dir = dir.sub("store");
    let mut store = DiskStore::open(&store_dir).unwrap();
    let long = "x/".repeat(500);
    let names =
        ["", "..", "../escape", "/abs/path", "a\\b", "C:\\x", "CON", "名前.重み", "nul\0byte", "A", "a", long.as_str()];
    for (i, name) in names.iter().enumerate() {
        let t = store.put(name, HostData::u32(&[i + 1], &u32_data(i + 1))).unwrap();
        assert_eq!(t.path().parent().unwrap(), store_dir, "{name:?}");
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(store.get(name).unwrap().view(), TensorView::U32(&u32_data(i + 1)), "{name:?}");
    }
    assert_eq!(fs::read_dir(&store_dir).unwrap().count(), names.len());
    let siblings: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(siblings, vec![std::ffi::OsString::from("store")]);
}

/// Two stores on one directory keep apart, and dropping a store removes its files, and the
/// directory only if it created it.
#[test]
fn stores_share_a_directory_and_clean_up() {
    let dir = TestDir::new("cleanup");
    let created = dir.sub("created");
    {
        let mut store = DiskStore::open(&created).unwrap();
        store.put("a", HostData::f32(&[1], &[1.0])).unwrap();
    }
    assert!(!created.exists(), "dropping removes the files and the directory it created");

    let shared = dir.sub("shared");
    let foreign = shared.join("foreign.txt");
    let mut first = DiskStore::open(&shared).unwrap();
    fs::write(&foreign, b"x").unwrap();
    let mut second = DiskStore::open(&shared).unwrap();
    first.put("a", HostData::f32(&[1], &[1.0])).unwrap();
    let t = second.put("a", HostData::f32(&[1], &[2.0])).unwrap();
    assert_eq!(first.get("a").unwrap().as_f32().unwrap(), &[1.0]);
    drop(first);
    assert!(shared.exists() && foreign.exists(), "a directory with other files stays");
    assert_eq!(second.get("a").unwrap().as_f32().unwrap(), &[2.0]);
    drop(second);
    assert!(!t.path().exists() && foreign.exists());
}

#[test]
fn mapped_tensor_outlives_store_and_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MappedTensor>();
    assert_send_sync::<DiskStore>();
    let dir = TestDir::new("outlive");
    let mut store = DiskStore::open(dir.sub("s")).unwrap();
    store.put("t", HostData::f32(&[3], &[1.0, 2.0, 3.0])).unwrap();
    let m = store.get("t").unwrap();
    drop(store);
    let handle = std::thread::spawn(move || m.as_f32().unwrap().iter().sum::<f32>());
    assert_eq!(handle.join().unwrap(), 6.0);
}

// ---------------------------------------------------------------- ledger

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn fmt_bytes_units() {
    assert_eq!(fmt_bytes(0), "0 B");
    assert_eq!(fmt_bytes(1023), "1023 B");
    assert_eq!(fmt_bytes(1024), "1.0 KiB");
    assert_eq!(fmt_bytes(1536), "1.5 KiB");
    assert_eq!(fmt_bytes(180 * MIB), "180.0 MiB");
    assert_eq!(fmt_bytes(2 * GIB), "2.00 GiB");
    assert_eq!(fmt_bytes(GIB * 19 / 10), "1.90 GiB");
    assert_eq!(fmt_bytes(u64::MAX), "17179869184.00 GiB");
}

#[test]
fn reservations_within_and_over_capacity() {
    let ledger = MemoryLedger::new(Some(2 * GIB), Some(8 * GIB), None);
    let a = ledger.reserve(Tier::Gpu, GIB, "blk.0 weights").unwrap();
    let b = ledger.reserve(Tier::Gpu, GIB * 9 / 10, "blk.1 weights").unwrap();
    assert_eq!(ledger.in_use(Tier::Gpu), GIB * 19 / 10);
    assert_eq!(ledger.available(Tier::Gpu), Some(2 * GIB - GIB * 19 / 10));
    assert_eq!(ledger.available(Tier::Disk), None);
    assert_eq!((a.tier(), a.bytes()), (Tier::Gpu, GIB));

    let e = ledger.reserve(Tier::Gpu, 180 * MIB, "blk.3 weights").unwrap_err();
    assert_eq!(
        e.to_string(),
        "the GPU budget of 2.00 GiB cannot hold blk.3 weights (180.0 MiB): 1.90 GiB already in use; \
         raise --gpu-mem or offload more"
    );
    match &e {
        StoreError::OverBudget(o) => {
            assert_eq!((o.tier, o.needed, o.in_use, o.capacity), (Tier::Gpu, 180 * MIB, GIB * 19 / 10, Some(2 * GIB)))
        }
        other => panic!("{other}"),
    }
    // A failed reservation changes nothing.
    assert_eq!(ledger.in_use(Tier::Gpu), GIB * 19 / 10);
    // Exactly filling the capacity is fine; zero bytes always fit.
    let rest = ledger.reserve(Tier::Gpu, 2 * GIB - ledger.in_use(Tier::Gpu), "rest").unwrap();
    let _zero = ledger.reserve(Tier::Gpu, 0, "nothing").unwrap();
    assert!(ledger.reserve(Tier::Gpu, 1, "one byte").is_err());

    // Dropping releases; tiers are independent.
    drop(rest);
    b.release();
    assert_eq!(ledger.in_use(Tier::Gpu), GIB);
    let cpu = ledger.reserve(Tier::Cpu, 5 * GIB, "kv cache").unwrap();
    let e = ledger.reserve(Tier::Cpu, 4 * GIB, "kv cache").unwrap_err();
    assert!(e.to_string().contains("CPU budget of 8.00 GiB") && e.to_string().contains("--cpu-mem"), "{e}");
    drop(cpu);
    drop(a);
    assert_eq!(ledger.in_use(Tier::Gpu), 0);
    assert_eq!(ledger.in_use(Tier::Cpu), 0);
}

#[test]
fn unlimited_overflow_and_capacity_changes() {
    let ledger = MemoryLedger::default();
    let big = ledger.reserve(Tier::Disk, u64::MAX - 10, "everything").unwrap();
    let e = ledger.reserve(Tier::Disk, 11, "more").unwrap_err();
    assert!(e.to_string().contains("overflows") && e.to_string().contains("--disk-mem"), "{e}");
    drop(big);

    ledger.set_capacity(Tier::Gpu, Some(100));
    let r = ledger.reserve(Tier::Gpu, 80, "x").unwrap();
    ledger.set_capacity(Tier::Gpu, Some(50));
    assert_eq!(ledger.available(Tier::Gpu), Some(0));
    assert!(ledger.reserve(Tier::Gpu, 1, "y").is_err());
    drop(r);
    assert!(ledger.reserve(Tier::Gpu, 50, "z").is_ok());
    ledger.set_capacity(Tier::Gpu, None);
    assert_eq!(ledger.capacity(Tier::Gpu), None);
}

#[test]
fn peaks_track_and_reset() {
    let ledger = MemoryLedger::new(Some(1000), None, None);
    let a = ledger.reserve(Tier::Gpu, 300, "a").unwrap();
    let b = ledger.reserve(Tier::Gpu, 500, "b").unwrap();
    drop(b);
    let c = ledger.reserve(Tier::Gpu, 100, "c").unwrap();
    assert_eq!(ledger.in_use(Tier::Gpu), 400);
    assert_eq!(ledger.peak(Tier::Gpu), 800);
    assert_eq!(ledger.peak(Tier::Cpu), 0);
    ledger.reset_peaks();
    assert_eq!(ledger.peak(Tier::Gpu), 400);
    drop(a);
    assert_eq!(ledger.peak(Tier::Gpu), 400);
    drop(c);
    let s = ledger.to_string();
    assert!(s.starts_with("GPU 0 B / 1000 B (peak 400 B); CPU 0 B / unlimited"), "{s}");
}

#[test]
fn concurrent_reservations_never_exceed_capacity() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MemoryLedger>();
    assert_send_sync::<Reservation>();

    const CAPACITY: u64 = 10_000;
    let ledger = MemoryLedger::new(Some(CAPACITY), None, None);
    let barrier = Arc::new(Barrier::new(4));
    let successes = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (ledger, barrier) = (ledger.clone(), Arc::clone(&barrier));
            let (successes, failures) = (Arc::clone(&successes), Arc::clone(&failures));
            std::thread::spawn(move || {
                barrier.wait();
                // Deterministic per-thread pseudo-random sizes (xorshift).
                let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ (t + 1);
                let mut held = Vec::new();
                for _ in 0..20_000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let bytes = x % 3_000 + 1;
                    match ledger.reserve(Tier::Gpu, bytes, "stress") {
                        Ok(r) => {
                            successes.fetch_add(1, Ordering::Relaxed);
                            held.push(r);
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    assert!(ledger.in_use(Tier::Gpu) <= CAPACITY);
                    if !held.is_empty() && (x.is_multiple_of(3) || held.len() > 3) {
                        drop(held.swap_remove(0));
                    }
                    if x.is_multiple_of(97) {
                        held.clear();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ledger.in_use(Tier::Gpu), 0);
    assert!(ledger.peak(Tier::Gpu) <= CAPACITY);
    assert!(ledger.peak(Tier::Gpu) > CAPACITY / 2);
    assert!(successes.load(Ordering::Relaxed) > 1000);
    assert!(failures.load(Ordering::Relaxed) > 0, "the stress test should hit the capacity");
}

/// A slot file keeps what each step wrote at its slots, returns zeros past the slots in use,
/// refuses writes and reads outside its capacity, and disappears when dropped.
#[test]
fn slot_file_round_trip_and_bounds() {
    let dir = TestDir::new("slots");
    let (rows, capacity, slot) = (3, 5, 8);
    let path = dir.path().join("kv");
    let mut file = SlotFile::create(&path, rows, capacity, slot).unwrap();
    assert_eq!(file.len_bytes(), (rows * capacity * slot) as u64);
    // Step 1 writes slots 0..2 of every row, step 2 slot 2.
    let step = |start: usize, count: usize| -> Vec<u8> {
        (0..rows).flat_map(|r| (0..count * slot).map(move |i| (r * 50 + start * slot + i) as u8)).collect()
    };
    file.write(0, &step(0, 2)).unwrap();
    file.write(2, &step(2, 1)).unwrap();
    let read = file.read(3).unwrap();
    assert_eq!(read.len(), rows * capacity * slot);
    for r in 0..rows {
        let row = &read[r * capacity * slot..(r + 1) * capacity * slot];
        for (i, &b) in row.iter().enumerate() {
            let expected = if i < 3 * slot { (r * 50 + i) as u8 } else { 0 };
            assert_eq!(b, expected, "row {r}, byte {i}");
        }
    }
    // Only the slots in use are read.
    assert!(file.read(1).unwrap()[slot..2 * slot].iter().all(|&b| b == 0));
    assert!(file.write(4, &step(4, 2)).is_err(), "past the capacity");
    assert!(file.write(0, &[0u8; 7]).is_err(), "not whole slots");
    assert!(file.read(capacity + 1).is_err());
    assert!(SlotFile::create(dir.path().join("empty"), 0, capacity, slot).is_err());
    drop(file);
    assert!(!path.exists());

    let scratch = ScratchDir::create(dir.path(), "run").unwrap();
    scratch.write("a", &[1, 2, 3]).unwrap();
    assert_eq!(scratch.read("a", 3).unwrap(), vec![1, 2, 3]);
    assert!(matches!(scratch.read("a", 4), Err(StoreError::Truncated { .. })));
    let root = scratch.path("");
    drop(scratch);
    assert!(!root.exists());
}
