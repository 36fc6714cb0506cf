//! A GGUF file as a model: `DecoderSpec` from its metadata ([`super::metadata`]), tensors under
//! their HF names (so [`CausalLm`](crate::model::CausalLm) loads it like a safetensors checkpoint).
//!
//! For its `llama` architecture, llama.cpp's converter permutes the rows of `q_proj`/`k_proj` so
//! that RoPE rotates adjacent pairs (`reshape(heads, 2, head_dim/2, in).swapaxes(1, 2)`); the
//! decoder uses HF's rotate-half form, so those rows are permuted back on load. The other
//! architectures (Qwen, Gemma, Phi-3) are stored unpermuted, in NeoX layout.

use std::ops::Range;
use std::path::Path;

use burn::tensor::Device;
use burn_llm_kernels::{GroupQuantized, QuantSpec};

use super::GgufFile;
use super::quant::{RepackedBlocks, repack_blocks};
use crate::config::{Architecture, DecoderSpec};
use crate::error::{ModelError, Result};
use crate::layers::projection::WEIGHT_QUANT_AXIS;
use crate::weights::{TensorSource, check_window, window};

/// A GGUF model file with its decoder description.
pub struct GgufModel {
    file: GgufFile,
    spec: DecoderSpec,
}

/// Row permutation to undo for a tensor.
#[derive(Clone, Copy)]
enum Rows {
    AsIs,
    /// Undo llama.cpp's RoPE permutation over this many heads.
    Rope(usize),
}

impl GgufModel {
    /// Opens `path` and reads its architecture.
    pub fn open(path: &Path) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let spec = super::metadata::spec_from_metadata(&file)?;
        Ok(Self { file, spec })
    }

    /// The decoder description.
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    /// The underlying file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The GGUF name of an HF tensor name, and the row permutation to undo.
    fn map_name(&self, hf: &str) -> Option<(String, Rows)> {
        let fixed = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = fixed {
            return Some((name.to_string(), Rows::AsIs));
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        // llama.cpp permutes q/k rows for its `llama` architecture only; the others rotate in NeoX
        // (rotate-half) layout already.
        let permuted = self.spec.arch.gguf_rope_permuted();
        let rope = |heads: usize| if permuted { Rows::Rope(heads) } else { Rows::AsIs };
        let gemma = self.spec.arch == Architecture::Gemma3;
        let (gguf, rows) = match module {
            "input_layernorm" => ("attn_norm", Rows::AsIs),
            "self_attn.q_proj" => ("attn_q", rope(self.spec.num_heads)),
            "self_attn.k_proj" => ("attn_k", rope(self.spec.num_kv_heads)),
            "self_attn.qkv_proj" => ("attn_qkv", Rows::AsIs),
            "self_attn.q_norm" => ("attn_q_norm", Rows::AsIs),
            "self_attn.k_norm" => ("attn_k_norm", Rows::AsIs),
            "post_attention_layernorm" if gemma => ("post_attention_norm", Rows::AsIs),
            "pre_feedforward_layernorm" => ("ffn_norm", Rows::AsIs),
            "post_feedforward_layernorm" => ("post_ffw_norm", Rows::AsIs),
            "mlp.gate_up_proj" => ("ffn_up", Rows::AsIs),
            "self_attn.v_proj" => ("attn_v", Rows::AsIs),
            "self_attn.o_proj" => ("attn_output", Rows::AsIs),
            "post_attention_layernorm" => ("ffn_norm", Rows::AsIs),
            "mlp.gate_proj" => ("ffn_gate", Rows::AsIs),
            "mlp.up_proj" => ("ffn_up", Rows::AsIs),
            "mlp.down_proj" => ("ffn_down", Rows::AsIs),
            _ => return None,
        };
        Some((format!("blk.{layer}.{gguf}.{kind}"), rows))
    }
}

impl GgufModel {
    /// The blocks of a quantized matrix (any type [`repack_blocks`] reads) repacked on the host
    /// (groups of 16 or 32 along the input dimension, llama.cpp's layout) with RoPE-permuted rows
    /// un-permuted as whole rows of codes, scales and minimums, and how they are quantized; `None`
    /// for other tensors.
    fn blocks(&self, name: &str, [rows, cols]: [usize; 2]) -> Result<Option<(RepackedBlocks, QuantSpec)>> {
        let Some((gguf, order)) = self.map_name(name) else {
            return Ok(None);
        };
        let Some(info) = self.file.tensor_info(&gguf) else {
            return Ok(None);
        };
        let Some(blocks) = repack_blocks(info.kind, self.file.tensor_bytes(info)) else {
            return Ok(None);
        };
        let shape = info.shape();
        if shape != [rows, cols] {
            return Err(ModelError::ShapeMismatch { name: gguf, expected: vec![rows, cols], found: shape });
        }
        let corrupt = |message: String| ModelError::CorruptGguf { path: self.file.path().to_path_buf(), message };
        let RepackedBlocks { mut codes, mut scale, mut min, bits, group, offset } = blocks;
        if !cols.is_multiple_of(group) {
            return Err(corrupt(format!("`{gguf}` has rows of {cols} values, not whole groups of {group}")));
        }
        if let Rows::Rope(heads) = order {
            codes = unpermute_rope_rows(&codes, heads, rows, cols * bits as usize / 32);
            scale = unpermute_rope_rows(&scale, heads, rows, cols / group);
            min = unpermute_rope_rows(&min, heads, rows, cols / group);
        }
        // A symmetric type's minimums are `−offset · scale`: the CPU kernels derive them instead
        // of reading them (`from_host` checks the product).
        let spec = QuantSpec::new(bits, group, WEIGHT_QUANT_AXIS)
            .map_err(|e| corrupt(format!("`{gguf}`: {e}")))?
            .with_symmetric_offset(offset);
        Ok(Some((RepackedBlocks { codes, scale, min, bits, group, offset }, spec)))
    }

    /// Uploads host blocks of an `HF` `[rows, cols]` matrix to `device`.
    fn upload(
        &self,
        name: &str,
        blocks: RepackedBlocks,
        shape: [usize; 2],
        spec: QuantSpec,
        device: &Device,
    ) -> Result<GroupQuantized<2>> {
        GroupQuantized::from_host(blocks.codes, blocks.scale, blocks.min, shape, spec, device).map_err(|e| {
            ModelError::CorruptGguf { path: self.file.path().to_path_buf(), message: format!("`{name}`: {e}") }
        })
    }
}

impl TensorSource for GgufModel {
    /// Quantized matrices come back as their blocks, repacked losslessly (groups of 16 or 32 along
    /// the input dimension, llama.cpp's layout); RoPE-permuted rows are un-permuted as whole rows
    /// of codes, scales and minimums.
    fn quantized(&self, name: &str, shape: [usize; 2], device: &Device) -> Result<Option<GroupQuantized<2>>> {
        match self.blocks(name, shape)? {
            Some((blocks, spec)) => self.upload(name, blocks, shape, spec, device).map(Some),
            None => Ok(None),
        }
    }

    /// Cuts the window out of the repacked blocks on the host, so only the shard reaches `device`.
    fn quantized_window(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: Range<usize>,
        cols: Range<usize>,
        device: &Device,
    ) -> Result<Option<GroupQuantized<2>>> {
        check_window(name, shape, &rows, &cols)?;
        let Some((blocks, spec)) = self.blocks(name, shape)? else {
            return Ok(None);
        };
        let group = blocks.group;
        if !cols.start.is_multiple_of(group) || !cols.end.is_multiple_of(group) {
            return Err(ModelError::Window {
                name: name.to_string(),
                shape,
                rows,
                cols,
                why: format!(
                    "the columns do not start and end on its groups of {group} values; choose a split whose shards are whole groups"
                ),
            });
        }
        let per_word = spec.per_word();
        let words = |c: &Range<usize>| c.start / per_word..c.end / per_word;
        let groups = |c: &Range<usize>| c.start / group..c.end / group;
        let cut = RepackedBlocks {
            codes: window(&blocks.codes, shape[1] / per_word, rows.clone(), words(&cols)),
            scale: window(&blocks.scale, shape[1] / group, rows.clone(), groups(&cols)),
            min: window(&blocks.min, shape[1] / group, rows.clone(), groups(&cols)),
            bits: blocks.bits,
            group,
            offset: blocks.offset,
        };
        self.upload(name, cut, [rows.len(), cols.len()], spec, device).map(Some)
    }

    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let (gguf, rows) = self
            .map_name(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), dir: self.file.path().to_path_buf() })?;
        let (values, shape) = self.file.read_f32(&gguf)?;
        if shape != expected {
            return Err(ModelError::ShapeMismatch { name: gguf, expected: expected.to_vec(), found: shape });
        }
        Ok(match rows {
            Rows::AsIs => values,
            Rows::Rope(heads) => {
                unpermute_rope_rows(&values, heads, expected[0], expected.get(1).copied().unwrap_or(1))
            }
        })
    }
}

/// Inverts llama.cpp's `reshape(heads, 2, half, cols).swapaxes(1, 2)` on the rows of a
/// `[rows, cols]` matrix (or a `[rows]` bias with `cols = 1`).
pub fn unpermute_rope_rows<T: Copy + Default>(values: &[T], heads: usize, rows: usize, cols: usize) -> Vec<T> {
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let hf_row = h * head_dim + j * half + i;
                let gguf_row = h * head_dim + i * 2 + j;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&values[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    out
}

/// llama.cpp's converter permutation of q/k rows (`reshape(heads, 2, half, cols).swapaxes(1, 2)`),
/// the inverse of [`unpermute_rope_rows`]; for writing GGUF files from HF weights.
pub fn permute_rope_rows(values: &[f32], heads: usize, rows: usize, cols: usize) -> Vec<f32> {
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let (src, dst) = (h * head_dim + j * half + i, h * head_dim + i * 2 + j);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_the_converter() {
        let (heads, rows, cols) = (3, 12, 5);
        let original: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let permuted = permute_rope_rows(&original, heads, rows, cols);
        assert_ne!(permuted, original);
        assert_eq!(unpermute_rope_rows(&permuted, heads, rows, cols), original);
    }
}
