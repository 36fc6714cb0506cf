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

/// Splits a fused `[Σ parts, in]` projection (rows of each part after the other: Phi-3's
/// `qkv_proj` and `gate_up_proj`) into one bias-free projection per part, each kept quantized when
/// the file stores it so (its rows cut out of the blocks) or read dense otherwise.
pub fn load_fused_out_in<const PARTS: usize>(
    ckpt: &impl TensorSource,
    prefix: &str,
    d_in: usize,
    parts: [usize; PARTS],
    device: &Device,
) -> Result<[Projection; PARTS]> {
    let name = format!("{prefix}.weight");
    let shape = [parts.iter().sum(), d_in];
    let mut start = 0;
    let mut out = Vec::with_capacity(PARTS);
    for rows in parts {
        let range = start..start + rows;
        start += rows;
        if let Some(q) = ckpt.quantized_window(&name, shape, range.clone(), 0..d_in, device)? {
            out.push(Projection::Quantized(QLinear::from_out_in(q, None)));
            continue;
        }
        let values = ckpt.read_f32_window(&name, shape, range, 0..d_in)?;
        let weight = crate::weights::transpose(&values, rows, d_in);
        out.push(Projection::Dense(Linear {
            weight: Param::from_tensor(Tensor::from_data(TensorData::new(weight, [d_in, rows]), device)),
            bias: None,
        }));
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!("one projection per part")))
}
