//! Moving `f32` tensors between Burn's `Tensor` and Flex's own `FlexTensor`, and running a fused
//! loop over output rows.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;
use std::sync::{Mutex, PoisonError};

/// Elements of work (multiply-adds, roughly) below which a loop runs on the calling thread: a
/// decode step's ops take microseconds, less than handing them to the thread pool costs.
const PARALLEL_WORK: usize = 1 << 17;

/// Whether `t` is an `f32` tensor on Flex, the case the fused loops handle.
pub(super) fn on_flex<const D: usize>(t: &Tensor<D>) -> bool {
    t.dtype() == DType::F32 && t.device() == Device::flex()
}

/// The Flex tensor behind `t` (checked by [`on_flex`]), its elements contiguous and in order.
pub(super) fn into_flex<const D: usize>(t: Tensor<D>) -> FlexTensor {
    let t = t.try_into_primitive::<Flex>().expect("checked by on_flex");
    if t.is_contiguous() { t } else { t.to_contiguous() }
}

/// The elements of a tensor from [`into_flex`].
pub(super) fn slice(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("into_flex returns contiguous f32 tensors")
}

/// The elements of a tensor from [`into_flex`], for writing: in place when its buffer is not
/// shared with another tensor, in a copy otherwise.
pub(super) fn slice_mut(t: &mut FlexTensor) -> &mut [f32] {
    let (start, end) = t.layout().contiguous_offsets().expect("into_flex returns contiguous tensors");
    &mut t.storage_mut::<f32>()[start..end]
}

/// Back to a Burn tensor.
pub(super) fn from_flex<const D: usize>(t: FlexTensor) -> Tensor<D> {
    Tensor::from_primitive::<Flex>(t)
}

/// A new Flex tensor of `shape` holding `values`.
pub(super) fn from_vec<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
    from_flex(FlexTensor::from_data(TensorData::new(values, shape)))
}

/// Calls `f(index, row)` for every `width`-wide row of `out`, in parallel when the rows add up to
/// more than a few microseconds of work (`work_per_row` multiply-adds each).
///
/// On two threads the rows alternate between this thread and the split helper of the quantized
/// products (`crate::quant::split`), which is still spinning from the last product: rayon's
/// workers would contend with it for the second core. Alternate rows also balance a causal
/// mask's growing rows. Elsewhere, rayon.
pub(crate) fn for_rows(out: &mut [f32], width: usize, work_per_row: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if width == 0 {
        return;
    }
    let rows = out.len() / width;
    if rows <= 1 || rows * work_per_row < PARALLEL_WORK {
        out.chunks_exact_mut(width).enumerate().for_each(|(i, row)| f(i, row));
    } else if rayon::current_num_threads() == 2 {
        let mut halves = [Vec::with_capacity(rows.div_ceil(2)), Vec::with_capacity(rows / 2)];
        for (i, row) in out.chunks_exact_mut(width).enumerate() {
            halves[i % 2].push((i, row));
        }
        let halves = halves.map(Mutex::new);
        crate::quant::split::split2(&|part| {
            let mut rows = halves[part].lock().unwrap_or_else(PoisonError::into_inner);
            rows.iter_mut().for_each(|(i, row)| f(*i, row));
        });
    } else {
        let per_task = (PARALLEL_WORK / work_per_row.max(1)).clamp(1, rows.div_ceil(2));
        out.par_chunks_mut(width).with_min_len(per_task).enumerate().for_each(|(i, row)| f(i, row));
    }
}
