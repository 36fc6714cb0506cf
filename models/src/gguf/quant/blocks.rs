//! One decoder per quantized GGML type: a block's bytes to one code per value and a scale and a
//! minimum per group, with `x = code · scale + min` (layouts in llama.cpp's `ggml-common.h`; the
//! arithmetic follows the PyPI `gguf` package's `gguf.quants`, so the values match it bit for
//! bit).
//!
//! Every product here is exact in `f32`: an f16 scale has 11 significant bits, a sub-block scale
//! at most 7 and a code at most 8, and no type has more than 24 of them together (the most is
//! Q6_K's 11 + 7 + 6), so `code · scale` and `offset · scale` never round, and their sum rounds
//! only where the reference's own expression does (`d·q − m` for the types with a minimum).
//! Signed codes (`q − 8`, `q − 16`, `q − 32`, …) become unsigned ones with the offset folded into
//! the minimum, which is therefore lossless (`dequantize` still computes the signed form, so that
//! a zero keeps the reference's sign).

use half::f16;

use super::GgmlType;

/// Where a decoder writes one block: a code per value, a scale and minimum per group.
pub(super) struct BlockOut<'a> {
    pub codes: &'a mut [u8],
    pub scale: &'a mut [f32],
    pub min: &'a mut [f32],
}

/// The decoder of a quantized type; `None` for floating-point and unread types.
pub(super) fn decoder(kind: GgmlType) -> Option<fn(&[u8], BlockOut<'_>)> {
    let decode: fn(&[u8], BlockOut<'_>) = match kind {
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_1 => q4_1,
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q5_1 => q5_1,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q2_K => q2_k,
        GgmlType::Q3_K => q3_k,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        _ => return None,
    };
    Some(decode)
}

/// The f16 at `b[at..at + 2]`, widened.
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// 32 values from 16 nibble bytes: value `j` is the low nibble of byte `j`, value `j + 16` the
/// high nibble; `high(j)` supplies the fifth bit of value `j` (0 for 4-bit types).
fn nibbles(qs: &[u8], codes: &mut [u8], high: impl Fn(usize) -> u8) {
    for (j, &q) in qs[..16].iter().enumerate() {
        codes[j] = (q & 0x0F) | high(j);
        codes[j + 16] = (q >> 4) | high(j + 16);
    }
}

fn q4_0(b: &[u8], out: BlockOut<'_>) {
    let d = half(b, 0);
    nibbles(&b[2..], out.codes, |_| 0);
    (out.scale[0], out.min[0]) = (d, -8.0 * d);
}

fn q4_1(b: &[u8], out: BlockOut<'_>) {
    nibbles(&b[4..], out.codes, |_| 0);
    (out.scale[0], out.min[0]) = (half(b, 0), half(b, 2));
}

/// The 32 fifth bits of a 5-bit block, a little-endian `u32`.
fn fifth_bits(b: &[u8]) -> impl Fn(usize) -> u8 {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    move |j| (((qh >> j) & 1) << 4) as u8
}

fn q5_0(b: &[u8], out: BlockOut<'_>) {
    let d = half(b, 0);
    nibbles(&b[6..], out.codes, fifth_bits(&b[2..6]));
    (out.scale[0], out.min[0]) = (d, -16.0 * d);
}

fn q5_1(b: &[u8], out: BlockOut<'_>) {
    nibbles(&b[8..], out.codes, fifth_bits(&b[4..8]));
    (out.scale[0], out.min[0]) = (half(b, 0), half(b, 2));
}

fn q8_0(b: &[u8], out: BlockOut<'_>) {
    let d = half(b, 0);
    for (c, &q) in out.codes.iter_mut().zip(&b[2..34]) {
        *c = (q as i8 as i16 + 128) as u8;
    }
    (out.scale[0], out.min[0]) = (d, -128.0 * d);
}

/// Q2_K: `scales[16]`, `qs[64]`, `d`, `dmin`. Value `128h + 32s + l` is bits `2s..2s+2` of
/// `qs[32h + l]`; sub-block `i` has scale `d·(scales[i] & 15)` and minimum `dmin·(scales[i] >> 4)`.
fn q2_k(b: &[u8], out: BlockOut<'_>) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    crumbs(qs, out.codes, |_| 0);
    for (i, &sc) in scales.iter().enumerate() {
        out.scale[i] = d * (sc & 0x0F) as f32;
        out.min[i] = -(dmin * (sc >> 4) as f32);
    }
}

/// 256 values from 64 bytes of 2-bit fields: value `128h + 32s + l` is bits `2s..2s+2` of byte
/// `32h + l`, plus `extra(value)`.
fn crumbs(qs: &[u8], codes: &mut [u8], extra: impl Fn(usize) -> u8) {
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let e = 128 * h + 32 * s + l;
                codes[e] = ((qs[32 * h + l] >> (2 * s)) & 3) + extra(e);
            }
        }
    }
}

/// Q3_K: `hmask[32]`, `qs[64]`, `scales[12]`, `d`. The low two bits are laid out as in Q2_K;
/// value `32b + l`'s high bit is bit `b` of `hmask[l]`, and `q = low − 4` where that bit is clear.
/// Sub-block `i`'s 6-bit scale is the low (i < 8) or high nibble of `scales[i % 8]` with bits
/// `2(i / 4)..` of `scales[8 + i % 4]` on top, less 32.
fn q3_k(b: &[u8], out: BlockOut<'_>) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    // code = q + 4 = low + 4·bit.
    crumbs(qs, out.codes, |e| 4 * ((hmask[e % 32] >> (e / 32)) & 1));
    for i in 0..16 {
        let low = if i < 8 { scales[i] & 0x0F } else { scales[i - 8] >> 4 };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
        (out.scale[i], out.min[i]) = (dl, -4.0 * dl);
    }
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K/Q5_K block (`get_scale_min_k4`).
fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// The eight sub-block scales and minimums of a Q4_K/Q5_K block: `d·sc` and `−dmin·m`.
fn k4_groups(b: &[u8], out: &mut BlockOut<'_>) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(&b[4..16], j);
        out.scale[j] = d * sc as f32;
        out.min[j] = -(dmin * m as f32);
    }
}

/// 256 values from 128 nibble bytes: value `64c + 32s + l` is nibble `s` of byte `32c + l`, plus
/// `high(value)`.
fn k_nibbles(qs: &[u8], codes: &mut [u8], high: impl Fn(usize) -> u8) {
    for c in 0..4 {
        for s in 0..2 {
            for l in 0..32 {
                let e = 64 * c + 32 * s + l;
                codes[e] = ((qs[32 * c + l] >> (4 * s)) & 0x0F) | high(e);
            }
        }
    }
}

/// Q4_K: `d`, `dmin`, `scales[12]`, `qs[128]`.
fn q4_k(b: &[u8], mut out: BlockOut<'_>) {
    k4_groups(b, &mut out);
    k_nibbles(&b[16..144], out.codes, |_| 0);
}

/// Q5_K: `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`; value `32b + l`'s fifth bit is bit `b`
/// of `qh[l]`.
fn q5_k(b: &[u8], mut out: BlockOut<'_>) {
    k4_groups(b, &mut out);
    let qh = &b[16..48];
    k_nibbles(&b[48..176], out.codes, |e| ((qh[e % 32] >> (e / 32)) & 1) << 4);
}

/// Q6_K: `ql[128]`, `qh[64]`, `scales[16]` (signed), `d`. Value `128h + 64s + l` (l < 64) has low
/// nibble `s` of `ql[64h + l]`; value `128h + 32s + l` (l < 32) has high bits `2s..2s+2` of
/// `qh[32h + l]`; `q − 32` is signed, so the code is `q` with `−32·d·scale` as the minimum.
fn q6_k(b: &[u8], out: BlockOut<'_>) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for h in 0..2 {
        for s in 0..2 {
            for l in 0..64 {
                out.codes[128 * h + 64 * s + l] = (ql[64 * h + l] >> (4 * s)) & 0x0F;
            }
        }
        for s in 0..4 {
            for l in 0..32 {
                out.codes[128 * h + 32 * s + l] |= ((qh[32 * h + l] >> (2 * s)) & 3) << 4;
            }
        }
    }
    for (i, &sc) in scales.iter().enumerate() {
        let dl = d * sc as i8 as f32;
        (out.scale[i], out.min[i]) = (dl, -32.0 * dl);
    }
}
