//! A rank's view of a checkpoint: the same tensor names as the whole model, but each projection of
//! one layer comes back as the rank's shard, cut on the host ([`TensorSource::read_f32_window`],
//! [`TensorSource::quantized_window`]) before anything is uploaded. The models' own loader
//! ([`CausalLm::load_layer`](burn_llm_models::CausalLm::load_layer)) builds the rank from it with
//! the rank's [`ShardPlan::rank_spec`], so no loading code is repeated here.

use std::collections::HashMap;
use std::ops::Range;

use burn::tensor::Device;
use burn_llm_models::arch::QkvNames;
use burn_llm_models::layers::linear::WeightLayout;
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{DecoderSpec, GroupQuantized, ModelError, Result};

use super::plan::ShardPlan;

/// How one projection is cut, in its output (`Column`) or input (`Row`) dimension.
#[derive(Debug, Clone)]
enum Split {
    /// Output columns `range` (q, k, v, up, gate): the bias is cut the same way.
    Column(Range<usize>),
    /// Input rows `range` (o, down): the bias is whole (the rank-0 module keeps it).
    Row(Range<usize>),
    /// Several output ranges of a fused `[in, parts · out]` projection (GPT-2's `c_attn`),
    /// concatenated in order.
    Fused(Vec<Range<usize>>),
}

/// A projection's cut and its whole size, `d_in → d_out`.
#[derive(Debug, Clone)]
struct Shard {
    split: Split,
    d_in: usize,
    d_out: usize,
}

/// `inner` as rank `rank` of layer `layer` sees it.
pub(crate) struct ShardSource<'a, S> {
    inner: &'a S,
    layout: WeightLayout,
    /// Projection prefix (`model.layers.3.self_attn.q_proj`) → its cut.
    shards: HashMap<String, Shard>,
}

impl<'a, S: TensorSource> ShardSource<'a, S> {
    pub(crate) fn new(inner: &'a S, spec: &DecoderSpec, plan: &ShardPlan, layer: usize, rank: usize) -> Self {
        let names = spec.arch.tensor_names();
        let prefix = names.layer.replace("{i}", &layer.to_string());
        let name = |suffix: &str| format!("{prefix}.{suffix}");
        let hidden = spec.hidden_size;
        let (q_out, kv_out) = (plan.heads * plan.head_dim, plan.kv_heads * plan.head_dim);
        let (q, kv, ffn) = (plan.q_range(rank), plan.kv_range(rank), plan.ffn_range(rank));
        let column = |range: &Range<usize>, d_out| Shard { split: Split::Column(range.clone()), d_in: hidden, d_out };
        let row = |range: &Range<usize>, d_in| Shard { split: Split::Row(range.clone()), d_in, d_out: hidden };
        let mut shards = HashMap::new();
        match names.qkv {
            QkvNames::Separate(qn, kn, vn) => {
                shards.insert(name(qn), column(&q, q_out));
                shards.insert(name(kn), column(&kv, kv_out));
                shards.insert(name(vn), column(&kv, kv_out));
            }
            QkvNames::Fused(qkv) => {
                let shift = |r: &Range<usize>, by: usize| r.start + by..r.end + by;
                let parts = vec![q.clone(), shift(&kv, q_out), shift(&kv, q_out + kv_out)];
                shards.insert(name(qkv), Shard { split: Split::Fused(parts), d_in: hidden, d_out: q_out + 2 * kv_out });
            }
            // Refused before a source is built (`TensorParallelLayer::load`).
            QkvNames::FusedOutIn(_) => {}
        }
        shards.insert(name(names.o_proj), row(&q, q_out));
        shards.insert(name(names.up), column(&ffn, plan.ffn));
        if let Some(gate) = names.gate {
            shards.insert(name(gate), column(&ffn, plan.ffn));
        }
        shards.insert(name(names.down), row(&ffn, plan.ffn));
        Self { inner, layout: names.layout, shards }
    }

    /// The cut projection `name` (`{prefix}.weight` or `{prefix}.bias`) belongs to, if any.
    fn shard<'n>(&self, name: &'n str) -> Option<(&Shard, &'n str)> {
        let (prefix, kind) = name.rsplit_once('.')?;
        self.shards.get(prefix).map(|shard| (shard, kind))
    }

    /// The HF shape of a cut weight and the rows and columns of the rank's window in it.
    fn window(&self, shard: &Shard, cut: &Range<usize>, column: bool) -> ([usize; 2], Range<usize>, Range<usize>) {
        let (d_in, d_out) = (shard.d_in, shard.d_out);
        match (self.layout, column) {
            (WeightLayout::OutIn, true) => ([d_out, d_in], cut.clone(), 0..d_in),
            (WeightLayout::OutIn, false) => ([d_out, d_in], 0..d_out, cut.clone()),
            (WeightLayout::InOut, true) => ([d_in, d_out], 0..d_in, cut.clone()),
            (WeightLayout::InOut, false) => ([d_in, d_out], cut.clone(), 0..d_out),
        }
    }

    /// Reads a cut weight or bias.
    fn read_cut(&self, name: &str, shard: &Shard, kind: &str) -> Result<Option<Vec<f32>>> {
        let whole_bias = || self.inner.read_f32(name, &[shard.d_out]);
        let values = match (kind, &shard.split) {
            ("weight", Split::Column(cut)) | ("weight", Split::Row(cut)) => {
                let (shape, rows, cols) = self.window(shard, cut, matches!(shard.split, Split::Column(_)));
                self.inner.read_f32_window(name, shape, rows, cols)?
            }
            ("weight", Split::Fused(parts)) => {
                // `[in, total]` (Conv1D): each row of the shard is the rows of the parts, in order.
                let shape = [shard.d_in, shard.d_out];
                let parts: Vec<Vec<f32>> = parts
                    .iter()
                    .map(|cols| self.inner.read_f32_window(name, shape, 0..shard.d_in, cols.clone()))
                    .collect::<Result<_>>()?;
                (0..shard.d_in)
                    .flat_map(|r| {
                        parts.iter().flat_map(move |p| {
                            let width = p.len() / shard.d_in;
                            p[r * width..(r + 1) * width].iter().copied()
                        })
                    })
                    .collect()
            }
            ("bias", Split::Column(cut)) => whole_bias()?[cut.clone()].to_vec(),
            ("bias", Split::Fused(parts)) => {
                let whole = whole_bias()?;
                parts.iter().flat_map(|cut| whole[cut.clone()].iter().copied()).collect()
            }
            _ => return Ok(None),
        };
        Ok(Some(values))
    }
}

impl<S: TensorSource> TensorSource for ShardSource<'_, S> {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let cut = match self.shard(name) {
            Some((shard, kind)) => self.read_cut(name, shard, kind)?,
            None => None,
        };
        let Some(values) = cut else {
            return self.inner.read_f32(name, expected);
        };
        // The rank's spec and the cut must agree; a mismatch is a bug in the plan, not bad input,
        // but it is reported rather than uploaded as garbage.
        if values.len() != expected.iter().product::<usize>() {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: vec![values.len()],
            });
        }
        Ok(values)
    }

    fn quantized(&self, name: &str, shape: [usize; 2], device: &Device) -> Result<Option<GroupQuantized<2>>> {
        match self.shard(name) {
            Some((shard, "weight")) => match &shard.split {
                Split::Column(cut) | Split::Row(cut) => {
                    let (whole, rows, cols) = self.window(shard, cut, matches!(shard.split, Split::Column(_)));
                    self.inner.quantized_window(name, whole, rows, cols, device)
                }
                // Fused projections are Conv1D (GPT-2), which the loader never asks for in
                // quantized form.
                Split::Fused(_) => Ok(None),
            },
            _ => self.inner.quantized(name, shape, device),
        }
    }
}
