//! The one CubeCL kernel behind every row RMSNorm of [`FusedOps`](super::ops::FusedOps):
//! [`fused_rms_norm`](super::ops::FusedOps::fused_rms_norm), the residual add before it
//! ([`fused_add_rms_norm`](super::ops::FusedOps::fused_add_rms_norm)), the residual add after it
//! ([`fused_rms_norm_add`](super::ops::FusedOps::fused_rms_norm_add)) and the add between two
//! norms ([`fused_norm_add_norm`](super::ops::FusedOps::fused_norm_add_norm)), configured at
//! compile time by [`RowNorm`]. One cube per row; its units sum the squares in shared memory
//! (`super::cube::cube_sum`). Every value an unfused op would store is rounded to the storage
//! dtype where it would, so each form computes what the separate ops did.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube::{cube_sum, cubes_of, empty_like, row_threads};

/// Which row norm a launch computes (a comptime choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum RowNorm {
    /// `out = rms(x) · γ`.
    Plain,
    /// `sum = x + residual` (rounded), `out = rms(sum) · γ`.
    AddBefore,
    /// `out = residual + F(rms(x) · γ)`.
    AddAfter,
    /// `sum = residual + F(rms(x) · γ₁)`, `out = rms(sum) · γ₂`.
    AddBetween,
}

impl RowNorm {
    /// Whether the launch reads `residual`.
    fn has_residual(self) -> bool {
        self != Self::Plain
    }

    /// Whether the launch writes `sum`.
    fn writes_sum(self) -> bool {
        matches!(self, Self::AddBefore | Self::AddBetween)
    }
}

/// `1 / sqrt(mean(squares) + ε)` for a row whose units hold partial sums of squares.
#[cube]
fn inv_rms(squares: f32, width: usize, epsilon: f32, #[comptime] threads: usize) -> f32 {
    f32::new(1.0) / f32::sqrt(cube_sum(squares, threads) / f32::cast_from(width) + epsilon)
}

/// One cube per row of `x` (any rank, any strides: views into a fused projection's output need
/// no copy); `residual`, `out` and `sum` are contiguous `[rows, width]`. Operands a form does not
/// use are small placeholders, never indexed.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn row_norm_kernel<F: Float, G: Float>(
    x: &Tensor<F>,
    residual: &Tensor<F>,
    gamma: &Tensor<G>,
    gamma_second: &Tensor<G>,
    out: &mut Tensor<F>,
    sum: &mut Tensor<F>,
    rows: usize,
    width: usize,
    epsilon: f32,
    epsilon_second: f32,
    #[comptime] threads: usize,
    #[comptime] form: RowNorm,
    #[define(F, G)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let unit = UNIT_POS as usize;
    let last = x.rank() - 1;
    let step = x.stride(last);
    // The row's offset in `x`: its index unravelled over the leading dimensions.
    let mut rest = row;
    let mut at = 0usize;
    let mut dim = last;
    while dim > 0 {
        dim -= 1;
        let size = x.shape(dim);
        at += (rest % size) * x.stride(dim);
        rest /= size;
    }
    let base = row * width;

    // The first norm's input: `x`, or `x + residual` as stored (written to `sum`).
    let mut squares = f32::new(0.0);
    let mut i = unit;
    while i < width {
        let mut v = f32::cast_from(x[at + i * step]);
        if comptime!(form == RowNorm::AddBefore) {
            let s = x[at + i * step] + residual[base + i];
            sum[base + i] = s;
            v = f32::cast_from(s);
        }
        squares += v * v;
        i += threads;
    }
    let inv = inv_rms(squares, width, epsilon, threads);

    let mut squares_second = f32::new(0.0);
    let mut i = unit;
    while i < width {
        if comptime!(form == RowNorm::Plain || form == RowNorm::AddBefore) {
            let mut v = f32::cast_from(x[at + i * step]);
            if comptime!(form == RowNorm::AddBefore) {
                v = f32::cast_from(x[at + i * step] + residual[base + i]);
            }
            out[base + i] = F::cast_from(v * inv * f32::cast_from(gamma[i]));
        } else {
            let s =
                residual[base + i] + F::cast_from(f32::cast_from(x[at + i * step]) * inv * f32::cast_from(gamma[i]));
            if comptime!(form == RowNorm::AddAfter) {
                out[base + i] = s;
            } else {
                sum[base + i] = s;
                let v = f32::cast_from(s);
                squares_second += v * v;
            }
        }
        i += threads;
    }

    if comptime!(form == RowNorm::AddBetween) {
        let inv = inv_rms(squares_second, width, epsilon_second, threads);
        let mut i = unit;
        while i < width {
            // Each unit reads back the sums it wrote itself.
            out[base + i] = F::cast_from(f32::cast_from(sum[base + i]) * inv * f32::cast_from(gamma_second[i]));
            i += threads;
        }
    }
}

/// The launch of [`row_norm_kernel`] for `form`: `x` `[..., width]`, `residual` (contiguous or
/// made so) where the form reads one, `gammas` `(γ, γ₂)` (`γ₂` for [`RowNorm::AddBetween`]),
/// `epsilons` likewise. Returns `(out, sum)`, both shaped as `x`; `sum` is the residual stream the
/// form writes, or an empty placeholder.
pub(super) fn row_norm(
    form: RowNorm,
    x: CubeTensor,
    residual: Option<CubeTensor>,
    (gamma, gamma_second): (CubeTensor, Option<CubeTensor>),
    (epsilon, epsilon_second): (f32, f32),
) -> (CubeTensor, CubeTensor) {
    let shape = x.shape();
    let width = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / width.max(1);
    let placeholder = || empty_like(&x, Shape::new([1]));
    let out = empty_like(&x, shape.clone());
    let sum = if form.writes_sum() { empty_like(&x, shape) } else { placeholder() };
    if rows == 0 || width == 0 {
        return (out, sum);
    }
    let residual = match residual {
        Some(r) if form.has_residual() => into_contiguous(r),
        _ => placeholder(),
    };
    let gamma = into_contiguous(gamma);
    let gamma_second = gamma_second.map(into_contiguous).unwrap_or_else(|| empty_like(&gamma, Shape::new([1])));
    let client = x.client.clone();
    let threads = row_threads(&client, width);
    let (count, dim) = cubes_of(&client, rows, threads);
    let dtypes = [dtype_to_storage_type(x.dtype), dtype_to_storage_type(gamma.dtype)];
    row_norm_kernel::launch(
        &client,
        count,
        dim,
        x.into_tensor_arg(),
        residual.into_tensor_arg(),
        gamma.into_tensor_arg(),
        gamma_second.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        rows,
        width,
        epsilon,
        epsilon_second,
        threads,
        form,
        dtypes,
    );
    (out, sum)
}
