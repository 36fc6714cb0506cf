//! Greedy decoding's pick: the index of each row's largest value.

use burn::tensor::{Int, Tensor};

/// `logits.argmax(1)` for `[rows, width]` logits (`[rows, 1]`: the first index of each row's
/// largest value). On Flex a two-pass loop over each row: the maximum in eight lanes (which
/// vectorizes; Burn's argmax compares one element at a time, which shows over a vocabulary of
/// tens of thousands of tokens), then the first position holding it.
pub fn argmax_rows(logits: Tensor<2>) -> Tensor<2, Int> {
    #[cfg(feature = "flex")]
    if super::flex::on_flex(&logits) {
        use burn::tensor::TensorData;
        let [rows, width] = logits.dims();
        let device = logits.device();
        let logits = super::flex::into_flex(logits);
        let values = super::flex::slice(&logits);
        let ids: Vec<i64> = if width == 0 {
            vec![0; rows]
        } else {
            values.chunks_exact(width).map(|row| argmax_row(row) as i64).collect()
        };
        return Tensor::from_data(TensorData::new(ids, [rows, 1]), &device);
    }
    logits.argmax(1)
}

#[cfg(feature = "flex")]
avx2_dispatch! {
    /// The first index of the largest value of `row` (non-empty) as a scan that keeps the first
    /// strictly greater value would find it (so NaNs are passed over, unless the row starts
    /// with one: then 0); with AVX2 when the CPU has it.
    fn argmax_row(row: &[f32]) -> usize => argmax_row_portable
}

#[cfg(feature = "flex")]
#[inline(always)]
fn argmax_row_portable(row: &[f32]) -> usize {
    let first = row[0];
    let mut lanes = [first; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = if v > *lane { v } else { *lane };
        }
    }
    let max = lanes.iter().chain(tail).fold(first, |max, &v| if v > max { v } else { max });
    row.iter().position(|&v| v == max).unwrap_or(0)
}
