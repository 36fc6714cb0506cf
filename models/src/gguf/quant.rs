//! GGML storage types and their dequantization to `f32`.
//!
//! Block formats (llama.cpp `ggml-common.h`), 32 elements a block:
//! - `Q4_0`: f16 scale `d`, 16 bytes of nibbles; `x = (q − 8)·d`.
//! - `Q4_1`: f16 scale `d`, f16 minimum `m`, 16 bytes of nibbles; `x = q·d + m`.
//! - `Q8_0`: f16 scale `d`, 32 signed bytes; `x = q·d`.
//!
//! In a 4-bit block, byte `j` holds element `j` in its low nibble and element `j + 16` in its high
//! nibble. `Q4_1` is exactly FlexGen's asymmetric min/scale group quantization with group 32.

use half::f16;

/// A GGML tensor storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit floats.
    F32,
    /// 16-bit IEEE floats.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit symmetric blocks of 32.
    Q4_0,
    /// 4-bit asymmetric blocks of 32.
    Q4_1,
    /// 8-bit symmetric blocks of 32.
    Q8_0,
    /// A type this crate does not read (its GGML id).
    Other(u32),
}

/// Elements per quantized block.
pub const BLOCK: usize = 32;

impl GgmlType {
    /// The type with GGML id `id`.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// Bytes of `elements` values, or `None` when they do not fill whole blocks. Types we cannot
    /// read get a size of 0 here; reading them is refused later, with the tensor's name.
    pub fn byte_size(self, elements: u64) -> Option<u64> {
        let blocks = |bytes_per_block: u64| {
            elements.is_multiple_of(BLOCK as u64).then(|| elements / BLOCK as u64 * bytes_per_block)
        };
        match self {
            Self::F32 => elements.checked_mul(4),
            Self::F16 | Self::Bf16 => elements.checked_mul(2),
            Self::Q4_0 => blocks(18),
            Self::Q4_1 => blocks(20),
            Self::Q8_0 => blocks(34),
            Self::Other(_) => Some(0),
        }
    }
}

/// Decodes `bytes` of type `kind` to `f32`; `None` for types this crate does not read.
pub fn dequantize(kind: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    Some(match kind {
        GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(half).collect(),
        GgmlType::Bf16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::Q4_0 => nibble_blocks(bytes, 18, |b| (half(&b[0..2]), -8.0 * half(&b[0..2]), &b[2..])),
        GgmlType::Q4_1 => nibble_blocks(bytes, 20, |b| (half(&b[0..2]), half(&b[2..4]), &b[4..])),
        GgmlType::Q8_0 => bytes
            .chunks_exact(34)
            .flat_map(|b| {
                let d = half(&b[0..2]);
                b[2..].iter().map(move |&q| q as i8 as f32 * d)
            })
            .collect(),
        GgmlType::Other(_) => return None,
    })
}

/// Decodes 4-bit blocks: `header` gives each block's scale, offset and 16 nibble bytes, and
/// `x = q·scale + offset`.
fn nibble_blocks(bytes: &[u8], block_bytes: usize, header: impl Fn(&[u8]) -> (f32, f32, &[u8])) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * BLOCK);
    for block in bytes.chunks_exact(block_bytes) {
        let (scale, offset, qs) = header(block);
        let mut values = [0f32; BLOCK];
        for (j, &q) in qs.iter().enumerate() {
            values[j] = (q & 0x0F) as f32 * scale + offset;
            values[j + BLOCK / 2] = (q >> 4) as f32 * scale + offset;
        }
        out.extend_from_slice(&values);
    }
    out
}

/// A GGUF tensor's quantized blocks re-laid out for `burn_llm_kernels::GroupQuantized` (groups of
/// [`BLOCK`] along the fastest-varying dimension), without passing through `f32`: codes are
/// repacked little-end-first into `u32` words, scales and minimums widened to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct RepackedBlocks {
    /// Packed codes, `32 / bits` a word.
    pub codes: Vec<u32>,
    /// Per-block scale.
    pub scale: Vec<f32>,
    /// Per-block minimum (`x = q · scale + min`).
    pub min: Vec<f32>,
    /// Bits per code.
    pub bits: u32,
}

/// Repacks `Q4_0`, `Q4_1` and `Q8_0` blocks as asymmetric codes: `Q4_0`'s `(q − 8)·d` becomes
/// `min = −8d`, `Q8_0`'s signed `q·d` becomes code `q + 128` with `min = −128d`. `None` for other
/// types (floating-point tensors are read as `f32` instead).
pub fn repack_blocks(kind: GgmlType, bytes: &[u8]) -> Option<RepackedBlocks> {
    let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    let (block_bytes, bits) = match kind {
        GgmlType::Q4_0 => (18, 4),
        GgmlType::Q4_1 => (20, 4),
        GgmlType::Q8_0 => (34, 8),
        _ => return None,
    };
    let blocks = bytes.len() / block_bytes;
    let mut out = RepackedBlocks {
        codes: Vec::with_capacity(blocks * BLOCK * bits as usize / 32),
        scale: Vec::with_capacity(blocks),
        min: Vec::with_capacity(blocks),
        bits,
    };
    for block in bytes.chunks_exact(block_bytes) {
        let d = half(&block[0..2]);
        match kind {
            GgmlType::Q8_0 => {
                out.scale.push(d);
                out.min.push(-128.0 * d);
                for four in block[2..].chunks_exact(4) {
                    let word = four
                        .iter()
                        .enumerate()
                        .fold(0u32, |w, (t, &q)| w | (((q as i8 as i32 + 128) as u32) << (8 * t)));
                    out.codes.push(word);
                }
            }
            _ => {
                let (min, qs) =
                    if kind == GgmlType::Q4_1 { (half(&block[2..4]), &block[4..]) } else { (-8.0 * d, &block[2..]) };
                out.scale.push(d);
                out.min.push(min);
                // Element e is the low nibble of byte e (e < 16) or the high nibble of byte e − 16.
                let code =
                    |e: usize| if e < BLOCK / 2 { (qs[e] & 0x0F) as u32 } else { (qs[e - BLOCK / 2] >> 4) as u32 };
                for w in 0..BLOCK / 8 {
                    out.codes.push((0..8).fold(0u32, |word, t| word | (code(8 * w + t) << (4 * t))));
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_decodes_low_then_high_nibbles() {
        let mut block = Vec::new();
        block.extend_from_slice(&f16_bytes(0.5));
        block.extend_from_slice(&f16_bytes(-1.0));
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let out = dequantize(GgmlType::Q4_1, &block).unwrap();
        assert_eq!(out.len(), 32);
        assert_eq!(out[0], -1.0);
        assert_eq!(out[3], 0.5);
        assert_eq!(out[16], 15.0 * 0.5 - 1.0);
        assert_eq!(out[31], -1.0);
    }

    #[test]
    fn q4_0_is_centered_on_eight_and_q8_0_is_signed() {
        let mut block = f16_bytes(2.0).to_vec();
        block.extend(std::iter::repeat_n(0x8F, 16));
        let out = dequantize(GgmlType::Q4_0, &block).unwrap();
        assert_eq!((out[0], out[16]), (14.0, 0.0));

        let mut block = f16_bytes(0.25).to_vec();
        block.extend((0..32).map(|i: i32| (i - 16) as i8 as u8));
        let out = dequantize(GgmlType::Q8_0, &block).unwrap();
        assert_eq!((out[0], out[31]), (-4.0, 15.0 * 0.25));
    }

    /// Decoding the repacked codes as `q · scale + min` gives exactly what `dequantize` gives.
    #[test]
    fn repacked_blocks_decode_like_ggml() {
        let mut bytes = Vec::new();
        for (kind, header) in [(GgmlType::Q4_0, 2), (GgmlType::Q4_1, 4), (GgmlType::Q8_0, 2)] {
            bytes.clear();
            for b in 0..3u8 {
                bytes.extend_from_slice(&f16_bytes(0.25 * (b + 1) as f32));
                if header == 4 {
                    bytes.extend_from_slice(&f16_bytes(-1.5));
                }
                let payload = if kind == GgmlType::Q8_0 { 32 } else { 16 };
                bytes.extend((0..payload).map(|j: u8| j.wrapping_mul(37).wrapping_add(b * 11)));
            }
            let expected = dequantize(kind, &bytes).unwrap();
            let r = repack_blocks(kind, &bytes).unwrap();
            let per = 32 / r.bits as usize;
            let mask = (1u32 << r.bits) - 1;
            let decoded: Vec<f32> = (0..expected.len())
                .map(|e| {
                    let q = (r.codes[e / per] >> ((e % per) as u32 * r.bits)) & mask;
                    q as f32 * r.scale[e / BLOCK] + r.min[e / BLOCK]
                })
                .collect();
            assert_eq!(decoded, expected, "{kind:?}");
        }
        assert!(repack_blocks(GgmlType::F16, &[0, 0]).is_none());
    }

    #[test]
    fn sizes_need_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.byte_size(64), Some(40));
        assert_eq!(GgmlType::Q8_0.byte_size(33), None);
        assert_eq!(GgmlType::F16.byte_size(3), Some(6));
    }
}
