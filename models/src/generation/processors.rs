//! The logits processors that run before the penalties, in vLLM's order: the structured-output
//! mask (vLLM applies the grammar bitmask before its sampler), then `logit_bias`; and `min_p`,
//! which vLLM runs after temperature and before top-k/top-p.
//!
//! The mask and the biases become one additive `[batch, vocab]` tensor (`-inf` for a token the
//! constraint forbids, the bias for a biased one, `0` elsewhere), uploaded once per step and only
//! for the requests that have either.

use burn::tensor::{Tensor, TensorData};
use llguidance::toktrie::SimpleVob;

use super::sampling::SamplingParams;
use crate::error::{ModelError, Result};

/// `logits` plus `params.logit_bias` on every row, with the tokens `allowed[b]` does not hold set
/// to `-inf` in row `b` (`allowed` empty: no constraint). Unchanged when there is neither.
pub fn add_biases(logits: Tensor<2>, params: &SamplingParams, allowed: &[SimpleVob]) -> Result<Tensor<2>> {
    if allowed.is_empty() && params.logit_bias.is_empty() {
        return Ok(logits);
    }
    let [batch, vocab] = logits.dims();
    if !allowed.is_empty() && allowed.len() != batch {
        return Err(ModelError::InvalidSampling(format!(
            "a constrained step needs one token mask per row: {batch} rows, {} masks",
            allowed.len()
        )));
    }
    let mut bias = vec![0f32; batch * vocab];
    for (b, row) in bias.chunks_exact_mut(vocab).enumerate() {
        if let Some(mask) = allowed.get(b) {
            if mask.is_zero() {
                return Err(ModelError::InvalidSampling(
                    "the output's constraint allows no token at this point".into(),
                ));
            }
            // Forbid everything, then allow the mask's set bits (a word at a time: masks are
            // mostly zero words).
            row.fill(f32::NEG_INFINITY);
            mask.iter_set_entries(|id| {
                if let Some(value) = row.get_mut(id) {
                    *value = 0.0;
                }
            });
        }
        for (&id, &by) in &params.logit_bias {
            if let Some(value) = row.get_mut(id as usize) {
                *value += by;
            }
        }
    }
    let bias = Tensor::<2>::from_data(TensorData::new(bias, [batch, vocab]), &logits.device());
    Ok(logits + bias)
}

/// Per row of `logits` (`[rows, vocab]`): the greedy token among those `allowed[row]` holds, the
/// first index of the largest allowed logit, which is what an argmax of the row after
/// [`add_biases`] gives. It reads the rows back and visits only the allowed entries, instead of
/// building, uploading and adding a `[rows, vocab]` bias. A mask that allows no token of the row
/// is an error.
pub fn masked_argmax(logits: Tensor<2>, allowed: &[SimpleVob]) -> Result<Vec<u32>> {
    let [rows, vocab] = logits.dims();
    if allowed.len() != rows {
        return Err(ModelError::InvalidSampling(format!(
            "a constrained step needs one token mask per row: {rows} rows, {} masks",
            allowed.len()
        )));
    }
    let values = super::sampling::read_floats(logits)?;
    let mut ids = Vec::with_capacity(rows);
    for (row, mask) in values.chunks_exact(vocab.max(1)).zip(allowed) {
        let mut best: Option<(usize, f32)> = None;
        mask.iter_set_entries(|id| {
            if let Some(&value) = row.get(id)
                && best.is_none_or(|(_, top)| value > top)
            {
                best = Some((id, value));
            }
        });
        let (id, _) = best.ok_or_else(|| {
            ModelError::InvalidSampling("the output's constraint allows no token at this point".into())
        })?;
        ids.push(id as u32);
    }
    Ok(ids)
}

/// Sorted (descending) logits after temperature with every entry whose probability is below
/// `min_p` × the row's highest set to `-inf` (`p ≥ min_p · p_max` ⇔ `l ≥ l_max + ln min_p`).
pub fn apply_min_p(sorted: Tensor<2>, min_p: f32) -> Tensor<2> {
    if min_p <= 0.0 {
        return sorted;
    }
    let [batch, vocab] = sorted.dims();
    let threshold = sorted.clone().slice([0..batch, 0..1]).add_scalar(min_p.ln()).expand([batch, vocab]);
    let below = sorted.clone().lower(threshold);
    sorted.mask_fill(below, f32::NEG_INFINITY)
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;

    fn row(values: &[f32]) -> Tensor<2> {
        Tensor::from_data(TensorData::new(values.to_vec(), [1, values.len()]), &Device::flex())
    }

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_into_vec_as::<f32>().unwrap()
    }

    #[test]
    fn mask_and_bias_add_up_and_min_p_keeps_the_likely() {
        let params = SamplingParams { logit_bias: [(1, 2.0), (3, -1.0)].into(), ..SamplingParams::default() };
        let mut mask = SimpleVob::alloc(4);
        mask.allow_token(1);
        mask.allow_token(2);
        let out = values(add_biases(row(&[0.5, 1.0, 2.0, 3.0]), &params, &[mask]).unwrap());
        assert_eq!(out, [f32::NEG_INFINITY, 3.0, 2.0, f32::NEG_INFINITY]);
        let unmasked = values(add_biases(row(&[0.5, 1.0, 2.0, 3.0]), &params, &[]).unwrap());
        assert_eq!(unmasked, [0.5, 3.0, 2.0, 2.0]);
        assert!(add_biases(row(&[0.0; 4]), &params, &[SimpleVob::alloc(4)]).is_err());
        // Sorted logits 3 > 2 > 0: with min_p 0.3, p ≥ 0.3 p_max ⇔ l ≥ 3 + ln 0.3 ≈ 1.80.
        let kept = values(apply_min_p(row(&[3.0, 2.0, 0.0]), 0.3));
        assert_eq!(kept, [3.0, 2.0, f32::NEG_INFINITY]);
        assert_eq!(values(apply_min_p(row(&[3.0, 2.0, 0.0]), 0.0)), [3.0, 2.0, 0.0]);
    }

    /// The masked argmax picks what an argmax after the `-inf` bias picks, ties included (the
    /// first index), row by row; a row whose mask allows nothing is an error.
    #[test]
    fn masked_argmax_equals_argmax_after_the_bias() {
        let logits = [0.5, 3.0, 2.0, 2.0, 9.0, 1.0, -4.0, -1.0, -1.0, 7.0];
        let (rows, vocab) = (2, 5);
        let tensor = || Tensor::<2>::from_data(TensorData::new(logits.to_vec(), [rows, vocab]), &Device::flex());
        let masks: Vec<SimpleVob> = [&[2, 3][..], &[1, 2, 3]]
            .iter()
            .map(|ids| {
                let mut mask = SimpleVob::alloc(vocab);
                ids.iter().for_each(|&id| mask.allow_token(id));
                mask
            })
            .collect();
        let biased = add_biases(tensor(), &SamplingParams::default(), &masks).unwrap();
        let expected = crate::generation::sampling::read_ids(burn_llm_kernels::argmax_rows(biased)).unwrap();
        assert_eq!(masked_argmax(tensor(), &masks).unwrap(), expected);
        assert_eq!(expected, [2, 2]);
        assert!(masked_argmax(tensor(), &masks[..1]).is_err());
        assert!(masked_argmax(tensor(), &[SimpleVob::alloc(vocab), masks[1].clone()]).is_err());
    }
}
