//! Top-K sparse attention (FlexGen §5): each query keeps only its highest-scoring keys, so the
//! other keys' values are never needed.

use burn::tensor::Tensor;
use burn_llm_models::cache::{MASKED, attention_with};

/// The models' masked attention where each query keeps only its `keep` highest-scoring keys;
/// `None` or a `keep` at least the number of keys is dense attention. Ties at the threshold are
/// all kept.
pub fn sparse_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    scale: f32,
    keep: Option<usize>,
) -> Tensor<4> {
    let keys = k.dims()[2];
    attention_with(q, k, v, bias, scale, |scores| match keep.filter(|&keep| keep > 0 && keep < keys) {
        Some(keep) => {
            // The keep-th largest score of each query is its threshold; lower scores are masked.
            let threshold = scores.clone().topk(keep, 3).narrow(3, keep - 1, 1);
            let dropped = scores.clone().lower(threshold);
            scores.mask_fill(dropped, MASKED)
        }
        None => scores,
    })
}

/// Keys a decode query keeps when it keeps `fraction` of `keys` (at least one).
pub fn keys_kept(fraction: f32, keys: usize) -> usize {
    ((fraction * keys as f32).ceil() as usize).max(1)
}
