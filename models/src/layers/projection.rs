//! Linear projections stored densely (`Linear`) or group-quantized (`QLinear`, FlexGen's 4/8-bit
//! weight compression), behind one type so the decoder does not care which.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Int, Tensor};
use burn_llm_kernels::{dequantize, qmatmul, quantize, GroupQuantized, QuantSpec};

use crate::error::{ModelError, Result};

/// Rows of input up to which the fused dequantize-matmul kernel is used; above, dequantizing the
/// weight once and running an ordinary matmul is faster.
pub const FUSED_MAX_ROWS: usize = 16;

/// A drop-in for `Linear` whose `[in, out]` weight is group-quantized along the output axis.
#[derive(Module, Debug)]
pub struct QLinear {
    /// Packed codes, `[in, out · bits / 32]`, `U32`.
    pub codes: Tensor<2, Int>,
    /// Per-group scale, `[in, out / group]`.
    pub scale: Tensor<2>,
    /// Per-group minimum, `[in, out / group]`.
    pub min: Tensor<2>,
    /// Bias, kept in full precision.
    pub bias: Option<Param<Tensor<1>>>,
    /// Input width.
    pub d_input: usize,
    /// Output width.
    pub d_output: usize,
    /// Bits per code.
    pub bits: u32,
    /// Values per group.
    pub group_size: usize,
}

impl QLinear {
    /// Quantizes a dense layer's weight with `bits` and `group_size` along its output axis.
    pub fn from_linear(linear: &Linear, bits: u32, group_size: usize) -> std::result::Result<Self, burn_llm_kernels::KernelError> {
        let weight = linear.weight.val();
        let [d_input, d_output] = weight.dims();
        let q = quantize(weight, QuantSpec::new(bits, group_size, 1))?;
        Ok(Self {
            codes: q.codes,
            scale: q.scale,
            min: q.min,
            bias: linear.bias.clone(),
            d_input,
            d_output,
            bits,
            group_size,
        })
    }

    /// The quantized weight.
    pub fn weight(&self) -> GroupQuantized<2> {
        GroupQuantized {
            codes: self.codes.clone(),
            scale: self.scale.clone(),
            min: self.min.clone(),
            shape: [self.d_input, self.d_output],
            spec: QuantSpec::new(self.bits, self.group_size, 1),
        }
    }

    /// `x · W + b` for `x` `[..., in]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dims = x.dims();
        let rows = dims[..D - 1].iter().product::<usize>();
        let flat: Tensor<2> = x.reshape([rows, self.d_input]);
        let weight = self.weight();
        let out = if rows <= FUSED_MAX_ROWS {
            qmatmul(flat, &weight).expect("QLinear weights are quantized along the output axis")
        } else {
            flat.matmul(dequantize(&weight))
        };
        let out = match &self.bias {
            Some(bias) => out + bias.val().unsqueeze(),
            None => out,
        };
        let mut shape = dims;
        shape[D - 1] = self.d_output;
        out.reshape(shape)
    }
}

/// A projection of the decoder, dense or quantized.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // a few per layer, built once
pub enum Projection {
    /// Full-precision weight.
    Dense(Linear),
    /// Group-quantized weight.
    Quantized(QLinear),
}

impl From<Linear> for Projection {
    fn from(linear: Linear) -> Self {
        Projection::Dense(linear)
    }
}

impl Projection {
    /// `x · W + b` for `x` `[..., in]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Projection::Dense(l) => l.forward(x),
            Projection::Quantized(q) => q.forward(x),
        }
    }

    /// The same projection with its weight quantized (already quantized ones are kept). `name`
    /// identifies the layer in errors.
    pub fn quantized(self, bits: u32, group_size: usize, name: &str) -> Result<Self> {
        match self {
            Projection::Dense(linear) => QLinear::from_linear(&linear, bits, group_size)
                .map(Projection::Quantized)
                .map_err(|e| ModelError::Quantization(format!("{name}: {e}"))),
            quantized => Ok(quantized),
        }
    }
}
