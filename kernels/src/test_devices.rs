//! The devices the test suites of every crate run their device tests on, chosen by environment
//! variables so that one test binary runs on the CPU, on a software rasterizer or on a real GPU:
//!
//! - unset: Flex, and wgpu (when compiled in) unless `BURN_LLM_TEST_WGPU=0`;
//! - `BURN_LLM_TEST_DEVICE=NAME[,NAME…]` with names among `flex`, `wgpu` and `vulkan` (the last
//!   only in a build with the `vulkan` feature): exactly those, in that order. The GPU bundle's
//!   script runs the GPU test suite with `BURN_LLM_TEST_DEVICE=vulkan`.

use burn::tensor::Device;

/// The variable naming the devices under test.
pub const TEST_DEVICE_ENV: &str = "BURN_LLM_TEST_DEVICE";
/// The older switch: `0` leaves wgpu out of the default set.
pub const TEST_WGPU_ENV: &str = "BURN_LLM_TEST_WGPU";

/// A device name in [`TEST_DEVICE_ENV`] that this build cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TestDeviceError {
    /// Not a device name at all.
    #[error("{TEST_DEVICE_ENV}: unknown device `{0}`: use a comma-separated list of flex, wgpu, vulkan")]
    Unknown(String),
    /// A backend this build was compiled without.
    #[error("{TEST_DEVICE_ENV}: device `{0}` is not compiled into this test binary: rebuild with `--features {0}`")]
    NotCompiled(&'static str),
    /// The variable is set but names nothing.
    #[error("{TEST_DEVICE_ENV} is set but names no device: use a comma-separated list of flex, wgpu, vulkan")]
    Empty,
}

/// The devices under test, named, as the environment asks (see the module docs).
pub fn devices_under_test() -> Result<Vec<(&'static str, Device)>, TestDeviceError> {
    match std::env::var(TEST_DEVICE_ENV) {
        Ok(list) => parse_list(&list),
        Err(_) => {
            let wgpu_wanted = std::env::var(TEST_WGPU_ENV).map(|v| v != "0").unwrap_or(true);
            let names: &[&str] = if wgpu_wanted && cfg!(feature = "wgpu") { &["flex", "wgpu"] } else { &["flex"] };
            names.iter().map(|n| device_named(n)).collect()
        }
    }
}

/// The first device under test that is not Flex (the GPU runtime under test), if any.
pub fn gpu_under_test() -> Result<Option<(&'static str, Device)>, TestDeviceError> {
    Ok(devices_under_test()?.into_iter().find(|(name, _)| *name != "flex"))
}

/// Parses a comma-separated list of device names.
fn parse_list(list: &str) -> Result<Vec<(&'static str, Device)>, TestDeviceError> {
    let names: Vec<&str> = list.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Err(TestDeviceError::Empty);
    }
    names.into_iter().map(device_named).collect()
}

/// The device a name stands for, in this build.
#[allow(unreachable_code)]
fn device_named(name: &str) -> Result<(&'static str, Device), TestDeviceError> {
    let lower = name.to_ascii_lowercase();
    match lower.as_str() {
        "flex" => {
            #[cfg(feature = "flex")]
            return Ok(("flex", Device::flex()));
            Err(TestDeviceError::NotCompiled("flex"))
        }
        "wgpu" => {
            #[cfg(feature = "wgpu")]
            return Ok(("wgpu", Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)));
            Err(TestDeviceError::NotCompiled("wgpu"))
        }
        "vulkan" => {
            #[cfg(feature = "vulkan")]
            return Ok(("vulkan", Device::vulkan(burn::tensor::DeviceKind::DefaultDevice)));
            Err(TestDeviceError::NotCompiled("vulkan"))
        }
        _ => Err(TestDeviceError::Unknown(name.to_string())),
    }
}

/// The devices the kernel tests of both modules ([`crate::quant`], [`crate::paged`]) run on.
#[cfg(test)]
pub(crate) fn devices() -> Vec<Device> {
    devices_under_test().unwrap_or_else(|e| panic!("{e}")).into_iter().map(|(_, d)| d).collect()
}

/// The GPU device the kernel-vs-twin tests compare with Flex, if one is under test.
#[cfg(test)]
pub(crate) fn gpu_device() -> Option<Device> {
    gpu_under_test().unwrap_or_else(|e| panic!("{e}")).map(|(_, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_names_are_errors() {
        let names = |list| parse_list(list).map(|v| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>());
        assert_eq!(names(" flex , FLEX"), Ok(vec!["flex", "flex"]));
        assert_eq!(names(" , "), Err(TestDeviceError::Empty));
        assert_eq!(names("flex,tpu"), Err(TestDeviceError::Unknown("tpu".into())));
        if !cfg!(feature = "vulkan") {
            assert_eq!(names("vulkan"), Err(TestDeviceError::NotCompiled("vulkan")));
        }
        assert!(TestDeviceError::Unknown("tpu".into()).to_string().contains("flex, wgpu, vulkan"));
    }
}
