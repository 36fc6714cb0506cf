//! [`QuantSpec`], the one description of a group quantization (bits, group size, axis) that the
//! kernels, the models, the offloading policy's cost model and the command line share, and
//! [`KernelError`], what is wrong with one.

use std::fmt;

/// Bytes each group stores besides its codes: an `f32` scale and an `f32` minimum.
const GROUP_PARAM_BYTES: usize = 2 * std::mem::size_of::<f32>();

/// What is wrong with a quantization request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Only 4- and 8-bit codes are implemented.
    #[error("{0}-bit quantization is not supported (use 4 or 8)")]
    Bits(u32),
    /// The group size does not hold whole `u32` words of codes.
    #[error("group size {group} must be a positive multiple of {per_word}, the {bits}-bit codes one 32-bit word holds")]
    GroupWords {
        /// Requested group size.
        group: usize,
        /// Bits per code.
        bits: u32,
        /// Codes per `u32` word at this bit width.
        per_word: usize,
    },
    /// The group size does not tile the quantized axis into whole words.
    #[error("group size {group} must be a positive multiple of {per_word} that divides the axis length {len}")]
    GroupSize {
        /// Requested group size.
        group: usize,
        /// Codes per `u32` word at this bit width.
        per_word: usize,
        /// Length of the quantized axis.
        len: usize,
    },
    /// Host buffers handed to [`GroupQuantized::from_host`](super::GroupQuantized::from_host) do
    /// not fit the shape.
    #[error("quantized buffers hold {found:?} codes/scales/minimums, the shape needs {expected:?}")]
    HostBuffers {
        /// Lengths the shape and spec need (codes, scales, minimums).
        expected: [usize; 3],
        /// Lengths received.
        found: [usize; 3],
    },
    /// A symmetric spec's minimum is not `−offset · scale` ([`QuantSpec::with_symmetric_offset`]).
    #[error(
        "group {group}'s minimum is not −{offset} × its scale, as the symmetric spec says; build the spec \
         without a symmetric offset (`QuantSpec::with_symmetric_offset(0)`)"
    )]
    SymmetricMinimum {
        /// The first group (in storage order) that disagrees.
        group: usize,
        /// The spec's offset.
        offset: u32,
    },
    /// The axis does not exist.
    #[error("axis {axis} out of range for a rank-{rank} tensor")]
    Axis {
        /// Requested axis.
        axis: usize,
        /// Tensor rank.
        rank: usize,
    },
}

/// How to quantize: bits per value, values per group, and the axis groups run along.
///
/// Valid by construction: [`QuantSpec::new`] accepts 4 or 8 bits and a group size that is a
/// positive multiple of the codes one `u32` word holds; whether the groups tile a given tensor is
/// checked against its shape ([`QuantSpec::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    bits: u32,
    group_size: usize,
    axis: usize,
    /// See [`QuantSpec::symmetric_offset`]; 0 for an independent minimum.
    symmetric_offset: u32,
}

impl QuantSpec {
    /// FlexGen's setting (§5 of the paper): 4 bits.
    pub const FLEXGEN_BITS: u32 = 4;
    /// FlexGen's setting: groups of 64.
    pub const FLEXGEN_GROUP_SIZE: usize = 64;

    /// `bits`-bit groups of `group_size` along `axis`; `bits` must be 4 or 8 and `group_size` a
    /// positive multiple of `32 / bits`.
    pub fn new(bits: u32, group_size: usize, axis: usize) -> Result<Self, KernelError> {
        if bits != 4 && bits != 8 {
            return Err(KernelError::Bits(bits));
        }
        let spec = Self { bits, group_size, axis, symmetric_offset: 0 };
        let per_word = spec.per_word();
        if group_size == 0 || !group_size.is_multiple_of(per_word) {
            return Err(KernelError::GroupWords { group: group_size, bits, per_word });
        }
        Ok(spec)
    }

    /// FlexGen's 4-bit groups of 64 along `axis`.
    pub const fn flexgen(axis: usize) -> Self {
        Self { bits: Self::FLEXGEN_BITS, group_size: Self::FLEXGEN_GROUP_SIZE, axis, symmetric_offset: 0 }
    }

    /// The same bits and group size along another axis.
    pub const fn along(self, axis: usize) -> Self {
        Self { axis, ..self }
    }

    /// The same quantization of a symmetric type (llama.cpp's `Q4_0`, `Q5_0`, `Q8_0`, `Q3_K`,
    /// `Q6_K`: `x = (code − offset) · scale`): every group's minimum is exactly `−offset · scale`,
    /// so a kernel may derive it instead of reading it (the CPU kernels do: fewer bytes a
    /// product). The minimums are still stored, so every backend can also read them;
    /// [`GroupQuantized::from_host`](super::GroupQuantized::from_host) checks that they are that
    /// product, bit for bit. 0: an independent minimum.
    pub const fn with_symmetric_offset(self, offset: u32) -> Self {
        Self { symmetric_offset: offset, ..self }
    }

    /// The offset whose `−offset · scale` is every group's minimum, or 0 (see
    /// [`QuantSpec::with_symmetric_offset`]).
    pub const fn symmetric_offset(&self) -> u32 {
        self.symmetric_offset
    }

    /// Bits per code: 4 or 8.
    pub const fn bits(&self) -> u32 {
        self.bits
    }

    /// Consecutive values sharing one `scale` and `min` (FlexGen uses 64).
    pub const fn group_size(&self) -> usize {
        self.group_size
    }

    /// Axis along which groups are formed (weights: the output channel; KV cache: the hidden
    /// dimension).
    pub const fn axis(&self) -> usize {
        self.axis
    }

    /// Codes per `u32` word.
    pub const fn per_word(&self) -> usize {
        32 / self.bits as usize
    }

    /// Largest code, `2^bits − 1`.
    pub const fn max_code(&self) -> u32 {
        (1 << self.bits) - 1
    }

    /// Bytes that `values` values take when quantized this way: the codes plus an `f32` scale
    /// and minimum per group.
    pub fn storage_bytes(&self, values: usize) -> usize {
        values * self.bits as usize / 8 + values / self.group_size * GROUP_PARAM_BYTES
    }

    /// [`QuantSpec::storage_bytes`] per value, `bits / 8 + 8 / group_size`, for sizes that are
    /// not whole numbers of groups (the offloading cost model's per-layer and per-token bytes).
    /// 4 bits in groups of 64: 0.625 bytes a value, 0.3125× of fp16.
    pub fn bytes_per_value(&self) -> f64 {
        f64::from(self.bits) / 8.0 + GROUP_PARAM_BYTES as f64 / self.group_size as f64
    }

    /// Checks that a tensor of `shape` can be quantized this way: the axis exists and its length
    /// is a whole number of groups.
    pub fn validate(&self, shape: &[usize]) -> Result<(), KernelError> {
        let len = *shape.get(self.axis).ok_or(KernelError::Axis { axis: self.axis, rank: shape.len() })?;
        if !len.is_multiple_of(self.group_size) {
            return Err(KernelError::GroupSize { group: self.group_size, per_word: self.per_word(), len });
        }
        Ok(())
    }
}

impl fmt::Display for QuantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-bit groups of {} along axis {}", self.bits, self.group_size, self.axis)
    }
}
