//! GGML storage types and their decoding: to `f32`, and repacked for
//! `burn_llm_kernels::GroupQuantized` without passing through `f32`.
//!
//! Block formats (llama.cpp `ggml-common.h`): `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1` and `Q8_0` hold 32
//! values a block with an f16 scale (and minimum); the K-quants `Q2_K`…`Q6_K` hold 256 in
//! sub-blocks of 16 or 32 whose scales are themselves quantized against f16 super-scales. Each
//! type's decoder is in [`blocks`]; every quantized type decodes to codes with a scale and a
//! minimum per group of 16 or 32, `x = code · scale + min`, exactly as the PyPI `gguf` package
//! decodes it.
//!
//! Repacked, each type keeps its group: 4-bit codes for `Q4_0`, `Q4_1`, `Q4_K` and (with groups
//! of 16) `Q2_K` and `Q3_K`; 8-bit codes for `Q5_0`, `Q5_1`, `Q5_K`, `Q8_0` and (groups of 16)
//! `Q6_K`. The repacking is lossless: decoding it gives the values [`dequantize`] gives (up to
//! the sign of a zero: `q·d + (−8d)` is `+0` where the reference's `d·(q − 8)` may be `−0`).

mod blocks;
mod types;

pub use types::{BlockLayout, GgmlType};

use half::f16;

/// A quantized tensor decoded to one code per value and a scale and minimum per group.
struct Decoded {
    codes: Vec<u8>,
    scale: Vec<f32>,
    min: Vec<f32>,
    layout: BlockLayout,
}

/// Decodes whole blocks of a quantized `kind`; `None` for other types. Trailing bytes short of a
/// block are ignored (the header parser has checked sizes).
fn decode(kind: GgmlType, bytes: &[u8]) -> Option<Decoded> {
    let (layout, decode_block) = (kind.layout()?, blocks::decoder(kind)?);
    let n = bytes.len() / layout.bytes;
    let groups_per_block = layout.elements / layout.group;
    let mut out = Decoded {
        codes: vec![0; n * layout.elements],
        scale: vec![0.0; n * groups_per_block],
        min: vec![0.0; n * groups_per_block],
        layout,
    };
    let chunks = bytes
        .chunks_exact(layout.bytes)
        .zip(out.codes.chunks_exact_mut(layout.elements))
        .zip(out.scale.chunks_exact_mut(groups_per_block).zip(out.min.chunks_exact_mut(groups_per_block)));
    for ((block, codes), (scale, min)) in chunks {
        decode_block(block, blocks::BlockOut { codes, scale, min });
    }
    Some(out)
}

/// Decodes `bytes` of type `kind` to `f32`; `None` for types this crate does not read.
pub fn dequantize(kind: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match kind {
        GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::Bf16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        quantized => {
            let d = decode(quantized, bytes)?;
            let BlockLayout { group, offset, .. } = d.layout;
            let groups = d.codes.chunks_exact(group).zip(d.scale.iter().zip(&d.min));
            if offset > 0 {
                // The reference's `scale · (q − offset)`: equal to `code · scale + min`, and
                // also in the sign of a zero.
                let offset = i16::from(offset);
                groups
                    .flat_map(|(codes, (&s, _))| codes.iter().map(move |&q| s * f32::from(i16::from(q) - offset)))
                    .collect()
            } else {
                groups.flat_map(|(codes, (&s, &m))| codes.iter().map(move |&q| s * f32::from(q) + m)).collect()
            }
        }
    })
}

/// A GGUF tensor's quantized blocks re-laid out for `burn_llm_kernels::GroupQuantized` (groups of
/// [`RepackedBlocks::group`] along the fastest-varying dimension), without passing through `f32`:
/// codes are repacked little-end-first into `u32` words, scales and minimums widened to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct RepackedBlocks {
    /// Packed codes, `32 / bits` a word.
    pub codes: Vec<u32>,
    /// Per-group scale.
    pub scale: Vec<f32>,
    /// Per-group minimum (`x = q · scale + min`).
    pub min: Vec<f32>,
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Values per group: 16 or 32.
    pub group: usize,
    /// For the symmetric types, the offset of their signed codes ([`BlockLayout::offset`]): every
    /// minimum is then `−offset · scale`, exactly. 0 for the types with a minimum.
    pub offset: u32,
}

/// Repacks the blocks of any quantized type as unsigned codes with a scale and minimum per group
/// (see the module docs for each type's bits and group). `None` for other types (floating-point
/// tensors are read as `f32` instead).
pub fn repack_blocks(kind: GgmlType, bytes: &[u8]) -> Option<RepackedBlocks> {
    let Decoded { codes, scale, min, layout } = decode(kind, bytes)?;
    let bits = layout.bits;
    let per = (32 / bits) as usize;
    let codes = codes
        .chunks_exact(per)
        .map(|c| c.iter().enumerate().fold(0u32, |w, (t, &q)| w | (u32::from(q) << (bits as usize * t))))
        .collect();
    Some(RepackedBlocks { codes, scale, min, bits, group: layout.group, offset: u32::from(layout.offset) })
}

#[cfg(test)]
mod tests;
