//! A layer's slots as the flat parts the disk tier keeps: keys then values, each one float tensor
//! in the model's dtype, or `u32` codes with float scales and minimums (the models' quantized
//! layout), every part `[batch, kv_heads, slots, width]`.

use std::ops::Range;

use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_llm_kernels::QuantSpec;
use burn_llm_models::KvLayout;
use burn_llm_models::cache::{LayerSlots, Slots};

use crate::error::{OffloadError, Result};

/// Width and element type of each part of a layer of `layout` stored with `quant`, keys first.
pub fn part_shapes(layout: KvLayout, quant: Option<QuantSpec>) -> Vec<(usize, DType)> {
    let d = layout.head_dim;
    let float = layout.dtype.dtype();
    let per_kv = match quant {
        None => vec![(d, float)],
        Some(spec) => {
            vec![(d / spec.per_word(), DType::U32), (d / spec.group_size(), float), (d / spec.group_size(), float)]
        }
    };
    [per_kv.clone(), per_kv].concat()
}

/// Slots `range` of every part of `slots`, in [`part_shapes`] order.
pub fn slot_data(slots: &LayerSlots, range: Range<usize>) -> Vec<TensorData> {
    [&slots.keys, &slots.values].into_iter().flat_map(|s| parts_of(s, range.clone())).collect()
}

/// Rebuilds a layer's slots on `device` from `parts` laid out as [`slot_data`] returns them over
/// the whole capacity; `quant` is the cache's quantization.
pub fn from_slot_data(parts: Vec<TensorData>, quant: Option<QuantSpec>, device: &Device) -> Result<LayerSlots> {
    let per = if quant.is_some() { 3 } else { 1 };
    if parts.len() != 2 * per {
        return Err(OffloadError::Internal(format!(
            "{} KV parts read for a layer that stores {}",
            parts.len(),
            2 * per
        )));
    }
    let mut parts = parts.into_iter();
    let mut next = || slots_of(parts.by_ref().take(per).collect(), quant, device);
    Ok(LayerSlots { keys: next(), values: next() })
}

fn parts_of(slots: &Slots, range: Range<usize>) -> Vec<TensorData> {
    let window = |t: [usize; 4]| [0..t[0], 0..t[1], range.clone(), 0..t[3]];
    match slots {
        Slots::Dense(t) => vec![t.clone().slice(window(t.dims())).into_data()],
        Slots::Quantized { codes, scale, min, .. } => vec![
            codes.clone().slice(window(codes.dims())).into_data(),
            scale.clone().slice(window(scale.dims())).into_data(),
            min.clone().slice(window(min.dims())).into_data(),
        ],
    }
}

/// `parts` holds one tensor (`None`) or three (`Some`): checked by [`from_slot_data`].
fn slots_of(mut parts: Vec<TensorData>, quant: Option<QuantSpec>, device: &Device) -> Slots {
    match quant {
        None => Slots::Dense(float(parts.remove(0), device)),
        Some(spec) => {
            let min = float(parts.remove(2), device);
            let scale = float(parts.remove(1), device);
            let codes = Tensor::from_data(parts.remove(0), (device, DType::U32));
            Slots::Quantized { codes, scale, min, spec }
        }
    }
}

/// A float part on `device` in the dtype it was stored in.
fn float<const D: usize>(data: TensorData, device: &Device) -> Tensor<D> {
    let dtype = data.dtype();
    Tensor::from_data(data, (device, dtype))
}
