//! `eˣ` in straight-line `f32` arithmetic (Cephes' `expf`: `x = n·ln 2 + r`, a degree-6 polynomial
//! for `eʳ` on `|r| ≤ ln 2 / 2`, `2ⁿ` built in the exponent bits), so that loops over slices
//! vectorize; libm's `expf` is a call per element. Relative error below 2e-7 over the range where
//! `eˣ` is a normal `f32`; 0 below it (softmax weights of masked scores), `+∞` above.

/// `x · log₂e + MAGIC` rounds `x · log₂e` to an integer held in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n · LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this `eˣ` is not a normal `f32`.
const LOWEST: f32 = -87.33;
/// Above this (`eˣ ≈ 1.65e38`) the result is `+∞`, a little early: callers take `eˣ` of
/// non-positive arguments (softmax) or of `−x` for activations, where it does not matter.
const HIGHEST: f32 = 88.0;

/// `eˣ`.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    let clamped = x.clamp(LOWEST, HIGHEST);
    let t = clamped * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // `t`'s low bits hold `n` (two's complement): shifted into the exponent field, `2ⁿ`.
    let two_n = f32::from_bits((t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127)) << 23);
    let y = er * two_n;
    if x < LOWEST {
        0.0
    } else if x > HIGHEST {
        f32::INFINITY
    } else {
        y
    }
}
