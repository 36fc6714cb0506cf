//! Summing the ranks' partial outputs, and copying the layer input to every rank, with a count of
//! the bytes that move between ranks.

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::{Device, Tensor};

/// How the partial sums of the row-split projections are reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReducePath {
    /// `burn::tensor::distributed::all_reduce` (NCCL): every rank is a distinct CUDA device in this
    /// process. Only builds with the `cuda` feature choose it; it has not been run here (CUDA
    /// cannot be built on this project's machines).
    AllReduce,
    /// Gather the partial sums to rank 0 with `to_device`, add them there, and send the result
    /// back to the ranks that need it: works on every backend and any mix of devices.
    ToDevice,
}

impl ReducePath {
    /// [`ReducePath::AllReduce`] when every device is a CUDA device, no two the same, and there
    /// are at least two; otherwise [`ReducePath::ToDevice`] (Burn's `all_reduce` panics on any
    /// other device).
    pub fn for_devices(devices: &[Device]) -> Self {
        let distinct = devices.iter().enumerate().all(|(i, d)| !devices[..i].contains(d));
        if devices.len() > 1 && distinct && devices.iter().all(is_cuda) {
            ReducePath::AllReduce
        } else {
            ReducePath::ToDevice
        }
    }

    /// The name outputs and benchmarks print: `all_reduce` or `to_device`.
    pub fn name(self) -> &'static str {
        match self {
            ReducePath::AllReduce => "all_reduce",
            ReducePath::ToDevice => "to_device",
        }
    }
}

impl std::fmt::Display for ReducePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `device` is a CUDA device (the one kind Burn 0.22's `all_reduce` serves).
#[cfg(feature = "cuda")]
fn is_cuda(device: &Device) -> bool {
    #[allow(unreachable_patterns)]
    match device.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => cube.runtime() == burn::backend::RuntimeId::Cuda,
        _ => false,
    }
}

/// Whether `device` is a CUDA device: never, in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
fn is_cuda(_device: &Device) -> bool {
    false
}

/// Bytes moved between ranks and forward passes run, since the layer was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransferStats {
    /// Forward passes of the layer.
    pub forwards: u64,
    /// Bytes sent from one rank to another: every `to_device` between ranks, and for an
    /// all-reduce the traffic of a ring all-reduce (each rank sends `2·(ranks − 1)/ranks` of the
    /// tensor, `2·(ranks − 1)` tensors in all). Counted whether or not the ranks share a
    /// physical device (ranks on one device model a split without the copies).
    pub bytes: u64,
}

/// The ranks' devices, the reduction path and the transfer counters.
#[derive(Debug)]
pub(crate) struct Reducer {
    pub(crate) devices: Vec<Device>,
    pub(crate) path: ReducePath,
    forwards: AtomicU64,
    bytes: AtomicU64,
}

/// Bytes of `t`'s values.
fn bytes_of<const D: usize>(t: &Tensor<D>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}

impl Reducer {
    pub(crate) fn new(devices: Vec<Device>) -> Self {
        let path = ReducePath::for_devices(&devices);
        Self { devices, path, forwards: AtomicU64::new(0), bytes: AtomicU64::new(0) }
    }

    pub(crate) fn stats(&self) -> TransferStats {
        TransferStats { forwards: self.forwards.load(Ordering::Relaxed), bytes: self.bytes.load(Ordering::Relaxed) }
    }

    pub(crate) fn count_forward(&self) {
        self.forwards.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn others(&self) -> u64 {
        self.devices.len().saturating_sub(1) as u64
    }

    /// `x` (on rank 0) on every rank, rank 0's being `x` itself.
    pub(crate) fn scatter<const D: usize>(&self, x: Tensor<D>) -> Vec<Tensor<D>> {
        self.count(self.others() * bytes_of(&x));
        let mut copies: Vec<Tensor<D>> = self.devices[1..].iter().map(|d| x.clone().to_device(d)).collect();
        copies.insert(0, x);
        copies
    }

    /// The sum of the ranks' `parts` (part `r` on rank `r`), on every rank.
    pub(crate) fn sum_everywhere(&self, parts: Vec<Tensor<3>>) -> Vec<Tensor<3>> {
        match self.path {
            ReducePath::AllReduce => self.all_reduce(parts),
            ReducePath::ToDevice => self.scatter(self.gather_sum(parts)),
        }
    }

    /// The sum of the ranks' `parts`, on rank 0.
    pub(crate) fn sum_at_root(&self, parts: Vec<Tensor<3>>) -> Tensor<3> {
        match self.path {
            ReducePath::AllReduce => self.all_reduce(parts).swap_remove(0),
            ReducePath::ToDevice => self.gather_sum(parts),
        }
    }

    /// Gathers the parts to rank 0 and adds them there.
    fn gather_sum(&self, parts: Vec<Tensor<3>>) -> Tensor<3> {
        let root = &self.devices[0];
        let mut parts = parts.into_iter();
        let first = parts.next().expect("a tensor-parallel layer has at least one rank");
        parts.fold(first, |sum, part| {
            self.count(bytes_of(&part));
            sum + part.to_device(root)
        })
    }

    /// Burn's collective: every rank's all-reduce is submitted before any is resolved (the
    /// submits do not block; cubecl's own test drives its ranks this way from one thread).
    fn all_reduce(&self, parts: Vec<Tensor<3>>) -> Vec<Tensor<3>> {
        use burn::tensor::distributed::{ReduceOperation, all_reduce};
        let n = self.devices.len() as u64;
        if let Some(first) = parts.first() {
            self.count(2 * (n - 1) * bytes_of(first));
        }
        let pending: Vec<_> =
            parts.into_iter().map(|p| all_reduce(p, ReduceOperation::Sum, self.devices.clone())).collect();
        pending.into_iter().map(|c| c.resolve()).collect()
    }
}
