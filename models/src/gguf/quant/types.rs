//! [`GgmlType`]: the GGML storage types by id and name, and the block layout of each one this
//! crate reads.

use std::fmt;

/// A GGML tensor storage type. Variants carry GGML's own names (`Q4_K`), which the crate prints.
#[allow(non_camel_case_types)]
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
    /// 5-bit symmetric blocks of 32.
    Q5_0,
    /// 5-bit asymmetric blocks of 32.
    Q5_1,
    /// 8-bit symmetric blocks of 32.
    Q8_0,
    /// 2-bit super-blocks of 256: 16 sub-blocks of 16 with 4-bit scales and minimums.
    Q2_K,
    /// 3-bit super-blocks of 256: 16 sub-blocks of 16 with signed 6-bit scales.
    Q3_K,
    /// 4-bit super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4_K,
    /// 5-bit super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q5_K,
    /// 6-bit super-blocks of 256: 16 sub-blocks of 16 with signed 8-bit scales.
    Q6_K,
    /// A type this crate does not read (its GGML id; [`GgmlType::name`] still names it).
    Other(u32),
}

/// How a quantized type lays out its blocks, and how [`super::decode`] hands them on: codes of
/// `bits` bits (4 or 8, what `burn_llm_kernels::QuantSpec` packs) in groups of `group` values
/// sharing a scale and a minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    /// Values per block (32, or 256 for the K-quants).
    pub elements: usize,
    /// Bytes per block.
    pub bytes: usize,
    /// Values per scale/minimum group after decoding (16 or 32).
    pub group: usize,
    /// Bits per decoded code in the repacked form: 4 when the type's codes fit in a nibble, else 8.
    pub bits: u32,
    /// For the symmetric types, the offset of their signed codes (`x = (code − offset) · scale`,
    /// and `min = −offset · scale`): 8, 16, 128, 4, 32 for Q4_0, Q5_0, Q8_0, Q3_K, Q6_K. 0 for the
    /// types with a minimum (`x = code · scale + min`).
    pub offset: u8,
}

/// GGML's names of the type ids this crate knows but does not read (`ggml.h`'s `ggml_type`).
const OTHER_NAMES: [(u32, &str); 19] = [
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

impl GgmlType {
    /// Every type this crate reads, in GGML id order.
    pub const SUPPORTED: [GgmlType; 13] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Bf16,
    ];

    /// The type with GGML id `id`.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// GGML's name of the type (`Q4_K`), or `type <id>` for an id GGML does not define.
    pub fn name(self) -> String {
        let known = match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Other(id) => match OTHER_NAMES.iter().find(|(i, _)| *i == id) {
                Some(&(_, name)) => name,
                None => return format!("type {id}"),
            },
        };
        known.to_string()
    }

    /// The names of [`GgmlType::SUPPORTED`], comma-separated (for error messages).
    pub fn supported_names() -> String {
        Self::SUPPORTED.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }

    /// The block layout of a quantized type; `None` for floating-point and unread types.
    pub fn layout(self) -> Option<BlockLayout> {
        let (elements, bytes, group, bits, offset) = match self {
            Self::Q4_0 => (32, 18, 32, 4, 8),
            Self::Q4_1 => (32, 20, 32, 4, 0),
            Self::Q5_0 => (32, 22, 32, 8, 16),
            Self::Q5_1 => (32, 24, 32, 8, 0),
            Self::Q8_0 => (32, 34, 32, 8, 128),
            Self::Q2_K => (256, 84, 16, 4, 0),
            Self::Q3_K => (256, 110, 16, 4, 4),
            Self::Q4_K => (256, 144, 32, 4, 0),
            Self::Q5_K => (256, 176, 32, 8, 0),
            Self::Q6_K => (256, 210, 16, 8, 32),
            Self::F32 | Self::F16 | Self::Bf16 | Self::Other(_) => return None,
        };
        Some(BlockLayout { elements, bytes, group, bits, offset })
    }

    /// Values per block: 1 for floating-point types, 32 or 256 for quantized ones, 1 for types we
    /// cannot read.
    pub fn block_elements(self) -> usize {
        self.layout().map_or(1, |l| l.elements)
    }

    /// Bytes of `elements` values, or `None` when they do not fill whole blocks. Types we cannot
    /// read get a size of 0 here; reading them is refused later, with the tensor's name.
    pub fn byte_size(self, elements: u64) -> Option<u64> {
        match self {
            Self::F32 => elements.checked_mul(4),
            Self::F16 | Self::Bf16 => elements.checked_mul(2),
            Self::Other(_) => Some(0),
            quantized => {
                let l = quantized.layout()?;
                let per = l.elements as u64;
                elements.is_multiple_of(per).then(|| elements / per * l.bytes as u64)
            }
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
