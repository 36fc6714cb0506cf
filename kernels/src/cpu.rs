//! The host CPU's vector instruction sets, detected once per process.
//!
//! Every run-time dispatch of the Flex twins (and the benches that measure the host's peaks) asks
//! [`features`] instead of probing on its own, so that all of them agree on what the CPU has.

use std::sync::OnceLock;

/// The instruction-set extensions the Flex twins dispatch on. All `false` off x86-64.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 (256-bit integer and float vectors).
    pub avx2: bool,
    /// Fused multiply-add on 128/256-bit vectors (FMA3).
    pub fma: bool,
    /// AVX-512 Foundation (512-bit vectors).
    pub avx512f: bool,
    /// AVX-512 VNNI (`vpdpbusd`: u8 × i8 quads summed into i32 lanes).
    pub avx512vnni: bool,
}

impl CpuFeatures {
    /// Probes the CPU running this (uncached: use [`features`]).
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            Self { avx2: has!("avx2"), fma: has!("fma"), avx512f: has!("avx512f"), avx512vnni: has!("avx512vnni") }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self::default()
    }

    /// AVX2 with FMA: what every `#[target_feature(enable = "avx2,fma")]` twin needs.
    pub fn avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }

    /// AVX-512F with FMA: the 512-bit `f32` twins.
    pub fn avx512_fma(&self) -> bool {
        self.avx512f && self.fma
    }

    /// AVX-512F with VNNI: the 512-bit int8 dot products.
    pub fn avx512_vnni(&self) -> bool {
        self.avx512f && self.avx512vnni
    }
}

/// The features of the CPU running this, detected on first use.
pub fn features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(CpuFeatures::detect)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_combinations_follow_the_single_flags() {
        let f = features();
        assert_eq!(f.avx2_fma(), f.avx2 && f.fma);
        assert_eq!(f.avx512_fma(), f.avx512f && f.fma);
        assert_eq!(f.avx512_vnni(), f.avx512f && f.avx512vnni);
        assert_eq!(f, features(), "detected once, the same every call");
        #[cfg(not(target_arch = "x86_64"))]
        assert_eq!(f, CpuFeatures::default());
    }
}
