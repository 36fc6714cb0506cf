//! Stages on threads of their own: [`PipelineLm`]'s [`LanguageModel::forward_micro_batches`].
//!
//! The cache is split into one view per stage ([`MicroBatchCache::split_layers`]); each stage
//! runs on a scoped thread, takes micro-batch `m`'s hidden states from the stage before over a
//! channel (the first stage embeds them), runs its layers through its view and hands the result
//! on (the last stage applies the head). So stage `s + 1` works on micro-batch (or TeraPipe token
//! slice) `m` while stage `s` works on `m + 1`, on every kind of device: stages on the host CPU
//! (Flex) compute at the same time on their own cores, and stages on asynchronous devices (wgpu,
//! remote workers) have their blocking calls (a worker's round trips, a read back) overlap. A stage
//! goes on to micro-batch `m + 1` only once the next stage has handed `m` over to its device, so
//! a device that runs its work in order (a worker) hands `m` on before it starts `m + 1`.
//!
//! Each stage sees the micro-batches in order, through its own cache layers, so the result equals
//! [`forward_micro_batches_in_turn`] bit for bit: only when work happens changes.
//!
//! Host stages share the machine's cores: each gets its own rayon pool (Flex's matrix products
//! and reductions split over `rayon::current_num_threads`) of `cores ÷ host stages` threads (at
//! least one), or [`PipelineLm::with_stage_threads`] / `$BURN_LLM_STAGE_THREADS` threads each.
//! Only a stage's computing runs in its pool; its thread waits for the stage before, the next
//! stage and its turn ([`super::turns`]) outside it, so that steps of several callers at once
//! share a pool of one thread without deadlock.
//! Every stage thread computes in the calling thread's matmul precision (`--exact-matmul` is a
//! thread-local setting of the kernels, [`with_matmul_precision`]). Without a split (a cache that
//! cannot be split, one stage or one micro-batch) the stages run in turn on the calling thread,
//! over the global pool.

use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, channel};

use burn::tensor::{Device, Tensor};
use burn_llm_kernels::{matmul_precision, with_matmul_precision};
use burn_llm_models::device::is_host_device;
use burn_llm_models::language_model::forward_micro_batches_in_turn;
use burn_llm_models::model::Hidden;
use burn_llm_models::{LanguageModel, MicroBatchCache, ModelError, Result, StepInput};

use super::model::PipelineLm;

/// Threads per host stage, overriding the even share of the cores.
pub const STAGE_THREADS_ENV: &str = "BURN_LLM_STAGE_THREADS";

/// Threads each of `host_stages` stages on the host CPU computes with: `overridden` when given,
/// else an even share of `cores` (at least one).
pub fn stage_threads(host_stages: usize, cores: usize, overridden: Option<usize>) -> usize {
    overridden.unwrap_or(cores / host_stages.max(1)).max(1)
}

/// `$BURN_LLM_STAGE_THREADS`: `None` when unset, an error naming the variable when it is not a
/// count ≥ 1.
fn env_stage_threads() -> Result<Option<usize>> {
    let Ok(text) = std::env::var(STAGE_THREADS_ENV) else { return Ok(None) };
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(ModelError::Device(format!(
            "{STAGE_THREADS_ENV}={text:?} is not a thread count: set it to a number ≥ 1 (threads per host pipeline stage) or unset it"
        ))),
    }
}

/// The rayon threads of each stage on `devices` (in pipeline order) when stages run concurrently:
/// `Some` for a stage on the host CPU ([`stage_threads`] of the machine's cores, `overridden` or
/// `$BURN_LLM_STAGE_THREADS` first), `None` for other devices. An unparsable variable is an error
/// naming it.
pub fn stage_pool_threads(devices: &[Device], overridden: Option<usize>) -> Result<Vec<Option<usize>>> {
    let hosts = devices.iter().filter(|d| is_host_device(d)).count();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let threads = stage_threads(hosts, cores, overridden.map_or_else(env_stage_threads, |n| Ok(Some(n)))?);
    Ok(devices.iter().map(|d| is_host_device(d).then_some(threads)).collect())
}

/// One rayon pool per stage on the host CPU (`None` for other stages), built on first use.
#[derive(Default)]
pub(super) struct StagePools {
    pools: std::sync::OnceLock<Vec<Option<rayon::ThreadPool>>>,
    /// Threads per host stage set by the caller (before the environment and the even share).
    pub threads: Option<usize>,
}

impl StagePools {
    fn get(&self, model: &PipelineLm) -> Result<&[Option<rayon::ThreadPool>]> {
        if let Some(pools) = self.pools.get() {
            return Ok(pools);
        }
        let devices: Vec<Device> = model.stages().iter().map(|s| s.device().clone()).collect();
        // A pool that cannot be built leaves its stage on the global pool: slower, same result.
        let pools = stage_pool_threads(&devices, self.threads)?
            .into_iter()
            .enumerate()
            .map(|(s, threads)| {
                threads.and_then(|threads| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |i| format!("burn-llm-stage{s}-{i}"))
                        .build()
                        .ok()
                })
            })
            .collect();
        Ok(self.pools.get_or_init(|| pools))
    }
}

impl PipelineLm {
    /// Threads each stage on the host CPU computes with when stages run concurrently (default:
    /// `$BURN_LLM_STAGE_THREADS`, else the machine's cores shared evenly among those stages).
    /// Takes effect before the first forward pass over micro-batches.
    pub fn with_stage_threads(mut self, threads: usize) -> Self {
        self.pools_mut().threads = Some(threads.max(1));
        self
    }

    /// See the [module docs](self).
    pub(super) fn forward_threaded(
        &self,
        steps: &[StepInput],
        cache: &mut dyn MicroBatchCache,
    ) -> Result<Vec<Tensor<3>>> {
        if self.stages().len() < 2 || steps.len() < 2 {
            return forward_micro_batches_in_turn(self, steps, cache);
        }
        let ranges: Vec<Range<usize>> = self.stages().iter().map(|s| self.kv_map().cache_layers(s.layers())).collect();
        let pools = self.pools().get(self)?;
        let Some(views) = cache.split_layers(&ranges) else {
            return forward_micro_batches_in_turn(self, steps, cache);
        };
        let last = views.len() - 1;
        let precision = matmul_precision();
        std::thread::scope(|scope| {
            let mut from: Option<Upstream> = None;
            let mut handles = Vec::with_capacity(views.len());
            for (s, mut view) in views.into_iter().enumerate() {
                let (to, next) = match s < last {
                    true => {
                        let (hidden_tx, hidden_rx) = channel();
                        let (handed_tx, handed_rx) = channel();
                        (
                            Some(Downstream { hidden: hidden_tx, handed: handed_rx }),
                            Some(Upstream { hidden: hidden_rx, handed: handed_tx }),
                        )
                    }
                    false => (None, None),
                };
                let from = std::mem::replace(&mut from, next);
                let compute = Compute { pool: pools.get(s).and_then(Option::as_ref), precision };
                handles.push(scope.spawn(move || self.stage_loop(s, steps, &mut *view, from, to, compute)));
            }
            let mut out = None;
            let mut failed = None;
            for handle in handles {
                match handle.join() {
                    Ok(Ok(Some(states))) => out = Some(states),
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        failed.get_or_insert(e);
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            match (failed, out) {
                (Some(e), _) => Err(e),
                (None, Some(states)) => Ok(states),
                (None, None) => Err(ModelError::Device("a pipeline stage stopped without a result".into())),
            }
        })
    }

    /// Stage `s`'s thread: every micro-batch in order, from the stage before (or embedded), through
    /// its layers, to the stage after (or the head). `Ok(None)` when a neighbour stopped (its
    /// error is the one reported) or for stages before the last.
    ///
    /// A stage hands micro-batch `m` over to its own device itself and only then lets the stage
    /// before go on to `m + 1` ([`Upstream::handed`]). An asynchronous device runs its work in
    /// the order it was issued, so the hand-over (a worker's expose of `m`) comes before the
    /// stage before's work on `m + 1`, and the next device has `m` while that runs. Without the
    /// wait, the stage before issues every micro-batch at once (issuing costs little) and the
    /// hand-over of the first queues behind all of them: no overlap. Each stage also flushes its
    /// device after issuing a micro-batch's layers: the remote backend's fusion keeps operations
    /// back until a read, and a stage's work left there would run only at the step's end.
    fn stage_loop(
        &self,
        s: usize,
        steps: &[StepInput],
        view: &mut (dyn MicroBatchCache + Send),
        from: Option<Upstream>,
        to: Option<Downstream>,
        compute: Compute<'_>,
    ) -> Result<Option<Vec<Tensor<3>>>> {
        let device = self.stages()[s].device();
        let mut out = Vec::with_capacity(if to.is_none() { steps.len() } else { 0 });
        for (m, step) in steps.iter().enumerate() {
            // This stage's turn among callers running pipelines at once ([`super::turns`]),
            // taken once `m` is here (before it is handed over to this stage's device, where the
            // turns' ranks allow) and kept until the next stage has handed it over.
            let (turn, hidden) = match &from {
                None => (self.turns().take(s), compute.run(|| self.embed(step))),
                Some(up) => {
                    let Ok(hidden) = up.hidden.recv() else { return Ok(None) };
                    // Under this stage's turn too, where the ranks allow ([`super::turns`]).
                    let turn = self.turns().take_for_hand_over(s);
                    let hidden = self.hand_over(hidden, device);
                    if up.handed.send(()).is_err() {
                        return Ok(None);
                    }
                    (turn.unwrap_or_else(|| self.turns().take(s)), hidden)
                }
            };
            view.select_micro_batch(m);
            let hidden = compute.run(|| self.run_stage_layers(s, hidden, &mut *view))?;
            // A lazy device (fusion over a worker) holds the layers' operations until something
            // reads; send them now so this device computes `m` while the others go on.
            device.flush().map_err(|e| ModelError::Device(format!("stage {s} on {device:?}: {e:?}")))?;
            match &to {
                Some(down) => {
                    if down.hidden.send(hidden).is_err() || down.handed.recv().is_err() {
                        return Ok(None);
                    }
                }
                None => out.push(compute.run(|| self.finish(hidden))),
            }
            // Flushed above, after the layers.
            drop(turn);
        }
        Ok(to.is_none().then_some(out))
    }
}

/// Where a stage thread computes: in its stage's pool (host stages), in the caller's matmul
/// precision. Only the computing goes to the pool, never a wait on a channel or a turn: a pool
/// thread blocked on another stage would leave the pool to nothing else, and callers running the
/// model at once (virtual engines) would deadlock on pools of one thread.
#[derive(Clone, Copy)]
struct Compute<'a> {
    pool: Option<&'a rayon::ThreadPool>,
    precision: burn_llm_kernels::MatmulPrecision,
}

impl Compute<'_> {
    fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        let work = || with_matmul_precision(self.precision, work);
        match self.pool {
            Some(pool) => pool.install(work),
            None => work(),
        }
    }
}

/// A stage's link from the stage before: micro-batches' hidden states in, and a signal back once
/// each is handed over to this stage's device.
struct Upstream {
    hidden: Receiver<Hidden>,
    handed: Sender<()>,
}

/// A stage's link to the stage after: the other ends of the next stage's [`Upstream`].
struct Downstream {
    hidden: Sender<Hidden>,
    handed: Receiver<()>,
}

#[cfg(test)]
mod tests {
    use super::stage_threads;

    #[test]
    fn host_stages_share_the_cores_evenly() {
        assert_eq!(stage_threads(2, 16, None), 8);
        assert_eq!(stage_threads(3, 2, None), 1);
        assert_eq!(stage_threads(0, 4, None), 4);
        assert_eq!(stage_threads(2, 16, Some(3)), 3);
    }
}
