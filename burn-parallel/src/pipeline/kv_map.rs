//! The KV cache's layout for a pipeline whose stages may have different tensor-parallel degrees.
//!
//! A rank of a stage of degree `d` holds `kv_heads / d` key/value heads of each of its layers
//! (one replicated head when `d` is a multiple of more heads than there are,
//! [`ShardPlan::kv_heads_per_rank`](crate::tensor::ShardPlan::kv_heads_per_rank)). A cache
//! ([`KvLayout`]) has one head count for every cache layer, so the pipeline's cache layers are
//! **units** of `u` heads, `u` the greatest common divisor of every stage's per-rank head count:
//! rank `r` of decoder layer `l` owns `c = per_rank / u` consecutive cache layers, from
//! `first(l) + r·c`, on its own device, and [`StageKv`] cuts its `attend` into `c` calls, one per
//! unit, each with the unit's kv heads and the query heads that read them (attention is
//! independent per head, so the result is the same as one call over all of them).
//!
//! Every cache layer has the same shape, so the contiguous and the paged caches, the paged
//! engine's bytes per block (the sum over cache layers), swapping, copy-on-write and prefix
//! caching all work unchanged: a token's keys and values take exactly the bytes of the ranks'
//! heads. With one degree for every stage, `u` is the per-rank head count, `c = 1` and the layout
//! is the tensor-parallel one, `l·d + r` ([`rank_kv_layout`](crate::tensor::rank_kv_layout)).

use std::ops::Range;

use burn::tensor::Tensor;
use burn_llm_models::{KvCache, KvLayout, Result};

/// Where each decoder layer's ranks keep their keys and values; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvMap {
    /// Key/value heads per cache layer.
    unit: usize,
    /// Per decoder layer: its first cache layer, its degree, and the cache layers per rank.
    layers: Vec<LayerKv>,
    /// Cache layers in all.
    total: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LayerKv {
    first: usize,
    degree: usize,
    chunks: usize,
}

/// Key/value heads one rank of degree `degree` holds (`kv_heads / degree`, or one replicated).
fn per_rank(kv_heads: usize, degree: usize) -> usize {
    (kv_heads / degree.max(1)).max(1)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl KvMap {
    /// The map of a model with `kv_heads` key/value heads whose decoder layer `l` runs at degree
    /// `degrees[l]` (every degree ≥ 1; a degree the heads cannot be split by is refused earlier,
    /// by [`ShardPlan`](crate::tensor::ShardPlan)).
    pub fn new(kv_heads: usize, degrees: &[usize]) -> Self {
        let unit = degrees.iter().fold(0, |g, &d| gcd(g, per_rank(kv_heads, d))).max(1);
        let mut first = 0;
        let layers = degrees
            .iter()
            .map(|&degree| {
                let degree = degree.max(1);
                let layer = LayerKv { first, degree, chunks: per_rank(kv_heads, degree) / unit };
                first += degree * layer.chunks;
                layer
            })
            .collect();
        Self { unit, layers, total: first }
    }

    /// The cache's layout: every cache layer of [`KvMap::unit`] heads, for a model whose
    /// single-device layout is `model`.
    pub fn layout(&self, model: KvLayout) -> KvLayout {
        KvLayout { num_layers: self.total, num_kv_heads: self.unit, ..model }
    }

    /// Key/value heads per cache layer.
    pub fn unit(&self) -> usize {
        self.unit
    }

    /// Cache layers in all.
    pub fn num_cache_layers(&self) -> usize {
        self.total
    }

    /// Cache layers each rank of decoder layer `layer` owns.
    pub fn chunks(&self, layer: usize) -> usize {
        self.layers[layer].chunks
    }

    /// The cache layers of decoder layers `layers` (a stage's), in order.
    pub fn cache_layers(&self, layers: Range<usize>) -> Range<usize> {
        let start = self.layers.get(layers.start).map_or(self.total, |l| l.first);
        let end = self.layers.get(layers.end).map_or(self.total, |l| l.first);
        start..end
    }

    /// The cache layers of rank `rank` of decoder layer `layer`.
    pub fn rank_cache_layers(&self, layer: usize, rank: usize) -> Range<usize> {
        let l = self.layers[layer];
        let start = l.first + rank * l.chunks;
        start..start + l.chunks
    }

    /// The decoder layer and rank a block addresses with `index` (`layer · degree + rank`, the
    /// blocks' addressing, [`crate::block`]), when `layer` runs at its map's degree.
    fn locate(&self, index: usize, degree: usize) -> Option<(usize, usize)> {
        let degree = degree.max(1);
        let (layer, rank) = (index / degree, index % degree);
        (self.layers.get(layer)?.degree == degree).then_some((layer, rank))
    }
}

/// A stage's blocks' view of the pipeline's cache: a block of degree `degree` addresses rank `r`
/// of decoder layer `l` as cache layer `l·degree + r` ([`crate::block`]); this view sends it to
/// the rank's cache layers in `map`, one `attend` per unit of heads.
pub struct StageKv<'a> {
    /// The pipeline's cache (or a stage's view of it), addressed by cache layer.
    pub inner: &'a mut dyn KvCache,
    /// The pipeline's map.
    pub map: &'a KvMap,
    /// The stage's tensor-parallel degree.
    pub degree: usize,
}

impl KvCache for StageKv<'_> {
    fn attend(
        &mut self,
        index: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> Result<Tensor<4>> {
        let Some((layer, rank)) = self.map.locate(index, self.degree) else {
            return Err(burn_llm_models::ModelError::KvCache(
                format!(
                    "cache address {index} at tensor-parallel degree {} names no rank of the pipeline's layers",
                    self.degree
                )
                .into(),
            ));
        };
        let cache_layers = self.map.rank_cache_layers(layer, rank);
        let chunks = cache_layers.len();
        if chunks == 1 {
            return self.inner.attend(cache_layers.start, q, k, v, scale, window);
        }
        let (heads, kv_heads) = (q.dims()[1], k.dims()[1]);
        let (q_unit, kv_unit) = (heads / chunks, kv_heads / chunks);
        let mut out = Vec::with_capacity(chunks);
        for (c, cache_layer) in cache_layers.enumerate() {
            let part = |t: &Tensor<4>, unit: usize| t.clone().narrow(1, c * unit, unit);
            out.push(self.inner.attend(
                cache_layer,
                part(&q, q_unit),
                part(&k, kv_unit),
                part(&v, kv_unit),
                scale,
                window,
            )?);
        }
        Ok(Tensor::cat(out, 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_degree_everywhere_is_the_tensor_parallel_layout() {
        // 2 kv heads, 3 layers at degree 2: one head per cache layer, rank r of layer l at 2l + r.
        let map = KvMap::new(2, &[2, 2, 2]);
        assert_eq!((map.unit(), map.num_cache_layers()), (1, 6));
        assert_eq!(map.rank_cache_layers(1, 1), 3..4);
        assert_eq!(map.cache_layers(1..3), 2..6);
        // Degree 1: the model's own layout.
        let whole = KvMap::new(4, &[1, 1]);
        assert_eq!((whole.unit(), whole.num_cache_layers(), whole.rank_cache_layers(1, 0)), (4, 2, 1..2));
        // Replicated heads (degree 4 over 2 kv heads): one head per rank.
        let replicated = KvMap::new(2, &[4, 4]);
        assert_eq!((replicated.unit(), replicated.num_cache_layers()), (1, 8));
    }

    #[test]
    fn mixed_degrees_cut_every_rank_into_units_of_the_common_head_count() {
        // 4 kv heads; layers 0-1 at degree 2 (2 heads per rank), layer 2 at degree 1 (4 heads).
        let map = KvMap::new(4, &[2, 2, 1]);
        assert_eq!(map.unit(), 2);
        assert_eq!(map.rank_cache_layers(0, 1), 1..2);
        assert_eq!(map.rank_cache_layers(1, 0), 2..3);
        assert_eq!(map.rank_cache_layers(2, 0), 4..6);
        assert_eq!((map.cache_layers(0..2), map.cache_layers(2..3), map.num_cache_layers()), (0..4, 4..6, 6));
        // 6 kv heads at degrees 2 and 3: 3 and 2 heads per rank, units of one head.
        let map = KvMap::new(6, &[2, 3]);
        assert_eq!((map.unit(), map.chunks(0), map.chunks(1), map.num_cache_layers()), (1, 3, 2, 12));
        assert_eq!(map.rank_cache_layers(1, 2), 10..12);
        // Every head of every rank is stored once: the total equals the ranks' heads.
        let layout = KvLayout { num_layers: 2, num_kv_heads: 6, head_dim: 8, dtype: burn_llm_models::Precision::F32 };
        assert_eq!(map.layout(layout).values_per_token(), layout.values_per_token());
        // A block addressing a layer at another degree than the map's is refused.
        assert_eq!(map.locate(5, 3), Some((1, 2)));
        assert_eq!(map.locate(1, 3), None);
    }
}
