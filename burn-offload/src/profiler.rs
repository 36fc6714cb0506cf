//! Measures the hardware constants of FlexGen's cost model on the devices at hand: link
//! bandwidths, disk bandwidth through the offload store, device matmul and batched-matmul
//! throughput, CPU throughput, and (de)quantization rates. The result is cached as JSON.

use std::path::Path;
use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor, TensorData};
use burn_llm_kernels::{dequantize, quantize};

use crate::error::{OffloadError, Result};
use crate::policy::{ComputeOp, ComputeSample, HardwareProfile, IoSample, IoTaskProfile, ThreadProfile};
use crate::store::{DiskStore, HostData};

/// Forces pending work on a tensor's device to finish.
fn sync<const D: usize>(t: &Tensor<D>) {
    let _ = t.clone().sum().into_data();
}

/// Median seconds of `runs` calls of `f` after one warm-up call; `f` must leave its work
/// finished (read something back or sync).
pub fn time(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut samples: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64()
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Reads a probe tensor back from the disk tier as the runtime reads a layer's weights (see
/// `weights::read_layer`): map and validate the file, verify its checksum, copy the values out and
/// build a tensor on `host`.
fn read_probe(store: &DiskStore, name: &str, host: &Device) {
    if let Ok(t) = store.get(name)
        && let Some(v) = t.as_f32()
    {
        sync(&Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), host));
    }
}

fn matmul_flops(device: &Device, m: usize, k: usize, n: usize) -> f64 {
    let a = Tensor::<2>::random([m, k], Distribution::Uniform(-1.0, 1.0), device);
    let b = Tensor::<2>::random([k, n], Distribution::Uniform(-1.0, 1.0), device);
    let s = time(3, || sync(&a.clone().matmul(b.clone())));
    (2 * m * k * n) as f64 / s
}

fn bmm_flops(device: &Device, batch: usize, m: usize, k: usize, n: usize) -> f64 {
    let a = Tensor::<3>::random([batch, m, k], Distribution::Uniform(-1.0, 1.0), device);
    let b = Tensor::<3>::random([batch, k, n], Distribution::Uniform(-1.0, 1.0), device);
    let s = time(3, || sync(&a.clone().matmul(b.clone())));
    (2 * batch * m * k * n) as f64 / s
}

/// Profiles `device` against the host (`host`, normally `Device::flex()`) and the disk under
/// `dir`, with `mb` megabytes per transfer. Memory capacities are placeholders (1 GiB): the engine
/// replaces them with its budgets.
pub fn profile(device: &Device, host: &Device, dir: &Path, mb: usize) -> Result<HardwareProfile> {
    let values = mb * (1 << 20) / 4;
    let on_host = Tensor::<1>::random([values], Distribution::Uniform(-1.0, 1.0), host);
    sync(&on_host);
    let bytes = (values * 4) as f64;
    let to_device = time(3, || sync(&on_host.clone().to_device(device)));
    let on_device = on_host.clone().to_device(device);
    let to_host = time(3, || sync(&on_device.clone().to_device(host)));

    let mut store = DiskStore::open(dir)?;
    let data: Vec<f32> = on_host.clone().into_data().try_into_vec_as::<f32>().unwrap_or_else(|_| vec![0.0; values]);
    let write = time(2, || {
        let _ = store.put("profile/probe", HostData::f32(&[values], &data));
    });
    let read = time(2, || read_probe(&store, "profile/probe", host));
    let _ = store.remove("profile/probe");

    let w = Tensor::<2>::random([1024, 1024], Distribution::Uniform(-1.0, 1.0), device);
    let spec = crate::policy::FLEXGEN_WEIGHTS;
    let quant_s = time(3, || {
        if let Ok(q) = quantize(w.clone(), spec) {
            sync(&q.scale);
        }
    });
    let wq = quantize(w.clone(), spec).ok();
    let dequant_s = time(3, || {
        if let Some(q) = &wq {
            sync(&dequantize(q));
        }
    });
    let w_host = w.clone().to_device(host);
    let cpu_quant_s = time(3, || {
        if let Ok(q) = quantize(w_host.clone(), spec) {
            sync(&q.scale);
        }
    });
    let layer_bytes = (1024 * 1024 * 4) as f64;
    Ok(HardwareProfile {
        name: format!("{device:?} with host {host:?}"),
        gpu_memory_bytes: 1 << 30,
        cpu_memory_bytes: 1 << 30,
        disk_memory_bytes: 1 << 40,
        cpu_to_gpu_bandwidth: bytes / to_device,
        gpu_to_cpu_bandwidth: bytes / to_host,
        disk_to_cpu_bandwidth: bytes / read,
        cpu_to_disk_bandwidth: bytes / write,
        gpu_matmul_flops: matmul_flops(device, 256, 1024, 1024),
        gpu_bmm_flops: bmm_flops(device, 32, 64, 64, 256),
        cpu_flops: bmm_flops(host, 32, 1, 64, 256),
        gpu_memory_bandwidth: None,
        cpu_attention_bandwidth: None,
        gpu_quantize_bandwidth: layer_bytes / quant_s,
        gpu_matmul_flops_by_rows: [1, 4, 16, 64, 256, 1024]
            .iter()
            .map(|&m| (m as f64, matmul_flops(device, m, 1024, 1024)))
            .collect(),
        gpu_dequantize_bandwidth: layer_bytes / dequant_s,
        cpu_quantize_bandwidth: layer_bytes / cpu_quant_s,
    })
}

/// The cached profile at `path`, or a fresh one (saved there).
pub fn load_or_profile(path: &Path, device: &Device, host: &Device, dir: &Path) -> Result<HardwareProfile> {
    if let Ok(profile) = HardwareProfile::load_json(path) {
        return Ok(profile);
    }
    let profile = profile(device, host, dir, 64)?;
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = profile.save_json(path);
    Ok(profile)
}

/// Seconds of `f` run `runs` times (median) inside a rayon pool of `threads` threads.
fn time_in(threads: u32, runs: usize, mut f: impl FnMut() + Send) -> Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads as usize)
        .build()
        .map_err(|e| OffloadError::Config(format!("cannot build a thread pool: {e}")))?;
    Ok(pool.install(|| time(runs, &mut f)))
}

/// LM-Offload's one-time thread profile (input of Algorithm 3, [`crate::policy::choose_threads`]):
/// the three dependent operators of CPU attention in decode (scores, softmax, weighted sum) for
/// `batch` sequences of `context` cached tokens, and the weight-load task (a disk-tier read of
/// `layer_bytes` into a tensor), each timed with 1 to all hardware threads.
pub fn profile_threads(
    host: &Device,
    dir: &Path,
    batch: usize,
    context: usize,
    layer_bytes: usize,
) -> Result<ThreadProfile> {
    let max_threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let (heads, head_dim) = (12, 64);
    let q = Tensor::<4>::random([batch, heads, 1, head_dim], Distribution::Uniform(-1.0, 1.0), host);
    let k = Tensor::<4>::random([batch, heads, context, head_dim], Distribution::Uniform(-1.0, 1.0), host);
    let v = Tensor::<4>::random([batch, heads, context, head_dim], Distribution::Uniform(-1.0, 1.0), host);
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3));
    let probs = burn::tensor::activation::softmax(scores.clone(), 3);
    let mut compute_samples = Vec::new();
    for threads in 1..=max_threads {
        let op_seconds = vec![
            time_in(threads, 3, || sync(&q.clone().matmul(k.clone().swap_dims(2, 3))))?,
            time_in(threads, 3, || sync(&burn::tensor::activation::softmax(scores.clone(), 3)))?,
            time_in(threads, 3, || sync(&probs.clone().matmul(v.clone())))?,
        ];
        compute_samples.push(ComputeSample { intra_op_threads: threads, op_seconds });
    }
    let mut store = DiskStore::open(dir)?;
    let values = (layer_bytes / 4).max(1);
    let data = vec![0.5f32; values];
    store.put("threads/probe", HostData::f32(&[values], &data))?;
    let mut samples = Vec::new();
    for threads in 1..=max_threads {
        let seconds = time_in(threads, 3, || read_probe(&store, "threads/probe", host))?;
        samples.push(IoSample { threads, seconds });
    }
    let _ = store.remove("threads/probe");
    let op = |name: &str, deps: Vec<usize>| ComputeOp { name: name.into(), deps };
    Ok(ThreadProfile {
        max_threads,
        compute_ops: vec![op("scores", vec![]), op("softmax", vec![0]), op("weighted sum", vec![1])],
        compute_samples,
        io_tasks: vec![IoTaskProfile { name: "load weights".into(), bytes: layer_bytes as f64, samples }],
    })
}
