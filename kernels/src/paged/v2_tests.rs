//! PagedAttention v2 on the GPU runtime under test equals the Flex twin: contexts over several
//! partitions (a partial last one, a boundary inside a block, exactly one partition), grouped
//! query attention with 1 to 16 query heads per KV head, head dims 16 to 272 and one not
//! divisible by 4 (the scalar path), f32 and f16, empty contexts, the single-pass form for
//! batches that fill the GPU, and the quantized row loader over long contexts.

use burn::tensor::{DType, Device};
use rand::SeedableRng;

use super::cube_v2::{PARTITION, partitions};
use super::quant_tests::{spec, written};
use super::tests::{Batch, Rng8, tensor, values};
use super::*;
use crate::test_devices::gpu_device;

/// (heads, kv heads, head dim, block size, sequence lengths).
const LONG_CASES: [(usize, usize, usize, usize, &[usize]); 7] = [
    // MHA; 1100 = two partitions and a partial third, 513 and 512 either side of one boundary.
    (4, 4, 64, 16, &[1100, 513, 512, 2]),
    // Two query heads per KV head; 12-token blocks put partition boundaries inside blocks.
    (8, 4, 80, 12, &[1300, 600]),
    (16, 4, 128, 16, &[1537, 40]),
    // Eight per KV head, 24-token blocks.
    (32, 4, 64, 24, &[1030, 700]),
    // Sixteen per KV head: two cubes of eight heads each.
    (32, 2, 16, 16, &[900]),
    // Six per KV head, head dim 30 (not a multiple of 4: one value per load).
    (12, 2, 30, 8, &[1200, 3]),
    // Head dim 272: more vector dims than one key group's units cover at once.
    (4, 2, 272, 4, &[600]),
];

/// `batch` on `device` with every float operand in `dtype`, read back as f32.
fn run(batch: &Batch, device: &Device, dtype: DType) -> Vec<f32> {
    let out = batch.run_as(device, dtype);
    assert_eq!(out.dtype(), dtype);
    values(out.cast(DType::F32))
}

/// `found` within `tolerance` of `reference`, relative to the largest reference value (and at
/// least absolute).
fn assert_near(found: &[f32], reference: &[f32], tolerance: f32, what: &str) {
    assert_eq!(found.len(), reference.len(), "{what}");
    let scale = reference.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in found.iter().zip(reference).enumerate() {
        assert!(a.is_finite() && (a - b).abs() <= tolerance * scale, "{what}: element {i}: gpu {a} vs flex {b}");
    }
}

/// The long cases are partitioned on the GPU (the merge kernel runs), and every output, the
/// empty context's zeros included, equals the Flex twin in f32 and f16.
#[test]
fn v2_long_contexts_equal_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let flex = Device::flex();
    let mut rng = Rng8::seed_from_u64(41);
    for (i, &(heads, kv_heads, head_dim, block_size, lens)) in LONG_CASES.iter().enumerate() {
        let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, i % lens.len());
        let max_context = batch.max_blocks * block_size;
        let parts = partitions(batch.tokens() * kv_heads, batch.tokens() * heads * head_dim, max_context);
        assert!(parts > 1, "case {i}: {max_context} tokens over {} queries should be partitioned", batch.tokens());
        for (dtype, tolerance) in [(DType::F32, 1e-5), (DType::F16, 2e-3)] {
            let what = format!("case {i} {dtype:?}");
            let (a, b) = (run(&batch, &gpu, dtype), run(&batch, &flex, dtype));
            assert_near(&a, &b, tolerance, &what);
            let row = heads * head_dim;
            assert!(a[a.len() - row..].iter().all(|&x| x == 0.0), "{what}: an empty context must give zeros");
            assert!(a[..a.len() - row].iter().any(|&x| x != 0.0), "{what}: all zeros");
        }
    }
}

/// A batch with cubes enough to fill a GPU runs in one pass even over contexts longer than a
/// partition, and equals the Flex twin.
#[test]
fn v2_single_pass_over_long_contexts_equals_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let mut rng = Rng8::seed_from_u64(42);
    let (heads, kv_heads, head_dim, block_size, len) = (8, 8, 16, 16, 700);
    let queries = 130;
    let mut batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, &[len], 0);
    batch.query_seq = vec![0; queries];
    batch.context_lens = (0..queries).map(|t| (len - queries + 1 + t) as u32).collect();
    batch.q = super::tests::random(&mut rng, queries * heads * head_dim).iter().map(|x| x * 3.0).collect();
    let max_context = batch.max_blocks * block_size;
    assert_eq!(partitions(queries * kv_heads, queries * heads * head_dim, max_context), 1);
    assert!(max_context > PARTITION);
    let (a, b) = (run(&batch, &gpu, DType::F32), run(&batch, &Device::flex(), DType::F32));
    assert_near(&a, &b, 1e-5, "single pass");
}

/// The quantized row loader over contexts of several partitions: GPU equals Flex for 8 and 4
/// bits, with and without grouped-query attention.
#[test]
fn v2_quantized_long_contexts_equal_flex_twin() {
    let Some(gpu) = gpu_device() else { return };
    let flex = Device::flex();
    let mut rng = Rng8::seed_from_u64(43);
    for (heads, kv_heads, head_dim, block_size, lens) in [(8, 4, 80, 12, &[1300, 600][..]), (8, 1, 64, 16, &[1100][..])]
    {
        let batch = Batch::new(&mut rng, heads, kv_heads, head_dim, block_size, lens, 0);
        for bits in [8, 4] {
            let spec = spec(bits, head_dim);
            // Quantized once (on Flex), so both devices read the same codes.
            let (k, v) = (written(&batch.k, batch.shape, spec, &flex), written(&batch.v, batch.shape, spec, &flex));
            let attend = |device: &Device| {
                let (k, v) = (k.clone().to_device(device), v.clone().to_device(device));
                let q = tensor(batch.q.clone(), [batch.tokens(), heads, head_dim], device);
                let paged = PagedBatch::new(
                    &batch.tables,
                    batch.max_blocks,
                    block_size,
                    &batch.query_seq,
                    &batch.context_lens,
                    device,
                )
                .unwrap();
                values(paged_attention_pool(q, &k, &v, &paged, batch.scale()).unwrap())
            };
            assert_near(&attend(&gpu), &attend(&flex), 1e-5, &format!("{bits}-bit, {heads}/{kv_heads} heads"));
        }
    }
}

/// The plane-reduction path on this GPU runtime: the long-context and quantized tests again, in a
/// child process with plane reductions forced on (`BURN_LLM_PAGED_PLANE=1`; lavapipe has
/// subgroups though CubeCL does not enable them on CPU devices), which must pass.
#[test]
fn v2_plane_reductions_equal_flex_twin() {
    if gpu_device().is_none() || std::env::var_os("BURN_LLM_PAGED_PLANE").is_some() {
        return;
    }
    for test in [
        "paged::v2_tests::v2_long_contexts_equal_flex_twin",
        "paged::v2_tests::v2_quantized_long_contexts_equal_flex_twin",
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--test-threads", "1"])
            .env("BURN_LLM_PAGED_PLANE", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{test} with plane reductions:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The partition choice: one pass when the context fits a partition, when the batch alone
/// fills the GPU, or when the partition buffers would be too large; otherwise one partition per
/// 512 tokens of the longest context the block table allows.
#[test]
fn v2_partition_choice() {
    assert_eq!(partitions(8, 8 * 4096, 512), 1);
    assert_eq!(partitions(8, 8 * 4096, 513), 2);
    assert_eq!(partitions(8, 8 * 4096, 2048), 4);
    assert_eq!(partitions(4096, 4096 * 4096, 2048), 1);
    assert_eq!(partitions(64, 1 << 24, 1 << 20), 1);
}
