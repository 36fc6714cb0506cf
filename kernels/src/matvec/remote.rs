//! [`MatvecOps`] on remote devices: the client-side glue for Burn's router backend and the
//! server-side handler (wire format: see [`crate::remote`]).

use burn::backend::TensorMetadata;
use burn::backend::ir::BackendIr;
use burn::backend::tensor::FloatTensor;
use burn_router::{BackendRouter, CustomOpRegistry, RouterChannel};

use super::ops::MatvecOps;
use crate::remote::launch;

impl<C: RouterChannel> MatvecOps for BackendRouter<C> {
    fn matvec(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        let mut shape = x.shape();
        shape[1] = w.shape()[1];
        let dtype = x.dtype();
        launch("matvec", vec![x, w], shape, dtype, &[])
    }
}

/// Registers the server-side handler of [`MatvecOps::matvec`] for backend `B`.
pub(crate) fn register<B: BackendIr + MatvecOps>(registry: &mut CustomOpRegistry<B>) {
    registry.register("matvec", |handles, ir, _device| {
        let ([x, w], [out]) = ir.as_fixed::<2, 1>();
        let y = B::matvec(handles.get_float_tensor::<B>(x), handles.get_float_tensor::<B>(w));
        handles.register_float_tensor::<B>(&out.id, y);
    });
}
