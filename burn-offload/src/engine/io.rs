//! The I/O side of the block schedule: tasks on their own threads (or deferred, without overlap),
//! the block's disk files, and the weight and KV-cache tasks of Algorithm 1 (`load_weight`,
//! `load_cache`, `store_cache`) with the jobs that carry their work from one step to the next.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{Scope, ScopedJoinHandle};

use burn::module::Module;
use burn::tensor::{DType, TensorData};
use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::LayerSlots;
use burn_llm_models::model::{DecoderLayer, Hidden};
use tracing::trace_span;

use super::parking::Parked;
use super::{LayerHome, OffloadEngine};
use crate::cache::OffloadKvCache;
use crate::cache::parts::{from_slot_data, part_shapes, slot_data};
use crate::error::{OffloadError, Result};
use crate::policy::Tier;
use crate::store::{Reservation, ScratchDir, SlotFile};
use crate::weights::read_layer;

/// A task of the block schedule: running on its own thread (overlap), or deferred until joined.
pub(super) enum Task<'scope, T> {
    Running(ScopedJoinHandle<'scope, Result<T>>),
    Deferred(Box<dyn FnOnce() -> Result<T> + Send + 'scope>),
}

impl<'scope, T: Send + 'scope> Task<'scope, T> {
    /// Starts `f` on a thread of `scope` when `overlap`, else keeps it for [`Task::join`].
    pub(super) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        overlap: bool,
        f: impl FnOnce() -> Result<T> + Send + 'scope,
    ) -> Self {
        if overlap { Task::Running(scope.spawn(f)) } else { Task::Deferred(Box::new(f)) }
    }

    /// The task's result: waits for its thread, or runs it now.
    pub(super) fn join(self) -> Result<T> {
        match self {
            Task::Running(handle) => {
                handle.join().unwrap_or_else(|_| Err(OffloadError::Internal("an offloading task panicked".into())))
            }
            Task::Deferred(f) => f(),
        }
    }
}

/// A layer ready to run on the device, with the budget it holds while loaded.
pub(super) struct Loaded {
    layer: DecoderLayer,
    _budget: Option<Reservation>,
}

/// The layer on the device and the next layer's load (FlexGen's weight prefetch).
pub(super) struct Weights<'scope> {
    current: Option<(usize, Loaded)>,
    next: Option<Task<'scope, Loaded>>,
}

impl<'scope> Weights<'scope> {
    /// Nothing on the device yet, `first` loading.
    pub(super) fn new(first: Task<'scope, Loaded>) -> Self {
        Self { current: None, next: Some(first) }
    }

    /// Layer `j` on the device. At its first step the previous layer leaves the device, `j`'s
    /// load is joined (or, deferred, runs now) and `prefetch` starts the next one's.
    pub(super) fn layer(
        &mut self,
        j: usize,
        prefetch: impl FnOnce() -> Option<Task<'scope, Loaded>>,
    ) -> Result<&DecoderLayer> {
        if self.current.as_ref().is_none_or(|(at, _)| *at != j) {
            let task = self.next.take().ok_or_else(|| OffloadError::Internal(format!("layer {j} was not loading")))?;
            drop(self.current.take());
            self.current = Some((j, task.join()?));
            self.next = prefetch();
        }
        match &self.current {
            Some((_, loaded)) => Ok(&loaded.layer),
            None => Err(OffloadError::Internal(format!("layer {j} not loaded"))),
        }
    }
}

/// The KV cache a `load_cache` task reads from disk.
pub(super) struct KvLoad {
    /// Slots written so far.
    used: usize,
    quant: Option<QuantSpec>,
    /// Host bytes the loaded layer takes.
    bytes: u64,
}

impl KvLoad {
    /// What loading a disk layer of `cache` before its next step reads.
    pub(super) fn of(cache: &OffloadKvCache) -> Self {
        Self { used: cache.steps().range().start, quant: cache.quantization(), bytes: cache.layer_bytes() as u64 }
    }
}

/// A disk layer's KV cache a `store_cache` task writes back: the layer's slots, the slots the
/// step wrote, and the host budget they held while loaded.
pub(super) struct KvStore {
    pub(super) slots: LayerSlots,
    pub(super) step: Range<usize>,
    pub(super) _budget: Option<Reservation>,
}

/// What the load tasks bring in for one (layer, batch) step.
pub(super) struct LoadJob {
    pub(super) layer: usize,
    pub(super) batch: usize,
    /// For `load_cache`: the KV cache, when on disk.
    pub(super) kv: Option<KvLoad>,
    /// For `load_hidden`: the activations, when parked off the device.
    pub(super) hidden: Option<Parked>,
}

/// What the store tasks take out after one (layer, batch) step.
pub(super) struct StoreJob {
    pub(super) layer: usize,
    pub(super) batch: usize,
    /// For `store_cache`: the KV cache, when on disk.
    pub(super) kv: Option<KvStore>,
    /// For `store_hidden`: the output activations and the tier they wait on.
    pub(super) hidden: Option<(Hidden, Tier)>,
}

/// A step's inputs, as its load tasks left them.
#[derive(Default)]
pub(super) struct Inputs {
    pub(super) kv: Option<(LayerSlots, Reservation)>,
    pub(super) hidden: Option<Hidden>,
}

/// The disk side of a block: KV-cache files per (layer, batch) and the scratch directory.
pub(super) struct BlockIo {
    scratch: Option<ScratchDir>,
    kv_files: HashMap<(usize, usize), Mutex<Vec<KvFile>>>,
    /// Largest activation file of each GPU batch.
    activation_bytes: Vec<AtomicU64>,
}

impl BlockIo {
    /// The I/O of a block of `batches` GPU batches, with a scratch directory when something of
    /// it goes to disk.
    pub(super) fn new(scratch: Option<ScratchDir>, batches: usize) -> Self {
        Self { scratch, kv_files: HashMap::new(), activation_bytes: (0..batches).map(|_| AtomicU64::new(0)).collect() }
    }

    pub(super) fn scratch(&self) -> Result<&ScratchDir> {
        self.scratch.as_ref().ok_or_else(|| {
            OffloadError::Internal("no scratch directory for a disk-resident cache or activations".into())
        })
    }

    /// Creates the files of layer `j` of GPU batch `k`'s cache, in [`part_shapes`] order.
    pub(super) fn add_kv_files(&mut self, cache: &OffloadKvCache, j: usize, k: usize) -> Result<()> {
        let layout = cache.layout();
        let rows = cache.steps().batch() * layout.num_kv_heads;
        let parts = part_shapes(layout, cache.quantization());
        let per_kv = parts.len() / 2;
        let scratch = self.scratch()?;
        let files = parts
            .into_iter()
            .enumerate()
            .map(|(i, (width, dtype))| {
                let path = scratch.path(&format!("kv-l{j}-b{k}-{}{}", ["k", "v"][i / per_kv], i % per_kv));
                Ok(KvFile {
                    file: SlotFile::create(path, rows, cache.steps().capacity(), width * dtype.size())?,
                    shape: [cache.steps().batch(), layout.num_kv_heads, cache.steps().capacity(), width],
                    dtype,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.kv_files.insert((j, k), Mutex::new(files));
        Ok(())
    }

    fn files(&self, layer: usize, batch: usize) -> Result<&Mutex<Vec<KvFile>>> {
        self.kv_files
            .get(&(layer, batch))
            .ok_or_else(|| OffloadError::Internal(format!("no disk KV cache for layer {layer}, GPU batch {batch}")))
    }

    /// Raises GPU batch `batch`'s largest activation file to `bytes`.
    pub(super) fn record_activation(&self, batch: usize, bytes: u64) {
        if let Some(peak) = self.activation_bytes.get(batch) {
            peak.fetch_max(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes the block's KV cache and activations took on disk.
    pub(super) fn disk_bytes(&self) -> u64 {
        let kv: u64 = self
            .kv_files
            .values()
            .flat_map(|f| f.lock().map(|f| f.iter().map(|f| f.file.len_bytes()).sum::<u64>()))
            .sum();
        kv + self.activation_bytes.iter().map(|b| b.load(Ordering::Relaxed)).sum::<u64>()
    }
}

/// One stored part of a layer's keys or values (float slots, or codes, scales, minimums).
struct KvFile {
    file: SlotFile,
    /// `[batch, kv_heads, capacity, width]`.
    shape: [usize; 4],
    dtype: DType,
}

fn poisoned() -> OffloadError {
    OffloadError::Internal("a KV-cache file lock was poisoned by a panicking task".into())
}

impl OffloadEngine {
    /// `load_weight(j)` as a task of the block schedule: layer `j` on the device, with the device
    /// budget it holds while loaded (a copy from the host, or a disk read, checksum and upload),
    /// in the I/O pool.
    ///
    /// With `overlap` the budget is taken here, when the load is issued, not when its thread
    /// gets to run: the layer may be resident from then on, and a thread the host schedules late
    /// must not let the ledger count the previous layer gone first (the peak would then depend
    /// on the host's load). Deferred, the load and its budget wait until it is joined, after the
    /// previous layer left the device.
    pub(super) fn weight_task<'scope, 'env>(
        &'scope self,
        scope: &'scope Scope<'scope, 'env>,
        overlap: bool,
        j: usize,
    ) -> Task<'scope, Loaded> {
        let issued = overlap.then(|| self.weight_budget(j));
        Task::start(scope, overlap, move || {
            let budget = match issued {
                Some(budget) => budget?,
                None => self.weight_budget(j)?,
            };
            self.load_weight(j, budget)
        })
    }

    /// The device budget layer `j` takes while loaded (`None` for a layer that lives there).
    fn weight_budget(&self, j: usize) -> Result<Option<Reservation>> {
        match &self.layers[j] {
            LayerHome::Device(_) => Ok(None),
            LayerHome::Host(_) | LayerHome::Disk(_) => {
                let what = format!("layer {j} weights (loaded)");
                Ok(Some(self.ledger.reserve(Tier::Gpu, self.layer_bytes[j], &what)?))
            }
        }
    }

    /// `load_weight`: layer `j` on the device under `budget`, in the I/O pool.
    fn load_weight(&self, j: usize, budget: Option<Reservation>) -> Result<Loaded> {
        let _span = trace_span!("load_weight", layer = j).entered();
        self.in_pool(&self.io_pool, || {
            let layer = match &self.layers[j] {
                LayerHome::Device(layer) => layer.clone(),
                LayerHome::Host(layer) => layer.clone().to_device(&self.device),
                LayerHome::Disk(template) => read_layer(template, &self.store, &format!("layer{j}/"), &self.device)?,
            };
            Ok(Loaded { layer, _budget: budget })
        })
    }

    /// `load_cache`: reads a disk layer's KV cache into host memory, against the host budget.
    pub(super) fn load_cache(
        &self,
        layer: usize,
        batch: usize,
        load: KvLoad,
        io: &BlockIo,
    ) -> Result<(LayerSlots, Reservation)> {
        let _span = trace_span!("load_cache", layer, batch).entered();
        let what = format!("KV cache of layer {layer}, GPU batch {batch} (loaded from disk)");
        let budget = self.ledger.reserve(Tier::Cpu, load.bytes, &what)?;
        let files = io.files(layer, batch)?;
        let files = files.lock().map_err(|_| poisoned())?;
        let parts = files
            .iter()
            .map(|f| Ok(TensorData::from_bytes_vec(f.file.read(load.used)?, f.shape.to_vec(), f.dtype)))
            .collect::<Result<Vec<_>>>()?;
        Ok((from_slot_data(parts, load.quant, &self.host)?, budget))
    }

    /// `store_cache`: writes the slots a step added to a disk layer's KV cache back to its files
    /// (the host budget of the loaded layer is released after).
    pub(super) fn store_cache(&self, layer: usize, batch: usize, kv: KvStore, io: &BlockIo) -> Result<()> {
        let _span = trace_span!("store_cache", layer, batch).entered();
        let files = io.files(layer, batch)?;
        let mut files = files.lock().map_err(|_| poisoned())?;
        for (file, data) in files.iter_mut().zip(slot_data(&kv.slots, kv.step.clone())) {
            file.file.write(kv.step.start, data.as_bytes())?;
        }
        Ok(())
    }

    /// Runs `f` in `pool` when thread control gave one, else on the caller's pool.
    pub(super) fn in_pool<R: Send>(&self, pool: &Option<rayon::ThreadPool>, f: impl FnOnce() -> R + Send) -> R {
        match pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}
