//! Activations between layers (FlexGen's activation placement): a GPU batch's hidden states wait
//! for the batch's next layer on the device, in host memory, or in the block's scratch directory.
//! `store_hidden` parks them on their tier, `load_hidden` brings them back to the device.

use burn::tensor::{DType, Tensor, TensorData};
use burn_llm_models::model::Hidden;
use tracing::trace_span;

use super::OffloadEngine;
use super::io::BlockIo;
use crate::error::Result;
use crate::policy::Tier;
use crate::store::Reservation;

/// Activations between layers, where their tier keeps them.
pub(super) enum Parked {
    /// On the device.
    Device(Hidden),
    /// In host memory, holding their host budget.
    Host { hidden: Hidden, _budget: Reservation },
    /// In the block's scratch directory (the rotary angles, small, stay on the device).
    Disk { batch: usize, dims: [usize; 3], dtype: DType, rotary: Option<(Tensor<4>, Tensor<4>)> },
}

impl Parked {
    /// Whether bringing these activations back is I/O (they are off the device).
    pub(super) fn is_away(&self) -> bool {
        !matches!(self, Parked::Device(_))
    }
}

impl OffloadEngine {
    /// `store_hidden`: moves GPU batch `batch`'s output activations to `tier`, against the host
    /// budget there.
    pub(super) fn store_hidden(&self, batch: usize, hidden: Hidden, tier: Tier, io: &BlockIo) -> Result<Parked> {
        let _span = trace_span!("store_hidden", batch, ?tier).entered();
        let (dims, dtype) = (hidden.states.dims(), hidden.states.dtype());
        let bytes = (dims.iter().product::<usize>() * dtype.size()) as u64;
        Ok(match tier {
            Tier::Gpu => Parked::Device(hidden),
            Tier::Cpu => {
                let budget = self.ledger.reserve(Tier::Cpu, bytes, &format!("activations of GPU batch {batch}"))?;
                Parked::Host {
                    hidden: Hidden { states: hidden.states.to_device(&self.host), rotary: hidden.rotary },
                    _budget: budget,
                }
            }
            Tier::Disk => {
                io.scratch()?.write(&activation_file(batch), hidden.states.into_data().as_bytes())?;
                io.record_activation(batch, bytes);
                Parked::Disk { batch, dims, dtype, rotary: hidden.rotary }
            }
        })
    }

    /// `load_hidden`: parked activations back on the device.
    pub(super) fn load_hidden(&self, parked: Parked, io: &BlockIo) -> Result<Hidden> {
        let _span = trace_span!("load_hidden", away = parked.is_away()).entered();
        match parked {
            Parked::Device(h) => Ok(h),
            Parked::Host { hidden, _budget } => {
                Ok(Hidden { states: hidden.states.to_device(&self.device), rotary: hidden.rotary })
            }
            Parked::Disk { batch, dims, dtype, rotary } => {
                let len = dims.iter().product::<usize>() * dtype.size();
                let bytes = io.scratch()?.read(&activation_file(batch), len)?;
                let states = Tensor::from_data(TensorData::from_bytes_vec(bytes, dims, dtype), (&self.device, dtype));
                Ok(Hidden { states, rotary })
            }
        }
    }
}

/// The scratch file holding GPU batch `batch`'s parked activations.
fn activation_file(batch: usize) -> String {
    format!("act-b{batch}")
}
