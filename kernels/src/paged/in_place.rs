//! Rewriting a tensor held by `&mut` without the op Burn's `Tensor::inplace` adds.
//!
//! `Tensor::inplace` moves the tensor out by swapping `Tensor::empty([0; D])` into its place. On
//! a fusion device (every CubeCL runtime, and a `ws://` worker, whose client side is
//! `Fusion<BackendRouter>`) that empty tensor is an op with no inputs, so fusion's stream
//! optimizer opens a new block for it and later merges the block into the step's graph, a merge
//! that copies and re-fuses every op gathered so far. A paged step writes each layer's K and V
//! this way, so the client's work per step grows with the square of the step's op count.
//!
//! [`update`] swaps in a clone of one empty tensor kept per thread, device and tensor type
//! instead. Cloning a tensor on its own stream only counts a reference, and dropping a clone
//! that is not the last does nothing, so the placeholder never reaches the device.

use std::any::Any;
use std::cell::RefCell;
use std::mem::ManuallyDrop;

use burn::tensor::kind::Basic;
use burn::tensor::{Device, Tensor};

/// An empty tensor of some type on `Device`, never dropped: a thread-local destructor would send
/// a drop to a device that may be gone by then, and an empty tensor holds no memory.
type Placeholder = (Device, ManuallyDrop<Box<dyn Any>>);

thread_local! {
    /// One empty tensor per (device, tensor type) this thread has updated.
    static PLACEHOLDERS: RefCell<Vec<Placeholder>> = const { RefCell::new(Vec::new()) };
}

/// A tensor with no elements on `device`, of the same type as the tensors it stands in for.
fn placeholder<const D: usize, K>(device: &Device) -> Tensor<D, K>
where
    K: Basic + 'static,
{
    PLACEHOLDERS.with(|cell| {
        let mut kept = cell.borrow_mut();
        let found =
            kept.iter().filter(|(d, _)| d == device).find_map(|(_, tensor)| tensor.downcast_ref::<Tensor<D, K>>());
        if let Some(tensor) = found {
            return tensor.clone();
        }
        let tensor = Tensor::<D, K>::empty([0; D], device);
        kept.push((device.clone(), ManuallyDrop::new(Box::new(tensor.clone()))));
        tensor
    })
}

/// Replaces `tensor` with `f(tensor)`, handing `f` the tensor itself (uniquely owned if it was,
/// so `f` can write it in place) without registering any op for the swap.
pub(crate) fn update<const D: usize, K>(tensor: &mut Tensor<D, K>, f: impl FnOnce(Tensor<D, K>) -> Tensor<D, K>)
where
    K: Basic + 'static,
{
    let taken = std::mem::replace(tensor, placeholder(&tensor.device()));
    *tensor = f(taken);
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Int, Tensor};

    use super::{PLACEHOLDERS, update};
    use crate::test_devices::devices_under_test;

    fn kept() -> usize {
        PLACEHOLDERS.with(|cell| cell.borrow().len())
    }

    #[test]
    fn update_hands_over_the_tensor_itself_and_keeps_one_placeholder_per_type() {
        for (name, device) in devices_under_test().unwrap() {
            let before = kept();
            let mut t = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
            let unique = t.can_mut();
            for step in 0..3 {
                update(&mut t, |x| {
                    // Still the only handle: the swap took no reference of its own.
                    assert_eq!(x.can_mut(), unique, "{name}: step {step}");
                    x.add_scalar(1.0)
                });
            }
            assert_eq!(t.to_data().try_to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0, 7.0], "{name}");
            assert_eq!(kept(), before + 1, "{name}: one placeholder for Tensor<2> on this device");

            let mut ids = Tensor::<1, Int>::from_ints([1, 2], &device);
            update(&mut ids, |x| x * 2);
            update(&mut ids, |x| x + 1);
            assert_eq!(ids.to_data().convert::<i64>().try_to_vec::<i64>().unwrap(), vec![3, 5], "{name}");
            assert_eq!(kept(), before + 2, "{name}: a second placeholder for Tensor<1, Int>");
        }
    }
}
