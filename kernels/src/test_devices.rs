//! Devices the kernel tests of both modules ([`crate::quant`], [`crate::paged`]) run on.

use burn::tensor::Device;

/// Devices the kernel tests run on: Flex, and wgpu unless `BURN_LLM_TEST_WGPU=0`.
pub(crate) fn devices() -> Vec<Device> {
    let mut out = vec![Device::flex()];
    #[cfg(feature = "wgpu")]
    out.extend(wgpu_device());
    out
}

/// The wgpu device, unless `BURN_LLM_TEST_WGPU=0`.
#[cfg(feature = "wgpu")]
pub(crate) fn wgpu_device() -> Option<Device> {
    let wanted = std::env::var("BURN_LLM_TEST_WGPU").map(|v| v != "0").unwrap_or(true);
    wanted.then(|| Device::wgpu(burn::tensor::DeviceKind::DefaultDevice))
}
