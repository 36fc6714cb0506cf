//! [`GroupQuantOps`] on remote devices: the client-side glue for Burn's router backend and the
//! server-side handlers (wire format: see [`crate::remote`]).

use burn::backend::Scalar;
use burn::backend::TensorMetadata;
use burn::backend::ir::{BackendIr, CustomOpIr};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::DType;
use burn_router::{BackendRouter, CustomOpRegistry, RouterChannel};

use super::ops::GroupQuantOps;
use super::{MatmulPrecision, ProductSite, fused_product_wins};
use crate::remote::{launch, scalar_usize};

impl<C: RouterChannel> GroupQuantOps for BackendRouter<C> {
    fn pack_groups(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> IntTensor<Self> {
        let mut shape = x.shape();
        let last = shape.num_dims() - 1;
        shape[last] = shape[last] * bits as usize / 32;
        launch("pack_groups", vec![x, scale, min], shape, DType::U32, &layout(bits, group))
    }

    fn unpack_groups(
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let mut shape = codes.shape();
        let last = shape.num_dims() - 1;
        shape[last] = shape[last] * 32 / bits as usize;
        let dtype = scale.dtype();
        launch("unpack_groups", vec![codes, scale, min], shape, dtype, &layout(bits, group))
    }

    fn fused_qmatmul(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let mut shape = x.shape();
        shape[1] = codes.shape()[1] * 32 / bits as usize;
        let dtype = x.dtype();
        launch("fused_qmatmul", vec![x, codes, scale, min], shape, dtype, &layout(bits, group))
    }

    fn fused_qmatmul_nt(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
        int8_rows: u32,
        symmetric_offset: u32,
    ) -> FloatTensor<Self> {
        let mut shape = x.shape();
        shape[1] = codes.shape()[0];
        let dtype = x.dtype();
        let [bits, group] = layout(bits, group);
        let scalars = [bits, group, Scalar::from(int8_rows), Scalar::from(symmetric_offset)];
        launch("fused_qmatmul_nt", vec![x, codes, scale, min], shape, dtype, &scalars)
    }
}

/// The scalars every op of the trait ships: bits per code, then the group size.
fn layout(bits: u32, group: usize) -> [Scalar; 2] {
    [Scalar::from(bits), Scalar::from(group)]
}

/// The `(bits, group)` a shipped op carries (see [`layout`]).
fn read_layout(ir: &CustomOpIr) -> (u32, usize) {
    (scalar_usize(ir, 0) as u32, scalar_usize(ir, 1))
}

/// Registers the server-side handlers of every [`GroupQuantOps`] op for backend `B`.
pub(crate) fn register<B: BackendIr + GroupQuantOps + 'static>(registry: &mut CustomOpRegistry<B>) {
    registry.register("pack_groups", |handles, ir, _device| {
        let ([x, scale, min], [out]) = ir.as_fixed::<3, 1>();
        let (bits, group) = read_layout(ir);
        let codes = B::pack_groups(
            handles.get_float_tensor::<B>(x),
            handles.get_float_tensor::<B>(scale),
            handles.get_float_tensor::<B>(min),
            bits,
            group,
        );
        handles.register_int_tensor::<B>(&out.id, codes);
    });
    registry.register("unpack_groups", |handles, ir, _device| {
        let ([codes, scale, min], [out]) = ir.as_fixed::<3, 1>();
        let (bits, group) = read_layout(ir);
        let x = B::unpack_groups(
            handles.get_int_tensor::<B>(codes),
            handles.get_float_tensor::<B>(scale),
            handles.get_float_tensor::<B>(min),
            bits,
            group,
        );
        handles.register_float_tensor::<B>(&out.id, x);
    });
    // The two fused matmuls share one wire layout (x, codes, scale, min; bits, group), and the
    // transposed one ships the client's matmul precision and the weight's symmetric offset as a
    // third and a fourth scalar (see `GroupQuantOps::fused_qmatmul_nt`).
    for (id, transposed) in [("fused_qmatmul", false), ("fused_qmatmul_nt", true)] {
        registry.register(id, move |handles, ir, _device| {
            let ([x, codes, scale, min], [out]) = ir.as_fixed::<4, 1>();
            let (bits, group) = read_layout(ir);
            let x = handles.get_float_tensor::<B>(x);
            let codes = handles.get_int_tensor::<B>(codes);
            let (scale, min) = (handles.get_float_tensor::<B>(scale), handles.get_float_tensor::<B>(min));
            // The client ships the fused op for any number of rows (it cannot tell a CPU worker
            // from a GPU one); the choice it would make for a device of its own is made here.
            let int8_rows = if transposed { scalar_usize(ir, 2) as u32 } else { 0 };
            let precision = if int8_rows == 1 { MatmulPrecision::Int8Activations } else { MatmulPrecision::Exact };
            let rows = x.shape()[0];
            let y = if !fused_product_wins(rows, site::<B>(), transposed, precision) {
                let w = B::unpack_groups(codes, scale, min, bits, group);
                B::float_matmul(x, if transposed { B::float_transpose(w) } else { w })
            } else if transposed {
                B::fused_qmatmul_nt(x, codes, scale, min, bits, group, int8_rows, scalar_usize(ir, 3) as u32)
            } else {
                B::fused_qmatmul(x, codes, scale, min, bits, group)
            };
            handles.register_float_tensor::<B>(&out.id, y);
        });
    }
}

/// What a server of backend `B` computes on: Flex is the CPU; every other backend a worker
/// serves is a CubeCL runtime.
fn site<B: 'static>() -> ProductSite {
    #[cfg(feature = "flex")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Flex>() {
        return ProductSite::Cpu;
    }
    ProductSite::Gpu
}
