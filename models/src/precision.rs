//! The floating-point type a model's weights are stored and multiplied in (`--dtype`), and the
//! cast that puts a loaded module into it.
//!
//! Weights, activations between layers and the KV cache live in the model's [`Precision`]; the
//! steps whose accuracy needs more range or mantissa than half precision has run in `f32` and
//! cast back at their boundaries, as HF transformers does: the attention softmax
//! ([`crate::cache::attention`]), the norms ([`crate::layers::norm`]) and the logits
//! ([`crate::model::CausalLm::logits`]). Norm parameters stay in `f32` for the same reason (they
//! are a few thousand values per layer).

use std::fmt;
use std::str::FromStr;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};

/// Floating-point type of a model's weights, activations and KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE single precision: the reference, within 1e-4 of HF transformers.
    #[default]
    F32,
    /// IEEE half precision (10-bit mantissa, range ±65504).
    F16,
    /// bfloat16 (7-bit mantissa, the range of `f32`).
    Bf16,
}

/// The names `--dtype` accepts, for error messages.
pub const PRECISION_NAMES: &str = "f32, f16, bf16";

impl Precision {
    /// Burn's element type.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::F16 => DType::F16,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// The precision of a Burn float dtype; `None` for other dtypes.
    pub fn from_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Precision::F32),
            DType::F16 => Some(Precision::F16),
            DType::BF16 => Some(Precision::Bf16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        self.dtype().size()
    }

    /// Machine epsilon: the gap between 1 and the next representable value (`2^-23`, `2^-10`,
    /// `2^-7`). Tolerances against a reference in the same precision are multiples of it.
    pub fn epsilon(self) -> f32 {
        match self {
            Precision::F32 => f32::EPSILON,
            Precision::F16 => half::f16::EPSILON.to_f32(),
            Precision::Bf16 => half::bf16::EPSILON.to_f32(),
        }
    }

    /// The `--dtype` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        }
    }

    /// `value` rounded to this type (as `f32`), as a constant cast to it would be.
    pub fn round(self, value: f64) -> f32 {
        match self {
            Precision::F32 => value as f32,
            Precision::F16 => half::f16::from_f64(value).to_f32(),
            Precision::Bf16 => half::bf16::from_f64(value).to_f32(),
        }
    }

    /// Whether this is a 16-bit type.
    pub fn is_half(self) -> bool {
        self != Precision::F32
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `--dtype` value that names no supported precision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype `{0}`: expected one of {PRECISION_NAMES}")]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            _ => Err(UnknownPrecision(s.to_string())),
        }
    }
}

/// `module` with every float parameter cast to `precision`, except those of norm layers (`Norm`,
/// `LayerNorm`, `RmsNorm`), which stay as loaded (`f32`) because the norms compute in `f32`.
/// Integer parameters (quantized codes) are untouched; the scales and minimums of quantized
/// weights are cast, so dequantization produces `precision` values. Parameters already in
/// `precision` are kept as they are (no copy).
pub fn cast_module<M: Module>(module: M, precision: Precision) -> M {
    module.map(&mut CastFloats { dtype: precision.dtype(), in_norm: 0 })
}

/// Casts float parameters outside norm layers.
struct CastFloats {
    dtype: DType,
    /// Depth of norm modules entered.
    in_norm: usize,
}

/// Whether a module container type names a norm layer.
fn is_norm(container_type: &str) -> bool {
    matches!(container_type, "Enum:Norm" | "Struct:LayerNorm" | "Struct:RmsNorm")
}

impl ModuleMapper for CastFloats {
    fn enter_module(&mut self, _name: &str, container_type: &str) {
        if is_norm(container_type) {
            self.in_norm += 1;
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        if is_norm(container_type) {
            self.in_norm -= 1;
        }
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.in_norm > 0 {
            return param;
        }
        let dtype = self.dtype;
        param.map(|t| t.cast(dtype))
    }
}

/// `x` computed on in `f32`: `f(x as f32)` cast back to `x`'s dtype. For the steps that need the
/// range or mantissa of `f32` (norms, the softmax); the casts vanish when `x` is `f32` already.
pub fn in_f32<const D: usize>(x: Tensor<D>, f: impl FnOnce(Tensor<D>) -> Tensor<D>) -> Tensor<D> {
    let dtype = x.dtype();
    f(x.cast(DType::F32)).cast(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_every_precision() {
        for p in [Precision::F32, Precision::F16, Precision::Bf16] {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
            assert_eq!(Precision::from_dtype(p.dtype()), Some(p));
        }
        assert_eq!("BFloat16".parse::<Precision>(), Ok(Precision::Bf16));
        let err = "f8".parse::<Precision>().unwrap_err();
        assert!(err.to_string().contains("f32, f16, bf16"), "{err}");
        assert_eq!(Precision::F16.size_bytes(), 2);
        assert_eq!(Precision::Bf16.epsilon(), 1.0 / 128.0);
    }
}
