//! The token embedding table, dense or kept quantized as a GGUF file ships it; a tied LM head reads
//! the same table.

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, Int, Tensor};
use burn_llm_kernels::dequantize;

use crate::layers::projection::{Projection, QLinear};

/// Token embedding `[vocab, dim]`.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per model
pub enum TokenEmbedding {
    /// Full-precision table.
    Dense(Embedding),
    /// Group-quantized rows (groups along `dim`, the GGUF layout): lookups dequantize only the
    /// rows they read, and a tied head multiplies by it without expanding it.
    Quantized(QLinear),
}

impl TokenEmbedding {
    /// Embeddings of `ids` `[batch, seq]` → `[batch, seq, dim]`.
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        match self {
            TokenEmbedding::Dense(e) => e.forward(ids),
            TokenEmbedding::Quantized(q) => {
                let [b, s] = ids.dims();
                let rows = dequantize(&q.weight().select_rows(ids.reshape([b * s])));
                rows.reshape([b, s, q.d_input])
            }
        }
    }

    /// The table as an LM head `dim → vocab` (weight tying). The quantized table is shared, not
    /// copied; the dense one is transposed into a new tensor.
    pub fn tied_head(&self) -> Projection {
        match self {
            TokenEmbedding::Dense(e) => {
                Projection::Dense(Linear { weight: Param::from_tensor(e.weight.val().transpose()), bias: None })
            }
            TokenEmbedding::Quantized(q) => Projection::Quantized(q.clone()),
        }
    }

    /// Logits of a tied head: `states` `[n, dim]` times the table's transpose.
    pub fn tied_logits(&self, states: Tensor<2>) -> Tensor<2> {
        match self {
            TokenEmbedding::Dense(e) => burn_llm_kernels::matmul(states, e.weight.val().transpose()),
            TokenEmbedding::Quantized(q) => q.forward(states),
        }
    }

    /// The same table in full precision.
    pub fn dense(self) -> Self {
        match self {
            TokenEmbedding::Quantized(q) => {
                TokenEmbedding::Dense(Embedding { weight: Param::from_tensor(dequantize(&q.weight())) })
            }
            dense => dense,
        }
    }

    /// The device the table lives on.
    pub fn device(&self) -> Device {
        match self {
            TokenEmbedding::Dense(e) => e.weight.val().device(),
            TokenEmbedding::Quantized(q) => q.scale.device(),
        }
    }

    /// Bytes of the table as stored.
    pub fn size_bytes(&self) -> usize {
        match self {
            TokenEmbedding::Dense(e) => e.weight.val().dims().iter().product::<usize>() * e.weight.val().dtype().size(),
            TokenEmbedding::Quantized(q) => q.size_bytes(),
        }
    }

    /// Bytes of the table that a tied head's product on the CPU reads
    /// ([`Projection::cpu_read_bytes`]).
    pub fn cpu_read_bytes(&self) -> usize {
        match self {
            TokenEmbedding::Dense(_) => self.size_bytes(),
            TokenEmbedding::Quantized(q) => q.cpu_read_bytes(),
        }
    }
}
