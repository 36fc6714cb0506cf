//! Facts about a Burn device that engines decide by.

use burn::tensor::Device;

/// Whether `device` computes on the host CPU (Burn's Flex backend), so that "device memory" is
/// the machine's RAM. Decided by the device's kind, not its name.
pub fn is_host_device(device: &Device) -> bool {
    #[allow(unreachable_patterns)]
    match device.as_dispatch() {
        #[cfg(feature = "flex")]
        burn::backend::DispatchDevice::Flex(_) => true,
        _ => false,
    }
}

/// Whether `device` is a remote worker's (Burn's remote backend): its operations travel to another
/// process, which computes them in the order they arrive.
pub fn is_remote_device(device: &Device) -> bool {
    #[allow(unreachable_patterns)]
    match device.as_dispatch() {
        #[cfg(feature = "remote")]
        burn::backend::DispatchDevice::Remote(_) => true,
        _ => false,
    }
}

/// Sends a remote worker the operations recorded for it so far (nothing elsewhere), so that it
/// computes them while the caller records what comes next. The client's fusion otherwise holds
/// them until something is read: a model's layers would reach the worker only after the caller
/// had recorded them all, and the worker would idle meanwhile. Layer loops call this after each
/// layer. Local GPUs are left to their own submission policy.
pub fn send_to_worker(device: &Device) -> crate::Result<()> {
    if is_remote_device(device) {
        device.flush().map_err(|e| crate::ModelError::Device(format!("sending operations to {device:?}: {e:?}")))?;
    }
    Ok(())
}
