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
}
