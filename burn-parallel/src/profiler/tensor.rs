//! A tensor-parallel layer timed on its device group (Alpa's intra-operator choice needs each
//! degree's cost, communication included): the model's first layer split over the group's
//! devices, its prefill of a prompt and one decode step after it, each the median of timed runs
//! with every device of the group synchronised before the clock starts and before it is read.

use std::time::Instant;

use burn::tensor::Device;
use burn_llm_models::CausalLm;
use burn_llm_models::cache::{ContiguousKvCache, LayerDevices};

use super::ProfileError;
use crate::block::LayerBlock;
use crate::tensor::{TensorParallelLayer, rank_kv_layout};
use burn_plan::profile::{DecodeTable, PrefillTable, Profile};

/// A tensor-parallel layer's measured times, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorParallelTimes {
    /// Prefill of `prompt_tokens` tokens, no context.
    pub prefill_ms: f64,
    /// One decode step after `prompt_tokens` tokens.
    pub decode_ms: f64,
}

/// Times `model`'s first layer (a one-layer model on `devices[0]`) split over `devices`: one
/// prompt of `prompt_tokens` tokens, then decode steps after it; `repeats` timed runs each after
/// one untimed. A degree the layer cannot be split by is an error naming the numbers.
pub fn tensor_parallel_times(
    model: &CausalLm,
    devices: &[Device],
    prompt_tokens: usize,
    repeats: usize,
) -> Result<TensorParallelTimes, ProfileError> {
    let layer = model.layers.first().cloned().ok_or_else(|| ProfileError::Grid("the model has no layer".into()))?;
    let block = TensorParallelLayer::split(layer, devices)
        .map_err(|e| ProfileError::Grid(format!("tensor-parallel degree {}: {e}", devices.len())))?;
    let layout = rank_kv_layout(model.kv_layout(), devices.len());
    let prompt = super::probe_ids(prompt_tokens, model.spec().vocab_size);
    let sync = || devices.iter().try_for_each(|d| d.sync().map_err(|e| ProfileError::Device(e.to_string())));
    let runs = repeats.max(1) + 1;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let placement = LayerDevices::new(&block.kv_devices());
        let mut cache = ContiguousKvCache::placed(layout, 1, prompt_tokens + 1, &devices[0], placement, None)?;
        let mut step_ms = |tokens: &[u32]| -> Result<f64, ProfileError> {
            let step = cache.begin_step(&[tokens])?;
            let hidden = model.embed(&step);
            sync()?;
            let started = Instant::now();
            let out = block.forward(hidden.states, 0, hidden.rotary.as_ref(), &mut cache)?;
            sync()?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            drop(out);
            Ok(ms)
        };
        let p = step_ms(&prompt)?;
        let d = step_ms(&prompt[..1])?;
        if run > 0 {
            prefill.push(p);
            decode.push(d);
        }
    }
    Ok(TensorParallelTimes { prefill_ms: super::fit::median(prefill), decode_ms: super::fit::median(decode) })
}

/// The profile of a device group running every layer at tensor-parallel degree `degree` with
/// `times` per layer: `rank0`'s profile (embeddings, LM head, bytes) with flat layer tables at
/// the measured point and each device's share of a layer's weights and KV cache.
pub fn group_profile(rank0: &Profile, degree: usize, prompt_tokens: usize, times: TensorParallelTimes) -> Profile {
    let degree = degree.max(1) as u64;
    Profile {
        prefill: PrefillTable {
            batch: vec![1.0],
            tokens: vec![prompt_tokens as f64],
            base_ms: vec![vec![times.prefill_ms]],
            context_ms: [0.0; 4],
        },
        decode: DecodeTable { batch: vec![1.0], context: vec![prompt_tokens as f64], ms: vec![vec![times.decode_ms]] },
        weight_bytes_per_layer: rank0.weight_bytes_per_layer.div_ceil(degree),
        kv_bytes_per_token_per_layer: rank0.kv_bytes_per_token_per_layer.div_ceil(degree),
        ..rank0.clone()
    }
}
