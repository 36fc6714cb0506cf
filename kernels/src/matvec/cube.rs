//! CubeCL kernels of the dense matrix-vector product ([`MatvecOps`]) for every GPU runtime, and
//! what the quantized ones ([`super::cube_quant`]) share with them: the two reductions, the
//! split-sum pass and the launch geometry.
//!
//! `[k, n]` layout (`*_kn` kernels): a workgroup is `KN_LINES` × `KN_SLICES` threads; thread
//! `(x, y)` owns the `N`-wide column vector `line = block · KN_LINES + x` (4 columns where `n`
//! allows) and walks rows `k ≡ y (mod KN_SLICES)` of its workgroup's slice of `k`, holding one
//! accumulator vector per input row. [`store_slice_sums`] adds the `KN_SLICES` partial sums in
//! shared memory, in a fixed order. When `k` is split across workgroups, each split writes `f32`
//! partials `[splits, m, n]` and [`sum_splits_kernel`] adds them in split order.
//!
//! `[n, k]` layout (`*_nk` kernels): a workgroup is `groups` groups of `lanes` threads; a group
//! owns `per_group` consecutive output rows of `W` and its lanes walk `k` in vectors; each lane
//! holds `m · per_group` partial dot products, which [`store_lane_sums`] reduces over the lanes.
//!
//! The number of input rows is compiled in, rounded up to a power of two ([`row_bucket`]) so
//! that the accumulators are registers and few variants are compiled; rows past `m` are skipped.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::features::Plane;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::ops::MatvecOps;

/// Column vectors per `[k, n]` workgroup (16 · 4 columns: a 128-byte row segment in `f16`).
pub(super) const KN_LINES: usize = 16;
/// Threads per `[k, n]` workgroup sharing one column vector, each on its own rows of `k`.
pub(super) const KN_SLICES: usize = 8;
/// Input rows whose partial sums are reduced per shared-memory round (`≤ KN_SLICES`).
const KN_ROWS_PER_ROUND: usize = 4;
/// Workgroups a launch aims for, by splitting `k` across workgroups (a large GPU runs a few
/// thousand at once).
const TARGET_CUBES: usize = 2048;
/// Fewest rows of `k` each thread of a split walks (below, the splits' partials cost more than
/// the parallelism gains).
const MIN_ROWS_PER_THREAD: usize = 8;
/// Threads of an `[n, k]` workgroup.
const NK_THREADS: usize = 128;
/// Lanes of a lane group where the device has no plane operations.
const SHARED_LANES: usize = 32;

/// `Σ_j a[j] · b[j]` over the vectors' lanes.
#[cube]
pub(super) fn dot<N: Size>(a: Vector<f32, N>, b: Vector<f32, N>) -> f32 {
    let p = a * b;
    let mut s = f32::new(0.0);
    #[unroll]
    for j in 0..N::value() {
        s += p.extract(j);
    }
    s
}

/// `acc[i] += x[i, kk] · wv` for the input rows `i < m` of a `[k, n]` kernel: `wv` is the
/// (dequantized) weight vector of shared row `kk`, applied to every input row it serves.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn add_row_products<F: Float, N: Size>(
    acc: &mut Array<Vector<f32, N>>,
    x: &Tensor<F>,
    wv: Vector<f32, N>,
    kk: usize,
    k_len: usize,
    m: usize,
    #[comptime] rows: usize,
) {
    #[unroll]
    for i in 0..rows {
        if i < m {
            acc[i] += Vector::broadcast(f32::cast_from(x[i * k_len + kk])) * wv;
        }
    }
}

/// Sums each row's accumulator over the workgroup's `KN_SLICES` threads of one column vector
/// (`UNIT_POS_Y`), `KN_ROWS_PER_ROUND` rows per round through shared memory, adding the slices
/// in order, and writes rows `< m` to `out[(first_row + i) · lines + line]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn store_slice_sums<O: Float, N: Size>(
    acc: &Array<Vector<f32, N>>,
    out: &mut Tensor<Vector<O, N>>,
    line: usize,
    lines: usize,
    m: usize,
    first_row: usize,
    #[comptime] rows: usize,
) {
    let threads = comptime!(KN_LINES * KN_SLICES);
    let per_round = comptime!(if rows < KN_ROWS_PER_ROUND { rows } else { KN_ROWS_PER_ROUND });
    let mut shared = Shared::<[Vector<f32, N>]>::new_slice(comptime!(per_round * threads));
    let unit = UNIT_POS as usize;
    let slice = UNIT_POS_Y as usize;
    let column = UNIT_POS_X as usize;
    #[unroll]
    for round in 0..comptime!(rows / per_round) {
        #[unroll]
        for r in 0..per_round {
            shared[r * threads + unit] = acc[round * per_round + r];
        }
        sync_cube();
        if slice < per_round {
            let i = round * per_round + slice;
            let base = slice * threads + column;
            let mut sum = shared[base];
            for s in 1..KN_SLICES {
                sum += shared[base + s * KN_LINES];
            }
            if i < m && line < lines {
                out[(first_row + i) * lines + line] = Vector::cast_from(sum);
            }
        }
        sync_cube();
    }
}

/// Reduces each lane's `rows · per_group` partial dot products over the `lanes` lanes of its
/// group (`UNIT_POS_X`): with `plane_sum` when the lanes are one plane, otherwise through shared
/// memory, adding the lanes in order. Value `v = r · rows + i` is output `out[i, j]` for row
/// `j = (CUBE_POS · groups + group) · per_group + r` of `W`; only `i < m`, `j < n` are written.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn store_lane_sums<F: Float>(
    acc: &Array<f32>,
    out: &mut Tensor<F>,
    m: usize,
    n: usize,
    #[comptime] rows: usize,
    #[comptime] per_group: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] plane: bool,
) {
    let values = comptime!(rows * per_group);
    let first_group = CUBE_POS * groups;
    if comptime!(plane) {
        let j0 = (first_group + UNIT_POS_Y as usize) * per_group;
        #[unroll]
        for v in 0..values {
            let s = plane_sum(acc[v]);
            let i = v % rows;
            let j = j0 + v / rows;
            if UNIT_POS_X == 0 && i < m && j < n {
                out[i * n + j] = F::cast_from(s);
            }
        }
    } else {
        let threads = comptime!(lanes * groups);
        let per_round = comptime!(if values < lanes { values } else { lanes });
        let mut shared = Shared::<[f32]>::new_slice(comptime!(per_round * threads));
        let unit = UNIT_POS as usize;
        #[unroll]
        for round in 0..comptime!(values / per_round) {
            #[unroll]
            for q in 0..per_round {
                shared[q * threads + unit] = acc[round * per_round + q];
            }
            sync_cube();
            if unit < per_round * groups {
                let q = unit % per_round;
                let group = unit / per_round;
                let base = q * threads + group * lanes;
                let mut s = f32::new(0.0);
                for l in 0..lanes {
                    s += shared[base + l];
                }
                let v = round * per_round + q;
                let i = v % rows;
                let j = (first_group + group) * per_group + v / rows;
                if i < m && j < n {
                    out[i * n + j] = F::cast_from(s);
                }
            }
            sync_cube();
        }
    }
}

/// Dense `[k, n]` weight: workgroup `block + split · col_blocks` covers column vectors
/// `block · KN_LINES ..` over rows `split · k_chunk ..` of `k`. `out` is the result (`O = F`,
/// one split) or the `f32` partials of every split.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn matvec_kn_kernel<F: Float, O: Float, N: Size>(
    x: &Tensor<F>,
    w: &Tensor<Vector<F, N>>,
    out: &mut Tensor<Vector<O, N>>,
    m: usize,
    k_len: usize,
    lines: usize,
    col_blocks: usize,
    k_chunk: usize,
    splits: usize,
    #[comptime] rows: usize,
    #[define(F, O)] _dtypes: [ElemType; 2],
) {
    let block = CUBE_POS % col_blocks;
    let split = CUBE_POS / col_blocks;
    let line = block * KN_LINES + UNIT_POS_X as usize;
    let start = split * k_chunk;
    let mut end = start + k_chunk;
    if end > k_len {
        end = k_len;
    }
    let mut acc = Array::<Vector<f32, N>>::new(rows);
    #[unroll]
    for i in 0..rows {
        acc[i] = Vector::broadcast(f32::new(0.0));
    }
    if line < lines {
        let mut kk = start + UNIT_POS_Y as usize;
        while kk < end {
            let wv = Vector::<f32, N>::cast_from(w[kk * lines + line]);
            add_row_products::<F, N>(&mut acc, x, wv, kk, k_len, m, rows);
            kk += KN_SLICES;
        }
    }
    // Uniform per workgroup: the launch may round the workgroup count up.
    if split < splits {
        store_slice_sums::<O, N>(&acc, out, line, lines, m, split * m, rows);
    }
}

/// `out = Σ_s partial[s]` in split order, one thread per output vector, cast to the output dtype.
#[cube(launch)]
fn sum_splits_kernel<F: Float, N: Size>(
    partial: &Tensor<Vector<f32, N>>,
    out: &mut Tensor<Vector<F, N>>,
    splits: usize,
    len: usize,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= len {
        terminate!();
    }
    let mut sum = partial[idx];
    for s in 1..splits {
        sum += partial[s * len + idx];
    }
    out[idx] = Vector::cast_from(sum);
}

/// Dense `[n, k]` weight (`outputs = n` rows of `W`, each contiguous), both operands read in `N`-wide vectors along
/// `k` (`k_lines = k / N` of them a row).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn matvec_nk_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    out: &mut Tensor<F>,
    m: usize,
    outputs: usize,
    k_lines: usize,
    #[comptime] rows: usize,
    #[comptime] per_group: usize,
    #[comptime] lanes: usize,
    #[comptime] groups: usize,
    #[comptime] plane: bool,
    #[define(F)] _dtype: ElemType,
) {
    let j0 = (CUBE_POS * groups + UNIT_POS_Y as usize) * per_group;
    let mut acc = Array::<f32>::new(comptime!(rows * per_group));
    #[unroll]
    for v in 0..comptime!(rows * per_group) {
        acc[v] = f32::new(0.0);
    }
    let mut wv = Array::<Vector<f32, N>>::new(per_group);
    let mut kl = UNIT_POS_X as usize;
    while kl < k_lines {
        #[unroll]
        for r in 0..per_group {
            // Rows past `outputs` (the last group's) read row `outputs − 1` and are never stored.
            let mut j = j0 + r;
            if j >= outputs {
                j = outputs - 1;
            }
            wv[r] = Vector::cast_from(w[j * k_lines + kl]);
        }
        #[unroll]
        for i in 0..rows {
            if i < m {
                let xv = Vector::<f32, N>::cast_from(x[i * k_lines + kl]);
                #[unroll]
                for r in 0..per_group {
                    acc[r * rows + i] += dot::<N>(xv, wv[r]);
                }
            }
        }
        kl += lanes;
    }
    store_lane_sums::<F>(&acc, out, m, outputs, rows, per_group, lanes, groups, plane);
}

impl MatvecOps for CubeBackend {
    fn matvec(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let w = if w.dtype == x.dtype { w } else { burn_cubecl::kernel::cast(w, x.dtype) };
        let x = into_contiguous(x);
        let transposed = burn_cubecl::ops::permute(w.clone(), &[1, 0]);
        if !w.is_contiguous() && transposed.is_contiguous() {
            launch_nk(x, transposed)
        } else {
            launch_kn(x, into_contiguous(w))
        }
    }
}

/// The widest vector (4, 2 or 1 elements) that divides `len`.
pub(super) fn vector_width(len: usize) -> usize {
    [4, 2].into_iter().find(|v| len.is_multiple_of(*v)).unwrap_or(1)
}

/// `m` rounded up to a power of two: the row count a kernel is compiled for.
pub(super) fn row_bucket(m: usize) -> usize {
    m.next_power_of_two()
}

/// How a `[k, n]` product is spread: workgroups per column block and split of `k`.
pub(super) struct KnGrid {
    /// Workgroups across the column vectors.
    pub col_blocks: usize,
    /// Workgroups across `k`.
    pub splits: usize,
    /// Rows of `k` per split.
    pub k_chunk: usize,
}

impl KnGrid {
    /// Splits `k` across workgroups until about `TARGET_CUBES` run, while every thread keeps
    /// `MIN_ROWS_PER_THREAD` rows and the partials (`f32`, written and read once) stay under a
    /// quarter of the `weight_bytes` the product reads.
    pub(super) fn new(m: usize, k: usize, n: usize, lines: usize, weight_bytes: usize) -> Self {
        let col_blocks = lines.div_ceil(KN_LINES);
        let wanted = TARGET_CUBES.div_ceil(col_blocks);
        let deepest = k / (KN_SLICES * MIN_ROWS_PER_THREAD);
        let affordable = weight_bytes / (32 * m * n);
        let splits = wanted.min(deepest).min(affordable).max(1);
        let k_chunk = k.div_ceil(splits).next_multiple_of(KN_SLICES);
        Self { col_blocks, splits: k.div_ceil(k_chunk), k_chunk }
    }

    /// The workgroup count of the launch.
    pub(super) fn cube_count(&self, client: &Client) -> CubeCount {
        cube_count(client, self.col_blocks * self.splits, KN_LINES * KN_SLICES)
    }
}

/// `cubes` workgroups of `threads` threads, spread over as many dimensions as the device's
/// per-dimension limit needs (kernels index them through the linear `CUBE_POS` and ignore any
/// extra ones).
pub(super) fn cube_count(client: &Client, cubes: usize, threads: usize) -> CubeCount {
    let dim = CubeDim::new_1d(threads as u32);
    calculate_cube_count_elemwise(client, cubes * threads, dim)
}

/// The `[k, n]` workgroup shape.
pub(super) fn kn_cube_dim() -> CubeDim {
    CubeDim::new_2d(KN_LINES as u32, KN_SLICES as u32)
}

/// How an `[n, k]` product is spread: lanes per group (a plane where the device has plane
/// operations of one fixed size), groups per workgroup, output rows per group.
pub(super) struct NkGrid {
    /// Threads walking `k` together for the same weight rows.
    pub lanes: usize,
    /// Lane groups per workgroup.
    pub groups: usize,
    /// Rows of `W` (outputs) per lane group.
    pub per_group: usize,
    /// Whether the lanes are one plane, reduced with `plane_sum`.
    pub plane: bool,
}

impl NkGrid {
    /// The grid on `client`'s device for a kernel compiled for `rows` input rows.
    pub(super) fn new(client: &Client, rows: usize) -> Self {
        let hardware = &client.properties().hardware;
        let fixed = hardware.plane_size_min == hardware.plane_size_max;
        let size = hardware.plane_size_max as usize;
        let plane = client.features().plane.contains(Plane::Ops)
            && fixed
            && size.is_power_of_two()
            && (4..=NK_THREADS).contains(&size);
        let lanes = if plane { size } else { SHARED_LANES };
        // One row per group for a single input row (more workgroups), up to four as rows grow
        // (each vector of `x` loaded serves more weight rows), two past 16 rows (registers).
        let per_group = match rows {
            1 => 1,
            2..=4 => 2,
            5..=16 => 4,
            _ => 2,
        };
        Self { lanes, groups: NK_THREADS / lanes, per_group, plane }
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim::new_2d(self.lanes as u32, self.groups as u32)
    }

    /// Workgroups for `n` output rows.
    fn cubes(&self, n: usize) -> usize {
        n.div_ceil(self.per_group * self.groups)
    }
}

/// `x · w` with `w` `[k, n]` contiguous.
fn launch_kn(x: CubeTensor, w: CubeTensor) -> CubeTensor {
    let [m, k] = x.shape().dims::<2>();
    let n = w.shape().dims::<2>()[1];
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), Shape::new([m, n]), x.dtype);
    let width = vector_width(n);
    let lines = n / width;
    let grid = KnGrid::new(m, k, n, lines, k * n * x.dtype.size());
    let rows = row_bucket(m);
    let dtype = dtype_to_storage_type(x.dtype);
    let target = if grid.splits == 1 {
        out.clone()
    } else {
        empty_device_dtype(client.clone(), x.device.clone(), Shape::new([grid.splits, m, n]), DType::F32)
    };
    let target_dtype = dtype_to_storage_type(target.dtype);
    matvec_kn_kernel::launch(
        &client,
        grid.cube_count(&client),
        kn_cube_dim(),
        width,
        x.into_tensor_arg(),
        w.into_tensor_arg(),
        target.clone().into_tensor_arg(),
        m,
        k,
        lines,
        grid.col_blocks,
        grid.k_chunk,
        grid.splits,
        rows,
        [dtype, target_dtype],
    );
    if grid.splits > 1 {
        sum_splits(target, out.clone(), grid.splits, m * lines, width);
    }
    out
}

/// `out = Σ_s partial[s]` (`len` vectors of `width` each).
pub(super) fn sum_splits(partial: CubeTensor, out: CubeTensor, splits: usize, len: usize, width: usize) {
    let client = out.client.clone();
    let dim = CubeDim::new(&client, len);
    let count = calculate_cube_count_elemwise(&client, len, dim);
    let dtype = dtype_to_storage_type(out.dtype);
    sum_splits_kernel::launch(
        &client,
        count,
        dim,
        width,
        partial.into_tensor_arg(),
        out.into_tensor_arg(),
        splits,
        len,
        dtype,
    );
}

/// `x · Wᵀ` with `W` `[n, k]` contiguous (given as `wt`).
fn launch_nk(x: CubeTensor, wt: CubeTensor) -> CubeTensor {
    let [m, k] = x.shape().dims::<2>();
    let n = wt.shape().dims::<2>()[0];
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), Shape::new([m, n]), x.dtype);
    let width = vector_width(k);
    let rows = row_bucket(m);
    let grid = NkGrid::new(&client, rows);
    let dtype = dtype_to_storage_type(x.dtype);
    matvec_nk_kernel::launch(
        &client,
        cube_count(&client, grid.cubes(n), NK_THREADS),
        grid.cube_dim(),
        width,
        x.into_tensor_arg(),
        wt.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        m,
        n,
        k / width,
        rows,
        grid.per_group,
        grid.lanes,
        grid.groups,
        grid.plane,
        dtype,
    );
    out
}

/// The grid of an `[n, k]` launch, for the quantized kernels.
pub(super) fn nk_launch_shape(client: &Client, rows: usize, n: usize) -> (NkGrid, CubeCount, CubeDim) {
    let grid = NkGrid::new(client, rows);
    let count = cube_count(client, grid.cubes(n), NK_THREADS);
    let dim = grid.cube_dim();
    (grid, count, dim)
}
