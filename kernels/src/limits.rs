//! How large one GPU tensor may be on a device, read from what its runtime reports.
//!
//! Two limits apply to every tensor a kernel here reads or writes:
//!
//! - **Bytes.** A tensor is one buffer, bound whole to the kernels that use it. CubeCL's wgpu
//!   runtime reports the largest such buffer as `properties().memory.max_page_size`:
//!   `min(max_storage_buffer_binding_size, max_buffer_size)` of the wgpu device. wgpu-hal's Vulkan
//!   adapter clamps the storage binding size to 2^31 − 1 bytes (`MAX_I32_BINDING_SIZE`), whatever
//!   the driver allows, unless CubeCL's SPIR-V backend finds 64-bit shader indexing; on Linux it
//!   also caps the buffer size at 2^31 − 1 bytes for every vendor but NVIDIA. Past the limit
//!   the buffer fails to allocate, and the failure surfaces only when a result is read.
//! - **Elements.** CubeCL kernels index with `usize`, which the generated code makes a 32-bit
//!   integer unless a kernel is launched with a 64-bit address type (none here is), so no
//!   tensor may hold 2^32 or more elements.

use std::fmt;

use burn::tensor::{DType, Device};

/// Most elements a kernel here indexes: its `usize` indices are 32-bit in the generated code.
pub const KERNEL_INDEX_ELEMENTS: u64 = u32::MAX as u64;

/// The largest tensor one GPU device holds, in bytes and elements ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuTensorLimit {
    /// Most bytes of one buffer, as the device's runtime reports it.
    pub max_bytes: u64,
}

impl GpuTensorLimit {
    /// The limit of `device` as its CubeCL runtime reports it (this opens the device), or `None`
    /// for a device no CubeCL runtime here drives (Flex, a remote device).
    pub fn of(device: &Device) -> Option<Self> {
        #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))]
        if let burn::backend::DispatchDevice::Cube(cube) = device.as_dispatch() {
            return Some(Self { max_bytes: cube.client().properties().memory.max_page_size });
        }
        let _ = device;
        None
    }

    /// Most elements of `dtype` one tensor may hold: the byte limit over the element size, and
    /// at most [`KERNEL_INDEX_ELEMENTS`].
    pub fn max_elements(&self, dtype: DType) -> u64 {
        (self.max_bytes / dtype.size().max(1) as u64).min(KERNEL_INDEX_ELEMENTS)
    }

    /// Whether a tensor of `elements` values of `dtype` fits.
    pub fn fits(&self, elements: u64, dtype: DType) -> bool {
        elements <= self.max_elements(dtype)
    }
}

impl fmt::Display for GpuTensorLimit {
    /// E.g. "2147483647 bytes (the device's largest buffer binding) and 4294967295 elements (the
    /// kernels' 32-bit indices)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes (the device's largest buffer binding) and {KERNEL_INDEX_ELEMENTS} elements (the kernels' 32-bit \
             indices)",
            self.max_bytes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes bound f16 and f32 tensors under wgpu's 2^31 − 1-byte binding cap; the 32-bit index
    /// bounds byte-sized elements under a larger one; Flex reports no limit.
    #[test]
    fn limits_in_bytes_and_elements() {
        let wgpu_cap = GpuTensorLimit { max_bytes: (1 << 31) - 1 };
        assert_eq!(wgpu_cap.max_elements(DType::F32), (1 << 29) - 1);
        assert_eq!(wgpu_cap.max_elements(DType::F16), (1 << 30) - 1);
        assert!(wgpu_cap.fits(1 << 29, DType::F16) && !wgpu_cap.fits(1 << 29, DType::F32));
        let large = GpuTensorLimit { max_bytes: 1 << 40 };
        assert_eq!(large.max_elements(DType::U8), KERNEL_INDEX_ELEMENTS);
        assert!(large.to_string().contains("1099511627776 bytes"));
        assert_eq!(GpuTensorLimit::of(&Device::flex()), None);
    }

    /// The GPU under test reports a positive byte limit.
    #[cfg(any(feature = "wgpu", feature = "vulkan"))]
    #[test]
    fn gpu_reports_its_limit() {
        let Some(gpu) = crate::test_devices::gpu_device() else { return };
        let limit = GpuTensorLimit::of(&gpu).expect("a CubeCL device reports its limits");
        assert!(limit.max_bytes >= 1 << 27, "{limit}");
    }
}
