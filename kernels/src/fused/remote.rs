//! [`FusedOps`] on remote devices: the client-side glue for Burn's router backend and the
//! server-side handlers (wire format: see [`crate::remote`]).

use burn::backend::Scalar;
use burn::backend::TensorMetadata;
use burn::backend::ir::BackendIr;
use burn::backend::tensor::FloatTensor;
use burn_router::{BackendRouter, CustomOpRegistry, RouterChannel};

use super::ops::{FusedOps, halved};
use crate::remote::{launch, launch_n, scalar_usize};

impl<C: RouterChannel> FusedOps for BackendRouter<C> {
    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f32) -> FloatTensor<Self> {
        let (shape, dtype) = (x.shape(), x.dtype());
        launch("fused_rms_norm", vec![x, gamma], shape, dtype, &[Scalar::from(epsilon)])
    }

    fn fused_add_rms_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (shape, dtype) = (x.shape(), x.dtype());
        let outputs = [(shape.clone(), dtype), (shape, dtype)];
        let [out, sum] = launch_n("fused_add_rms_norm", vec![x, residual, gamma], outputs, &[Scalar::from(epsilon)]);
        (out, sum)
    }

    fn fused_rms_norm_add(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        epsilon: f32,
    ) -> FloatTensor<Self> {
        let (shape, dtype) = (x.shape(), x.dtype());
        launch("fused_rms_norm_add", vec![x, gamma, residual], shape, dtype, &[Scalar::from(epsilon)])
    }

    fn fused_norm_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma_first: FloatTensor<Self>,
        gamma_second: FloatTensor<Self>,
        epsilon_first: f32,
        epsilon_second: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (shape, dtype) = (x.shape(), x.dtype());
        let outputs = [(shape.clone(), dtype), (shape, dtype)];
        let scalars = [Scalar::from(epsilon_first), Scalar::from(epsilon_second)];
        let [out, sum] =
            launch_n("fused_norm_add_norm", vec![x, residual, gamma_first, gamma_second], outputs, &scalars);
        (out, sum)
    }

    fn fused_norm_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        q_gamma: FloatTensor<Self>,
        k_gamma: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = [(q.shape(), q.dtype()), (k.shape(), k.dtype())];
        let inputs = vec![q, k, q_gamma, k_gamma, cos, sin];
        let [q, k] = launch_n("fused_norm_rotate_half_qk", inputs, outputs, &[Scalar::from(epsilon)]);
        (q, k)
    }

    fn fused_rotate_half_qk(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = [(q.shape(), q.dtype()), (k.shape(), k.dtype())];
        let [q, k] = launch_n("fused_rotate_half_qk", vec![q, k, cos, sin], outputs, &[]);
        (q, k)
    }

    fn fused_gated_mul(gate_up: FloatTensor<Self>, act: u32) -> FloatTensor<Self> {
        let (shape, dtype) = (halved(&gate_up.shape()), gate_up.dtype());
        launch("fused_gated_mul", vec![gate_up], shape, dtype, &[Scalar::from(act)])
    }

    fn fused_prefix_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        len: usize,
        scale: f32,
    ) -> FloatTensor<Self> {
        let mut shape = q.shape();
        shape.swap(1, 2);
        let dtype = q.dtype();
        let scalars = [Scalar::from(len), Scalar::from(scale)];
        launch("fused_prefix_attention", vec![q, k, v, bias], shape, dtype, &scalars)
    }
}

/// Registers the server-side handlers of every [`FusedOps`] op for backend `B`.
pub(crate) fn register<B: BackendIr + FusedOps>(registry: &mut CustomOpRegistry<B>) {
    registry.register("fused_rms_norm", |handles, ir, _device| {
        let ([x, gamma], [out]) = ir.as_fixed::<2, 1>();
        let y = B::fused_rms_norm(
            handles.get_float_tensor::<B>(x),
            handles.get_float_tensor::<B>(gamma),
            ir.scalars[0].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
    });
    registry.register("fused_add_rms_norm", |handles, ir, _device| {
        let ([x, residual, gamma], [out, sum]) = ir.as_fixed::<3, 2>();
        let (y, s) = B::fused_add_rms_norm(
            handles.get_float_tensor::<B>(x),
            handles.get_float_tensor::<B>(residual),
            handles.get_float_tensor::<B>(gamma),
            ir.scalars[0].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
        handles.register_float_tensor::<B>(&sum.id, s);
    });
    registry.register("fused_rms_norm_add", |handles, ir, _device| {
        let ([x, gamma, residual], [out]) = ir.as_fixed::<3, 1>();
        let y = B::fused_rms_norm_add(
            handles.get_float_tensor::<B>(x),
            handles.get_float_tensor::<B>(gamma),
            handles.get_float_tensor::<B>(residual),
            ir.scalars[0].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
    });
    registry.register("fused_norm_add_norm", |handles, ir, _device| {
        let ([x, residual, first, second], [out, sum]) = ir.as_fixed::<4, 2>();
        let (y, s) = B::fused_norm_add_norm(
            handles.get_float_tensor::<B>(x),
            handles.get_float_tensor::<B>(residual),
            handles.get_float_tensor::<B>(first),
            handles.get_float_tensor::<B>(second),
            ir.scalars[0].elem::<f32>(),
            ir.scalars[1].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
        handles.register_float_tensor::<B>(&sum.id, s);
    });
    registry.register("fused_norm_rotate_half_qk", |handles, ir, _device| {
        let ([q, k, q_gamma, k_gamma, cos, sin], [q_out, k_out]) = ir.as_fixed::<6, 2>();
        let (q, k) = B::fused_norm_rotate_half_qk(
            handles.get_float_tensor::<B>(q),
            handles.get_float_tensor::<B>(k),
            handles.get_float_tensor::<B>(q_gamma),
            handles.get_float_tensor::<B>(k_gamma),
            handles.get_float_tensor::<B>(cos),
            handles.get_float_tensor::<B>(sin),
            ir.scalars[0].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&q_out.id, q);
        handles.register_float_tensor::<B>(&k_out.id, k);
    });
    registry.register("fused_rotate_half_qk", |handles, ir, _device| {
        let ([q, k, cos, sin], [q_out, k_out]) = ir.as_fixed::<4, 2>();
        let (q, k) = B::fused_rotate_half_qk(
            handles.get_float_tensor::<B>(q),
            handles.get_float_tensor::<B>(k),
            handles.get_float_tensor::<B>(cos),
            handles.get_float_tensor::<B>(sin),
        );
        handles.register_float_tensor::<B>(&q_out.id, q);
        handles.register_float_tensor::<B>(&k_out.id, k);
    });
    registry.register("fused_prefix_attention", |handles, ir, _device| {
        let ([q, k, v, bias], [out]) = ir.as_fixed::<4, 1>();
        let y = B::fused_prefix_attention(
            handles.get_float_tensor::<B>(q),
            handles.get_float_tensor::<B>(k),
            handles.get_float_tensor::<B>(v),
            handles.get_float_tensor::<B>(bias),
            scalar_usize(ir, 0),
            ir.scalars[1].elem::<f32>(),
        );
        handles.register_float_tensor::<B>(&out.id, y);
    });
    registry.register("fused_gated_mul", |handles, ir, _device| {
        let ([gate_up], [out]) = ir.as_fixed::<1, 1>();
        let y = B::fused_gated_mul(handles.get_float_tensor::<B>(gate_up), scalar_usize(ir, 0) as u32);
        handles.register_float_tensor::<B>(&out.id, y);
    });
}
