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
