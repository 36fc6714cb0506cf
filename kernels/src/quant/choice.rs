//! Which product a group-quantized weight gets: the fused kernel, which never materializes the
//! weight, or dequantize-then-matmul. The answer depends on where the product runs, which the
//! host knows for its own devices and only a worker knows for a `ws://` device; both ask here.

use burn::tensor::Device;

use super::MatmulPrecision;
use crate::MATVEC_MAX_ROWS;

/// Rows of input up to which the fused kernel is used on a CPU in `f32` (on a GPU: up to
/// [`MATVEC_MAX_ROWS`]); above, dequantizing the weight once and running an ordinary matmul is
/// faster.
pub const FUSED_MAX_ROWS: usize = 16;

/// What kind of processor a product runs on, as far as choosing its kernel goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductSite {
    /// A CPU (Burn's Flex backend): integer kernels for 8-bit input rows.
    Cpu,
    /// A GPU (a CubeCL runtime): matrix-vector kernels for up to [`MATVEC_MAX_ROWS`] rows.
    Gpu,
}

/// Where a product on `device` runs, or `None` for a worker's device, whose server chooses the
/// product itself (the client ships the fused op; see [`crate::remote`]).
pub fn product_site(device: &Device) -> Option<ProductSite> {
    #[allow(unreachable_patterns)]
    match device.as_dispatch() {
        #[cfg(feature = "flex")]
        burn::backend::DispatchDevice::Flex(_) => Some(ProductSite::Cpu),
        #[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
        burn::backend::DispatchDevice::Remote(_) => None,
        _ => Some(ProductSite::Gpu),
    }
}

/// Whether the fused kernel beats dequantize-then-matmul for `rows` input rows on `site`:
/// always for a decode step's few rows; on a GPU for as many rows as its matrix-vector kernels
/// take; on a CPU, for any number of rows when the weight is grouped along its input (llama.cpp's
/// layout) and the rows are quantized to 8 bits, since the integer kernel reads each weight block
/// once per tile of rows.
pub fn fused_product_wins(rows: usize, site: ProductSite, input_grouped: bool, precision: MatmulPrecision) -> bool {
    rows <= FUSED_MAX_ROWS
        || (rows <= MATVEC_MAX_ROWS && site == ProductSite::Gpu)
        || (input_grouped && precision == MatmulPrecision::Int8Activations && site == ProductSite::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_kernel_is_chosen_where_it_wins() {
        use MatmulPrecision::{Exact, Int8Activations};
        use ProductSite::{Cpu, Gpu};
        for site in [Cpu, Gpu] {
            assert!(fused_product_wins(1, site, false, Exact));
            assert!(fused_product_wins(FUSED_MAX_ROWS, site, true, Exact));
        }
        assert!(fused_product_wins(MATVEC_MAX_ROWS, Gpu, false, Exact));
        assert!(!fused_product_wins(MATVEC_MAX_ROWS, Cpu, false, Exact));
        assert!(!fused_product_wins(MATVEC_MAX_ROWS + 1, Gpu, true, Int8Activations));
        assert!(fused_product_wins(4096, Cpu, true, Int8Activations));
        assert!(!fused_product_wins(4096, Cpu, true, Exact));
        assert!(!fused_product_wins(4096, Cpu, false, Int8Activations));
    }
}
