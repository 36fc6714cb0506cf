//! [`PagedKvOps`] on remote devices: the client-side glue for Burn's router backend and the
//! server-side handlers (wire format: see [`crate::remote`]). The cache-writing ops keep their
//! in-place behaviour on the server: a cache the client holds uniquely arrives there as a
//! read-write handle, which the server's kernel writes without copying.

use burn::backend::Scalar;
use burn::backend::TensorMetadata;
use burn::backend::ir::BackendIr;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn_router::{BackendRouter, CustomOpRegistry, RouterChannel};

use super::ops::PagedKvOps;
use crate::remote::{launch, scalar_usize};

impl<C: RouterChannel> PagedKvOps for BackendRouter<C> {
    fn reshape_and_cache(
        cache: FloatTensor<Self>,
        new: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let (shape, dtype) = (cache.shape(), cache.dtype());
        launch("reshape_and_cache", vec![cache, new, slots], shape, dtype, &[])
    }

    fn copy_blocks(cache: FloatTensor<Self>, pairs: IntTensor<Self>) -> FloatTensor<Self> {
        let (shape, dtype) = (cache.shape(), cache.dtype());
        launch("copy_blocks", vec![cache, pairs], shape, dtype, &[])
    }

    fn write_blocks(cache: FloatTensor<Self>, ids: IntTensor<Self>, blocks: FloatTensor<Self>) -> FloatTensor<Self> {
        let (shape, dtype) = (cache.shape(), cache.dtype());
        launch("write_blocks", vec![cache, ids, blocks], shape, dtype, &[])
    }

    fn paged_attention(
        q: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        block_tables: IntTensor<Self>,
        query_seq: IntTensor<Self>,
        context_lens: IntTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let (shape, dtype) = (q.shape(), q.dtype());
        let inputs = vec![q, k_cache, v_cache, block_tables, query_seq, context_lens];
        launch("paged_attention", inputs, shape, dtype, &[Scalar::from(scale)])
    }

    fn paged_attention_quantized(
        q: FloatTensor<Self>,
        k_codes: IntTensor<Self>,
        k_scale: FloatTensor<Self>,
        k_min: FloatTensor<Self>,
        v_codes: IntTensor<Self>,
        v_scale: FloatTensor<Self>,
        v_min: FloatTensor<Self>,
        block_tables: IntTensor<Self>,
        query_seq: IntTensor<Self>,
        context_lens: IntTensor<Self>,
        scale: f32,
        bits: u32,
        group: usize,
        key_channels: u32,
    ) -> FloatTensor<Self> {
        let (shape, dtype) = (q.shape(), q.dtype());
        let inputs = vec![q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, block_tables, query_seq, context_lens];
        let scalars = [Scalar::from(scale), Scalar::from(bits), Scalar::from(group), Scalar::from(key_channels)];
        launch("paged_attention_quantized", inputs, shape, dtype, &scalars)
    }
}

/// Registers the server-side handlers of every [`PagedKvOps`] op for backend `B`.
pub(crate) fn register<B: BackendIr + PagedKvOps>(registry: &mut CustomOpRegistry<B>) {
    registry.register("reshape_and_cache", |handles, ir, _device| {
        let ([cache, new, slots], [out]) = ir.as_fixed::<3, 1>();
        let cache = B::reshape_and_cache(
            handles.get_float_tensor::<B>(cache),
            handles.get_float_tensor::<B>(new),
            handles.get_int_tensor::<B>(slots),
        );
        handles.register_float_tensor::<B>(&out.id, cache);
    });
    registry.register("copy_blocks", |handles, ir, _device| {
        let ([cache, pairs], [out]) = ir.as_fixed::<2, 1>();
        let cache = B::copy_blocks(handles.get_float_tensor::<B>(cache), handles.get_int_tensor::<B>(pairs));
        handles.register_float_tensor::<B>(&out.id, cache);
    });
    registry.register("write_blocks", |handles, ir, _device| {
        let ([cache, ids, blocks], [out]) = ir.as_fixed::<3, 1>();
        let cache = B::write_blocks(
            handles.get_float_tensor::<B>(cache),
            handles.get_int_tensor::<B>(ids),
            handles.get_float_tensor::<B>(blocks),
        );
        handles.register_float_tensor::<B>(&out.id, cache);
    });
    registry.register("paged_attention", |handles, ir, _device| {
        let ([q, k_cache, v_cache, block_tables, query_seq, context_lens], [out]) = ir.as_fixed::<6, 1>();
        let y = B::paged_attention(
            handles.get_float_tensor::<B>(q),
            handles.get_float_tensor::<B>(k_cache),
            handles.get_float_tensor::<B>(v_cache),
            handles.get_int_tensor::<B>(block_tables),
            handles.get_int_tensor::<B>(query_seq),
            handles.get_int_tensor::<B>(context_lens),
            ir.scalars[0].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
    });
    registry.register("paged_attention_quantized", |handles, ir, _device| {
        let ([q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, block_tables, query_seq, context_lens], [out]) =
            ir.as_fixed::<10, 1>();
        let y = B::paged_attention_quantized(
            handles.get_float_tensor::<B>(q),
            handles.get_int_tensor::<B>(k_codes),
            handles.get_float_tensor::<B>(k_scale),
            handles.get_float_tensor::<B>(k_min),
            handles.get_int_tensor::<B>(v_codes),
            handles.get_float_tensor::<B>(v_scale),
            handles.get_float_tensor::<B>(v_min),
            handles.get_int_tensor::<B>(block_tables),
            handles.get_int_tensor::<B>(query_seq),
            handles.get_int_tensor::<B>(context_lens),
            ir.scalars[0].elem::<f32>(),
            scalar_usize(ir, 1) as u32,
            scalar_usize(ir, 2),
            scalar_usize(ir, 3) as u32,
        );
        handles.register_float_tensor::<B>(&out.id, y);
    });
}
