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
        GgmlType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
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

    #[test]
    fn sizes_need_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.byte_size(64), Some(40));
        assert_eq!(GgmlType::Q8_0.byte_size(33), None);
        assert_eq!(GgmlType::F16.byte_size(3), Some(6));
    }
}
