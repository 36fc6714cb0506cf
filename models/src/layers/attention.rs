//! Multi-head self-attention with grouped-query support. The projections live here; storing K/V and
//! the attention itself are delegated to the [`KvCache`], which is what lets contiguous, paged and
//! offloaded caches run the same model code.

use burn::module::Module;
use burn::tensor::Tensor;
use burn_llm_kernels::{norm_rotate_half_qk, rotate_half_qk};

use crate::cache::KvCache;
use crate::error::Result;
use crate::layers::norm::Norm;
use crate::layers::projection::Projection;

/// Self-attention of one decoder layer.
#[derive(Module, Debug)]
pub struct SelfAttention {
    /// Query projection, `hidden → heads · head_dim`; after [`SelfAttention::fused`], the query,
    /// key and value projections in one, `hidden → (heads + 2 · kv_heads) · head_dim`.
    pub q: Projection,
    /// Key projection, `hidden → kv_heads · head_dim`; `None` once fused into `q`.
    pub k: Option<Projection>,
    /// Value projection, `hidden → kv_heads · head_dim`; `None` once fused into `q`.
    pub v: Option<Projection>,
    /// Output projection, `heads · head_dim → hidden`.
    pub o: Projection,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Multiplier of the scores (`1/sqrt(head_dim)`, times GPT-2's per-layer factor).
    pub scale: f64,
    /// Per-head RMSNorm of the queries before RoPE (QK-norm: Gemma 3, Qwen3).
    pub q_norm: Option<Norm>,
    /// Per-head RMSNorm of the keys before RoPE.
    pub k_norm: Option<Norm>,
    /// Keys a query sees when this layer is local (sliding-window attention).
    #[module(skip)]
    pub window: Option<usize>,
    /// Which of the step's RoPE tables this layer rotates with (0: global, 1: local; see
    /// [`Hidden::rotary`](crate::model::Hidden::rotary)).
    #[module(skip)]
    pub rope_table: usize,
}

impl SelfAttention {
    /// Attends `x` (`[batch, seq, hidden]`) over this layer's cache; `rotary` holds the step's
    /// `cos`/`sin` from [`RopeSpec::cos_sin`](crate::layers::rope::RopeSpec::cos_sin).
    pub fn forward(
        &self,
        x: Tensor<3>,
        layer: usize,
        rotary: Option<&(Tensor<4>, Tensor<4>)>,
        cache: &mut dyn KvCache,
    ) -> Result<Tensor<3>> {
        let [b, s, _] = x.dims();
        let (heads, kv_heads) = (self.num_heads, self.num_kv_heads);
        // `[b, s, heads, head_dim]`, the projections' own layout: RoPE rotates it in place.
        let split = |t: Tensor<3>, n: usize| t.reshape([b, s, n, self.head_dim]);
        let (mut q, mut k, v) = match (&self.k, &self.v) {
            (Some(k), Some(v)) => (
                split(self.q.forward(x.clone()), heads),
                split(k.forward(x.clone()), kv_heads),
                split(v.forward(x), kv_heads),
            ),
            // One product, split into views along the heads.
            _ => {
                let qkv = split(self.q.forward(x), heads + 2 * kv_heads);
                (
                    qkv.clone().narrow(2, 0, heads),
                    qkv.clone().narrow(2, heads, kv_heads),
                    qkv.narrow(2, heads + kv_heads, kv_heads),
                )
            }
        };
        let qk_rms = match (self.q_norm.as_ref().and_then(Norm::rms), self.k_norm.as_ref().and_then(Norm::rms)) {
            (Some((q_gamma, q_eps)), Some((k_gamma, k_eps))) if q_eps == k_eps => Some((q_gamma, k_gamma, q_eps)),
            _ => None,
        };
        match (rotary, qk_rms) {
            // QK-norm and RoPE of both in one pass.
            (Some((cos, sin)), Some((q_gamma, k_gamma, epsilon))) => {
                let (cos, sin) = self.rope_table_of(cos, sin);
                (q, k) = norm_rotate_half_qk((q, q_gamma), (k, k_gamma), epsilon, &cos, &sin);
            }
            _ => {
                if let Some(norm) = &self.q_norm {
                    q = norm.forward(q);
                }
                if let Some(norm) = &self.k_norm {
                    k = norm.forward(k);
                }
                if let Some((cos, sin)) = rotary {
                    let (cos, sin) = self.rope_table_of(cos, sin);
                    (q, k) = rotate_half_qk(q, k, &cos, &sin);
                }
            }
        }
        let heads = |t: Tensor<4>| t.swap_dims(1, 2);
        let (q, k, v, scale) = (heads(q), heads(k), heads(v), self.scale as f32);
        let out = cache.attend(layer, q, k, v, scale, self.window)?;
        let out = out.swap_dims(1, 2).reshape([b, s, self.num_heads * self.head_dim]);
        Ok(self.o.forward(out))
    }

    /// The layer with its query, key and value projections fused into one (see
    /// [`Projection::concat`]), or as it is when they cannot be (or already are) fused.
    pub fn fused(self) -> Self {
        let (Some(k), Some(v)) = (&self.k, &self.v) else { return self };
        match Projection::concat(&[&self.q, k, v]) {
            Some(qkv) => SelfAttention { q: qkv, k: None, v: None, ..self },
            None => self,
        }
    }

    /// Whether the query, key and value projections are fused into `q`.
    pub fn is_fused(&self) -> bool {
        self.k.is_none() || self.v.is_none()
    }

    /// This layer's `cos`/`sin` out of the step's tables (`[.., tables · head_dim / 2]`, one
    /// table per RoPE the model uses).
    fn rope_table_of(&self, cos: &Tensor<4>, sin: &Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let half = self.head_dim / 2;
        if cos.dims()[3] == half {
            return (cos.clone(), sin.clone());
        }
        let at = self.rope_table * half;
        (cos.clone().narrow(3, at, half), sin.clone().narrow(3, at, half))
    }
}
