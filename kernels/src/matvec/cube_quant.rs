//! CubeCL matrix-vector kernels over group-quantized weights (the layouts of
//! [`crate::ops::GroupQuantOps`]: codes packed little-end-first, `32 / bits` a `u32` word, one
//! `scale` and `min` per group), dequantizing `q · scale + min` in registers. Same grids and
//! reductions as the dense kernels ([`super::cube`]).
//!
//! - FlexGen's `[k, n]`, grouped along `n`: a thread owns 4 columns (half an 8-code word at 4
//!   bits, a whole word at 8; the two threads of one word load it once between them, from the
//!   same cache line), always inside one group since groups hold whole words.
//! - GGUF's `[n, k]`, grouped along `k`: a lane reads one word (8 or 4 values of `k`) of each of
//!   its group's weight rows per step, and the matching values of `x` as 4-wide vectors (`k` is a
//!   whole number of groups, so a multiple of 4).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube::{
    KN_LINES, KN_SLICES, KnGrid, add_row_products, dot, kn_cube_dim, nk_launch_shape, row_bucket, store_lane_sums,
    store_slice_sums, sum_splits,
};

/// Columns a `[k, n]` thread owns: one 4-wide vector.
const COLUMNS: usize = 4;

/// `[k, n]` codes grouped along `n`: like the dense `[k, n]` kernel, the weight vector of each
/// row of `k` decoded from its word (`words` per row of codes, `groups` scales per row).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn qmatvec_kn_kernel<F: Float, O: Float, N: Size>(
    x: &Tensor<F>,
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<Vector<O, N>>,
    m: usize,
    k_len: usize,
    lines: usize,
    col_blocks: usize,
    k_chunk: usize,
    splits: usize,
    words: usize,
    groups: usize,
    group: usize,
    #[comptime] bits: u32,
    #[comptime] rows: usize,
    #[define(F, O)] _dtypes: [ElemType; 2],
) {
    let per = comptime!((32 / bits) as usize);
    let mask = comptime!((1u32 << bits) - 1);
    let block = CUBE_POS % col_blocks;
    let split = CUBE_POS / col_blocks;
    let line = block * KN_LINES + UNIT_POS_X as usize;
    let column = line * N::value();
    let word_in_row = column / per;
    let first_shift = u32::cast_from(column % per) * bits;
    let group_in_row = column / group;
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
            let word = codes[kk * words + word_in_row];
            let s = f32::cast_from(scale[kk * groups + group_in_row]);
            let mn = f32::cast_from(min[kk * groups + group_in_row]);
            let mut wv = Vector::<f32, N>::broadcast(f32::new(0.0));
            #[unroll]
            for t in 0..N::value() {
                let q = (word >> (first_shift + u32::cast_from(t) * bits)) & mask;
                wv.insert(t, f32::cast_from(q) * s + mn);
            }
            add_row_products::<F, N>(&mut acc, x, wv, kk, k_len, m, rows);
            kk += KN_SLICES;
        }
    }
    if split < splits {
        store_slice_sums::<O, N>(&acc, out, line, lines, m, split * m, rows);
    }
}

/// `[n, k]` codes grouped along `k` (`outputs = n` rows, `words` per row, `groups` scales per row); `x` in 4-wide
/// vectors, `k_lines = k / 4` of them a row.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn qmatvec_nk_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<F>,
    m: usize,
    outputs: usize,
    k_lines: usize,
    words: usize,
    groups: usize,
    group: usize,
    #[comptime] bits: u32,
    #[comptime] rows: usize,
    #[comptime] per_group: usize,
    #[comptime] lanes: usize,
    #[comptime] cube_groups: usize,
    #[comptime] plane: bool,
    #[define(F)] _dtype: ElemType,
) {
    let per = comptime!((32 / bits) as usize);
    let mask = comptime!((1u32 << bits) - 1);
    // Vectors of 4 values in one word: 2 at 4 bits, 1 at 8.
    let vectors = comptime!(per / 4);
    let j0 = (CUBE_POS * cube_groups + UNIT_POS_Y as usize) * per_group;
    let mut acc = Array::<f32>::new(comptime!(rows * per_group));
    #[unroll]
    for v in 0..comptime!(rows * per_group) {
        acc[v] = f32::new(0.0);
    }
    let mut weights = Array::<Vector<f32, N>>::new(comptime!(per_group * vectors));
    let mut wi = UNIT_POS_X as usize;
    while wi < words {
        let g = wi * per / group;
        #[unroll]
        for r in 0..per_group {
            // Rows past `outputs` (the last group's) read row `outputs − 1` and are never stored.
            let mut j = j0 + r;
            if j >= outputs {
                j = outputs - 1;
            }
            let word = codes[j * words + wi];
            let s = f32::cast_from(scale[j * groups + g]);
            let mn = f32::cast_from(min[j * groups + g]);
            #[unroll]
            for h in 0..vectors {
                let mut wv = Vector::<f32, N>::broadcast(f32::new(0.0));
                #[unroll]
                for t in 0..N::value() {
                    let q = (word >> (u32::cast_from(h * 4 + t) * bits)) & mask;
                    wv.insert(t, f32::cast_from(q) * s + mn);
                }
                weights[r * vectors + h] = wv;
            }
        }
        #[unroll]
        for i in 0..rows {
            if i < m {
                #[unroll]
                for h in 0..vectors {
                    let xv = Vector::<f32, N>::cast_from(x[i * k_lines + wi * vectors + h]);
                    #[unroll]
                    for r in 0..per_group {
                        acc[r * rows + i] += dot::<N>(xv, weights[r * vectors + h]);
                    }
                }
            }
        }
        wi += lanes;
    }
    store_lane_sums::<F>(&acc, out, m, outputs, rows, per_group, lanes, cube_groups, plane);
}

/// The fused product `x · W` (`transposed`: `x · Wᵀ`) for `x` `[m, k]` contiguous, on the
/// quantized matrix-vector kernels; `n` output columns. Inputs as
/// [`crate::ops::GroupQuantOps::fused_qmatmul`] takes them, all contiguous.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_qmatvec(
    x: CubeTensor,
    codes: CubeTensor,
    scale: CubeTensor,
    min: CubeTensor,
    n: usize,
    bits: u32,
    group: usize,
    transposed: bool,
) -> CubeTensor {
    let [m, k] = x.shape().dims::<2>();
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), Shape::new([m, n]), x.dtype);
    let words = codes.shape().dims::<2>()[1];
    let groups = scale.shape().dims::<2>()[1];
    let rows = row_bucket(m);
    let dtype = dtype_to_storage_type(x.dtype);
    if transposed {
        let (grid, count, dim) = nk_launch_shape(&client, rows, n);
        qmatvec_nk_kernel::launch(
            &client,
            count,
            dim,
            COLUMNS,
            x.into_tensor_arg(),
            codes.into_tensor_arg(),
            scale.into_tensor_arg(),
            min.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            m,
            n,
            k / COLUMNS,
            words,
            groups,
            group,
            bits,
            rows,
            grid.per_group,
            grid.lanes,
            grid.groups,
            grid.plane,
            dtype,
        );
        return out;
    }
    let lines = n / COLUMNS;
    let grid = KnGrid::new(m, k, n, lines, k * n * bits as usize / 8);
    let target = if grid.splits == 1 {
        out.clone()
    } else {
        empty_device_dtype(client.clone(), x.device.clone(), Shape::new([grid.splits, m, n]), DType::F32)
    };
    let target_dtype = dtype_to_storage_type(target.dtype);
    qmatvec_kn_kernel::launch(
        &client,
        grid.cube_count(&client),
        kn_cube_dim(),
        COLUMNS,
        x.into_tensor_arg(),
        codes.into_tensor_arg(),
        scale.into_tensor_arg(),
        min.into_tensor_arg(),
        target.clone().into_tensor_arg(),
        m,
        k,
        lines,
        grid.col_blocks,
        grid.k_chunk,
        grid.splits,
        words,
        groups,
        group,
        bits,
        rows,
        [dtype, target_dtype],
    );
    if grid.splits > 1 {
        sum_splits(target, out.clone(), grid.splits, m * lines, COLUMNS);
    }
    out
}
