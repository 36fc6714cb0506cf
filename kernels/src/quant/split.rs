//! A two-way split of a decode-sized product between the calling thread and one helper thread.
//!
//! A decode step of a small model runs a couple of hundred matmuls of tens of microseconds each.
//! Handing each to rayon from a thread outside its pool costs a sleep and a wake-up of the
//! caller per call (the scheduler and `sched_yield` took about a tenth of decode time in `perf`).
//! Here the caller computes half of the rows itself while a helper, which spins for a short while
//! after each job before it parks (as llama.cpp's thread pool does), computes the other half. If
//! the helper has not picked its half up by the time the caller is done with its own (it is
//! parked, or another process holds the second core), the caller takes that half back and runs it
//! too: a busy machine costs the parallelism, never a wait on a thread that is not running.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
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

fn rayon_split(f: &(dyn Fn(usize) + Sync)) {
    rayon::join(|| f(0), || f(1));
}
