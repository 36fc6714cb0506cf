//! FlexGen's analytical cost model (Appendix A.3) with LM-Offload's quantization terms (§3.2).
//!
//! Every per-layer I/O and compute term and every peak-memory expression is built once per
//! [`PolicyShape`] as an *affine* function of the nine placement variables
//! `[wg, wc, wd, cg, cc, cd, hg, hc, hd]` (the crate-private `LinearModel`). [`estimate`] evaluates it at a
//! concrete placement; the search hands the same expressions to the LP, so the LP objective and
//! the reported estimate can never disagree.
//!
//! # Per-layer terms
//!
//! Notation as in FlexGen Table 6: `l` layers, prompt `s`, generation `n`, `bls = gbs·num_gb`.
//! `W` = stored bytes of one layer's weights (FlexGen: `8h1² + 4h1h2`), `K` = stored KV bytes per
//! token and layer (FlexGen: `4h1`), `A` = activation bytes per token (FlexGen: `2h1`),
//! `s̄ = s + n/2` the average context during decode.
//!
//! Prefill (one layer, whole block):
//! - `ctog = ((wc+wd)·W + (hc+hd)·s·A·bls) / ctog_bdw` (+ weight dequantization)
//! - `gtoc = ((cc+cd)·(s+1)·K·bls + (hc+hd)·s·A·bls) / gtoc_bdw`
//! - `dtoc = (wd·W + hd·s·A·bls) / dtoc_bdw`
//! - `ctod = (cd·(s+1)·K·bls + hd·s·A·bls) / ctod_bdw`
//! - `comp = bls·s·linear_flops / mm_flops + 4·bls·s²·q / bmm_flops`
//!
//! Decode (one layer, one token, whole block):
//! - `ctog = ((wc+wd)·W + (hc+hd)·A·bls + X) / ctog_bdw` (+ dequantization), where `X` is, with
//!   CPU attention, the attention output coming back `(cc+cd)·bls·q·e`, and with GPU attention the
//!   off-GPU cache loaded for attention `(cc+cd)·s̄·K·bls`
//! - `gtoc = ((hc+hd)·A·bls + Y) / gtoc_bdw` (+ quantization of new cache entries), `Y` = with
//!   CPU attention the new token's q, k, v sent to the CPU `(cc+cd)·bls·(q+2kv)·e`, with GPU
//!   attention the new cache entries stored back `(cc+cd)·K·bls`
//! - `dtoc = (cd·s̄·K·bls + wd·W + hd·A·bls) / dtoc_bdw`
//! - `ctod = (cd·K·bls + hd·A·bls) / ctod_bdw`
//! - `comp = bls·linear_flops / mm_flops + cg·att / bmm_flops + (cc+cd)·att / cpu_flops` with
//!   `att = 4·bls·s̄·q` (CPU attention), or `att / bmm_flops` for the whole cache (GPU attention).
//!
//! With [`HardwareProfile::gpu_memory_bandwidth`] set (extension), each GPU matmul term becomes
//! `num_gb · max(gbs·… / mm_flops, W_full / hbm)` and GPU decode attention
//! `max(att / bmm_flops, bls·s̄·K_full / hbm)`: small-batch decode is bound by reading the
//! weights, which is what makes batching pay off even when everything fits on the GPU. With CPU
//! attention, the CPU term is `max(att / cpu_flops, bls·s̄·K_full / cpu_attention_bandwidth)`
//! when the latter is set.
//!
//! With `overlap`, a layer takes the **max** of its five terms (FlexGen's `T_pre`, `T_gen`, perfect
//! overlap of the six tasks of Algorithm 1); without it, their **sum** (the tasks run one after
//! another, as in Accelerate's hook-based offloading). Block latency is
//! `T = T_pre·l + T_gen·(n−1)·l` and throughput `bls·n / T` generated tokens per second.
//!
//! # Quantization (LM-Offload §3.2)
//!
//! Storage is `bits/8 + 8/group` bytes per value
//! ([`QuantSpec::bytes_per_value`](super::QuantSpec::bytes_per_value), the per-value form of the
//! [`QuantSpec::storage_bytes`](super::QuantSpec::storage_bytes) the runtime allocates), so `W` and `K`
//! shrink everywhere: in every memory tier and in every transfer.
//! - Weights: quantized once on the CPU at load (`init_time`, LM-Offload Eq. 3, not part of the
//!   throughput, which FlexGen defines over an unbounded stream of blocks), dequantized on the
//!   GPU once per layer per block (`W_full / gpu_dequantize_bandwidth`), added to the weight
//!   load task `ctog` (Eq. 4), in prefill and decode.
//! - KV cache (only with GPU attention; with CPU attention there is no cost and no benefit):
//!   the prefill cache is quantized on the GPU, `(s+1)·K_full·bls / gpu_quantize_bandwidth`
//!   added to `T_pre` after the max (Eq. 5); each decode step dequantizes the old cache,
//!   `s̄·K_full·bls / gpu_dequantize_bandwidth` added to `ctog` (load_cache, Eq. 6), and
//!   quantizes the new entries, `K_full·bls / gpu_quantize_bandwidth` added to `gtoc`
//!   (store_cache, Eq. 7).
//!
//! # Peak memory (bytes)
//!
//! GPU prefill: `wg·W·l + hg·s·A·bls + cg·(s+n)·K·bls·l` (home) `+ 2(1−wg)·W + (1−hg)·s·A·gbs +
//! max(qkv, att1, att2, embed, mlp1, mlp2)` (working). GPU decode: the same with one-token
//! activations. CPU prefill: `wc·W·l + hc·s·A·bls + cc·(s+n)·K·bls·l + (1−wg)·W + (1−hg)·s·A·gbs +
//! 2cd·(s+n)·K·gbs` (the last term, the two staging buffers of a disk-resident cache, is not in
//! the paper's prefill formula; the runtime holds them in prefill as in decode).
//! CPU decode: `wc·W·l + hc·A·bls + cc·(s+n)·K·bls·l + wd·W + 2hd·A·gbs + 2cd·(s+n)·K·gbs +
//! nh·(s+n)·gbs·e + A·gbs`. Disk: `wd·W·l + hd·s·A·bls + cd·(s+n)·K·bls·l`. The working-set
//! alternatives are listed in the source of `LinearModel::build`.

use super::error::PolicyError;
use super::hardware::HardwareProfile;
use super::model::{MlpKind, ModelShape, OffloadWorkload};
use super::types::{Policy, PolicyShape};

mod affine;
mod estimate;

pub(crate) use affine::*;
pub use estimate::{CostEstimate, MemoryConstraint, PeakMemory, Term, TermBreakdown, TierBytes};

/// The cost model of one [`PolicyShape`], affine in the placement variables.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LinearModel {
    /// Prefill terms (`Term::ALL` order) and the serial prefill addend.
    pub prefill: [Affine; 5],
    /// Serial prefill time (cache quantization).
    pub prefill_serial: f64,
    /// Prefill quantization time included in the terms.
    pub prefill_quant: f64,
    /// Decode terms (`Term::ALL` order).
    pub decode: [Affine; 5],
    /// Decode quantization time included in the terms.
    pub decode_quant: f64,
    /// Peak-memory expressions, in `MemoryConstraint::ALL` order.
    pub memory: [MaxAffine; 5],
    /// `l`.
    pub layers: f64,
    /// `n`.
    pub gen_len: f64,
    /// `bls`.
    pub block: f64,
    /// Max (true) or sum (false) of the terms.
    pub overlap: bool,
    /// One-time weight quantization.
    pub init_time: f64,
}

impl LinearModel {
    /// Build the affine cost model for `shape` (see the module docs for every formula).
    pub fn build(
        hw: &HardwareProfile,
        model: &ModelShape,
        wl: &OffloadWorkload,
        shape: &PolicyShape,
    ) -> Result<Self, PolicyError> {
        hw.validate()?;
        model.validate()?;
        wl.validate()?;
        shape.validate()?;

        let l = f64::from(model.num_layers);
        let s = wl.prompt_len as f64;
        let n = wl.gen_len as f64;
        let gbs = f64::from(shape.gpu_batch_size);
        let bls = shape.block_size() as f64;
        let e = model.bytes_per_element as f64;
        let h1 = model.hidden as f64;
        let h2 = model.ffn as f64;
        let nh = model.num_heads as f64;
        let q = model.q_dim();
        let kv = model.kv_dim();
        let mlp_mult = match model.mlp {
            MlpKind::Standard => 1.0,
            MlpKind::Gated => 2.0,
        };

        let w_full = model.layer_weight_bytes();
        let w = stored_layer_weight_bytes(model, shape);
        let cache_c = shape.effective_cache_compression();
        let k_full = model.kv_bytes_per_token();
        let k = match cache_c {
            Some(c) => 2.0 * kv * c.bytes_per_value(),
            None => k_full,
        };
        let a = model.activation_bytes_per_token();
        let s_avg = s + n / 2.0;
        let gpu_attn_all = !shape.cpu_attention;
        let lin = model.linear_flops_per_token();

        let deq_w = if shape.compress_weights.is_some() { w_full / hw.gpu_dequantize_bandwidth } else { 0.0 };
        let (pf_cache_quant, deq_old_cache, quant_new_cache) = match cache_c {
            Some(_) => (
                (s + 1.0) * k_full * bls / hw.gpu_quantize_bandwidth,
                s_avg * k_full * bls / hw.gpu_dequantize_bandwidth,
                k_full * bls / hw.gpu_quantize_bandwidth,
            ),
            None => (0.0, 0.0, 0.0),
        };

        // ---------------- prefill terms ----------------
        let ctog_p = (Affine::vars(&[WC, WD], w) + Affine::vars(&[HC, HD], s * a * bls))
            * (1.0 / hw.cpu_to_gpu_bandwidth)
            + Affine::constant(deq_w);
        let gtoc_p = (Affine::vars(&[CC, CD], (s + 1.0) * k * bls) + Affine::vars(&[HC, HD], s * a * bls))
            * (1.0 / hw.gpu_to_cpu_bandwidth);
        let dtoc_p = (Affine::var(WD, w) + Affine::var(HD, s * a * bls)) * (1.0 / hw.disk_to_cpu_bandwidth);
        let ctod_p =
            (Affine::var(CD, (s + 1.0) * k * bls) + Affine::var(HD, s * a * bls)) * (1.0 / hw.cpu_to_disk_bandwidth);
        // Roofline (extension): a GPU kernel takes at least the time to read its operands.
        let nb = f64::from(shape.num_gpu_batches);
        let hbm = |bytes: f64| hw.gpu_memory_bandwidth.map_or(0.0, |bw| bytes / bw);
        let comp_p = Affine::constant(
            nb * (gbs * s * lin / hw.matmul_flops(gbs * s)).max(hbm(w_full)) + 4.0 * bls * s * s * q / hw.gpu_bmm_flops,
        );

        // ---------------- decode terms ----------------
        let (x_ctog, y_gtoc) = if gpu_attn_all {
            (Affine::vars(&[CC, CD], s_avg * k * bls), Affine::vars(&[CC, CD], k * bls))
        } else {
            (Affine::vars(&[CC, CD], e * q * bls), Affine::vars(&[CC, CD], e * (q + 2.0 * kv) * bls))
        };
        let ctog_g = (Affine::vars(&[WC, WD], w) + Affine::vars(&[HC, HD], a * bls) + x_ctog)
            * (1.0 / hw.cpu_to_gpu_bandwidth)
            + Affine::constant(deq_w + deq_old_cache);
        let gtoc_g = (Affine::vars(&[HC, HD], a * bls) + y_gtoc) * (1.0 / hw.gpu_to_cpu_bandwidth)
            + Affine::constant(quant_new_cache);
        let dtoc_g = (Affine::var(CD, s_avg * k * bls) + Affine::var(WD, w) + Affine::var(HD, a * bls))
            * (1.0 / hw.disk_to_cpu_bandwidth);
        let ctod_g = (Affine::var(CD, k * bls) + Affine::var(HD, a * bls)) * (1.0 / hw.cpu_to_disk_bandwidth);
        let att_flops = 4.0 * bls * s_avg * q;
        let linear_g = Affine::constant(nb * (gbs * lin / hw.matmul_flops(gbs)).max(hbm(w_full)));
        let gpu_att = (att_flops / hw.gpu_bmm_flops).max(hbm(bls * s_avg * k_full));
        let comp_g = if gpu_attn_all {
            linear_g + Affine::constant(gpu_att)
        } else {
            let by_flops = att_flops / hw.cpu_flops;
            let by_bytes = hw.cpu_attention_bandwidth.map_or(0.0, |bw| bls * s_avg * k_full / bw);
            linear_g + Affine::var(CG, gpu_att) + Affine::vars(&[CC, CD], by_flops.max(by_bytes))
        };

        // ---------------- peak memory ----------------
        let one_minus = |i: usize, coef: f64| Affine::constant(coef) + Affine::var(i, -coef);
        let deq_w_buf = if shape.compress_weights.is_some() { w_full } else { 0.0 };
        let cache_home = |i: usize| Affine::var(i, (s + n) * k * bls * l);

        let gpu_p_base = Affine::var(WG, w * l)
            + Affine::var(HG, s * a * bls)
            + cache_home(CG)
            + one_minus(WG, 2.0 * w)
            + one_minus(HG, s * a * gbs)
            + Affine::constant(deq_w_buf);
        let gpu_p_alts = vec![
            Affine::constant(gbs * s * e * (h1 + q + 2.0 * kv)),       // qkv
            Affine::constant(gbs * e * (s * q + s * kv + nh * s * s)), // att1: q, k, scores
            Affine::constant(gbs * e * (nh * s * s + s * kv + s * q)), // att2: scores, v, out
            Affine::constant(2.0 * gbs * s * e * h1),                  // embed
            Affine::constant(gbs * s * e * (h1 + mlp_mult * h2)),      // mlp1
            Affine::constant(gbs * s * e * (h2 + h1)),                 // mlp2
        ];

        let ctx = s + n;
        let (att_factor, gpu_attn_bufs) = if gpu_attn_all {
            let loaded = Affine::vars(&[CC, CD], 2.0 * gbs * ctx * k);
            let dequantized = if cache_c.is_some() { gbs * ctx * k_full } else { 0.0 };
            (Affine::constant(1.0), loaded + Affine::constant(dequantized))
        } else {
            (Affine::var(CG, 1.0), Affine::default())
        };
        let gpu_g_base = Affine::var(WG, w * l)
            + Affine::var(HG, a * bls)
            + cache_home(CG)
            + one_minus(WG, 2.0 * w)
            + one_minus(HG, a * gbs)
            + Affine::constant(deq_w_buf)
            + gpu_attn_bufs;
        let gpu_g_alts = vec![
            Affine::constant(gbs * e * (h1 + q + 2.0 * kv)),    // qkv
            att_factor * (gbs * e * (q + ctx * kv + nh * ctx)), // att1
            att_factor * (gbs * e * (nh * ctx + ctx * kv + q)), // att2
            Affine::constant(2.0 * gbs * e * h1),               // embed
            Affine::constant(gbs * e * (h1 + mlp_mult * h2)),   // mlp1
            Affine::constant(gbs * e * (h2 + h1)),              // mlp2
        ];

        let cpu_p = Affine::var(WC, w * l)
            + Affine::var(HC, s * a * bls)
            + cache_home(CC)
            + one_minus(WG, w)
            + one_minus(HG, s * a * gbs)
            + Affine::var(CD, 2.0 * ctx * k * gbs);
        let cpu_scores = if shape.cpu_attention { e * nh * ctx * gbs } else { 0.0 };
        let cpu_g = Affine::var(WC, w * l)
            + Affine::var(HC, a * bls)
            + cache_home(CC)
            + Affine::var(WD, w)
            + Affine::var(HD, 2.0 * a * gbs)
            + Affine::var(CD, 2.0 * ctx * k * gbs)
            + Affine::constant(cpu_scores + a * gbs);
        let disk = Affine::var(WD, w * l) + Affine::var(HD, s * a * bls) + cache_home(CD);

        Ok(Self {
            prefill: [ctog_p, gtoc_p, dtoc_p, ctod_p, comp_p],
            prefill_serial: pf_cache_quant,
            prefill_quant: deq_w,
            decode: [ctog_g, gtoc_g, dtoc_g, ctod_g, comp_g],
            decode_quant: deq_w + deq_old_cache + quant_new_cache,
            memory: [
                MaxAffine { base: gpu_p_base, alts: gpu_p_alts },
                MaxAffine { base: gpu_g_base, alts: gpu_g_alts },
                MaxAffine { base: cpu_p, alts: Vec::new() },
                MaxAffine { base: cpu_g, alts: Vec::new() },
                MaxAffine { base: disk, alts: Vec::new() },
            ],
            layers: l,
            gen_len: n,
            block: bls,
            overlap: shape.overlap,
            init_time: if shape.compress_weights.is_some() { l * w_full / hw.cpu_quantize_bandwidth } else { 0.0 },
        })
    }

    /// Evaluate every term and peak at placement `x`.
    pub fn evaluate(&self, x: &[f64; 9]) -> CostEstimate {
        let breakdown = |terms: &[Affine; 5], serial: f64, quant: f64| {
            let t = terms.map(|a| a.eval(x));
            TermBreakdown {
                cpu_to_gpu: t[0],
                gpu_to_cpu: t[1],
                disk_to_cpu: t[2],
                cpu_to_disk: t[3],
                compute: t[4],
                serial,
                quantization: quant + serial,
            }
        };
        let prefill_terms = breakdown(&self.prefill, self.prefill_serial, self.prefill_quant);
        let decode_terms = breakdown(&self.decode, 0.0, self.decode_quant);
        let t_pre = prefill_terms.layer_time(self.overlap);
        let t_gen = decode_terms.layer_time(self.overlap);
        let m = self.memory.each_ref().map(|m| m.eval(x));
        let peak_memory = PeakMemory {
            prefill: TierBytes { gpu: m[0], cpu: m[2], disk: m[4] },
            decode: TierBytes { gpu: m[1], cpu: m[3], disk: m[4] },
        };
        self.estimate([t_pre, t_gen], [prefill_terms, decode_terms], peak_memory)
    }

    /// The estimate for per-layer prefill and decode times (with their term breakdowns) and
    /// peak memory: the whole run's latency and throughput follow from the workload.
    pub fn estimate(
        &self,
        [t_pre, t_gen]: [f64; 2],
        [prefill_terms, decode_terms]: [TermBreakdown; 2],
        peak_memory: PeakMemory,
    ) -> CostEstimate {
        let prefill_time = t_pre * self.layers;
        let decode_time = t_gen * (self.gen_len - 1.0) * self.layers;
        let total = prefill_time + decode_time;
        CostEstimate {
            t_prefill_layer: t_pre,
            t_decode_layer: t_gen,
            prefill_time,
            decode_time,
            total_latency: total,
            throughput_tokens_per_s: if total > 0.0 { self.block * self.gen_len / total } else { 0.0 },
            init_time: self.init_time,
            peak_memory,
            prefill_terms,
            decode_terms,
        }
    }
}

/// Stored bytes of one layer's weights under `shape`'s weight compression (`W` of the formulas).
pub(crate) fn stored_layer_weight_bytes(model: &ModelShape, shape: &PolicyShape) -> f64 {
    match shape.compress_weights {
        Some(c) => model.params_per_layer() * c.bytes_per_value(),
        None => model.layer_weight_bytes(),
    }
}

/// Predict latency, throughput and peak memory of `policy` (FlexGen A.3 + LM-Offload §3.2).
///
/// Does not check the peaks against the capacities; use [`CostEstimate::fits`].
pub fn estimate(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    policy: &Policy,
) -> Result<CostEstimate, PolicyError> {
    policy.validate()?;
    let lm = LinearModel::build(hw, model, workload, &policy.shape)?;
    Ok(lm.evaluate(&policy.placement_vector()))
}

/// The largest GPU batch size in `1..=max_gpu_batch_size` for which `build(gbs)` fits in
/// `available`, with its estimate (`None` if even 1 does not fit). Peak memory never shrinks as
/// `gbs` grows for a fixed placement, so this is a binary search. Meant for the baselines
/// ([`Policy::deepspeed_like`], [`Policy::accelerate_like`]), whose batch FlexGen sets "as large
/// as possible".
pub fn largest_fitting_batch(
    hw: &HardwareProfile,
    model: &ModelShape,
    workload: &OffloadWorkload,
    available: &TierBytes,
    max_gpu_batch_size: u32,
    build: impl Fn(u32) -> Policy,
) -> Result<Option<(Policy, CostEstimate)>, PolicyError> {
    let fits = |g: u32| -> Result<Option<(Policy, CostEstimate)>, PolicyError> {
        let p = build(g);
        let e = estimate(hw, model, workload, &p)?;
        Ok(e.fits(available).then_some((p, e)))
    };
    let Some(mut best) = fits(1)? else { return Ok(None) };
    let (mut lo, mut hi) = (1u32, max_gpu_batch_size.max(1));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match fits(mid)? {
            Some(found) => {
                best = found;
                lo = mid;
            }
            None => hi = mid - 1,
        }
    }
    Ok(Some(best))
}
