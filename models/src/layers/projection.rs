//! Linear projections stored densely (`Linear`) or group-quantized (`QLinear`, FlexGen's 4/8-bit
//! weight compression, or a GGUF file's blocks as shipped), behind one type so the decoder does not
//! care which.

use burn::module::{Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::{Int, Tensor};
pub use burn_llm_kernels::FUSED_MAX_ROWS;
use burn_llm_kernels::{
    GroupQuantized, QuantSpec, dequantize, fused_product_wins, matmul, matmul_precision, product_site, qmatmul,
    qmatmul_transposed, quantize,
};

use crate::error::{ModelError, Result};

/// Axis a weight is quantized along: its last, the output channel of FlexGen's `[in, out]`
/// layout (and the input channel of GGUF's `[out, in]` one). A [`QuantSpec`] for weights names it.
pub const WEIGHT_QUANT_AXIS: usize = 1;

/// A drop-in for `Linear` holding a group-quantized weight, in one of two layouts:
/// - FlexGen's: `[in, out]` grouped along the output channel (what [`QLinear::from_linear`] makes);
/// - llama.cpp's (`input_grouped`): `[out, in]` grouped along the input channel, which is how GGUF
///   files store `Q4_0`/`Q4_1`/`Q8_0` weights, so they load without re-encoding.
#[derive(Module, Debug)]
pub struct QLinear {
    /// Packed codes, `U32`: `[in, out · bits / 32]`, or `[out, in · bits / 32]` when input-grouped.
    /// Parameters (not plain tensors) so that module visitors and mappers see them: records, and
    /// the offloading runtime's disk tier, store the codes as they are.
    pub codes: Param<Tensor<2, Int>>,
    /// Per-group scale, `[in, out / group]` or `[out, in / group]`.
    pub scale: Param<Tensor<2>>,
    /// Per-group minimum, same shape as `scale`.
    pub min: Param<Tensor<2>>,
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
    /// Whether groups run along the input channel (`[out, in]` storage).
    pub input_grouped: bool,
    /// For the weights of a symmetric GGUF type, the offset whose `−offset · scale` is every
    /// group's minimum ([`QuantSpec::symmetric_offset`]); 0 otherwise.
    pub symmetric_offset: u32,
}

impl QLinear {
    /// Quantizes a dense layer's weight as `spec` says, along its output channel: the spec's axis
    /// must be [`WEIGHT_QUANT_AXIS`] and its group size must divide the output width.
    pub fn from_linear(linear: &Linear, spec: QuantSpec) -> Result<Self> {
        if spec.axis() != WEIGHT_QUANT_AXIS {
            return Err(ModelError::Quantization(format!(
                "{spec}: weights are quantized along their output channel, axis {WEIGHT_QUANT_AXIS}"
            )));
        }
        let weight = linear.weight.val();
        let [d_input, d_output] = weight.dims();
        let q = quantize(weight, spec).map_err(|e| ModelError::Quantization(e.to_string()))?;
        Ok(Self::from_parts(q, linear.bias.clone(), [d_input, d_output], false))
    }

    /// A layer over an `[out, in]` weight already quantized along `in` (GGUF blocks).
    pub fn from_out_in(weight: GroupQuantized<2>, bias: Option<Param<Tensor<1>>>) -> Self {
        let [d_output, d_input] = weight.shape;
        Self::from_parts(weight, bias, [d_input, d_output], true)
    }

    /// A layer over `q` as it is: `[in, out]` grouped along `out`, or (`input_grouped`) `[out, in]`
    /// grouped along `in` (tensor parallelism builds rank shards with it).
    pub fn from_parts(
        q: GroupQuantized<2>,
        bias: Option<Param<Tensor<1>>>,
        [d_input, d_output]: [usize; 2],
        input_grouped: bool,
    ) -> Self {
        Self {
            codes: Param::initialized(ParamId::new(), q.codes),
            scale: Param::from_tensor(q.scale),
            min: Param::from_tensor(q.min),
            bias,
            d_input,
            d_output,
            bits: q.spec.bits(),
            group_size: q.spec.group_size(),
            input_grouped,
            symmetric_offset: q.spec.symmetric_offset(),
        }
    }

    /// How the weight is quantized (along [`WEIGHT_QUANT_AXIS`] in either layout).
    pub fn spec(&self) -> QuantSpec {
        QuantSpec::new(self.bits, self.group_size, WEIGHT_QUANT_AXIS)
            .expect("a QLinear is built from a checked QuantSpec")
            .with_symmetric_offset(self.symmetric_offset)
    }

    /// The quantized weight, `[in, out]` or (input-grouped) `[out, in]`, quantized along axis 1.
    pub fn weight(&self) -> GroupQuantized<2> {
        let shape = if self.input_grouped { [self.d_output, self.d_input] } else { [self.d_input, self.d_output] };
        GroupQuantized {
            codes: self.codes.val(),
            scale: self.scale.val(),
            min: self.min.val(),
            shape,
            spec: self.spec(),
        }
    }

    /// The weight in full precision, `[in, out]` (Burn's `Linear` layout).
    pub fn dequantized_weight(&self) -> Tensor<2> {
        let w = dequantize(&self.weight());
        if self.input_grouped { w.transpose() } else { w }
    }

    /// The layer in full precision, its weight stored contiguously in `[in, out]` (a transposed
    /// view would make every later matmul walk it with strides).
    pub fn to_dense(&self) -> Linear {
        let weight = self.dequantized_weight();
        let device = weight.device();
        Linear { weight: Param::from_tensor(Tensor::from_data(weight.into_data(), &device)), bias: self.bias.clone() }
    }

    /// Bytes of codes, scales and minimums.
    pub fn size_bytes(&self) -> usize {
        self.weight().size_bytes()
    }

    /// Bytes a product on the CPU's integer kernels reads (`GroupQuantized::cpu_read_bytes`).
    pub fn cpu_read_bytes(&self) -> usize {
        self.weight().cpu_read_bytes()
    }

    /// `x · W + b` for `x` `[..., in]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dims = x.dims();
        let rows = dims[..D - 1].iter().product::<usize>();
        let flat: Tensor<2> = x.reshape([rows, self.d_input]);
        let weight = self.weight();
        // A worker's device gets the fused op whatever the rows: its server, which knows whether
        // it is a CPU or a GPU, makes the same choice there.
        let fused = product_site(&flat.device())
            .is_none_or(|site| fused_product_wins(rows, site, self.input_grouped, matmul_precision()));
        let out = match (fused, self.input_grouped) {
            (true, false) => qmatmul(flat, &weight).expect("QLinear weights are quantized along the output axis"),
            (true, true) => qmatmul_transposed(flat, &weight).expect("input-grouped QLinear weights are [out, in]"),
            (false, _) => matmul(flat, self.dequantized_weight()),
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

/// `Linear::forward` through [`matmul`] (register-tiled `f32` loops on Flex, Burn's matmul
/// elsewhere).
fn dense_forward<const D: usize>(linear: &Linear, x: Tensor<D>) -> Tensor<D> {
    let mut shape = x.dims();
    let weight = linear.weight.val();
    let [d_input, d_output] = weight.dims();
    let out = matmul(x.reshape([shape[..D - 1].iter().product::<usize>(), d_input]), weight);
    let out = match &linear.bias {
        Some(bias) => out + bias.val().unsqueeze(),
        None => out,
    };
    shape[D - 1] = d_output;
    out.reshape(shape)
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
            Projection::Dense(l) => dense_forward(l, x),
            Projection::Quantized(q) => q.forward(x),
        }
    }

    /// Bytes of the weight as stored (the bias is not counted).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Projection::Dense(l) => l.weight.val().dims().iter().product::<usize>() * l.weight.val().dtype().size(),
            Projection::Quantized(q) => q.size_bytes(),
        }
    }

    /// Bytes of the weight that a product on the CPU reads: as stored, less the minimums that the
    /// integer kernels derive (a symmetric GGUF type's).
    pub fn cpu_read_bytes(&self) -> usize {
        match self {
            Projection::Dense(_) => self.weight_bytes(),
            Projection::Quantized(q) => q.cpu_read_bytes(),
        }
    }

    /// The same projection in full precision.
    pub fn dense(self) -> Self {
        match self {
            Projection::Quantized(q) => Projection::Dense(q.to_dense()),
            dense => dense,
        }
    }

    /// The same projection with its weight quantized as `spec` says (along
    /// [`WEIGHT_QUANT_AXIS`]). A weight already quantized with that bit width and group size is
    /// kept as it is (a GGUF file's blocks stay as shipped); one quantized differently is
    /// re-quantized from its dequantized values. `name` identifies the layer in errors.
    pub fn quantized(self, spec: QuantSpec, name: &str) -> Result<Self> {
        let linear = match self {
            Projection::Quantized(q) if q.spec() == spec => return Ok(Projection::Quantized(q)),
            Projection::Quantized(q) => q.to_dense(),
            Projection::Dense(linear) => linear,
        };
        QLinear::from_linear(&linear, spec).map(Projection::Quantized).map_err(|e| match e {
            ModelError::Quantization(why) => ModelError::Quantization(format!("{name}: {why}")),
            other => other,
        })
    }
}
