//! Per-tier memory ledger: bytes resident on GPU, CPU and disk against optional capacities.
//!
//! [`MemoryLedger`] is a cheap-to-clone handle (`Arc`) over three lock-free counters per tier
//! (in use, peak, capacity). [`MemoryLedger::reserve`] atomically checks `in_use + bytes <=
//! capacity` and bumps `in_use` (a compare-and-swap loop, so concurrent reservations from loader
//! threads can never overshoot the capacity together); the returned [`Reservation`] gives the
//! bytes back when dropped. Peaks are exact high-water marks of `in_use`.
//!
//! The ledger does not allocate anything: it is the bookkeeping the offloading runtime consults
//! before it allocates, so a plan that does not fit fails early with a readable message
//! ([`OverBudget`]) instead of an allocator abort deep in a kernel.

pub use burn_llm_models::units::fmt_bytes;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::StoreError;

pub use crate::policy::Tier;

/// Short label used in ledger messages.
fn label(tier: Tier) -> &'static str {
    match tier {
        Tier::Gpu => "GPU",
        Tier::Cpu => "CPU",
        Tier::Disk => "disk",
    }
}

/// What to tell the user when a tier is full.
fn hint(tier: Tier) -> &'static str {
    match tier {
        Tier::Gpu => "raise --gpu-mem or offload more",
        Tier::Cpu => "raise --cpu-mem or offload more to disk",
        Tier::Disk => "raise --disk-mem or free space in --offload-dir",
    }
}

/// Capacity sentinel for "unlimited".
const UNLIMITED: u64 = u64::MAX;

#[derive(Debug)]
struct TierState {
    in_use: AtomicU64,
    peak: AtomicU64,
    capacity: AtomicU64,
}

impl TierState {
    fn new(capacity: Option<u64>) -> Self {
        Self {
            in_use: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            capacity: AtomicU64::new(capacity.unwrap_or(UNLIMITED)),
        }
    }
}

#[derive(Debug)]
struct Inner {
    tiers: [TierState; 3],
}

impl Inner {
    fn tier(&self, tier: Tier) -> &TierState {
        &self.tiers[tier.index()]
    }
}

/// Bytes resident per tier, with optional capacities and peaks. Clones share the same ledger;
/// `Send + Sync`.
#[derive(Debug, Clone)]
pub struct MemoryLedger {
    inner: Arc<Inner>,
}

impl Default for MemoryLedger {
    /// An unlimited ledger.
    fn default() -> Self {
        Self::unlimited()
    }
}

impl MemoryLedger {
    /// A ledger with the given capacities in bytes (`None` = unlimited).
    pub fn new(gpu: Option<u64>, cpu: Option<u64>, disk: Option<u64>) -> Self {
        Self { inner: Arc::new(Inner { tiers: [TierState::new(gpu), TierState::new(cpu), TierState::new(disk)] }) }
    }

    /// A ledger without limits (still tracks usage and peaks).
    pub fn unlimited() -> Self {
        Self::new(None, None, None)
    }

    /// Capacity of `tier` in bytes, `None` if unlimited.
    pub fn capacity(&self, tier: Tier) -> Option<u64> {
        match self.inner.tier(tier).capacity.load(SeqCst) {
            UNLIMITED => None,
            c => Some(c),
        }
    }

    /// Change the capacity of `tier`. Lowering it below the bytes in use keeps the existing
    /// reservations; further reservations on that tier fail until enough are released.
    pub fn set_capacity(&self, tier: Tier, capacity: Option<u64>) {
        self.inner.tier(tier).capacity.store(capacity.unwrap_or(UNLIMITED), SeqCst);
    }

    /// Bytes currently reserved on `tier`.
    pub fn in_use(&self, tier: Tier) -> u64 {
        self.inner.tier(tier).in_use.load(SeqCst)
    }

    /// Bytes still free on `tier` (`None` if unlimited; `Some(0)` if over a lowered capacity).
    pub fn available(&self, tier: Tier) -> Option<u64> {
        self.capacity(tier).map(|c| c.saturating_sub(self.in_use(tier)))
    }

    /// Highest `in_use(tier)` since creation or the last [`reset_peaks`](Self::reset_peaks).
    pub fn peak(&self, tier: Tier) -> u64 {
        self.inner.tier(tier).peak.load(SeqCst)
    }

    /// Reset every tier's peak to its current usage.
    pub fn reset_peaks(&self) {
        for state in &self.inner.tiers {
            state.peak.store(state.in_use.load(SeqCst), SeqCst);
            // A reservation that raced with the store above is caught by this second look
            // (all operations are SeqCst), so `peak >= in_use` always holds.
            state.peak.fetch_max(state.in_use.load(SeqCst), SeqCst);
        }
    }

    /// Reserve `bytes` on `tier` for `what` (used in the error message, e.g. `"blk.3 weights"`).
    /// Fails with [`StoreError::OverBudget`] if the tier's capacity would be exceeded; the
    /// returned guard releases the bytes when dropped. Zero-byte reservations always succeed.
    pub fn reserve(&self, tier: Tier, bytes: u64, what: &str) -> Result<Reservation, StoreError> {
        let state = self.inner.tier(tier);
        let mut current = state.in_use.load(SeqCst);
        let new = loop {
            let capacity = state.capacity.load(SeqCst);
            let new = match current.checked_add(bytes) {
                Some(new) if new <= capacity => new,
                _ => {
                    return Err(StoreError::OverBudget(Box::new(OverBudget {
                        tier,
                        what: what.to_owned(),
                        needed: bytes,
                        in_use: current,
                        capacity: (capacity != UNLIMITED).then_some(capacity),
                    })));
                }
            };
            match state.in_use.compare_exchange_weak(current, new, SeqCst, SeqCst) {
                Ok(_) => break new,
                Err(actual) => current = actual,
            }
        };
        state.peak.fetch_max(new, SeqCst);
        Ok(Reservation { inner: Arc::clone(&self.inner), tier, bytes })
    }
}

impl fmt::Display for MemoryLedger {
    /// `GPU 1.90 GiB / 2.00 GiB (peak 1.95 GiB); CPU 3.0 MiB / unlimited (peak 3.0 MiB); …`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, tier) in Tier::ALL.into_iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let capacity = self.capacity(tier).map_or_else(|| "unlimited".to_owned(), fmt_bytes);
            write!(
                f,
                "{} {} / {capacity} (peak {})",
                label(tier),
                fmt_bytes(self.in_use(tier)),
                fmt_bytes(self.peak(tier))
            )?;
        }
        Ok(())
    }
}

/// Bytes held on one tier of a [`MemoryLedger`]; released when dropped.
#[must_use = "dropping a Reservation releases its bytes immediately"]
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
    tier: Tier,
    bytes: u64,
}

impl Reservation {
    /// The tier the bytes are reserved on.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Reserved bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Release now (same as dropping).
    pub fn release(self) {}
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.inner.tier(self.tier).in_use.fetch_sub(self.bytes, SeqCst);
    }
}

/// A reservation that does not fit: which tier, for what, how much, and the tier's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    /// The full tier.
    pub tier: Tier,
    /// What was being reserved (as passed to `reserve`).
    pub what: String,
    /// Bytes requested.
    pub needed: u64,
    /// Bytes already in use on the tier.
    pub in_use: u64,
    /// The tier's capacity (`None`: unlimited, and the total overflowed 64 bits).
    pub capacity: Option<u64>,
}

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tier = label(self.tier);
        match self.capacity {
            Some(capacity) => write!(f, "the {tier} budget of {}", fmt_bytes(capacity))?,
            None => write!(f, "the unlimited {tier} budget")?,
        }
        write!(
            f,
            " cannot hold {} ({}): {} already in use",
            self.what,
            fmt_bytes(self.needed),
            fmt_bytes(self.in_use)
        )?;
        if self.capacity.is_none() {
            f.write_str(" and the total overflows 64 bits")?;
        }
        write!(f, "; {}", hint(self.tier))
    }
}

impl std::error::Error for OverBudget {}
