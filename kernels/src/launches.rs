//! Counting the GPU kernels a piece of work launches, through CubeCL's launch observer
//! (`cubecl::logging::LaunchObservation`): the same launches CubeCL's profiling log lists
//! (`CUBECL_DEBUG_OPTION=profile`), observed in-process, on the thread that issues each one, so a
//! count needs no log file to parse. Process-wide: run nothing else on the GPU meanwhile.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use cubecl::config::{TypeNameFormatLevel, type_name_format};
use cubecl::logging::{LaunchObservation, LaunchObserver};

/// Kernel launches, in total and per kernel name (generic arguments removed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchCounts {
    /// Every launch.
    pub total: usize,
    /// Launches per kernel, by the name CubeCL's profiling log prints (shortened).
    pub by_kernel: BTreeMap<String, usize>,
}

#[derive(Default)]
struct Counter(Mutex<BTreeMap<&'static str, usize>>);

impl LaunchObserver for Counter {
    fn launched(&self, kernel: &'static str) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner).entry(kernel).or_default() += 1;
    }
}

/// Runs `work` and counts the kernels launched meanwhile. With Burn's fusion on, ops are
/// launched when their results are needed: `work` should end by reading a result back or by
/// syncing the device, or its last ops are counted in the next observed work instead.
pub fn count_launches<T>(work: impl FnOnce() -> T) -> (T, LaunchCounts) {
    let counter = Arc::new(Counter::default());
    let observation = LaunchObservation::new(counter.clone());
    let out = work();
    drop(observation);
    let raw = std::mem::take(&mut *counter.0.lock().unwrap_or_else(PoisonError::into_inner));
    let mut counts = LaunchCounts::default();
    for (name, n) in raw {
        counts.total += n;
        *counts.by_kernel.entry(type_name_format(name, TypeNameFormatLevel::Short)).or_default() += n;
    }
    (out, counts)
}
