//! Flash attention for prefill-sized steps on every CubeCL runtime: the kernel behind
//! [`FusedOps::fused_prefix_attention`](super::ops::FusedOps) for steps of more than
//! [`GPU_MAX_QUERIES`](super::attention::GPU_MAX_QUERIES) query rows, where the decode kernel
//! (`cube_attention.rs`, one cube per query row and head) would read every key and value once
//! per row, and Burn's ops would materialize `[b, heads, s, len]` scores three times.
//!
//! - **Grid.** One cube per (sequence, KV head, tile of `rows` query rows). The rows of a KV head
//!   are its query heads' rows folded position-major (row `r` is position `r / group`, query head
//!   `r % group` of the group), so under grouped-query attention one cube serves every query head
//!   of its KV head and K/V are never repeated, and the heads of one position share its bias row.
//! - **Tiles.** The query tile is staged once in shared memory (`f32`); keys come in tiles of
//!   `keys`: a key tile is staged, every unit scores `keys / lanes` keys of its row
//!   (`lanes` units per row), the value tile replaces the key tile in the same buffer, and each
//!   unit accumulates `head_dim / lanes` output values of its row. Rows of the shared tiles are
//!   padded by one vector, so the units of a row reading different keys hit different banks.
//!   Loads are `Vector`s of 4 where the head dim and strides allow, else of 1 (the same code).
//! - **Online softmax** in `f32` (running maximum and exp-sum per row, `exp(m_old − m_new)`
//!   rescaling); the row maximum and exp-sum of a tile are reduced over the row's units through
//!   shared memory in a fixed order (no plane ops: the same code runs, and is tested, on every
//!   device).
//! - **Skipped key tiles.** A first pass scans the bias rows of the cube's positions for keys
//!   above [`MASK_LIMIT`](super::attention::MASK_LIMIT) and visits only the key tiles between the
//!   tile of the first such key and that of the last (all tiles when a row has no such key: that
//!   row weighs every key, as the Flex path does). A skipped key would have weight exactly 0 in
//!   every row that has a visible key (`exp(−1e30 − m)` is 0), and a row that saw only skipped
//!   keys before its first visible one has its sums rescaled by exactly 0, so skipping changes no
//!   bit of the result ([`GpuPrefill::FlashEveryTile`](super::GpuPrefill) turns it off to check).
//!   This covers the causal mask's upper triangle, left padding and a sliding window's past,
//!   from the bias alone, whatever mask it holds. A skipped tile still passes its barriers (they
//!   must stay in uniform control flow), but loads and computes nothing.
//!
//! Launches are unchecked: shapes were validated by [`super::prefix_attention`], keys past `len`
//! and rows past the step are never read.

use crate::paged::lane_sum;
use cubecl::prelude::*;

mod launch;

pub(super) use self::launch::{flash_attention, flash_plan};

/// The comptime shape of one flash-attention launch (chosen by `launch::plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Config {
    /// Query rows per cube.
    rows: usize,
    /// Keys per tile.
    keys: usize,
    /// Units per query row.
    lanes: usize,
    /// Units per cube (`rows · lanes`).
    threads: usize,
    /// Keys each unit scores per tile (`keys / lanes`).
    keys_per_unit: usize,
    /// `head_dim / N`: vectors per row.
    vec_dims: usize,
    /// Output vectors each unit accumulates (`vec_dims / lanes`, rounded up).
    dims_per_unit: usize,
}

impl Config {
    /// Vectors per row of the shared query and key/value tiles (one of padding).
    fn pitch(&self) -> usize {
        self.vec_dims + 1
    }
}

/// Stages rows `first..first + count` (those below `limit`; zeros for the others) of one head of
/// `src` into `dst` as `f32`, `cfg.pitch()` vectors per row. `base` and `row_stride` are in
/// elements; the head dim is contiguous.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    dst: &mut Shared<[Vector<f32, N>]>,
    base: usize,
    row_stride: usize,
    first: usize,
    limit: usize,
    #[comptime] count: usize,
    #[comptime] cfg: Config,
) {
    let mut i = UNIT_POS as usize;
    while i < comptime!(count * cfg.vec_dims) {
        let r = i / cfg.vec_dims;
        let j = i % cfg.vec_dims;
        let mut x = Vector::<f32, N>::new(f32::new(0.0));
        if first + r < limit {
            x = Vector::<f32, N>::cast_from(src[(base + (first + r) * row_stride) / N::value() + j]);
        }
        dst[r * comptime!(cfg.pitch()) + j] = x;
        i += cfg.threads;
    }
}

/// One cube per (sequence, KV head, tile of query rows); see the [module docs](self).
///
/// Element strides: `q_*` of `q` (`[b, heads, s, d]`), `k_*`/`v_*` of `k`/`v`
/// (`[b, kv_heads, slots, d]`), `bias_*` of `bias` (`[b, 1, s, len]`, `0` on broadcast axes);
/// the head dim is contiguous in all three. `out` is the contiguous `[b, s, heads, d]`.
/// `every_tile` (`1`) visits every key tile instead of those the bias leaves visible.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn flash_attention_kernel<F: Float, G: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    bias: &Tensor<G>,
    out: &mut Tensor<Vector<F, N>>,
    q_sb: usize,
    q_sh: usize,
    q_ss: usize,
    k_sb: usize,
    k_sh: usize,
    k_ss: usize,
    v_sb: usize,
    v_sh: usize,
    v_ss: usize,
    bias_sb: usize,
    bias_ss: usize,
    bias_st: usize,
    seq: usize,
    kv_heads: usize,
    group: usize,
    len: usize,
    scale: f32,
    mask_limit: f32,
    every_tile: u32,
    tiles: usize,
    total: usize,
    #[comptime] cfg: Config,
    #[define(F, G)] _dtypes: [ElemType; 2],
) {
    let cube = CUBE_POS;
    if cube >= total {
        terminate!();
    }
    let tile = cube % tiles;
    let kv_head = (cube / tiles) % kv_heads;
    let b = cube / (tiles * kv_heads);
    let unit = UNIT_POS as usize;
    let row = unit / cfg.lanes;
    let lane = unit % cfg.lanes;
    let rows_total = group * seq;
    let first_row = tile * cfg.rows;
    let mut last_row = first_row + cfg.rows - 1;
    if last_row >= rows_total {
        last_row = rows_total - 1;
    }
    let ri = first_row + row;
    let row_valid = ri < rows_total;
    let pos = ri / group;
    let head = kv_head * group + ri % group;
    let bias_row = b * bias_sb + pos * bias_ss;
    let pitch = comptime!(cfg.pitch());
    let p_pitch = comptime!(cfg.keys + 1);

    let mut q_tile = Shared::<[Vector<f32, N>]>::new_slice(comptime!(cfg.rows * cfg.pitch()));
    let mut kv_tile = Shared::<[Vector<f32, N>]>::new_slice(comptime!(cfg.keys * cfg.pitch()));
    let mut probs = Shared::<[f32]>::new_slice(comptime!(cfg.rows * (cfg.keys + 1)));
    let mut partial = Shared::<[f32]>::new_slice(comptime!(2 * cfg.threads));
    let mut bounds = Shared::<[u32]>::new_slice(comptime!(2 * cfg.threads));
    let mut seen = Shared::<[u32]>::new_slice(cfg.rows);

    // Pass 1: the keys the bias leaves visible to any row of the cube's positions.
    let pos_first = first_row / group;
    let positions = last_row / group - pos_first + 1;
    if unit < cfg.rows {
        seen[unit] = 0u32;
    }
    sync_cube();
    let mut lo = len;
    let mut hi = 0usize;
    for p in 0..positions {
        let row_base = b * bias_sb + (pos_first + p) * bias_ss;
        let mut t = unit;
        while t < len {
            if f32::cast_from(bias[row_base + t * bias_st]) > mask_limit {
                if t < lo {
                    lo = t;
                }
                if t + 1 > hi {
                    hi = t + 1;
                }
                seen[p] = 1u32;
            }
            t += cfg.threads;
        }
    }
    bounds[unit] = u32::cast_from(lo);
    bounds[cfg.threads + unit] = u32::cast_from(hi);
    sync_cube();
    let mut first_key = len;
    let mut end_key = 0usize;
    for u in 0..cfg.threads {
        let a = bounds[u] as usize;
        let z = bounds[cfg.threads + u] as usize;
        if a < first_key {
            first_key = a;
        }
        if z > end_key {
            end_key = z;
        }
    }
    let mut all_keys = every_tile == 1u32;
    for p in 0..positions {
        if seen[p] == 0u32 {
            all_keys = true;
        }
    }
    if all_keys {
        first_key = 0;
        end_key = len;
    }

    // Pass 2: the query tile, then the key tiles with the online softmax.
    // Query row `first_row + r` is position `(first_row + r) / group` of query head
    // `kv_head · group + (first_row + r) % group`.
    let mut i = unit;
    while i < comptime!(cfg.rows * cfg.vec_dims) {
        let r = i / cfg.vec_dims;
        let j = i % cfg.vec_dims;
        let qr = first_row + r;
        let mut x = Vector::<f32, N>::new(f32::new(0.0));
        if qr < rows_total {
            let at = b * q_sb + (kv_head * group + qr % group) * q_sh + (qr / group) * q_ss;
            x = Vector::<f32, N>::cast_from(q[at / N::value() + j]);
        }
        q_tile[r * pitch + j] = x;
        i += cfg.threads;
    }

    let mut acc = Array::<Vector<f32, N>>::new(cfg.dims_per_unit);
    #[unroll]
    for m in 0..cfg.dims_per_unit {
        acc[m] = Vector::new(f32::new(0.0));
    }
    let mut scores = Array::<f32>::new(cfg.keys_per_unit);
    let mut dot = Array::<Vector<f32, N>>::new(cfg.keys_per_unit);
    // The lowest finite f32: below any score a finite bias gives (WGSL has no infinite literals).
    let lowest = f32::new(-3.4028235e38);
    let mut running_max = lowest;
    let mut running_sum = f32::new(0.0);
    // Every cube walks all key tiles so that its barriers stay in uniform control flow (naga
    // rejects a barrier under a condition read from shared memory); a hidden tile costs its
    // barriers and nothing else.
    let mut start = 0usize;
    while start < len {
        let active = start + cfg.keys > first_key && start < end_key;
        let mut valid = len - start;
        if valid > cfg.keys {
            valid = cfg.keys;
        }
        if active {
            stage::<F, N>(k, &mut kv_tile, b * k_sb + kv_head * k_sh, k_ss, start, len, cfg.keys, cfg);
        }
        sync_cube();
        if active {
            #[unroll]
            for c in 0..cfg.keys_per_unit {
                dot[c] = Vector::new(f32::new(0.0));
            }
            for j in 0..cfg.vec_dims {
                let qv = q_tile[row * pitch + j];
                #[unroll]
                for c in 0..cfg.keys_per_unit {
                    dot[c] += qv * kv_tile[(lane + c * cfg.lanes) * pitch + j];
                }
            }
            let mut tile_max = running_max;
            #[unroll]
            for c in 0..cfg.keys_per_unit {
                let key = lane + c * cfg.lanes;
                let mut s = lowest;
                if row_valid && key < valid {
                    s = lane_sum::<N>(dot[c]) * scale + f32::cast_from(bias[bias_row + (start + key) * bias_st]);
                }
                scores[c] = s;
                tile_max = f32::max(tile_max, s);
            }
            partial[unit] = tile_max;
        }
        sync_cube();
        let mut new_max = running_max;
        if active {
            // The key tile is read: the value tile takes its place.
            stage::<F, N>(v, &mut kv_tile, b * v_sb + kv_head * v_sh, v_ss, start, len, cfg.keys, cfg);
            for u in 0..cfg.lanes {
                new_max = f32::max(new_max, partial[row * cfg.lanes + u]);
            }
            let mut unit_sum = f32::new(0.0);
            #[unroll]
            for c in 0..cfg.keys_per_unit {
                let key = lane + c * cfg.lanes;
                let mut p = f32::new(0.0);
                if key < valid {
                    p = f32::exp(scores[c] - new_max);
                }
                probs[row * p_pitch + key] = p;
                unit_sum += p;
            }
            partial[cfg.threads + unit] = unit_sum;
        }
        sync_cube();
        if active {
            let mut tile_sum = f32::new(0.0);
            for u in 0..cfg.lanes {
                tile_sum += partial[cfg.threads + row * cfg.lanes + u];
            }
            let correction = f32::exp(running_max - new_max);
            running_sum = running_sum * correction + tile_sum;
            #[unroll]
            for m in 0..cfg.dims_per_unit {
                acc[m] *= Vector::new(correction);
            }
            for key in 0..valid {
                let p = Vector::<f32, N>::new(probs[row * p_pitch + key]);
                #[unroll]
                for m in 0..cfg.dims_per_unit {
                    let j = lane + m * cfg.lanes;
                    if j < cfg.vec_dims {
                        acc[m] += p * kv_tile[key * pitch + j];
                    }
                }
            }
            running_max = new_max;
        }
        start += cfg.keys;
        sync_cube();
    }

    if row_valid {
        let mut inv = f32::new(0.0);
        if running_sum > f32::new(0.0) {
            inv = f32::new(1.0) / running_sum;
        }
        let base = ((b * seq + pos) * kv_heads * group + head) * cfg.vec_dims;
        #[unroll]
        for m in 0..cfg.dims_per_unit {
            let j = lane + m * cfg.lanes;
            if j < cfg.vec_dims {
                out[base + j] = Vector::<F, N>::cast_from(acc[m] * Vector::new(inv));
            }
        }
    }
}
