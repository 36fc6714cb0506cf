//! The decoder shared by every architecture: embeddings, a stack of pre- or post-norm layers
//! (self-attention through a [`KvCache`] and an MLP), a final norm and the LM head.

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{DType, Device, Tensor};
use burn_llm_kernels::QuantSpec;

use crate::arch::QkvNames;
use crate::cache::{KvCache, KvLayout, StepInput};
use crate::config::{DecoderSpec, PositionKind};
use crate::error::{ModelError, Result};
use crate::language_model::LanguageModel;
use crate::layers::attention::SelfAttention;
use crate::layers::embedding::TokenEmbedding;
use crate::layers::linear::{WeightLayout, load_fused_in_out, load_fused_out_in, load_linear, load_projection};
use crate::layers::mlp::Mlp;
use crate::layers::norm::Norm;
use crate::layers::projection::{Projection, QLinear};
use crate::precision::{Precision, cast_module};
use crate::weights::{Checkpoint, RandomWeights, TensorSource};

/// One decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Norm on the attention branch (before it, or after the residual add when post-norm).
    pub attn_norm: Norm,
    /// Self-attention.
    pub attn: SelfAttention,
    /// Norm on the MLP branch.
    pub mlp_norm: Norm,
    /// Feed-forward block.
    pub mlp: Mlp,
    /// Pre-norm (`true`) or post-norm.
    pub pre_norm: bool,
    /// Norm of the attention output before its residual add (Gemma's sandwich norms).
    pub post_attn_norm: Option<Norm>,
    /// Norm of the MLP output before its residual add.
    pub post_mlp_norm: Option<Norm>,
}

impl DecoderLayer {
    /// The layer with its attention and MLP projections quantized (see
    /// [`CausalLm::quantize_weights`]).
    pub fn quantized(self, spec: QuantSpec) -> Result<Self> {
        self.map_projections(|p, name| p.quantized(spec, name))
    }

    /// Bytes of its projection weights as stored (norms and biases are not counted).
    pub fn weight_bytes(&self) -> usize {
        self.projection_bytes(Projection::weight_bytes)
    }

    /// Bytes of its projection weights that a step on the CPU reads
    /// ([`Projection::cpu_read_bytes`]).
    pub fn cpu_read_bytes(&self) -> usize {
        self.projection_bytes(Projection::cpu_read_bytes)
    }

    /// `bytes` summed over its attention and MLP projections.
    fn projection_bytes(&self, bytes: fn(&Projection) -> usize) -> usize {
        let attn = [Some(&self.attn.q), self.attn.k.as_ref(), self.attn.v.as_ref(), Some(&self.attn.o)];
        let mlp = [Some(&self.mlp.up), Some(&self.mlp.down), self.mlp.gate.as_ref()];
        attn.into_iter().chain(mlp).flatten().map(bytes).sum()
    }

    /// Applies `f` to every attention and MLP projection (with its name, for errors).
    fn map_projections(self, f: impl Fn(Projection, &str) -> Result<Projection>) -> Result<Self> {
        let DecoderLayer { attn_norm, attn, mlp_norm, mlp, pre_norm, post_attn_norm, post_mlp_norm } = self;
        let optional = |p: Option<Projection>, name: &str| p.map(|p| f(p, name)).transpose();
        let attn = SelfAttention {
            q: f(attn.q, "q")?,
            k: optional(attn.k, "k")?,
            v: optional(attn.v, "v")?,
            o: f(attn.o, "o")?,
            ..attn
        };
        let mlp = Mlp {
            up: f(mlp.up, "up")?,
            gate: match mlp.gate {
                Some(g) => Some(f(g, "gate")?),
                None => None,
            },
            down: f(mlp.down, "down")?,
            ..mlp
        };
        Ok(DecoderLayer { attn_norm, attn, mlp_norm, mlp, pre_norm, post_attn_norm, post_mlp_norm })
    }

    /// The layer with q|k|v and gate|up each fused into one projection where they can be (see
    /// [`Projection::concat`]): one product where there were two or three, the same outputs.
    pub fn fused(self) -> Self {
        DecoderLayer { attn: self.attn.fused(), mlp: self.mlp.fused(), ..self }
    }

    /// Runs the layer on `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        layer: usize,
        rotary: Option<&(Tensor<4>, Tensor<4>)>,
        cache: &mut dyn KvCache,
    ) -> Result<Tensor<3>> {
        Ok(if self.pre_norm {
            let attn = self.attn.forward(self.attn_norm.forward(x.clone()), layer, rotary, cache)?;
            // The post-attention norm (if any), the residual add and the MLP's norm in one pass.
            let (normed, x) = match &self.post_attn_norm {
                Some(post) => post.forward_add_norm(&self.mlp_norm, attn, x),
                None => self.mlp_norm.forward_add(x, attn),
            };
            let mlp = self.mlp.forward(normed);
            match &self.post_mlp_norm {
                Some(post) => post.forward_then_add(mlp, x),
                None => x + mlp,
            }
        } else {
            let x = self.attn_norm.forward(x.clone() + self.attn.forward(x, layer, rotary, cache)?);
            self.mlp_norm.forward(x.clone() + self.mlp.forward(x))
        })
    }
}

/// A causal language model: OPT, LLaMA or GPT-2, as described by its [`DecoderSpec`].
#[derive(Module, Debug)]
pub struct CausalLm {
    /// Token embedding `[vocab, embed_dim]`, dense or quantized as shipped.
    pub embed_tokens: TokenEmbedding,
    /// Learned positions (OPT, GPT-2).
    pub embed_positions: Option<Embedding>,
    /// `embed_dim → hidden` (OPT-350m).
    pub project_in: Option<Linear>,
    /// The decoder stack.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub final_norm: Option<Norm>,
    /// `hidden → embed_dim` (OPT-350m).
    pub project_out: Option<Linear>,
    /// LM head; `None` reuses `embed_tokens` (tied). Quantizing the weights gives a tied model a
    /// quantized copy here.
    pub lm_head: Option<Projection>,
    /// The architecture description.
    #[module(skip)]
    pub spec: DecoderSpec,
}

/// Intermediate state of a forward pass between layers: the residual stream and the step's rotary
/// angles. Exposed so that engines which schedule layers themselves (offloading) can run the model
/// one layer at a time.
pub struct Hidden {
    /// `[batch, seq, hidden]`.
    pub states: Tensor<3>,
    /// `cos`/`sin` of the step's positions for rotary models, `[batch, seq, 1, tables · d / 2]`:
    /// one table, or two side by side (global, then local) when local layers rotate with a RoPE
    /// of their own (Gemma 3); each layer picks its own.
    pub rotary: Option<(Tensor<4>, Tensor<4>)>,
}

impl CausalLm {
    /// Loads a model from an HF directory (`config.json` + safetensors) onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let spec = DecoderSpec::from_dir(dir)?;
        let ckpt = Checkpoint::open(dir)?;
        Self::from_checkpoint(spec, &ckpt, device)
    }

    /// Builds the model from an opened checkpoint, checking every tensor's shape against `spec`,
    /// in `spec.dtype` (each tensor cast from the file's dtype as it loads).
    pub fn from_checkpoint(spec: DecoderSpec, ckpt: &impl TensorSource, device: &Device) -> Result<Self> {
        let mut model = Self::skeleton(spec, ckpt, device)?;
        model.layers =
            (0..model.spec.num_layers).map(|i| load_layer(&model.spec, ckpt, i, device)).collect::<Result<Vec<_>>>()?;
        Ok(model)
    }

    /// Everything but the decoder layers (embeddings, final norm, projections, LM head), for
    /// engines that keep layers elsewhere and run them one at a time with
    /// [`CausalLm::load_layer`], [`CausalLm::embed`], [`DecoderLayer::forward`] and
    /// [`CausalLm::finish`] (offloading).
    pub fn skeleton(spec: DecoderSpec, ckpt: &impl TensorSource, device: &Device) -> Result<Self> {
        let dtype = spec.dtype;
        Self::check_precision(dtype, device)?;
        Ok(cast_module(Self::skeleton_f32(spec, ckpt, device)?, dtype))
    }

    /// Errors unless `device` computes in `precision` (f32 runs everywhere).
    pub fn check_precision(precision: Precision, device: &Device) -> Result<()> {
        if precision == Precision::F32 || device.supports_dtype(precision.dtype()) {
            return Ok(());
        }
        Err(ModelError::UnsupportedPrecision { precision, device: format!("{device:?}") })
    }

    fn skeleton_f32(spec: DecoderSpec, ckpt: &impl TensorSource, device: &Device) -> Result<Self> {
        let names = spec.arch.tensor_names();
        let (hidden, embed) = (spec.hidden_size, spec.embed_dim);
        let embedding = |name: &str, rows: usize, dim: usize| -> Result<Embedding> {
            Ok(Embedding { weight: Param::from_tensor(ckpt.tensor(name, [rows, dim], device)?) })
        };
        let embed_tokens = match ckpt.quantized(names.embed_tokens, [spec.vocab_size, embed], device)? {
            Some(table) => TokenEmbedding::Quantized(QLinear::from_out_in(table, None)),
            None => TokenEmbedding::Dense(embedding(names.embed_tokens, spec.vocab_size, embed)?),
        };
        let embed_positions = match (&spec.positions, names.embed_positions) {
            (PositionKind::Learned { rows, .. }, Some(name)) => Some(embedding(name, *rows, hidden)?),
            _ => None,
        };
        let projections = embed != hidden;
        let project = |name: Option<&str>, dims: [usize; 2]| -> Result<Option<Linear>> {
            match name {
                Some(name) if projections => Ok(Some(load_linear(ckpt, name, dims, false, names.layout, device)?)),
                _ => Ok(None),
            }
        };
        let project_in = project(names.project_in, [embed, hidden])?;
        let project_out = project(names.project_out, [hidden, embed])?;
        let offset = spec.variants.norm_weight_offset;
        let final_norm = if spec.final_norm {
            Some(Norm::load(ckpt, names.final_norm, spec.norm, hidden, offset, device)?)
        } else {
            None
        };
        let lm_head = if spec.tie_word_embeddings {
            None
        } else {
            Some(load_projection(ckpt, names.lm_head, [embed, spec.vocab_size], false, WeightLayout::OutIn, device)?)
        };
        Ok(Self {
            embed_tokens,
            embed_positions,
            project_in,
            layers: Vec::new(),
            final_norm,
            project_out,
            lm_head,
            spec,
        })
    }

    /// A model of `spec`'s shape with seeded random weights ([`RandomWeights::default`]), built
    /// by the same loader as a checkpoint: for benchmarks that only need the shape of a model
    /// (FlexGen's dummy weights).
    pub fn random(spec: DecoderSpec, device: &Device) -> Result<Self> {
        Self::from_checkpoint(spec, &RandomWeights::default(), device)
    }

    /// The model with every attention and MLP projection and the LM head group-quantized as `spec`
    /// says (4 or 8 bits, along the output channel: the spec's axis is
    /// [`WEIGHT_QUANT_AXIS`](crate::layers::projection::WEIGHT_QUANT_AXIS);
    /// FlexGen's weight compression). Weights already quantized that way (a GGUF file's blocks
    /// with the same bits and group size) are kept; others are re-quantized. A tied head gets its
    /// own quantized copy. The head stays as it is when the vocabulary does not split into whole
    /// groups (GPT-2's 50257 tokens, OPT's 50272 with groups of 64). The embedding lookup and the
    /// norms are left as loaded.
    pub fn quantize_weights(mut self, spec: QuantSpec) -> Result<Self> {
        if self.spec.vocab_size.is_multiple_of(spec.group_size()) {
            let head = match self.lm_head.take() {
                Some(head) => head,
                None => self.embed_tokens.tied_head(),
            };
            self.lm_head = Some(head.quantized(spec, "lm_head")?);
        }
        self.map_projections(|p, name| p.quantized(spec, name))
    }

    /// The model with every weight in full precision (quantized projections, head and embedding
    /// table dequantized): the `f32` baseline of a quantized checkpoint.
    pub fn dequantize_weights(mut self) -> Self {
        self.embed_tokens = self.embed_tokens.dense();
        self.lm_head = self.lm_head.map(Projection::dense);
        self.map_projections(|p, _| Ok(p.dense())).expect("dequantizing cannot fail")
    }

    /// Bytes of weights one decode step reads: every projection and the LM head (the embedding
    /// lookup reads a few rows, the norms are negligible).
    pub fn decode_weight_bytes(&self) -> usize {
        let head = match &self.lm_head {
            Some(head) => head.weight_bytes(),
            None => self.embed_tokens.size_bytes(),
        };
        let layers: usize = self.layers.iter().map(DecoderLayer::weight_bytes).sum();
        head + layers
    }

    /// [`CausalLm::decode_weight_bytes`] as a step on the CPU reads them: a symmetric GGUF type's
    /// minimums are derived from its scales, not read (`GroupQuantized::cpu_read_bytes`).
    pub fn decode_cpu_read_bytes(&self) -> usize {
        let head = match &self.lm_head {
            Some(head) => head.cpu_read_bytes(),
            None => self.embed_tokens.cpu_read_bytes(),
        };
        head + self.layers.iter().map(DecoderLayer::cpu_read_bytes).sum::<usize>()
    }

    /// The model with q|k|v and gate|up fused into one projection each in every layer (see
    /// [`DecoderLayer::fused`]): what the plain and paged engines run on a GPU, where each product
    /// is a kernel launch. Tensor parallelism and the offloading engine keep them separate (they
    /// shard and move projections one by one).
    pub fn fuse_projections(mut self) -> Self {
        self.layers = std::mem::take(&mut self.layers).into_iter().map(DecoderLayer::fused).collect();
        self
    }

    /// Applies `f` to every attention and MLP projection (with a name for errors).
    fn map_projections(mut self, f: impl Fn(Projection, &str) -> Result<Projection>) -> Result<Self> {
        let layers = std::mem::take(&mut self.layers);
        for (i, layer) in layers.into_iter().enumerate() {
            self.layers.push(layer.map_projections(|p, name| f(p, &format!("layer {i} {name}")))?);
        }
        Ok(self)
    }

    /// The model in `precision` (weights cast; norms stay `f32`), for a model built in another
    /// one (benchmarks that build random weights once).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.spec.dtype = precision;
        cast_module(self, precision)
    }

    /// The floating-point type of the weights and activations.
    pub fn precision(&self) -> Precision {
        self.spec.dtype
    }

    /// The device the model lives on.
    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    /// Loads decoder layer `i` of the model `spec` describes from `ckpt` onto `device`.
    pub fn load_layer(spec: &DecoderSpec, ckpt: &impl TensorSource, i: usize, device: &Device) -> Result<DecoderLayer> {
        load_layer(spec, ckpt, i, device)
    }

    /// The architecture description.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// What a KV cache for this model must hold per layer.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout::of(&self.spec)
    }

    /// Token and position embeddings of a step.
    pub fn embed(&self, step: &StepInput) -> Hidden {
        let mut states = self.embed_tokens.forward(step.tokens.clone());
        if let Some(scale) = self.spec.variants.embed_scale {
            // HF multiplies by the scale cast to the embedding's dtype.
            states = states.mul_scalar(self.spec.dtype.round(scale));
        }
        if let Some(project_in) = &self.project_in {
            states = project_in.forward(states);
        }
        let mut rotary = None;
        match &self.spec.positions {
            PositionKind::Learned { offset, .. } => {
                if let Some(table) = &self.embed_positions {
                    states = states + table.forward(step.positions.clone() + *offset as i64);
                }
            }
            PositionKind::Rotary(rope) => {
                // Angles in `f32` (as HF computes them), cast to the model's dtype like HF's `cos`/`sin`.
                let (mut cos, mut sin) = rope.cos_sin(&step.positions, step.max_position);
                if let Some(local) = self.spec.variants.sliding_window.as_ref().and_then(|w| w.local_rope.as_ref()) {
                    let (local_cos, local_sin) = local.cos_sin(&step.positions, step.max_position);
                    cos = Tensor::cat(vec![cos, local_cos], 3);
                    sin = Tensor::cat(vec![sin, local_sin], 3);
                }
                let dtype = self.spec.dtype.dtype();
                rotary = Some((cos.cast(dtype), sin.cast(dtype)));
            }
        }
        Hidden { states, rotary }
    }

    /// Runs decoder layer `layer`.
    pub fn run_layer(&self, layer: usize, hidden: Hidden, cache: &mut dyn KvCache) -> Result<Hidden> {
        let _span = tracing::trace_span!("layer", layer).entered();
        let states = self.layers[layer].forward(hidden.states, layer, hidden.rotary.as_ref(), cache)?;
        crate::device::send_to_worker(&states.device())?;
        Ok(Hidden { states, rotary: hidden.rotary })
    }

    /// Final norm and output projection: the states the LM head reads, `[batch, seq, embed_dim]`.
    pub fn finish(&self, hidden: Hidden) -> Tensor<3> {
        let mut states = hidden.states;
        if let Some(norm) = &self.final_norm {
            states = norm.forward(states);
        }
        if let Some(project_out) = &self.project_out {
            states = project_out.forward(states);
        }
        states
    }

    /// The whole stack for one step: final hidden states `[batch, seq, embed_dim]`.
    pub fn forward(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        LanguageModel::forward(self, step, cache)
    }

    /// LM head: `[n, embed_dim] → [n, vocab]` logits, in `f32` whatever the model's dtype (the
    /// sampler's softmax, penalties and log-probabilities need its range).
    pub fn logits(&self, states: Tensor<2>) -> Tensor<2> {
        let logits = match &self.lm_head {
            Some(head) => head.forward(states),
            None => self.embed_tokens.tied_logits(states),
        };
        let logits = logits.cast(DType::F32);
        match self.spec.variants.final_logit_softcap {
            Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
            None => logits,
        }
    }

    /// Logits of every token of the step, `[batch, seq, vocab]`.
    pub fn forward_all_logits(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<3>> {
        let states = self.forward(step, cache)?;
        let [b, s, e] = states.dims();
        Ok(self.logits(states.reshape([b * s, e])).reshape([b, s, self.spec.vocab_size]))
    }

    /// Logits of each row's last new token, `[batch, vocab]` (rows without a new token get the
    /// logits of their first column, which callers ignore).
    pub fn forward_last_logits(&self, step: &StepInput, cache: &mut dyn KvCache) -> Result<Tensor<2>> {
        LanguageModel::forward_last_logits(self, step, cache)
    }

    /// Logits of each row's token at column `last[row]` of `states` `[batch, seq, embed_dim]`
    /// (column 0 for rows without one), `[batch, vocab]`.
    pub fn last_logits(&self, states: Tensor<3>, last: &[Option<usize>]) -> Tensor<2> {
        LanguageModel::last_logits(self, states, last)
    }
}

/// `1/sqrt(head_dim)` (or the architecture's own, Gemma's `query_pre_attn_scalar^-½`), with
/// GPT-2's optional `1/(layer+1)`.
fn attention_scale(spec: &DecoderSpec, layer: usize) -> f64 {
    let base = spec.variants.attention_scale.unwrap_or(1.0 / (spec.head_dim as f64).sqrt());
    if spec.scale_attn_by_inverse_layer_idx { base / (layer + 1) as f64 } else { base }
}

fn load_layer(spec: &DecoderSpec, ckpt: &impl TensorSource, i: usize, device: &Device) -> Result<DecoderLayer> {
    Ok(cast_module(load_layer_f32(spec, ckpt, i, device)?, spec.dtype))
}

fn load_layer_f32(spec: &DecoderSpec, ckpt: &impl TensorSource, i: usize, device: &Device) -> Result<DecoderLayer> {
    let names = spec.arch.tensor_names();
    let prefix = names.layer.replace("{i}", &i.to_string());
    let name = |suffix: &str| format!("{prefix}.{suffix}");
    let hidden = spec.hidden_size;
    let q_out = spec.num_heads * spec.head_dim;
    let kv_out = spec.num_kv_heads * spec.head_dim;
    let linear = |suffix: &str, dims: [usize; 2], bias: bool| {
        load_projection(ckpt, &name(suffix), dims, bias, names.layout, device)
    };
    let (q, k, v) = match names.qkv {
        QkvNames::Separate(q, k, v) => (
            linear(q, [hidden, q_out], spec.attention_bias)?,
            linear(k, [hidden, kv_out], spec.attention_bias)?,
            linear(v, [hidden, kv_out], spec.attention_bias)?,
        ),
        QkvNames::Fused(qkv) => {
            let [q, k, v] = load_fused_in_out::<3>(ckpt, &name(qkv), hidden, q_out, device)?;
            (q.into(), k.into(), v.into())
        }
        QkvNames::FusedOutIn(qkv) => {
            let [q, k, v] = load_fused_out_in(ckpt, &name(qkv), hidden, [q_out, kv_out, kv_out], device)?;
            (q, k, v)
        }
    };
    let ffn = spec.intermediate_size;
    let (gate, up) = match (names.gate_up, names.gate) {
        (Some(gate_up), _) => {
            let [gate, up] = load_fused_out_in(ckpt, &name(gate_up), hidden, [ffn, ffn], device)?;
            (Some(gate), up)
        }
        (None, Some(gate)) => {
            (Some(linear(gate, [hidden, ffn], spec.mlp_bias)?), linear(names.up, [hidden, ffn], spec.mlp_bias)?)
        }
        (None, None) => (None, linear(names.up, [hidden, ffn], spec.mlp_bias)?),
    };
    let variants = &spec.variants;
    let norm =
        |suffix: &str, dim: usize| Norm::load(ckpt, &name(suffix), spec.norm, dim, variants.norm_weight_offset, device);
    let optional = |suffix: Option<&str>, on: bool, dim: usize| -> Result<Option<Norm>> {
        match suffix {
            Some(suffix) if on => norm(suffix, dim).map(Some),
            _ => Ok(None),
        }
    };
    let qk_norm = variants.qk_norm;
    let sandwich = variants.sandwich_norms;
    let window = spec.window(i);
    let local_rope = variants.sliding_window.as_ref().is_some_and(|w| w.local_rope.is_some());
    Ok(DecoderLayer {
        attn_norm: norm(names.attn_norm, hidden)?,
        attn: SelfAttention {
            q,
            k: Some(k),
            v: Some(v),
            o: linear(names.o_proj, [q_out, hidden], variants.o_bias.unwrap_or(spec.attention_bias))?,
            num_heads: spec.num_heads,
            num_kv_heads: spec.num_kv_heads,
            head_dim: spec.head_dim,
            scale: attention_scale(spec, i),
            q_norm: optional(names.q_norm, qk_norm, spec.head_dim)?,
            k_norm: optional(names.k_norm, qk_norm, spec.head_dim)?,
            window,
            rope_table: usize::from(local_rope && window.is_some()),
        },
        mlp_norm: norm(names.mlp_norm, hidden)?,
        mlp: Mlp {
            up,
            gate,
            gate_up: false,
            down: linear(names.down, [ffn, hidden], spec.mlp_bias)?,
            activation: spec.activation,
        },
        pre_norm: spec.pre_norm,
        post_attn_norm: optional(names.post_attn_norm, sandwich, hidden)?,
        post_mlp_norm: optional(names.post_mlp_norm, sandwich, hidden)?,
    })
}
