//! Our custom ops on devices of other processes and machines, through Burn's remote backend
//! (`burn-remote`): the client ships each op to the server as a custom op
//! (`OperationIr::Custom`), and the server runs it with the real kernel of its own backend.
//!
//! Two halves, both needed for an op to run remotely:
//!
//! - **Client**: [`GroupQuantOps`], [`PagedKvOps`] and [`MatvecOps`] are implemented for
//!   `burn_router::BackendRouter<C>` (in `quant/remote.rs`, `paged/remote.rs` and
//!   `matvec/remote.rs`), and the traits list the `Remote` selector, so a tensor on a remote device reaches them through
//!   `Dispatch` like any other backend. With Burn's `fusion` on (every GPU feature turns it on),
//!   the remote backend is `Fusion<BackendRouter<…>>`: the op then travels inside a cached op
//!   graph as the `#[backend_extension]` macro's own custom op, and the router impl runs only when
//!   the fuser leaves the op alone. Both emit one wire format, so the server cannot tell them
//!   apart: **id** = the trait method's name; **inputs** = the tensor arguments in declaration
//!   order; **scalars** = the integer and `f32` arguments in declaration order, each as
//!   `ScalarIr::from(Scalar::from(arg))`; one output.
//! - **Server**: [`register_ops`] adds a handler per op id to the registry a `RemoteServer`
//!   hosts (`with_custom_ops`); each handler reads its inputs, calls the trait on the server's
//!   backend (`burn::backend::Flex` for Flex devices, `burn::backend::Cube` for every CubeCL
//!   runtime), which runs the Flex twin or the CubeCL kernel, and registers the output. A server
//!   without the handlers panics on the first of our ops ("No custom-op handler registered").
//!
//! The wrappers (`quantize`, `qmatmul`, `paged_attention`, …) validate their arguments on the
//! client before anything is shipped, so the handlers receive only well-formed ops.
//!
//! Compiled with the `remote` feature together with a GPU feature: the IR types come from
//! `burn::backend::ir`, which Burn exports only with its `ir` feature (implied by `fusion`).

use burn::backend::Scalar;
use burn::backend::ir::{BackendIr, CustomOpIr, OperationIr, OperationOutput, ScalarIr, TensorIr};
use burn::tensor::{DType, Shape};
use burn_router::{CustomOpRegistry, RouterClient, RouterTensor};

use crate::fused::ops::FusedOps;
use crate::matvec::MatvecOps;
use crate::paged::ops::PagedKvOps;
use crate::quant::ops::GroupQuantOps;

/// Adds the handlers of every op of this crate ([`GroupQuantOps`], [`PagedKvOps`], [`MatvecOps`], [`FusedOps`]) to `registry`,
/// for a server whose devices run backend `B`:
///
/// ```rust,ignore
/// let mut ops = CustomOpRegistry::<burn::backend::Flex>::new();
/// burn_llm_kernels::remote::register_ops(&mut ops);
/// RemoteServer::new([Device::flex()]).with_custom_ops(ops).serve(transport)?;
/// ```
pub fn register_ops<B: BackendIr + GroupQuantOps + PagedKvOps + MatvecOps + FusedOps>(
    registry: &mut CustomOpRegistry<B>,
) {
    crate::fused::remote::register::<B>(registry);
    crate::quant::remote::register::<B>(registry);
    crate::matvec::remote::register::<B>(registry);
    crate::paged::remote::register::<B>(registry);
}

/// Ships the op `id` over `inputs` (in declaration order) with `scalars` to the server of the
/// inputs' client, declaring one output of `shape` and `dtype`, and returns that output.
pub(crate) fn launch<C: RouterClient>(
    id: &str,
    inputs: Vec<RouterTensor<C>>,
    shape: Shape,
    dtype: DType,
    scalars: &[Scalar],
) -> RouterTensor<C> {
    let [output] = launch_n(id, inputs, [(shape, dtype)], scalars);
    output
}

/// [`launch`] for an op with `N` outputs, of the given shapes and dtypes, in order.
pub(crate) fn launch_n<C: RouterClient, const N: usize>(
    id: &str,
    inputs: Vec<RouterTensor<C>>,
    outputs: [(Shape, DType); N],
    scalars: &[Scalar],
) -> [RouterTensor<C>; N] {
    let client = inputs[0].client.clone();
    let desc = CustomOpIr {
        id: id.to_owned(),
        inputs: inputs.into_iter().map(RouterTensor::into_ir).collect(),
        outputs: outputs
            .into_iter()
            .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
            .collect(),
        scalars: scalars.iter().map(|&s| ScalarIr::from(s)).collect(),
    };
    client.register(OperationIr::Custom(desc)).outputs::<N>()
}

/// Scalar `index` of a shipped op as a `usize` (bit widths, group sizes).
pub(crate) fn scalar_usize(ir: &CustomOpIr, index: usize) -> usize {
    ir.scalars[index].elem::<i64>() as usize
}
