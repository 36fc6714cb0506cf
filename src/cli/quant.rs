//! The quantization flags (`--quantize` with `--group-size`, `--kv-quant`, `--compress-weight`,
//! `--compress-cache`) as the kernels' [`QuantSpec`], built in one place.

use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::{fit_kv_quant, KvLayout, KV_QUANT_AXIS};
use burn_llm_models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_offload::policy::{Policy, SearchSpace};
use burn_offload::PolicyChoice;

use super::GenerateArgs;

/// `bits` in groups of `group_size` along `axis`; errors name `flag`.
fn quant_spec(flag: &str, bits: u32, group_size: usize, axis: usize) -> Result<QuantSpec, String> {
    QuantSpec::new(bits, group_size, axis).map_err(|e| format!("{flag}: {e}"))
}

/// FlexGen's 4-bit groups of 64 along `axis` when `on`.
fn flexgen(flag: &str, on: bool, axis: usize) -> Result<Option<QuantSpec>, String> {
    on.then(|| quant_spec(flag, QuantSpec::FLEXGEN_BITS, QuantSpec::FLEXGEN_GROUP_SIZE, axis)).transpose()
}

impl GenerateArgs {
    /// `--quantize` with `--group-size`: weights in groups along their output channel.
    pub fn weight_quant(&self) -> Result<Option<QuantSpec>, String> {
        self.quantize.map(|w| quant_spec("--quantize/--group-size", w.bits(), self.group_size, WEIGHT_QUANT_AXIS)).transpose()
    }

    /// `--kv-quant`: FlexGen's groups of 64 along the head dimension, fitted to the model's heads
    /// when it is loaded ([`fit_kv_quant`]: the whole head when 64 does not tile it).
    pub fn kv_quant_spec(&self) -> Result<Option<QuantSpec>, String> {
        self.kv_quant.map(|bits| quant_spec("--kv-quant", bits, QuantSpec::FLEXGEN_GROUP_SIZE, KV_QUANT_AXIS)).transpose()
    }

    /// `--compress-weight` and `--compress-cache` (offload engine): FlexGen's 4-bit groups of 64,
    /// for weights and for the KV cache.
    pub fn compression(&self) -> Result<(Option<QuantSpec>, Option<QuantSpec>), String> {
        Ok((
            flexgen("--compress-weight", self.compress_weight, WEIGHT_QUANT_AXIS)?,
            flexgen("--compress-cache", self.compress_cache, KV_QUANT_AXIS)?,
        ))
    }
}

/// The offload policy with its KV-cache compression fitted to the model's heads
/// ([`fit_kv_quant`]), so that the cost model prices the groups the runtime stores.
pub(super) fn fit_cache_compression(choice: PolicyChoice, layout: KvLayout) -> burn_llm_models::Result<PolicyChoice> {
    let fit = |c: Option<QuantSpec>| c.map(|spec| fit_kv_quant(layout, spec)).transpose();
    Ok(match choice {
        PolicyChoice::Fixed(p) => PolicyChoice::Fixed(Policy { compress_cache: fit(p.compress_cache)?, ..p }),
        PolicyChoice::Auto(space) => {
            let cache_compression = space.cache_compression.iter().map(|&c| fit(c)).collect::<burn_llm_models::Result<_>>()?;
            PolicyChoice::Auto(SearchSpace { cache_compression, ..space })
        }
    })
}
