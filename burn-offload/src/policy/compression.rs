//! The policy's quantization settings: [`QuantSpec`]s from the kernels crate, one per tensor kind,
//! each along the axis that kind is quantized on by the runtime (weights: [`WEIGHT_QUANT_AXIS`],
//! KV cache: [`KV_QUANT_AXIS`]).
//!
//! They serialize as `{"bits": 4, "group_size": 64}` (or `null`): the axis follows from the
//! field, so it is not written, and policy files keep the shape they had before the settings were
//! `QuantSpec`s. Reading one checks it as [`QuantSpec::new`] does (4 or 8 bits, whole words).

use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::KV_QUANT_AXIS;
use burn_llm_models::layers::projection::WEIGHT_QUANT_AXIS;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::PolicyError;

/// FlexGen's weight compression: 4-bit groups of 64 along each weight's output channel.
pub const FLEXGEN_WEIGHTS: QuantSpec = QuantSpec::flexgen(WEIGHT_QUANT_AXIS);

/// FlexGen's KV-cache compression: 4-bit groups of 64 along the head dimension.
pub const FLEXGEN_CACHE: QuantSpec = QuantSpec::flexgen(KV_QUANT_AXIS);

/// A [`QuantSpec`] as written in a policy.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    bits: u32,
    group_size: usize,
}

impl Written {
    fn of(spec: &QuantSpec) -> Self {
        Self { bits: spec.bits(), group_size: spec.group_size() }
    }

    fn along<E: serde::de::Error>(self, axis: usize) -> Result<QuantSpec, E> {
        QuantSpec::new(self.bits, self.group_size, axis).map_err(E::custom)
    }
}

/// Checks that a weight compression runs along [`WEIGHT_QUANT_AXIS`].
pub(crate) fn check_weights(spec: Option<QuantSpec>) -> Result<(), PolicyError> {
    check_axis("weight", WEIGHT_QUANT_AXIS, spec)
}

/// Checks that a KV-cache compression runs along [`KV_QUANT_AXIS`].
pub(crate) fn check_cache(spec: Option<QuantSpec>) -> Result<(), PolicyError> {
    check_axis("cache", KV_QUANT_AXIS, spec)
}

fn check_axis(kind: &str, axis: usize, spec: Option<QuantSpec>) -> Result<(), PolicyError> {
    match spec {
        Some(s) if s.axis() != axis => {
            Err(PolicyError::InvalidPolicy(format!("{kind} compression {s}: {kind}s are quantized along axis {axis}")))
        }
        _ => Ok(()),
    }
}

/// Writes a setting as `{"bits", "group_size"}` or `null`.
pub(crate) fn serialize<S: Serializer>(spec: &Option<QuantSpec>, s: S) -> Result<S::Ok, S::Error> {
    spec.as_ref().map(Written::of).serialize(s)
}

/// Writes a list of settings (a search space's choices).
pub(crate) fn serialize_choices<S: Serializer>(specs: &[Option<QuantSpec>], s: S) -> Result<S::Ok, S::Error> {
    specs.iter().map(|spec| spec.as_ref().map(Written::of)).collect::<Vec<_>>().serialize(s)
}

fn read<'de, D: Deserializer<'de>>(d: D, axis: usize) -> Result<Option<QuantSpec>, D::Error> {
    Option::<Written>::deserialize(d)?.map(|w| w.along(axis)).transpose()
}

fn read_choices<'de, D: Deserializer<'de>>(d: D, axis: usize) -> Result<Vec<Option<QuantSpec>>, D::Error> {
    Vec::<Option<Written>>::deserialize(d)?.into_iter().map(|w| w.map(|w| w.along(axis)).transpose()).collect()
}

/// Reads a weight compression setting.
pub(crate) fn weights<'de, D: Deserializer<'de>>(d: D) -> Result<Option<QuantSpec>, D::Error> {
    read(d, WEIGHT_QUANT_AXIS)
}

/// Reads a KV-cache compression setting.
pub(crate) fn cache<'de, D: Deserializer<'de>>(d: D) -> Result<Option<QuantSpec>, D::Error> {
    read(d, KV_QUANT_AXIS)
}

/// Reads a search space's weight compression choices.
pub(crate) fn weight_choices<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<QuantSpec>>, D::Error> {
    read_choices(d, WEIGHT_QUANT_AXIS)
}

/// Reads a search space's KV-cache compression choices.
pub(crate) fn cache_choices<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<QuantSpec>>, D::Error> {
    read_choices(d, KV_QUANT_AXIS)
}
