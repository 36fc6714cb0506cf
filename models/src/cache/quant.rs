//! KV-cache quantization: which [`QuantSpec`]s a cache of a given [`KvLayout`] can store its keys
//! and values with (groups along the head dimension of `[batch, kv_heads, slots, head_dim]`).

use burn_llm_kernels::QuantSpec;

use super::KvLayout;
use crate::error::{ModelError, Result};

/// Axis of a cached `[batch, kv_heads, slots, head_dim]` tensor that KV groups run along: the
/// head dimension. A [`QuantSpec`] for the KV cache names it.
pub const KV_QUANT_AXIS: usize = 3;

/// Checks that a cache of `layout` can store its keys and values exactly as `spec` says: along
/// [`KV_QUANT_AXIS`], in groups that tile a head.
pub fn check_kv_quant(layout: KvLayout, spec: QuantSpec) -> Result<()> {
    if spec.axis() != KV_QUANT_AXIS {
        return Err(ModelError::Quantization(format!(
            "KV cache: {spec}: keys and values are quantized along the head dimension, axis {KV_QUANT_AXIS}"
        )));
    }
    spec.validate(&[1, 1, 1, layout.head_dim]).map_err(|e| ModelError::Quantization(format!("KV cache: {e}")))
}

/// `requested` fitted to `layout`: its bits and group size along the head dimension, or groups
/// of the whole head when the requested size does not tile one (FlexGen's groups of 64 on a model
/// with 16-value heads). What `--kv-quant` and `--compress-cache` store.
pub fn fit_kv_quant(layout: KvLayout, requested: QuantSpec) -> Result<QuantSpec> {
    let requested = requested.along(KV_QUANT_AXIS);
    let spec = if layout.head_dim.is_multiple_of(requested.group_size()) {
        requested
    } else {
        QuantSpec::new(requested.bits(), layout.head_dim, KV_QUANT_AXIS)
            .map_err(|e| ModelError::Quantization(format!("KV cache: {e}")))?
    };
    check_kv_quant(layout, spec)?;
    Ok(spec)
}

/// Values per group along the head that `--kv-quant bits` uses unless `--kv-group-size` says
/// otherwise: FlexGen's 64 for 8-bit codes, 32 for 4-bit ones (llama.cpp's `q4_1` KV layout).
///
/// Keys are what 4-bit codes lose quality on: a few of a head's channels carry most of a key's
/// magnitude, and one scale and minimum over the whole group spends the 16 levels on them.
/// Smaller groups lose less but store more: groups of 8 cost more bytes per value than 8-bit
/// codes in groups of 64, so they are no default (docs/paged.md tables the perplexity and size of
/// every group).
pub const fn default_kv_group_size(bits: u32) -> usize {
    if bits == 4 { 32 } else { QuantSpec::FLEXGEN_GROUP_SIZE }
}

/// `bits`-bit KV codes in groups of `group_size` (default [`default_kv_group_size`]) along the
/// head dimension, before fitting to a model ([`fit_kv_quant`]).
pub fn kv_quant(bits: u32, group_size: Option<usize>) -> Result<QuantSpec> {
    QuantSpec::new(bits, group_size.unwrap_or(default_kv_group_size(bits)), KV_QUANT_AXIS)
        .map_err(|e| ModelError::Quantization(format!("KV cache: {e}")))
}
