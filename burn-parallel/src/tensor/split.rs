//! Cutting an already-loaded decoder layer into rank modules, each copied onto its rank's device.
//! Dense weights are Burn `[in, out]`; quantized ones keep their codes (cut on group boundaries,
//! never re-encoded).

use std::ops::Range;

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use burn_llm_models::layers::attention::SelfAttention;
use burn_llm_models::layers::mlp::Mlp;
use burn_llm_models::layers::projection::{Projection, QLinear};
use burn_llm_models::model::DecoderLayer;
use burn_llm_models::weights::quantized_window;
use burn_llm_models::{ModelError, Result};

use super::plan::ShardPlan;

/// Which dimension of a projection is cut.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Output columns (q, k, v, up, gate).
    Column,
    /// Input rows (o, down).
    Row,
}

/// Rank `rank`'s module of `layer`, on `device`.
pub(crate) fn split_layer(
    layer: &DecoderLayer,
    plan: &ShardPlan,
    rank: usize,
    device: &Device,
) -> Result<DecoderLayer> {
    let (q, kv, ffn) = (plan.q_range(rank), plan.kv_range(rank), plan.ffn_range(rank));
    // Row-split biases are added once: by rank 0's partial sum.
    let keep = rank == 0;
    let column =
        |p: &Projection, cut: &Range<usize>, name: &str| cut_projection(p, Cut::Column, cut, true, name, device);
    let row = |p: &Projection, cut: &Range<usize>, name: &str| cut_projection(p, Cut::Row, cut, keep, name, device);
    let attn = &layer.attn;
    let mlp = &layer.mlp;
    if layer.post_attn_norm.is_some() || layer.post_mlp_norm.is_some() {
        // Those norms read the whole reduced output, which this layer's forward never forms.
        return Err(ModelError::UnsupportedFeature(
            "tensor parallelism of a model with norms after attention and MLP (Gemma 3); run it on one device or \
             in a pipeline"
                .into(),
        ));
    }
    let (Some(k), Some(v), false) = (&attn.k, &attn.v, mlp.gate_up) else {
        return Err(ModelError::UnsupportedFeature(
            "tensor parallelism of a layer whose projections are fused (q|k|v, gate|up): shard the layer as \
             loaded, before `CausalLm::fuse_projections`"
                .into(),
        ));
    };
    let norm = |n: &Option<burn_llm_models::layers::norm::Norm>| n.clone().map(|n| n.to_device(device));
    Ok(DecoderLayer {
        attn_norm: layer.attn_norm.clone().to_device(device),
        attn: SelfAttention {
            q: column(&attn.q, &q, "q")?,
            k: Some(column(k, &kv, "k")?),
            v: Some(column(v, &kv, "v")?),
            o: row(&attn.o, &q, "o")?,
            num_heads: plan.heads_per_rank(),
            num_kv_heads: plan.kv_heads_per_rank(),
            head_dim: attn.head_dim,
            scale: attn.scale,
            q_norm: norm(&attn.q_norm),
            k_norm: norm(&attn.k_norm),
            window: attn.window,
            rope_table: attn.rope_table,
        },
        mlp_norm: layer.mlp_norm.clone().to_device(device),
        mlp: Mlp {
            up: column(&mlp.up, &ffn, "up")?,
            gate: mlp.gate.as_ref().map(|g| column(g, &ffn, "gate")).transpose()?,
            gate_up: false,
            down: row(&mlp.down, &ffn, "down")?,
            activation: mlp.activation,
        },
        pre_norm: layer.pre_norm,
        post_attn_norm: None,
        post_mlp_norm: None,
    })
}

/// Output width of a projection.
pub(crate) fn out_width(p: &Projection) -> usize {
    match p {
        Projection::Dense(l) => l.weight.val().dims()[1],
        Projection::Quantized(q) => q.d_output,
    }
}

/// `p` with its bias removed (a row-split projection on ranks other than 0).
pub(crate) fn without_bias(p: Projection) -> Projection {
    match p {
        Projection::Dense(l) => Projection::Dense(Linear { bias: None, ..l }),
        Projection::Quantized(q) => Projection::Quantized(QLinear { bias: None, ..q }),
    }
}

/// A contiguous copy of `t` on `device` (a narrowed view would keep the whole weight alive and
/// make every matmul walk it with strides).
fn copy<const D: usize>(t: Tensor<D>, device: &Device) -> Tensor<D> {
    Tensor::from_data(t.into_data(), device)
}

/// The rank's piece of `p`: columns or rows `cut` of its `d_in → d_out` map, on `device`, with
/// the bias cut along (columns), kept whole (rows, `keep_bias`) or dropped.
fn cut_projection(
    p: &Projection,
    cut: Cut,
    range: &Range<usize>,
    keep_bias: bool,
    name: &str,
    device: &Device,
) -> Result<Projection> {
    let (start, len) = (range.start, range.len());
    let bias = |b: &Option<Param<Tensor<1>>>| match (cut, b) {
        (Cut::Column, Some(b)) => Some(Param::from_tensor(copy(b.val().narrow(0, start, len), device))),
        (Cut::Row, Some(b)) if keep_bias => Some(Param::from_tensor(copy(b.val(), device))),
        _ => None,
    };
    Ok(match p {
        Projection::Dense(l) => {
            // Burn's `[in, out]`: columns are outputs, rows inputs.
            let axis = if cut == Cut::Column { 1 } else { 0 };
            let weight = copy(l.weight.val().narrow(axis, start, len), device);
            Projection::Dense(Linear { weight: Param::from_tensor(weight), bias: bias(&l.bias) })
        }
        Projection::Quantized(q) => {
            // Stored `[in, out]` grouped along `out`, or (input-grouped, GGUF) `[out, in]` grouped
            // along `in`: the stored columns are the grouped axis either way.
            let weight = q.weight();
            let [rows, cols] = weight.shape;
            let cut_rows = (cut == Cut::Column) == q.input_grouped;
            let (r, c) = if cut_rows { (range.clone(), 0..cols) } else { (0..rows, range.clone()) };
            let shard = quantized_window(&weight, name, r, c, device)?;
            let [d_in, d_out] = match cut {
                Cut::Column => [q.d_input, len],
                Cut::Row => [len, q.d_output],
            };
            Projection::Quantized(QLinear::from_parts(shard, bias(&q.bias), [d_in, d_out], q.input_grouped))
        }
    })
}
