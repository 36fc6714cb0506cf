//! Loading Burn `Linear` layers from HF tensors, whatever way round the checkpoint stores them.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};

use crate::error::Result;
use crate::layers::projection::{Projection, QLinear};
use crate::weights::TensorSource;

/// How a checkpoint stores a projection matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// PyTorch `nn.Linear`: `[out, in]` (OPT, LLaMA).
    OutIn,
    /// GPT-2's `Conv1D`: `[in, out]`, already Burn's layout.
    InOut,
}

/// Loads `{prefix}.weight` (and `{prefix}.bias` when `bias`) as a `d_in → d_out` layer.
pub fn load_linear(
    ckpt: &impl TensorSource,
    prefix: &str,
    [d_in, d_out]: [usize; 2],
    bias: bool,
    layout: WeightLayout,
    device: &Device,
) -> Result<Linear> {
    let name = format!("{prefix}.weight");
    let weight = match layout {
        WeightLayout::OutIn => ckpt.tensor_transposed(&name, [d_out, d_in], device)?,
        WeightLayout::InOut => ckpt.tensor(&name, [d_in, d_out], device)?,
    };
    Ok(Linear { weight: Param::from_tensor(weight), bias: load_bias(ckpt, prefix, d_out, bias, device)? })
}

/// `{prefix}.bias` when the layer has one.
fn load_bias(
    ckpt: &impl TensorSource,
    prefix: &str,
    d_out: usize,
    bias: bool,
    device: &Device,
) -> Result<Option<Param<Tensor<1>>>> {
    Ok(if bias { Some(Param::from_tensor(ckpt.tensor(&format!("{prefix}.bias"), [d_out], device)?)) } else { None })
}

/// Loads a projection as the checkpoint stores it: quantized (GGUF `Q4_0`/`Q4_1`/`Q8_0` blocks,
/// kept as they are) or dense.
pub fn load_projection(
    ckpt: &impl TensorSource,
    prefix: &str,
    [d_in, d_out]: [usize; 2],
    bias: bool,
    layout: WeightLayout,
    device: &Device,
) -> Result<Projection> {
    if layout == WeightLayout::OutIn
        && let Some(weight) = ckpt.quantized(&format!("{prefix}.weight"), [d_out, d_in], device)?
    {
        let bias = load_bias(ckpt, prefix, d_out, bias, device)?;
        return Ok(Projection::Quantized(QLinear::from_out_in(weight, bias)));
    }
    load_linear(ckpt, prefix, [d_in, d_out], bias, layout, device).map(Projection::Dense)
}

/// Splits a fused `[in, PARTS · out]` Conv1D projection (GPT-2's `c_attn`) into `PARTS` layers.
pub fn load_fused_in_out<const PARTS: usize>(
    ckpt: &impl TensorSource,
    prefix: &str,
    d_in: usize,
    d_out: usize,
    device: &Device,
) -> Result<[Linear; PARTS]> {
    let total = d_out * PARTS;
    let weight = ckpt.read_f32(&format!("{prefix}.weight"), &[d_in, total])?;
    let bias = ckpt.read_f32(&format!("{prefix}.bias"), &[total])?;
    Ok(std::array::from_fn(|p| {
        let cols = p * d_out..(p + 1) * d_out;
        let w: Vec<f32> = weight.chunks_exact(total).flat_map(|row| row[cols.clone()].iter().copied()).collect();
        let b = bias[cols].to_vec();
        Linear {
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(w, [d_in, d_out]), device)),
            bias: Some(Param::from_tensor(Tensor::from_data(TensorData::new(b, [d_out]), device))),
        }
    }))
}
