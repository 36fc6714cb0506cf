//! A two-way split of a decode-sized product between the calling thread and one helper thread.
//!
//! A decode step of a small model runs a couple of hundred matmuls of tens of microseconds each.
//! Handing each to rayon from a thread outside its pool costs a sleep and a wake-up of the
//! caller per call, a visible share of decode time spent in the scheduler and `sched_yield`.
//! Here the caller computes half of the rows itself while a helper, which spins for a short while
//! after each job before it parks (as llama.cpp's thread pool does), computes the other half. If
//! the helper has not picked its half up by the time the caller is done with its own (it is
//! parked, or another process holds the second core), the caller takes that half back and runs it
//! too: a busy machine costs the parallelism, never a wait on a thread that is not running.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const RUNNING: u8 = 2;
const DONE: u8 = 3;
/// How long the helper waits, spinning, for the next job before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A job: the caller's closure, valid until the helper marks it [`DONE`].
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(usize) + Sync));

// SAFETY: the closure is `Sync` and the caller keeps it alive until the helper is done with it.
unsafe impl Send for Job {}

struct Helper {
    state: AtomicU8,
    panicked: AtomicBool,
    job: Mutex<Option<Job>>,
    thread: OnceLock<Thread>,
    /// Held by the one caller using the helper; others fall back to rayon.
    busy: Mutex<()>,
}

static HELPER: OnceLock<Option<&'static Helper>> = OnceLock::new();

/// The helper thread, started on first use; `None` where a thread cannot be spawned.
fn helper() -> Option<&'static Helper> {
    *HELPER.get_or_init(|| {
        let helper: &'static Helper = Box::leak(Box::new(Helper {
            state: AtomicU8::new(IDLE),
            panicked: AtomicBool::new(false),
            job: Mutex::new(None),
            thread: OnceLock::new(),
            busy: Mutex::new(()),
        }));
        let handle = std::thread::Builder::new().name("burn-llm-split".into()).spawn(move || serve(helper)).ok()?;
        let _ = helper.thread.set(handle.thread().clone());
        Some(helper)
    })
}

/// The helper's loop: spin for a job, park when none comes for [`SPIN`], run it, mark it done.
fn serve(helper: &'static Helper) {
    loop {
        let mut since = Instant::now();
        let mut spins = 0u32;
        // Claim a posted job (the caller may take it back first).
        while helper.state.compare_exchange(POSTED, RUNNING, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && since.elapsed() > SPIN {
                std::thread::park_timeout(Duration::from_millis(50));
                since = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
        let job = helper.job.lock().ok().and_then(|mut j| j.take());
        if let Some(Job(f)) = job {
            // SAFETY: the poster waits for `DONE` before its closure goes out of scope.
            let ok = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(1) })).is_ok();
            helper.panicked.store(!ok, Ordering::Relaxed);
        }
        helper.state.store(DONE, Ordering::Release);
    }
}

/// Waits for the helper to finish the posted job, also while the caller unwinds (a job the
/// helper has not claimed is withdrawn instead).
struct AwaitHelper(&'static Helper);

impl AwaitHelper {
    /// Withdraws the job if the helper has not claimed it: then the caller runs it.
    fn take_back(&self) -> bool {
        let taken = self.0.state.compare_exchange(POSTED, IDLE, Ordering::Acquire, Ordering::Relaxed).is_ok();
        if taken {
            self.0.job.lock().ok().and_then(|mut j| j.take());
        }
        taken
    }
}

impl Drop for AwaitHelper {
    fn drop(&mut self) {
        if self.take_back() {
            return;
        }
        let mut spins = 0u32;
        while self.0.state.load(Ordering::Acquire) != DONE {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.0.state.store(IDLE, Ordering::Release);
    }
}

/// Runs `f(0)` on this thread and `f(1)` on the helper, returning when both are done; through
/// `rayon::join` when the helper is in use by another thread or cannot be started.
pub(crate) fn split2(f: &(dyn Fn(usize) + Sync)) {
    let Some(helper) = helper() else { return rayon_split(f) };
    let Ok(_busy) = helper.busy.try_lock() else { return rayon_split(f) };
    let Some(thread) = helper.thread.get() else { return rayon_split(f) };
    // SAFETY: only the lifetime is erased; `AwaitHelper` keeps this frame (and `f`) alive until
    // the helper has finished with the pointer.
    let job: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    match helper.job.lock() {
        Ok(mut slot) => *slot = Some(Job(job)),
        Err(_) => return rayon_split(f),
    }
    helper.state.store(POSTED, Ordering::Release);
    thread.unpark();
    let wait = AwaitHelper(helper);
    f(0);
    if wait.take_back() {
        // Withdrawn: nothing left to wait for.
        std::mem::forget(wait);
        f(1);
    } else {
        drop(wait);
    }
    assert!(!helper.panicked.swap(false, Ordering::Relaxed), "the helper thread's half of a split product panicked");
}

/// Runs `run` over `0..count` in chunks of `chunk` on this thread and the helper ([`split2`]):
/// each owns half of the chunks and takes its own from the front, in memory order (one stream
/// for the hardware prefetchers, as with fixed halves); one done with its own takes the other's
/// from the back, so that neither waits on a partner that started late (the helper was parked)
/// or runs slower (another process shares its core).
pub(crate) fn split2_chunks(count: usize, chunk: usize, run: &(dyn Fn(Range<usize>) + Sync)) {
    // At most 2^32 − 1 chunks, so that `Remaining` packs their indices into one word.
    let chunk = chunk.max(1).max(count.div_ceil(u32::MAX as usize));
    let chunks = count.div_ceil(chunk);
    let half = chunks.div_ceil(2);
    let halves = [Remaining::new(0..half), Remaining::new(half..chunks)];
    split2(&|me| {
        let run_chunk = |c: usize| run(c * chunk..((c + 1) * chunk).min(count));
        while let Some(c) = halves[me].take(true) {
            run_chunk(c);
        }
        while let Some(c) = halves[1 - me].take(false) {
            run_chunk(c);
        }
    });
}

/// The chunks of one half not yet taken, `lo..hi` packed in one atomic so that its owner (from
/// the front) and the other thread (from the back) never take the same chunk.
struct Remaining(AtomicU64);

impl Remaining {
    /// `chunks.end` fits 32 bits (`split2_chunks` sizes the chunks so).
    fn new(chunks: Range<usize>) -> Self {
        debug_assert!(chunks.end <= u32::MAX as usize);
        Self(AtomicU64::new(Self::pack(chunks.start, chunks.end)))
    }

    fn pack(lo: usize, hi: usize) -> u64 {
        ((lo as u64) << 32) | (hi as u64 & u64::from(u32::MAX))
    }

    /// Takes the first (`front`) or the last chunk left, if any.
    fn take(&self, front: bool) -> Option<usize> {
        let mut now = self.0.load(Ordering::Relaxed);
        loop {
            let (lo, hi) = ((now >> 32) as usize, (now & u64::from(u32::MAX)) as usize);
            if lo >= hi {
                return None;
            }
            let (next, taken) = if front { (Self::pack(lo + 1, hi), lo) } else { (Self::pack(lo, hi - 1), hi - 1) };
            match self.0.compare_exchange_weak(now, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(taken),
                Err(current) => now = current,
            }
        }
    }
}

fn rayon_split(f: &(dyn Fn(usize) + Sync)) {
    rayon::join(|| f(0), || f(1));
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::split2_chunks;

    /// Every row of `0..count` is run exactly once, in chunks of at most `chunk` rows, and when
    /// the helper is slow the calling thread takes over chunks of its half.
    #[test]
    fn split2_chunks_covers_every_row_once_and_takes_over_a_slow_half() {
        for (count, chunk) in [(1000, 32), (31, 32), (1, 7), (0, 16), (64, 16)] {
            let runs = Mutex::new(Vec::new());
            split2_chunks(count, chunk, &|rows| {
                // The helper 20 times slower than this thread (which is slow enough that the
                // helper claims its job before this thread could take it back).
                let helper = std::thread::current().name() == Some("burn-llm-split");
                std::thread::sleep(Duration::from_millis(if helper { 20 } else { 1 }));
                runs.lock().unwrap().push((rows, helper));
            });
            let mut runs = runs.into_inner().unwrap();
            runs.sort_by_key(|(rows, _)| rows.start);
            let mut next = 0;
            for (rows, _) in &runs {
                assert!(rows.start == next && rows.len() <= chunk && !rows.is_empty(), "{rows:?} after {next}");
                next = rows.end;
            }
            assert_eq!(next, count);
            // With the helper in play (not another test's), this thread ran part of its half.
            let half = count.div_ceil(chunk).div_ceil(2) * chunk;
            if count >= 4 * chunk && runs.iter().any(|(_, helper)| *helper) {
                assert!(runs.iter().any(|(rows, helper)| !helper && rows.start >= half), "nothing taken over");
            }
        }
    }
}
