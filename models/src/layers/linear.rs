//! Loading Burn `Linear` layers from HF tensors, whatever way round the checkpoint stores them.

use burn::module::Param;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor, TensorData};

use crate::error::Result;
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
    let bias = if bias {
        Some(Param::from_tensor(ckpt.tensor(&format!("{prefix}.bias"), [d_out], device)?))
    } else {
        None
    };
    Ok(Linear {
        weight: Param::from_tensor(weight),
        bias,
    })
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
            let w: Vec<f32> = weight
                .chunks_exact(total)
                .flat_map(|row| row[cols.clone()].iter().copied())
                .collect();
            let b = bias[cols].to_vec();
            Linear {
                weight: Param::from_tensor(Tensor::from_data(TensorData::new(w, [d_in, d_out]), device)),
                bias: Some(Param::from_tensor(Tensor::from_data(TensorData::new(b, [d_out]), device))),
            }
    }))
}

/// A randomly initialized layer (Burn's default initializer), for dummy-weight models.
pub fn init_linear([d_in, d_out]: [usize; 2], bias: bool, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(bias).init(device)
}
