//! The host side of the flash-attention kernel: the tile plan from the device's limits, and the
//! launch.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::{Config, flash_attention_kernel};
use crate::fused::attention::{GpuPrefill, MASK_LIMIT, gpu_prefill};
use crate::fused::cube_attention::broadcast_strides;

/// `(query rows, keys)` per tile, in order of preference: more rows reuse each staged key and
/// value for more queries; the first whose shared memory fits the device is taken.
const TILES: [(usize, usize); 9] = [(64, 32), (32, 32), (32, 16), (16, 16), (8, 16), (8, 8), (4, 8), (2, 8), (1, 8)];
/// Most units per cube (wgpu guarantees 256 invocations per workgroup).
const MAX_THREADS: usize = 256;

/// Bytes of shared memory a launch of `cfg` with vectors of `width` uses.
fn shared_bytes(cfg: &Config, width: usize) -> usize {
    let tiles = (cfg.rows + cfg.keys) * cfg.pitch() * width + cfg.rows * (cfg.keys + 1) + 2 * cfg.threads;
    4 * (tiles + 2 * cfg.threads + cfg.rows)
}

/// The tile shape for `rows_total` query rows per KV head (`group · s`) of `head_dim`, loaded in
/// vectors of `width`, on a device with `max_shared` bytes of shared memory and `max_units`
/// units per cube; `None` when not even the smallest tile fits.
pub(in crate::fused) fn plan(
    head_dim: usize,
    width: usize,
    rows_total: usize,
    max_shared: usize,
    max_units: usize,
) -> Option<Config> {
    let vec_dims = head_dim / width;
    let units = MAX_THREADS.min(max_units);
    TILES
        .iter()
        // A tile at least twice the step's rows would leave most of its units idle.
        .filter(|(rows, _)| *rows == 1 || rows / 2 < rows_total)
        .filter_map(|&(rows, keys)| {
            let lanes = (units / rows).min(keys);
            (lanes > 0).then(|| Config {
                rows,
                keys,
                lanes,
                threads: rows * lanes,
                keys_per_unit: keys / lanes,
                vec_dims,
                dims_per_unit: vec_dims.div_ceil(lanes),
            })
        })
        .find(|cfg| shared_bytes(cfg, width) <= max_shared)
}

/// `t` with a contiguous last axis (a copy only when it is not).
fn rows_contiguous(t: CubeTensor) -> CubeTensor {
    if t.meta.strides()[3] == 1 { t } else { into_contiguous(t) }
}

/// Whether `t` can be read in vectors of 4: its row strides and its start are multiples of 4.
fn reads_by_four(t: &CubeTensor) -> bool {
    let strides = t.meta.strides();
    let aligned = t.handle.offset_start.unwrap_or(0).is_multiple_of(4 * t.dtype.size() as u64);
    aligned && strides[..3].iter().all(|s| s.is_multiple_of(4))
}

/// How one launch runs: the tile shape and the vector width of the loads.
pub(in crate::fused) struct FlashPlan {
    cfg: Config,
    width: usize,
}

/// The plan for attention of `q` over `k`/`v` (shapes validated by the caller) on their
/// device: vectors of 4 when the head dim, strides and starts allow (a tensor whose head dim is
/// not contiguous is copied first, which makes it so), else of 1; `None` when not even the
/// smallest tile fits the device's shared memory.
pub(in crate::fused) fn flash_plan(q: &CubeTensor, k: &CubeTensor, v: &CubeTensor) -> Option<FlashPlan> {
    let [_, heads, s, d] = q.shape().dims::<4>();
    let group = heads / k.shape().dims::<4>()[1];
    let by_four = |t: &CubeTensor| t.meta.strides()[3] != 1 || reads_by_four(t);
    let width = if d.is_multiple_of(4) && [q, k, v].into_iter().all(by_four) { 4 } else { 1 };
    let hardware = &q.client.properties().hardware;
    let cfg = plan(d, width, group * s, hardware.max_shared_memory_size, hardware.max_units_per_cube as usize)?;
    Some(FlashPlan { cfg, width })
}

/// The flash-attention launch of [`FusedOps::fused_prefix_attention`](crate::fused::ops::FusedOps)
/// with a plan from [`flash_plan`] (shapes validated by the caller): returns `[b, s, heads, d]`.
pub(in crate::fused) fn flash_attention(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    bias: CubeTensor,
    len: usize,
    scale: f32,
    FlashPlan { cfg, width }: FlashPlan,
) -> CubeTensor {
    let [b, heads, s, d] = q.shape().dims::<4>();
    let kv_heads = k.shape().dims::<4>()[1];
    let group = heads / kv_heads;
    let (q, k, v) = (rows_contiguous(q), rows_contiguous(k), rows_contiguous(v));
    let client = q.client.clone();
    let out = empty_device_dtype(client.clone(), q.device.clone(), Shape::new([b, s, heads, d]), q.dtype);
    let tiles = (group * s).div_ceil(cfg.rows);
    let total = b * kv_heads * tiles;
    if total == 0 || d == 0 {
        return out;
    }
    let strides = |t: &CubeTensor| {
        let st = t.meta.strides();
        [st[0], st[1], st[2]]
    };
    let ([q_sb, q_sh, q_ss], [k_sb, k_sh, k_ss], [v_sb, v_sh, v_ss]) = (strides(&q), strides(&k), strides(&v));
    let [bias_sb, _, bias_ss, bias_st] = broadcast_strides(&bias);
    let every_tile = u32::from(gpu_prefill() == GpuPrefill::FlashEveryTile);
    let cube_dim = CubeDim::new_1d(cfg.threads as u32);
    let cube_count = calculate_cube_count_elemwise(&client, total * cfg.threads, cube_dim);
    let dtypes = [dtype_to_storage_type(q.dtype), dtype_to_storage_type(bias.dtype)];
    // SAFETY: the caller validated the shapes (`k`/`v` hold at least `len` slots, `bias` has `len`
    // keys and broadcasts to `[b, 1, s, len]`); the kernel reads keys below `len` and rows below
    // `group · s` only, writes each row of `out` once, and cubes past `total` return at once.
    unsafe {
        flash_attention_kernel::launch_unchecked(
            &client,
            cube_count,
            cube_dim,
            width,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            bias.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            q_sb,
            q_sh,
            q_ss,
            k_sb,
            k_sh,
            k_ss,
            v_sb,
            v_sh,
            v_ss,
            bias_sb,
            bias_ss,
            bias_st,
            s,
            kv_heads,
            group,
            len,
            scale,
            MASK_LIMIT,
            every_tile,
            tiles,
            total,
            cfg,
            dtypes,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan takes the largest tile that fits, shrinks it for large head dims and small
    /// shared memories, never exceeds the device's units, and gives up only when nothing fits.
    #[test]
    fn plan_fits_the_device() {
        let cfg = plan(128, 4, 4096, 49152, 1024).expect("fits 48 KiB");
        assert_eq!((cfg.rows, cfg.keys, cfg.threads, cfg.keys_per_unit, cfg.dims_per_unit), (32, 32, 256, 4, 4));
        let cfg = plan(64, 4, 4096, 49152, 1024).expect("fits 48 KiB");
        assert_eq!((cfg.rows, cfg.lanes), (64, 4));
        for (d, width) in [(16, 4), (80, 4), (256, 4), (30, 1), (272, 4)] {
            for max_shared in [16384, 32768, 49152] {
                for max_units in [64, 256, 1024] {
                    let what = format!("d {d} width {width} shared {max_shared} units {max_units}");
                    let cfg = plan(d, width, 4096, max_shared, max_units).unwrap_or_else(|| panic!("{what}"));
                    assert!(shared_bytes(&cfg, width) <= max_shared, "{what}");
                    assert!(cfg.threads <= max_units && cfg.threads == cfg.rows * cfg.lanes, "{what}");
                    assert_eq!(cfg.keys_per_unit * cfg.lanes, cfg.keys, "{what}");
                    assert!(cfg.dims_per_unit * cfg.lanes >= d / width, "{what}");
                }
            }
        }
        // 17 rows: no tile of 64.
        assert_eq!(plan(64, 4, 17, 49152, 1024).map(|c| c.rows), Some(32));
        assert_eq!(plan(4096, 4, 4096, 16384, 256), None);
    }
}
