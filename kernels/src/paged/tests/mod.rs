//! Cache writes read back exactly (skipped slots untouched, clones keep their contents), block
//! copy/write/read round trips, paged attention equal to dense attention computed with plain
//! Burn ops on the gathered keys, GPU kernels equal to their Flex twins, in-place writes, and
//! argument errors. Block tables, context lengths and data are drawn at random (seeded).

use burn::tensor::activation::softmax;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;

pub(super) type Rng8 = rand_chacha::ChaCha8Rng;

use crate::test_devices::devices;
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
use crate::test_devices::gpu_device;

mod arguments;

pub(super) fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

pub(super) fn random(rng: &mut Rng8, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

pub(super) fn tensor<const D: usize>(data: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// Host model of `reshape_and_cache`.
fn scatter_host(cache: &mut [f32], new: &[f32], slots: &[u32], [_, kv_heads, block_size, head_dim]: [usize; 4]) {
    for (t, &slot) in slots.iter().enumerate() {
        if slot == SKIP_SLOT {
            continue;
        }
        let (block, offset) = (slot as usize / block_size, slot as usize % block_size);
        for h in 0..kv_heads {
            for d in 0..head_dim {
                cache[((block * kv_heads + h) * block_size + offset) * head_dim + d] =
                    new[(t * kv_heads + h) * head_dim + d];
            }
        }
    }
}

/// Written slots hold the new values, skipped tokens and every other slot keep the old ones, a
/// clone taken before the write keeps the old contents, and the `&mut` form does the same.
#[test]
fn reshape_and_cache_writes_slots_and_skips() {
    let mut rng = Rng8::seed_from_u64(1);
    let shape = [6, 2, 4, 8];
    let n: usize = shape.iter().product();
    for device in devices() {
        let old = random(&mut rng, n);
        let new = random(&mut rng, 5 * 2 * 8);
        let slots = [3, SKIP_SLOT, 17, 0, 23];
        let mut expected = old.clone();
        scatter_host(&mut expected, &new, &slots, shape);

        let cache = tensor(old.clone(), shape, &device);
        let kept = cache.clone();
        let written = reshape_and_cache(cache, tensor(new.clone(), [5, 2, 8], &device), &slots).unwrap();
        assert_eq!(values(written), expected, "{device:?}");
        assert_eq!(values(kept), old, "{device:?}: a clone saw the write");

        let mut cache = tensor(old.clone(), shape, &device);
        reshape_and_cache_mut(&mut cache, tensor(new.clone(), [5, 2, 8], &device), &slots).unwrap();
        assert_eq!(values(cache.clone()), expected, "{device:?}");
        // Every token skipped: nothing changes.
        reshape_and_cache_mut(&mut cache, tensor(new, [5, 2, 8], &device), &[SKIP_SLOT; 5]).unwrap();
        assert_eq!(values(cache), expected, "{device:?}");
    }
}

/// Many tokens over several steps, in random slots of a larger cache, with non-contiguous input
/// (a transposed view): the cache equals the host model after every step.
#[test]
fn reshape_and_cache_over_many_steps() {
    let mut rng = Rng8::seed_from_u64(2);
    for device in devices() {
        let shape = [9, 4, 16, 16];
        let n: usize = shape.iter().product();
        let mut host = random(&mut rng, n);
        let mut cache = tensor(host.clone(), shape, &device);
        let mut free: Vec<u32> = (0..(9 * 16) as u32).collect();
        free.shuffle(&mut rng);
        for step in 0..6 {
            let tokens = [1, 7, 16, 3, 20, 1][step];
            let slots: Vec<u32> = (0..tokens).map(|_| free.pop().unwrap()).collect();
            let new = random(&mut rng, tokens * 4 * 16);
            scatter_host(&mut host, &new, &slots, shape);
            // Build `new` as a transposed view of a [Hkv, T, D] tensor.
            let mut heads_first = vec![0f32; new.len()];
            for t in 0..tokens {
                for h in 0..4 {
                    heads_first[(h * tokens + t) * 16..][..16].copy_from_slice(&new[(t * 4 + h) * 16..][..16]);
                }
            }
            let new = tensor(heads_first, [4, tokens, 16], &device).swap_dims(0, 1);
            reshape_and_cache_mut(&mut cache, new, &slots).unwrap();
            assert_eq!(values(cache.clone()), host, "{device:?} step {step}");
        }
    }
}

/// `copy_blocks` copies every pair (one source to several destinations), `write_blocks` then
/// `read_blocks` gives the written blocks back, and untouched blocks keep their values.
#[test]
fn copy_write_and_read_blocks_round_trip() {
    let mut rng = Rng8::seed_from_u64(3);
    let shape = [8, 2, 4, 16];
    let len = 2 * 4 * 16;
    for device in devices() {
        let old = random(&mut rng, 8 * len);
        let cache = tensor(old.clone(), shape, &device);
        let pairs = [(1, 4), (1, 5), (0, 2), (7, 6)];
        let cache = copy_blocks(cache, &pairs).unwrap();
        let mut expected = old.clone();
        for &(s, d) in &pairs {
            expected.copy_within(s as usize * len..(s as usize + 1) * len, d as usize * len);
        }
        assert_eq!(values(cache.clone()), expected, "{device:?}");

        let swapped_in = random(&mut rng, 2 * len);
        let mut cache = cache;
        write_blocks_mut(&mut cache, &[3, 0], tensor(swapped_in.clone(), [2, 2, 4, 16], &device)).unwrap();
        expected[3 * len..4 * len].copy_from_slice(&swapped_in[..len]);
        expected[..len].copy_from_slice(&swapped_in[len..]);
        assert_eq!(values(cache.clone()), expected, "{device:?}");

        let out = read_blocks(&cache, &[3, 0, 4]).unwrap();
        assert_eq!(out.dims(), [3, 2, 4, 16]);
        assert_eq!(values(out), [&swapped_in[..], &expected[4 * len..5 * len]].concat(), "{device:?}");

        // Swap out, then in again elsewhere: the block moves unchanged.
        let host = read_blocks(&cache, &[5]).unwrap().into_data();
        let cache = write_blocks(cache, &[7], Tensor::from_data(host, &device)).unwrap();
        let both = values(read_blocks(&cache, &[5, 7]).unwrap());
        assert_eq!(both[..len], both[len..]);
        assert_eq!(both[..len], old[len..2 * len]);

        // Nothing to do: empty pair, id and block lists.
        let cache = copy_blocks(cache, &[]).unwrap();
        let cache = write_blocks(cache, &[], Tensor::zeros([0, 2, 4, 16], &device)).unwrap();
        assert_eq!(read_blocks(&cache, &[]).unwrap().dims(), [0, 2, 4, 16]);
        assert_eq!(values(read_blocks(&cache, &[5]).unwrap()), old[len..2 * len]);
    }
}

/// One batch of paged-attention inputs: caches, block tables and queries.
pub(super) struct Batch {
    pub(super) shape: [usize; 4],
    pub(super) heads: usize,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) tables: Vec<u32>,
    pub(super) max_blocks: usize,
    pub(super) query_seq: Vec<u32>,
    pub(super) context_lens: Vec<u32>,
}

impl Batch {
    /// Sequences of lengths `lens` in shuffled physical blocks (unused table entries are
    /// `u32::MAX`, never read); every sequence gets a decode query at its full length, sequence
    /// `prefill` also gets `prefill_len` prefill queries with increasing context lengths ending
    /// just before it, and one query has an empty context.
    pub(super) fn new(
        rng: &mut Rng8,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        lens: &[usize],
        prefill: usize,
    ) -> Self {
        let max_blocks = lens.iter().map(|l| l.div_ceil(block_size)).max().unwrap_or(0).max(1) + 1;
        let needed: usize = lens.iter().map(|l| l.div_ceil(block_size)).sum();
        let num_blocks = needed + 3;
        let mut physical: Vec<u32> = (0..num_blocks as u32).collect();
        physical.shuffle(rng);
        let mut tables = vec![u32::MAX; lens.len() * max_blocks];
        for (s, len) in lens.iter().enumerate() {
            for b in 0..len.div_ceil(block_size) {
                tables[s * max_blocks + b] = physical.pop().unwrap();
            }
        }
        let (mut query_seq, mut context_lens) = (vec![], vec![]);
        let prefill_len = lens[prefill].min(5);
        for i in 0..prefill_len {
            query_seq.push(prefill as u32);
            context_lens.push((lens[prefill] - prefill_len + 1 + i) as u32);
        }
        for (s, &len) in lens.iter().enumerate() {
            query_seq.push(s as u32);
            context_lens.push(len as u32);
        }
        query_seq.push(0);
        context_lens.push(0);
        let shape = [num_blocks, kv_heads, block_size, head_dim];
        let n: usize = shape.iter().product();
        let tokens = query_seq.len();
        // Queries scaled up so that the softmax is far from uniform.
        let q = random(rng, tokens * heads * head_dim).iter().map(|x| x * 3.0).collect();
        Batch { shape, heads, k: random(rng, n), v: random(rng, n), q, tables, max_blocks, query_seq, context_lens }
    }

    pub(super) fn tokens(&self) -> usize {
        self.query_seq.len()
    }

    pub(super) fn scale(&self) -> f32 {
        1.0 / (self.shape[3] as f32).sqrt()
    }

    pub(super) fn run(&self, device: &Device) -> Tensor<3> {
        self.run_as(device, DType::F32)
    }

    /// [`Batch::run`] with every float operand in `dtype`.
    pub(super) fn run_as(&self, device: &Device, dtype: DType) -> Tensor<3> {
        let q = tensor(self.q.clone(), [self.tokens(), self.heads, self.shape[3]], device).cast(dtype);
        let k = tensor(self.k.clone(), self.shape, device).cast(dtype);
        let v = tensor(self.v.clone(), self.shape, device).cast(dtype);
        paged_attention(q, &k, &v, &self.tables, self.max_blocks, &self.query_seq, &self.context_lens, self.scale())
            .unwrap()
    }

    /// Dense attention with plain Burn ops: gather each query's keys and values into contiguous
    /// tensors (slot-major cache, `select` by slot, repeat kv heads), matmul, softmax, matmul.
    pub(super) fn reference(&self, device: &Device) -> Tensor<3> {
        let [num_blocks, kv_heads, block_size, head_dim] = self.shape;
        let heads = self.heads;
        let by_slot = |data: &[f32]| {
            tensor(data.to_vec(), self.shape, device).swap_dims(1, 2).reshape([
                num_blocks * block_size,
                kv_heads,
                head_dim,
            ])
        };
        let (k, v) = (by_slot(&self.k), by_slot(&self.v));
        let group = heads / kv_heads;
        let kv_of_head: Vec<i64> = (0..heads).map(|h| (h / group) as i64).collect();
        let kv_of_head = Tensor::<1, Int>::from_data(TensorData::new(kv_of_head, [heads]), device);
        let q = tensor(self.q.clone(), [self.tokens(), heads, head_dim], device);
        let mut rows = vec![];
        for t in 0..self.tokens() {
            let n = self.context_lens[t] as usize;
            if n == 0 {
                rows.push(Tensor::zeros([1, heads, head_dim], device));
                continue;
            }
            let table = &self.tables[self.query_seq[t] as usize * self.max_blocks..];
            let slots: Vec<i64> =
                (0..n).map(|p| (table[p / block_size] as usize * block_size + p % block_size) as i64).collect();
            let slots = Tensor::<1, Int>::from_data(TensorData::new(slots, [n]), device);
            let gather =
                |c: &Tensor<3>| c.clone().select(0, slots.clone()).select(1, kv_of_head.clone()).swap_dims(0, 1);
            let (kt, vt) = (gather(&k), gather(&v)); // [H, n, D]
            let qt = q.clone().narrow(0, t, 1).swap_dims(0, 1); // [H, 1, D]
            let p = softmax(qt.matmul(kt.swap_dims(1, 2)) * self.scale(), 2);
            rows.push(p.matmul(vt).swap_dims(0, 1));
        }
        Tensor::cat(rows, 0)
    }
}

/// Within 1e-4 of the largest reference value (relative, at least absolute 1e-4).
pub(super) fn assert_close(found: &[f32], reference: &[f32], what: &str) {
    assert_eq!(found.len(), reference.len(), "{what}");
    let scale = reference.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
    for (i, (a, b)) in found.iter().zip(reference).enumerate() {
        assert!(a.is_finite() && (a - b).abs() <= 1e-4 * scale.max(1.0), "{what}: element {i}: {a} vs {b}");
    }
}

/// The cases of the attention tests: (heads, kv heads, head dim, block size, sequence lengths).
/// GQA and MHA, head dims 16 and 64, block sizes 4 and 16, lengths 1, block boundaries and
/// lengths longer than one key tile, and head dims that are not a power of two or exceed one
/// cube's threads (several output dims per thread on the GPU).
pub(super) const CASES: [(usize, usize, usize, usize, &[usize]); 7] = [
    (4, 2, 16, 4, &[1, 4, 9, 37]),
    (4, 4, 16, 16, &[16, 1, 33]),
    (4, 2, 64, 16, &[70, 32, 1, 17]),
    (4, 4, 64, 4, &[8, 5, 129]),
    (8, 2, 64, 16, &[64, 300]),
    (2, 1, 80, 4, &[3, 12, 41]),
    (2, 2, 272, 4, &[1, 6, 300]),
];

/// Paged attention equals dense attention on the gathered keys for every case, on every device:
/// decode and prefill queries, empty contexts (zeros), GQA and MHA.
#[test]
fn paged_attention_equals_dense_reference() {
    let mut rng = Rng8::seed_from_u64(4);
    for device in devices() {
        for (i, &(heads, kv_heads, head_dim, block_size, lens)) in CASES.iter().enumerate() {
            let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, i % lens.len());
            let found = values(batch.run(&device));
            let reference = values(batch.reference(&device));
            assert_close(&found, &reference, &format!("{device:?} case {i}"));
            let d = head_dim * heads;
            assert!(found[found.len() - d..].iter().all(|&x| x == 0.0), "empty context must give zeros");
        }
    }
}

/// The GPU kernels agree with the Flex twins on the same inputs: attention within 1e-5
/// (relative), cache writes exactly.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn cube_kernels_equal_flex_twins() {
    let Some(gpu) = gpu_device() else { return };
    let cpu = Device::flex();
    let mut rng = Rng8::seed_from_u64(5);
    for (i, &(heads, kv_heads, head_dim, block_size, lens)) in CASES.iter().enumerate() {
        let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, 0);
        let (a, b) = (values(batch.run(&cpu)), values(batch.run(&gpu)));
        let scale = a.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * scale.max(1.0), "case {i}: flex {x} vs gpu {y}");
        }

        let tokens = 7;
        let new = random(&mut rng, tokens * kv_heads * head_dim);
        let num_slots = (batch.shape[0] * block_size) as u32;
        let mut slots: Vec<u32> = (0..num_slots).collect();
        slots.shuffle(&mut rng);
        slots.truncate(tokens);
        slots[2] = SKIP_SLOT;
        let pairs = [(0u32, batch.shape[0] as u32 - 1)];
        let write = |d: &Device| {
            let cache = tensor(batch.k.clone(), batch.shape, d);
            let cache = reshape_and_cache(cache, tensor(new.clone(), [tokens, kv_heads, head_dim], d), &slots).unwrap();
            values(copy_blocks(cache, &pairs).unwrap())
        };
        assert_eq!(write(&cpu), write(&gpu), "case {i}: cache writes differ");
    }
}

/// More (query, head) cubes than one grid dimension holds (65 535): 2 100 queries × 32 heads,
/// each with a short context; the GPU result equals the Flex twin.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn many_queries_exceed_one_grid_dimension() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = Rng8::seed_from_u64(9);
    let (tokens, heads, kv_heads, head_dim, block_size) = (2100, 32, 8, 16, 4);
    let shape = [3, kv_heads, block_size, head_dim];
    let n: usize = shape.iter().product();
    let batch = Batch {
        shape,
        heads,
        k: random(&mut rng, n),
        v: random(&mut rng, n),
        q: random(&mut rng, tokens * heads * head_dim),
        tables: vec![2, 0],
        max_blocks: 2,
        query_seq: vec![0; tokens],
        context_lens: (0..tokens).map(|t| (t % 8) as u32 + 1).collect(),
    };
    let (a, b) = (values(batch.run(&Device::flex())), values(batch.run(&gpu)));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-5, "element {i}: flex {x} vs gpu {y}");
    }
}

/// A decode batch of many sequences, each a different random length, in one launch; and a
/// long-context query whose scores would overflow `exp` without max subtraction.
#[test]
fn paged_attention_decode_batch_and_large_scores() {
    let mut rng = Rng8::seed_from_u64(6);
    for device in devices() {
        let lens: Vec<usize> = (0..12).map(|_| rng.random_range(1..90)).collect();
        let mut batch = Batch::new(&mut rng, 4, 2, 16, 16, &lens, 3);
        assert_close(
            &values(batch.run(&device)),
            &values(batch.reference(&device)),
            &format!("{device:?} decode batch"),
        );
        // Scores in the hundreds: exp would overflow f32 without max subtraction.
        batch.q.iter_mut().for_each(|x| *x *= 100.0);
        let found = values(batch.run(&device));
        assert_close(&found, &values(batch.reference(&device)), &format!("{device:?} large scores"));
    }
}

/// Flex writes into a uniquely owned cache's own buffer (no copy) and copies a shared one,
/// leaving the other owner's contents alone.
#[cfg(feature = "flex")]
#[test]
fn flex_writes_in_place_when_unique() {
    use burn::backend::Flex;
    use burn::backend::flex::FlexTensor;
    use ops::PagedKvOps;

    let shape = [4, 2, 4, 8];
    let n: usize = shape.iter().product();
    let flex = |data: Vec<f32>, shape: Vec<usize>| FlexTensor::from_data(TensorData::new(data, shape));
    let slots = || FlexTensor::from_data(TensorData::new(vec![5u32, 9], [2]));
    let cache = flex(vec![0.0; n], shape.to_vec());
    let before = cache.bytes().as_ptr();
    let cache = <Flex as PagedKvOps>::reshape_and_cache(cache, flex(vec![1.0; 32], vec![2, 2, 8]), slots());
    assert_eq!(cache.bytes().as_ptr(), before, "a uniquely owned cache was copied");
    let pairs = FlexTensor::from_data(TensorData::new(vec![1u32, 2], [1, 2]));
    let cache = <Flex as PagedKvOps>::copy_blocks(cache, pairs);
    assert_eq!(cache.bytes().as_ptr(), before, "copy_blocks copied the cache");
    let ids = FlexTensor::from_data(TensorData::new(vec![3u32], [1]));
    let cache = <Flex as PagedKvOps>::write_blocks(cache, ids, flex(vec![2.0; n / 4], vec![1, 2, 4, 8]));
    assert_eq!(cache.bytes().as_ptr(), before, "write_blocks copied the cache");

    let shared = cache.clone();
    let written = <Flex as PagedKvOps>::reshape_and_cache(cache, flex(vec![7.0; 32], vec![2, 2, 8]), slots());
    assert_ne!(written.bytes().as_ptr(), shared.bytes().as_ptr());
    let (a, b) = (written.into_data().try_to_vec::<f32>().unwrap(), shared.into_data().try_to_vec::<f32>().unwrap());
    assert_eq!(a.iter().filter(|&&x| x == 7.0).count(), 32);
    assert!(!b.contains(&7.0));
}

/// On the GPU a uniquely owned cache is written in place: rewriting a 64 MiB cache many times
/// never makes the allocator reserve room for a second copy, while a write to a shared cache
/// (the control) does.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn gpu_writes_in_place_when_unique() {
    let Some(device) = gpu_device() else { return };
    let shape = [256, 4, 64, 256];
    let bytes = (shape.iter().product::<usize>() * 4) as u64;
    let reserved = || {
        device.sync().unwrap();
        device.memory_pool_usage().map(|u| u.bytes_reserved).unwrap_or(0)
    };
    let mut cache = Tensor::<4>::from_data(TensorData::new(vec![0.5f32; bytes as usize / 4], shape), &device);
    // The same writes on a small cache first: the allocator's first pages for the step's small
    // tensors (new K/V rows, slots, block pairs) are then in `start`. NVIDIA's Vulkan driver got
    // ~98 MiB of them on an H200, which a cache of 64 MiB cannot tell from a copy.
    let mut small = Tensor::<4>::zeros([2, shape[1], shape[2], shape[3]], &device);
    reshape_and_cache_mut(&mut small, Tensor::<3>::full([2, 4, 256], 1.0, &device), &[0, 1]).unwrap();
    copy_blocks_mut(&mut small, &[(0, 1)]).unwrap();
    let start = reserved();
    for step in 0..8u32 {
        let new = Tensor::<3>::full([2, 4, 256], step as f32, &device);
        reshape_and_cache_mut(&mut cache, new, &[step * 3, 1000 + step]).unwrap();
        copy_blocks_mut(&mut cache, &[(0, 100 + step)]).unwrap();
    }
    let in_place = reserved();
    eprintln!("reserved: start {start}, after in-place writes {in_place}, cache {bytes}");
    assert!(in_place < start + bytes / 2, "reserved grew from {start} to {in_place} bytes: the cache was copied");
    let slice = values(read_blocks(&cache, &[100 + 7]).unwrap());
    assert!(slice.contains(&7.0));

    // Control: with a clone alive the write must copy, so the measurement can see a copy.
    let shared = cache.clone();
    let copied = reshape_and_cache(cache, Tensor::<3>::full([1, 4, 256], 9.0, &device), &[5]).unwrap();
    let after = reserved();
    eprintln!("reserved after a shared write: {after}");
    assert!(after >= in_place + bytes / 2, "control: reserved went from {in_place} to {after} bytes");
    assert!(!values(read_blocks(&shared, &[0]).unwrap()).contains(&9.0));
    assert!(values(read_blocks(&copied, &[0]).unwrap()).contains(&9.0));
}

/// The per-step forms: one [`SlotMapping`] and one [`PagedBatch`] serve the K and V caches of two
/// layers and give the same results as the slice-taking forms; inputs that do not fit them are
/// errors.
#[test]
fn per_step_inputs_serve_every_layer() {
    let mut rng = Rng8::seed_from_u64(7);
    for device in devices() {
        let batch = Batch::new(&mut rng, 4, 2, 16, 4, &[5, 9, 13], 1);
        let [num_blocks, kv_heads, block_size, head_dim] = batch.shape;
        let mut slots: Vec<u32> = (0..(num_blocks * block_size) as u32).collect();
        slots.shuffle(&mut rng);
        slots.truncate(3);
        slots.push(SKIP_SLOT);
        let mapping = SlotMapping::new(&slots, &device).unwrap();
        assert_eq!(mapping.tokens(), 4);
        let step = PagedBatch::new(
            &batch.tables,
            batch.max_blocks,
            block_size,
            &batch.query_seq,
            &batch.context_lens,
            &device,
        )
        .unwrap();
        assert_eq!(step.tokens(), batch.tokens());
        let q_shape = [batch.tokens(), batch.heads, head_dim];
        for layer in 0..2 {
            let mut caches = vec![];
            for data in [&batch.k, &batch.v] {
                let new = tensor(random(&mut rng, 4 * kv_heads * head_dim), [4, kv_heads, head_dim], &device);
                let mut cache = tensor(data.clone(), batch.shape, &device);
                let expected = reshape_and_cache(cache.clone(), new.clone(), &slots).unwrap();
                reshape_and_cache_with(&mut cache, new, &mapping).unwrap();
                assert_eq!(values(cache.clone()), values(expected), "{device:?} layer {layer}");
                caches.push(cache);
            }
            let q = tensor(random(&mut rng, q_shape.iter().product()), q_shape, &device);
            let (k, v) = (&caches[0], &caches[1]);
            let with = values(paged_attention_with(q.clone(), k, v, &step, 0.25).unwrap());
            let direct =
                paged_attention(q, k, v, &batch.tables, batch.max_blocks, &batch.query_seq, &batch.context_lens, 0.25);
            assert_eq!(with, values(direct.unwrap()), "{device:?} layer {layer}");
        }
        let (k, q) = (tensor(batch.k.clone(), batch.shape, &device), tensor(batch.q.clone(), q_shape, &device));
        let other = PagedBatch::new(
            &batch.tables,
            batch.max_blocks,
            2 * block_size,
            &batch.query_seq,
            &batch.context_lens,
            &device,
        )
        .unwrap();
        assert!(matches!(paged_attention_with(q.clone(), &k, &k, &other, 1.0), Err(PagedKernelError::Shape { .. })));
        let fewer = PagedBatch::new(
            &batch.tables,
            batch.max_blocks,
            block_size,
            &batch.query_seq[1..],
            &batch.context_lens[1..],
            &device,
        )
        .unwrap();
        assert!(matches!(paged_attention_with(q, &k, &k, &fewer, 1.0), Err(PagedKernelError::Shape { .. })));
        let mut k = k;
        let three = tensor(random(&mut rng, 3 * kv_heads * head_dim), [3, kv_heads, head_dim], &device);
        assert!(matches!(reshape_and_cache_with(&mut k, three, &mapping), Err(PagedKernelError::Length { .. })));
        assert!(matches!(
            SlotMapping::new(&[1, SKIP_SLOT, 1], &device),
            Err(PagedKernelError::Duplicate { index: 1, .. })
        ));
        let none = SlotMapping::new(&[SKIP_SLOT, SKIP_SLOT], &device).unwrap();
        let two = tensor(random(&mut rng, 2 * kv_heads * head_dim), [2, kv_heads, head_dim], &device);
        let before = values(k.clone());
        reshape_and_cache_with(&mut k, two, &none).unwrap();
        assert_eq!(values(k), before);
    }
}

/// Half-precision caches (F16 everywhere, BF16 on Flex): same result as f32 within the storage
/// precision (arithmetic is f32 either way), and cache writes keep the values.
#[test]
fn half_precision_caches() {
    let mut rng = Rng8::seed_from_u64(8);
    for device in devices() {
        let batch = Batch::new(&mut rng, 4, 2, 16, 4, &[5, 20, 33], 2);
        let reference = values(batch.reference(&device));
        let dtypes: &[DType] = if device == Device::flex() { &[DType::F16, DType::BF16] } else { &[DType::F16] };
        for &dtype in dtypes {
            let out = batch.run_as(&device, dtype);
            assert_eq!(out.dtype(), dtype);
            let found = values(out.cast(DType::F32));
            let tolerance = if dtype == DType::F16 { 1e-2 } else { 5e-2 };
            for (a, b) in found.iter().zip(&reference) {
                assert!((a - b).abs() <= tolerance, "{device:?} {dtype:?}: {a} vs {b}");
            }
            let k = tensor(batch.k.clone(), batch.shape, &device).cast(dtype);
            let new = tensor(random(&mut rng, 2 * 2 * 16), [2, 2, 16], &device).cast(dtype);
            let written = reshape_and_cache(k.clone(), new.clone(), &[0, 7]).unwrap();
            let got = values(read_blocks(&written, &[0, 1]).unwrap().cast(DType::F32));
            let want = values(new.cast(DType::F32));
            // Slot 0: block 0, offset 0; slot 7: block 1, offset 3 (head 0 of each token).
            assert_eq!(got[..16], want[..16], "{device:?} {dtype:?}");
            assert_eq!(got[2 * 4 * 16 + 3 * 16..][..16], want[32..48], "{device:?} {dtype:?}");
        }
    }
}
