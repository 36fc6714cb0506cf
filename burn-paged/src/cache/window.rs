//! Sliding-window attention over the paged pools (local layers of Gemma 3, Mistral, Phi-3): each
//! sequence's blocks that hold some query's window are gathered into one dense run and attended
//! with a mask that lets a query at position `p` (context length `p + 1`) see positions
//! `p - window + 1..=p` only. The PagedAttention kernel reads every position from 0, so local
//! layers take this path; blocks before the earliest window are not read at all.

use burn::tensor::{Int, Tensor, TensorData};
use burn_llm_kernels::paged::KvPool;
use burn_llm_models::cache::{MASKED, attention};

use super::PagedStep;
use crate::error::{PagedError, Result};

/// `[T, H, D]` outputs of the step's queries `q` (`[T, H, D]`) over the key and value `pools`
/// (`[blocks, H_kv, block_size, D]`), each query seeing the last `window` positions of its
/// sequence's context.
pub(super) fn windowed_attention(
    q: Tensor<3>,
    (keys, values): (&KvPool, &KvPool),
    step: &PagedStep,
    scale: f32,
    window: usize,
) -> Result<Tensor<3>> {
    let [tokens, heads, head_dim] = q.dims();
    let [_, kv_heads, block_size, _] = keys.dims();
    if step.query_seq.len() != tokens || step.context_lens.len() != tokens {
        return Err(PagedError::Internal(format!(
            "{tokens} queries but a layout of {} query rows and {} context lengths",
            step.query_seq.len(),
            step.context_lens.len()
        )));
    }
    let device = q.device();
    let mut order: Vec<i64> = Vec::with_capacity(tokens);
    let mut outputs = Vec::new();
    let mut sequences: Vec<u32> = step.query_seq.clone();
    sequences.sort_unstable();
    sequences.dedup();
    for seq in sequences {
        let rows: Vec<usize> = (0..tokens).filter(|&t| step.query_seq[t] == seq).collect();
        let lens: Vec<usize> = rows.iter().map(|&t| step.context_lens[t] as usize).collect();
        let end = lens.iter().copied().max().unwrap_or(0);
        let start = lens.iter().map(|&l| l.saturating_sub(window)).min().unwrap_or(0);
        let (first, last) = (start / block_size, end.div_ceil(block_size));
        let table = step
            .block_tables
            .get(seq as usize * step.max_blocks..(seq as usize + 1) * step.max_blocks)
            .ok_or_else(|| PagedError::Internal(format!("query row {seq} has no block table")))?;
        let ids = table
            .get(first..last)
            .ok_or_else(|| PagedError::Internal(format!("context of {end} positions exceeds its block table")))?;
        let offset = first * block_size;
        let span = ids.len() * block_size;
        // `[blocks, H_kv, block_size, D]` → `[1, H_kv, blocks · block_size, D]` (quantized blocks
        // dequantized, as the contiguous cache attends its local layers).
        let run = |pool: &KvPool| -> Result<Tensor<4>> {
            Ok(pool.read_blocks(ids)?.dense().swap_dims(0, 1).reshape([1, kv_heads, span, head_dim]))
        };
        let mut bias = vec![MASKED; rows.len() * span];
        for (i, &len) in lens.iter().enumerate() {
            for p in len.saturating_sub(window).max(offset)..len {
                bias[i * span + p - offset] = 0.0;
            }
        }
        let bias = Tensor::<4>::from_data(TensorData::new(bias, [1, 1, rows.len(), span]), &device);
        let index: Vec<i64> = rows.iter().map(|&t| t as i64).collect();
        let picked =
            q.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(index.clone(), [rows.len()]), &device));
        let q_seq = picked.swap_dims(0, 1).unsqueeze_dim::<4>(0);
        let out = attention(q_seq, run(keys)?, run(values)?, bias, scale);
        outputs.push(out.squeeze_dim::<3>(0).swap_dims(0, 1));
        order.extend(index);
    }
    // Back to the step's token order.
    let mut inverse = vec![0i64; tokens];
    for (at, &t) in order.iter().enumerate() {
        inverse[t as usize] = at as i64;
    }
    let out = Tensor::cat(outputs, 0);
    Ok(out
        .select(0, Tensor::<1, Int>::from_data(TensorData::new(inverse, [tokens]), &device))
        .reshape([tokens, heads, head_dim]))
}
