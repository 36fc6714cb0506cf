//! The integer strip kernel alone, for `cargo xtask bench kernels`: one GGUF-layout product run
//! single-threaded with a chosen instruction set. The library's products split the kernel over
//! threads and pick the instruction set themselves, so they cannot show the kernel's own rate.

use super::KernelError;
use super::q8::{self, Isa, QuantizedRows, strips};

/// Random `[m, k]` input rows times a random `[n, k]` weight of `bits`-bit codes grouped by
/// [`StripProduct::GROUP`] along `k` (the GGUF layout), the input rows quantized once up front.
#[derive(Debug, Clone)]
pub struct StripProduct {
    codes: Vec<u32>,
    scale: Vec<f32>,
    min: Vec<f32>,
    panel: strips::Panel,
    n: usize,
    bits: u32,
}

impl StripProduct {
    /// Values per weight group (Q4_1's and Q8_0's 32).
    pub const GROUP: usize = 32;

    /// A product of the given shape on values drawn from `seed` (the rates do not depend on
    /// them). `bits` is 4 or 8 and `k` a multiple of [`StripProduct::GROUP`].
    pub fn random(m: usize, k: usize, n: usize, bits: u32, seed: u64) -> Result<Self, KernelError> {
        if !matches!(bits, 4 | 8) {
            return Err(KernelError::Bits(bits));
        }
        if k == 0 || !k.is_multiple_of(Self::GROUP) {
            return Err(KernelError::GroupSize { group: Self::GROUP, per_word: 32 / bits as usize, len: k });
        }
        // SplitMix64: uniform enough for timing, and no dependency.
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        // In [0, 1).
        let unit = |v: u64| (v >> 40) as f32 / (1u64 << 24) as f32;
        let groups = n * k / Self::GROUP;
        let codes = (0..n * k * bits as usize / 32).map(|_| next() as u32).collect();
        let scale = (0..groups).map(|_| unit(next()) * 0.02).collect();
        let min = (0..groups).map(|_| -unit(next()) * 0.1).collect();
        let x: Vec<f32> = (0..m * k).map(|_| unit(next()) * 2.0 - 1.0).collect();
        let panel = strips::Panel::new(&QuantizedRows::new(&x, m, k, Self::GROUP, bits));
        Ok(Self { codes, scale, min, panel, n, bits })
    }

    /// The instruction sets this CPU runs the strip kernel with for these codes (`"AVX2"`,
    /// `"AVX-512 VNNI"`; none off x86-64).
    pub fn instruction_sets(&self) -> Vec<&'static str> {
        Isa::available().into_iter().filter(|&isa| strips::supports(isa, self.bits)).map(Isa::name).collect()
    }

    /// Runs the whole product once on this thread with `isa` (one of
    /// [`StripProduct::instruction_sets`]) and returns the sum of the strips' first values, so
    /// that the work is not optimised away. `None` for an instruction set it cannot run.
    pub fn run(&self, isa: &str) -> Option<f32> {
        let isa = Isa::available().into_iter().find(|&i| i.name() == isa && strips::supports(i, self.bits))?;
        let weights = q8::Weights {
            codes: &self.codes,
            scale: &self.scale,
            min: &self.min,
            bits: self.bits,
            group: Self::GROUP,
            symmetric_offset: 0,
        };
        let mut sink = 0f32;
        strips::weight_rows(&weights, &self.panel, 0..self.n, isa, |_, _, v| sink += v[0]);
        Some(sink)
    }
}
