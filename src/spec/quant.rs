//! The quantization settings as the kernels' [`QuantSpec`], built in one place for every engine:
//! `--quantize w4|w8 --group-size G` for weights and `--kv-quant 4|8` for the KV cache, with
//! FlexGen's names `--compress-weight` (= `--quantize w4 --group-size 64`) and `--compress-cache`
//! (= `--kv-quant 4 --kv-group-size 64`, FlexGen's format) as spellings of the same thing.

use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::{KV_QUANT_AXIS, KvLayout, default_kv_group_size, fit_kv_quant};
use burn_llm_models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_offload::PolicyChoice;
use burn_offload::policy::SearchSpace;

use super::{DEFAULT_GROUP_SIZE, EngineSpec};

/// `bits` in groups of `group_size` along `axis`; errors name `flag`.
fn quant_spec(flag: &str, bits: u32, group_size: usize, axis: usize) -> Result<QuantSpec, String> {
    QuantSpec::new(bits, group_size, axis).map_err(|e| format!("{flag}: {e}"))
}

/// FlexGen's 4-bit groups of 64 along `axis` when `on`.
fn flexgen(flag: &str, on: bool, axis: usize) -> Result<Option<QuantSpec>, String> {
    on.then(|| quant_spec(flag, QuantSpec::FLEXGEN_BITS, QuantSpec::FLEXGEN_GROUP_SIZE, axis)).transpose()
}

impl EngineSpec {
    /// `--quantize` with `--group-size` (or FlexGen's name for `--quantize w4 --group-size 64`,
    /// `--compress-weight`): weights in groups along their output channel, on every engine.
    pub fn weight_quant(&self) -> Result<Option<QuantSpec>, String> {
        match (self.quantize, self.compress_weight) {
            (Some(_), true) => Err("--quantize and --compress-weight both quantize the weights: give one".into()),
            (Some(w), false) => quant_spec(
                "--quantize/--group-size",
                w.bits(),
                self.group_size.unwrap_or(DEFAULT_GROUP_SIZE),
                WEIGHT_QUANT_AXIS,
            )
            .map(Some),
            (None, on) => flexgen("--compress-weight", on, WEIGHT_QUANT_AXIS),
        }
    }

    /// `--kv-quant` with `--kv-group-size` (default [`default_kv_group_size`]: 32 for 4 bits, 64
    /// for 8), or FlexGen's `--compress-cache` (4 bits in FlexGen's groups of 64, always): groups
    /// along the head dimension, fitted to the model's heads when it is loaded ([`fit_kv_quant`]:
    /// the whole head when the group does not tile it).
    pub fn kv_quant_spec(&self) -> Result<Option<QuantSpec>, String> {
        match (self.kv_quant, self.compress_cache, self.kv_group_size) {
            (Some(_), true, _) => Err("--kv-quant and --compress-cache both quantize the KV cache: give one".into()),
            (Some(bits), false, group) => quant_spec(
                "--kv-quant/--kv-group-size",
                bits,
                group.unwrap_or(default_kv_group_size(bits)),
                KV_QUANT_AXIS,
            )
            .map(Some),
            (None, _, Some(_)) => Err("sets the groups of --kv-quant, which is not given (--compress-cache \
                 always uses FlexGen's groups of 64)"
                .into()),
            (None, on, None) => flexgen("--compress-cache", on, KV_QUANT_AXIS),
        }
    }

    /// The offload engine's weight and cache compression: the same flags as every engine's
    /// ([`EngineSpec::weight_quant`], [`EngineSpec::kv_quant_spec`]).
    pub fn compression(&self) -> Result<(Option<QuantSpec>, Option<QuantSpec>), String> {
        Ok((self.weight_quant()?, self.kv_quant_spec()?))
    }
}

/// The offload policy with its KV-cache compression fitted to the model's heads
/// ([`fit_kv_quant`]), so that the cost model prices the groups the runtime stores.
pub(super) fn fit_cache_compression(choice: PolicyChoice, layout: KvLayout) -> burn_llm_models::Result<PolicyChoice> {
    let fit = |c: Option<QuantSpec>| c.map(|spec| fit_kv_quant(layout, spec)).transpose();
    Ok(match choice {
        PolicyChoice::Fixed(mut p) => {
            p.shape.compress_cache = fit(p.shape.compress_cache)?;
            PolicyChoice::Fixed(p)
        }
        PolicyChoice::Auto(space) => {
            let cache_compression =
                space.cache_compression.iter().map(|&c| fit(c)).collect::<burn_llm_models::Result<_>>()?;
            PolicyChoice::Auto(SearchSpace { cache_compression, ..space })
        }
    })
}
