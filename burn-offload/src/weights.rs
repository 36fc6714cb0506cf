//! Layer weights on the disk tier (`--offload-dir`), stored parameter by parameter exactly as
//! they run: in the model's float type (norms in `f32`), or a compressed layer's 4-bit codes, so that a compressed layer reads a
//! quarter of the bytes and is never re-quantized. (Benchmarks without a checkpoint load
//! [`RandomWeights`](burn_llm_models::weights::RandomWeights), FlexGen's dummy weights, like any
//! other source.)

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_llm_models::model::DecoderLayer;

use crate::error::OffloadError;
use crate::store::{DType as StoredType, DiskStore, HostData, TensorView};

/// Writes every parameter of `layer` (as it is stored: `f32`, or a compressed layer's `u32`
/// codes with their scales and minimums) to `store` as `prefix` + its index; returns the bytes
/// written. [`read_layer`] rebuilds the layer.
pub fn write_layer(layer: &DecoderLayer, store: &mut DiskStore, prefix: &str) -> crate::error::Result<u64> {
    let mut collect = Collect::default();
    layer.visit(&mut collect);
    let mut bytes = 0u64;
    for (i, data) in collect.tensors.into_iter().enumerate() {
        let name = format!("{prefix}{i}");
        let shape = data.shape().to_vec();
        let stored = match StoredType::of(data.dtype()) {
            Some(StoredType::F32) => {
                store.put(&name, HostData::f32(&shape, data.as_slice::<f32>().map_err(data_error(&name))?))?
            }
            Some(StoredType::U32) => {
                store.put(&name, HostData::u32(&shape, data.as_slice::<u32>().map_err(data_error(&name))?))?
            }
            Some(half @ (StoredType::F16 | StoredType::BF16)) => {
                let bits: &[u16] = bytemuck::try_cast_slice(data.as_bytes())
                    .map_err(|e| OffloadError::Config(format!("{name}: unaligned 16-bit parameter data: {e}")))?;
                store.put(&name, HostData::half(&shape, half, bits))?
            }
            None => {
                return Err(OffloadError::Config(format!(
                    "{name}: cannot store a {:?} parameter on the disk tier",
                    data.dtype()
                )));
            }
        };
        bytes += stored.payload_bytes();
    }
    Ok(bytes)
}

/// Reads the layer [`write_layer`] wrote under `prefix` onto `device`, into the structure of
/// `template` (that layer's own [`hollow`] copy: layers of one model may differ in more than their
/// weights, e.g. Gemma 3's attention windows). Every file is
/// checksum-verified; a missing, corrupted or mismatched tensor is an error.
pub fn read_layer(
    template: &DecoderLayer,
    store: &DiskStore,
    prefix: &str,
    device: &Device,
) -> crate::error::Result<DecoderLayer> {
    let mut restore = Restore { store, prefix, device, next: 0, error: None };
    let layer = template.clone().map(&mut restore);
    match restore.error {
        Some(e) => Err(e),
        None => Ok(layer),
    }
}

/// `layer` with every parameter replaced by a one-element tensor: the structure
/// [`read_layer`] fills, holding no weights.
pub fn hollow(layer: DecoderLayer) -> DecoderLayer {
    layer.map(&mut Hollow)
}

fn data_error(name: &str) -> impl Fn(burn::tensor::DataError) -> OffloadError + '_ {
    move |e| OffloadError::Config(format!("{name}: unreadable parameter data: {e:?}"))
}

/// Every parameter's data, in visiting order.
#[derive(Default)]
struct Collect {
    tensors: Vec<TensorData>,
}

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.tensors.push(param.val().into_data());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.tensors.push(param.val().into_data());
    }
}

/// Replaces parameters, in visiting order, with the tensors stored under a prefix.
struct Restore<'a> {
    store: &'a DiskStore,
    prefix: &'a str,
    device: &'a Device,
    next: usize,
    error: Option<OffloadError>,
}

impl Restore<'_> {
    /// The next stored tensor, checked to have rank `D` and one of the types `dtypes` (a float
    /// parameter is `f32`, or the model's 16-bit type; norms stay `f32` in a half model).
    fn take<const D: usize>(&mut self, dtypes: &[StoredType]) -> crate::error::Result<TensorData> {
        let name = format!("{}{}", self.prefix, self.next);
        self.next += 1;
        let tensor = self.store.get(&name)?;
        if tensor.shape().len() != D || !dtypes.contains(&tensor.dtype()) {
            return Err(OffloadError::Config(format!(
                "{name}: stored as {} {:?}, the model expects a rank-{D} tensor of {dtypes:?}",
                tensor.dtype(),
                tensor.shape()
            )));
        }
        let shape = tensor.shape().to_vec();
        Ok(match tensor.view() {
            TensorView::F32(values) => TensorData::new(values.to_vec(), shape),
            TensorView::U32(values) => TensorData::new(values.to_vec(), shape),
            TensorView::Half(dtype, bits) => {
                TensorData::from_bytes_vec(bytemuck::cast_slice(bits).to_vec(), shape, dtype.burn())
            }
        })
    }

    fn replace<T>(&mut self, param: Param<T>, load: impl FnOnce(&mut Self) -> crate::error::Result<T>) -> Param<T>
    where
        T: burn::module::ParameterValue,
    {
        if self.error.is_some() {
            return param;
        }
        match load(self) {
            Ok(value) => param.map(|_| value),
            Err(e) => {
                self.error = Some(e);
                param
            }
        }
    }
}

impl ModuleMapper for Restore<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.replace(param, |r| {
            let data = r.take::<D>(&[StoredType::F32, StoredType::F16, StoredType::BF16])?;
            let dtype = data.dtype();
            Ok(Tensor::from_data(data, (r.device, dtype)))
        })
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        self.replace(param, |r| Ok(Tensor::from_data(r.take::<D>(&[StoredType::U32])?, (r.device, DType::U32))))
    }
}

/// Replaces every parameter with a one-element tensor.
struct Hollow;

impl ModuleMapper for Hollow {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| Tensor::zeros([1; D], (&t.device(), t.dtype())))
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        param.map(|t| Tensor::zeros([1; D], (&t.device(), DType::U32)))
    }
}
