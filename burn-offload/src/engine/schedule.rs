//! FlexGen's block schedule with overlapping (Algorithm 1) over one generation step of a block:
//!
//! ```text
//! for j = 1 to num_layers                 // layer by layer,
//!   for k = 1 to num_gpu_batches          // every GPU batch of the block
//!     load_weight(j + 1)                  // the next layer's weights
//!     store_hidden(j, k − 1); store_cache(j, k − 1)
//!     load_cache(j, k + 1); load_hidden(j, k + 1)
//!     compute(j, k)
//!     sync()
//! ```
//!
//! Here a step `(j, k)` is one (layer, GPU batch) pair, and the I/O runs on two threads beside
//! the compute: one loads weights (a layer's load starts when the previous layer starts, so with
//! overlap two layers are on the device at once), the other runs the previous step's stores and
//! then the next step's loads (so at most two disk-resident KV tensors are in host memory at a
//! time: this step's and one in transit, the cost model's staging buffers). The stores run
//! cache first, then activations, so the cache's host budget is released before activations
//! take theirs. Without overlap every task is deferred until `sync` (or, for weights, until the
//! layer is needed, after the previous one left the device), which runs them one after the other.

use burn_llm_models::model::{DecoderLayer, Hidden};
use tracing::{debug_span, trace_span};

use super::OffloadEngine;
use super::io::{BlockIo, Inputs, KvLoad, KvStore, LoadJob, StoreJob, Task, Weights};
use super::parking::Parked;
use crate::cache::OffloadKvCache;
use crate::error::{OffloadError, Result};
use crate::policy::Tier;
use crate::store::Reservation;

/// What the store/load task of a step returns at `sync`: the parked activations of the batch it
/// stored, and the next step's inputs.
type Transfers = (Option<(usize, Parked)>, Inputs);

impl OffloadEngine {
    /// Every layer over every active GPU batch of the block (`hidden[k]` is `None` for a batch
    /// with nothing left to generate), one (layer, batch) step at a time; the hidden states come
    /// back on the device.
    pub(super) fn run_layers(
        &self,
        hidden: &mut [Option<Hidden>],
        caches: &mut [OffloadKvCache],
        io: &BlockIo,
    ) -> Result<()> {
        let layers = self.layers.len();
        let active: Vec<usize> = (0..hidden.len()).filter(|&k| hidden[k].is_some()).collect();
        let order: Vec<(usize, usize)> = (0..layers).flat_map(|j| active.iter().map(move |&k| (j, k))).collect();
        let Some(&first) = order.first() else { return Ok(()) };
        // With one batch, its activations are needed by the very next step: they never wait.
        let park = active.len() >= 2;
        let mut parked: Vec<Option<Parked>> = hidden.iter_mut().map(|h| h.take().map(Parked::Device)).collect();
        let overlap = self.policy.shape.overlap;
        std::thread::scope(|scope| -> Result<()> {
            // Before the first step: its weights start loading, its cache and activations come in.
            let mut weights = Weights::new(self.weight_task(scope, overlap, first.0));
            let mut inputs = self.load_inputs(self.load_job(first, caches, &mut parked), io)?;
            let mut pending: Option<StoreJob> = None;
            for (t, &(j, k)) in order.iter().enumerate() {
                let _step = debug_span!("step", layer = j, batch = k).entered();
                // load_weight(j + 1): at a layer's first batch its weights are in, and the next
                // layer's start loading.
                let next_layer = (j + 1 < layers).then_some(j + 1);
                let layer = weights.layer(j, || next_layer.map(|n| self.weight_task(scope, overlap, n)))?;
                // This step's cache and activations, loaded during the previous step, go in.
                let (state, kv_budget) = self.take_inputs(&mut inputs, &mut caches[k], &mut parked[k], j, io)?;
                // store_cache(j, k − 1), store_hidden(j, k − 1), then load_cache(j, k + 1),
                // load_hidden(j, k + 1) (the previous and next steps of the order): one task
                // beside the compute.
                let store = pending.take();
                let load = order.get(t + 1).map(|&next| self.load_job(next, caches, &mut parked));
                let transfers = (load.is_some() || store.is_some()).then(|| {
                    Task::start(scope, overlap, move || -> Result<Transfers> {
                        let stored = store.map(|job| self.store_outputs(job, io)).transpose()?.flatten();
                        let loaded = load.map(|job| self.load_inputs(job, io)).transpose()?.unwrap_or_default();
                        Ok((stored, loaded))
                    })
                });
                // compute(j, k).
                let out = self.compute(layer, j, k, state, &mut caches[k])?;
                // sync.
                inputs = sync(transfers, &mut parked)?;
                // What this step leaves for the next one to store.
                pending =
                    self.store_job((j, k), out, kv_budget, park && j + 1 < layers, &mut caches[k], &mut parked[k])?;
            }
            // The last step's stores.
            if let Some((batch, p)) = pending.take().map(|job| self.store_outputs(job, io)).transpose()?.flatten() {
                parked[batch] = Some(p);
            }
            Ok(())
        })?;
        for (h, p) in hidden.iter_mut().zip(parked) {
            *h = p.map(|p| self.load_hidden(p, io)).transpose()?;
        }
        Ok(())
    }

    /// What the load tasks of `step` have to bring in: its KV cache if on disk, its activations
    /// if they wait off the device (taken out of `parked`; activations still being stored are
    /// not there yet and come in when the step starts).
    fn load_job(
        &self,
        (layer, batch): (usize, usize),
        caches: &[OffloadKvCache],
        parked: &mut [Option<Parked>],
    ) -> LoadJob {
        let kv = (self.cache_tier(layer, batch) == Tier::Disk).then(|| KvLoad::of(&caches[batch]));
        let hidden = if parked[batch].as_ref().is_some_and(Parked::is_away) { parked[batch].take() } else { None };
        LoadJob { layer, batch, kv, hidden }
    }

    /// `load_cache` then `load_hidden` of one step.
    fn load_inputs(&self, job: LoadJob, io: &BlockIo) -> Result<Inputs> {
        let kv = job.kv.map(|load| self.load_cache(job.layer, job.batch, load, io)).transpose()?;
        let hidden = job.hidden.map(|p| self.load_hidden(p, io)).transpose()?;
        Ok(Inputs { kv, hidden })
    }

    /// `store_cache` then `store_hidden` of one step; returns the parked activations and their
    /// batch.
    fn store_outputs(&self, job: StoreJob, io: &BlockIo) -> Result<Option<(usize, Parked)>> {
        if let Some(kv) = job.kv {
            self.store_cache(job.layer, job.batch, kv, io)?;
        }
        job.hidden.map(|(hidden, tier)| Ok((job.batch, self.store_hidden(job.batch, hidden, tier, io)?))).transpose()
    }

    /// Puts step `(j, batch)`'s loaded inputs in place: a disk layer's KV cache into the batch's
    /// cache (with the host budget it holds until stored), its activations from the load task
    /// or, when they were still being stored as the load task started, from where they were
    /// parked.
    fn take_inputs(
        &self,
        inputs: &mut Inputs,
        cache: &mut OffloadKvCache,
        parked: &mut Option<Parked>,
        j: usize,
        io: &BlockIo,
    ) -> Result<(Hidden, Option<Reservation>)> {
        let mut kv_budget = None;
        if let Some((slots, budget)) = inputs.kv.take() {
            cache.put_layer(j, slots)?;
            kv_budget = Some(budget);
        }
        let state = match inputs.hidden.take() {
            Some(h) => h,
            None => self.load_hidden(parked.take().ok_or_else(missing_activations)?, io)?,
        };
        Ok((state, kv_budget))
    }

    /// `compute`: layer `j` over GPU batch `k`'s activations, in the compute pool.
    fn compute(
        &self,
        layer: &DecoderLayer,
        j: usize,
        k: usize,
        state: Hidden,
        cache: &mut OffloadKvCache,
    ) -> Result<Hidden> {
        let _span = trace_span!("compute", layer = j, batch = k).entered();
        let states =
            self.in_pool(&self.compute_pool, || layer.forward(state.states, j, state.rotary.as_ref(), &mut *cache))?;
        Ok(Hidden { states, rotary: state.rotary })
    }

    /// What step `(j, k)` leaves to store: a disk layer's KV cache (taken out of the cache), and
    /// its output activations when they wait off the device (`park`); activations that stay are
    /// parked on the device at once.
    fn store_job(
        &self,
        (j, k): (usize, usize),
        out: Hidden,
        kv_budget: Option<Reservation>,
        park: bool,
        cache: &mut OffloadKvCache,
        parked: &mut Option<Parked>,
    ) -> Result<Option<StoreJob>> {
        let kv = match self.cache_tier(j, k) {
            Tier::Disk => {
                let slots = cache
                    .take_layer(j)
                    .ok_or_else(|| OffloadError::Internal(format!("KV cache of layer {j} missing")))?;
                Some(KvStore { slots, step: cache.steps().range(), _budget: kv_budget })
            }
            _ => None,
        };
        let tier = self.activation_tier(k);
        let hidden = if park && tier != Tier::Gpu {
            Some((out, tier))
        } else {
            *parked = Some(Parked::Device(out));
            None
        };
        Ok((kv.is_some() || hidden.is_some()).then_some(StoreJob { layer: j, batch: k, kv, hidden }))
    }
}

/// `sync`: waits for the step's store/load task (or runs it, without overlap), parks the
/// activations it stored and returns the next step's inputs.
fn sync(transfers: Option<Task<'_, Transfers>>, parked: &mut [Option<Parked>]) -> Result<Inputs> {
    let _span = trace_span!("sync").entered();
    let (stored, loaded) = match transfers {
        Some(task) => task.join()?,
        None => (None, Inputs::default()),
    };
    if let Some((batch, p)) = stored {
        parked[batch] = Some(p);
    }
    Ok(loaded)
}

fn missing_activations() -> OffloadError {
    OffloadError::Internal("activations of a running GPU batch are missing".into())
}
