//! The Burn profiler: times one decoder layer of a model on a real device and writes the
//! [`Profile`] every planner reads (`cargo run --release --example plan -- profile …`).
//!
//! The model is built with random weights through the ordinary loader ([`CausalLm::random`]):
//! timing depends on shapes, not values. Every decoder layer of a model has the same shape, so the
//! profiler builds the model with its first few layers ([`run_layers`], at most [`RUN_LAYERS`]),
//! times them, and reports the spec's layer count: that keeps memory at a few layers' weights and
//! KV cache however deep the model is.
//!
//! A pipeline stage issues its layers back to back and synchronises once per pass. So every
//! prefill and decode point runs all the built layers between two synchronisations, and one decode
//! step of the first layer alone separates the fixed cost of a pass (`call_ms`: issuing it and the
//! synchronisation, a network round trip on a remote worker) from the per-layer times the tables
//! hold ([`fit::call_ms`], [`fit::per_layer`]).
//!
//! What is measured, each point after `warmup` runs as the median of `repeats` runs, with the
//! device synchronised before the clock starts and before it is read:
//! - **prefill** `base_ms[b][t]`: the layer's forward over `batch[b]` sequences of `tokens[t]` new
//!   tokens each, no context, through a [`ContiguousKvCache`];
//! - **context overhead**: at batch 1, the same for every (`i` tokens, `j` tokens of context) pair
//!   of the grid with `i + j` within the model's positions; TeraPipe's
//!   `t_ctx(i, j) = a0 + a1·i + a2·j + a3·i·j` is fitted to `t(i, j) − t(i, 0)` by non-negative
//!   least squares ([`fit`]);
//! - **decode** `ms[b][c]`: one step of `batch[b]` sequences, one new token each, after
//!   `context[c]` cached tokens;
//! - **embedding** and **LM head** (final norm and logits), timed at several token counts;
//!   `ms_per_token` is the least-squares slope through the origin;
//! - bytes: the layer's projection weights as stored, its `f32` keys and values per token, the
//!   embedding table and the LM head (a tied head counts its own copy: a pipeline's last stage
//!   needs one).
//!
//! Context is laid out with [`ContiguousKvCache::begin_step`] without running the layer over it:
//! the cached slots then stay zero, which costs the attention exactly what real keys would.
//! Tensor-parallel scaling is not measured (one device): `tensor_parallel` is left empty.
//!
//! The serving engine's measured steps (`engine_step_ms`, [`fit::engine_step_table`]) and its
//! linear per-step overhead (`engine_step`, [`fit::engine_step`]) are made here from steps timed
//! by the caller: the paged engine lives in a crate this one does not depend on, so
//! `burn_llm::schedule` times its steps over an [`EngineStepGrid`] and
//! [`cli::run_with_engine`] takes that timer.

pub mod cli;
pub mod device;
pub mod fit;
pub mod link;
mod measure;
pub mod overlap;
pub mod side_by_side;
pub mod tensor;

use burn::tensor::Device;
use burn_llm_models::{CausalLm, DecoderSpec, ModelError};
use serde::{Deserialize, Serialize};

use burn_plan::profile::{DecodeTable, Extra, PrefillTable, Profile};
use measure::{Bench, Progress};

pub use burn_plan::interference::{Interference, OverlapStep};
pub use device::{DeviceProfile, ProfileIdentity, ProfileSource, ProfileWeights, device_profile};
pub use link::{LinkProfile, measure_link};
pub use overlap::{OverlapDevice, pipeline_interference};
pub use side_by_side::{Side, SideBySide, side_by_side};
pub use tensor::{TensorParallelTimes, group_profile, tensor_parallel_times};

/// `n` token ids cycling through a vocabulary of `vocab` ids: the prompts timing runs feed a
/// model (what the ids are does not change how long a step takes).
pub fn probe_ids(n: usize, vocab: usize) -> Vec<u32> {
    probe_prompt(n, vocab, 0)
}

/// Prompt `r` of a batch of timing prompts: [`probe_ids`] shifted by `r`, so that no two
/// prompts of a batch share a first token. A paged engine's prefix cache would otherwise compute
/// one prompt of the batch and map the others' full blocks onto it, and a timed step of `b`
/// prompts would cost about one prompt's.
pub fn probe_prompt(n: usize, vocab: usize, r: usize) -> Vec<u32> {
    let vocab = vocab.max(1);
    (0..n).map(|k| ((k * 7 + 1 + r) % vocab) as u32).collect()
}

/// The points the profiler measures. Points a model cannot hold (more positions than it was
/// trained for) are dropped before measuring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileGrid {
    /// Prefill batch sizes (the profile's `prefill.batch`).
    pub prefill_batch: Vec<usize>,
    /// Tokens per sequence in a prefill slice (`prefill.tokens`).
    pub prefill_tokens: Vec<usize>,
    /// Tokens of context before a slice, for the context fit (each > 0).
    pub prefill_context: Vec<usize>,
    /// Decode batch sizes (`decode.batch`).
    pub decode_batch: Vec<usize>,
    /// Cached tokens before a decode step (`decode.context`).
    pub decode_context: Vec<usize>,
    /// Untimed runs of each point, before the timed ones.
    pub warmup: usize,
    /// Timed runs per point (the median is kept).
    pub repeats: usize,
}

impl ProfileGrid {
    /// A grid that runs in seconds on a CPU: for tests and a first look.
    pub fn small() -> Self {
        Self {
            prefill_batch: vec![1, 2],
            prefill_tokens: vec![1, 8, 32],
            prefill_context: vec![16, 48],
            decode_batch: vec![1, 4],
            decode_context: vec![0, 32, 96],
            warmup: 1,
            repeats: 3,
        }
    }

    /// The grid `--stage-layers auto` profiles each device over: one sequence, prompts up to 64
    /// tokens (with a context point for TeraPipe's `t_ctx` fit), a decode step after 0 and 64
    /// tokens; a few seconds per device on a CPU for a small model.
    pub fn stages() -> Self {
        Self {
            prefill_batch: vec![1],
            prefill_tokens: vec![1, 16, 64],
            prefill_context: vec![64],
            decode_batch: vec![1],
            decode_context: vec![0, 64],
            warmup: 1,
            repeats: 3,
        }
    }

    /// The [`stages`](Self::stages) grid around one request shape (a serving workload's: a
    /// prompt of `prompt_tokens`, `max_tokens` generated): its prompt among the prefill points and
    /// the context of its last decode step among the decode points, so that the request's cost is
    /// read at measured points, not extended from the slope between 16 and 64 tokens (a CPU's
    /// matmuls run faster per token on longer prompts); five timed runs per point (points whose
    /// median of three can be off by a factor of three on a loopback worker).
    pub fn request(prompt_tokens: usize, max_tokens: usize) -> Self {
        let add = |axis: Vec<usize>, point: usize| {
            let mut axis = axis;
            axis.push(point);
            axis.sort_unstable();
            axis.dedup();
            axis
        };
        let stages = Self::stages();
        Self {
            prefill_tokens: add(stages.prefill_tokens, prompt_tokens.max(1)),
            decode_context: add(stages.decode_context, prompt_tokens + max_tokens.saturating_sub(1)),
            warmup: 2,
            repeats: 5,
            ..Self::stages()
        }
    }

    /// The grid for planning real workloads (prompts up to 1024 tokens, contexts up to 2048).
    pub fn full() -> Self {
        Self {
            prefill_batch: vec![1, 4, 16],
            prefill_tokens: vec![1, 16, 64, 256, 1024],
            prefill_context: vec![64, 256, 1024],
            decode_batch: vec![1, 8, 32, 64],
            decode_context: vec![0, 256, 1024, 2048],
            warmup: 1,
            repeats: 5,
        }
    }

    /// The grid a serving engine of at most `max_batch` sequences plans with (the schedule bench
    /// and `--schedule exegpt` at start-up): batches 1, 4, 16 up to `max_batch`, prompts up to
    /// 256 tokens, contexts up to 256; seconds to a minute on a CPU.
    pub fn serving(max_batch: usize) -> Self {
        let batch = upto(&[1, 4, 16], max_batch.max(1));
        Self {
            prefill_batch: batch.clone(),
            prefill_tokens: vec![1, 16, 64, 256],
            prefill_context: vec![32, 128],
            decode_batch: batch,
            decode_context: vec![0, 64, 256],
            warmup: 1,
            repeats: 3,
        }
    }

    /// The grid restricted to what a model of `max_positions` positions can hold, checked.
    fn fitted_to(&self, max_positions: usize) -> Result<Self, ProfileError> {
        let axes = [
            ("prefill_batch", &self.prefill_batch, 1),
            ("prefill_tokens", &self.prefill_tokens, 1),
            ("prefill_context", &self.prefill_context, 1),
            ("decode_batch", &self.decode_batch, 1),
            ("decode_context", &self.decode_context, 0),
        ];
        for (name, axis, min) in axes {
            if axis.windows(2).any(|w| w[1] <= w[0]) || axis.first().is_some_and(|&p| p < min) {
                return Err(ProfileError::Grid(format!(
                    "`{name}` must be strictly increasing and at least {min}, got {axis:?}"
                )));
            }
        }
        if self.repeats == 0 {
            return Err(ProfileError::Grid("`repeats` must be at least 1".into()));
        }
        let steps = self.warmup + self.repeats;
        let grid = Self {
            prefill_tokens: keep(&self.prefill_tokens, |t| t <= max_positions),
            prefill_context: keep(&self.prefill_context, |c| c < max_positions),
            decode_context: keep(&self.decode_context, |c| c + steps <= max_positions),
            ..self.clone()
        };
        for (name, axis) in [
            ("prefill_batch", &grid.prefill_batch),
            ("prefill_tokens", &grid.prefill_tokens),
            ("decode_batch", &grid.decode_batch),
            ("decode_context", &grid.decode_context),
        ] {
            if axis.is_empty() {
                return Err(ProfileError::Grid(format!(
                    "no point of `{name}` fits the model's {max_positions} positions: give smaller ones"
                )));
            }
        }
        Ok(grid)
    }

    /// The (tokens, context) pairs of the context fit the model can hold.
    fn context_pairs(&self, max_positions: usize) -> Vec<(usize, usize)> {
        let mut pairs = Vec::new();
        for &j in &self.prefill_context {
            for &i in &self.prefill_tokens {
                if i + j <= max_positions {
                    pairs.push((i, j));
                }
            }
        }
        pairs
    }

    /// Timed points in all (for progress reports).
    fn points(&self, pairs: usize) -> usize {
        1 + self.prefill_batch.len() * self.prefill_tokens.len()
            + pairs
            + self.decode_batch.len() * self.decode_context.len()
            + self.prefill_tokens.len()
            + self.decode_batch.len()
            + 1
    }
}

/// The points of `axis` below `max`, then `max`.
fn upto(axis: &[usize], max: usize) -> Vec<usize> {
    let mut kept: Vec<usize> = axis.iter().copied().filter(|&b| b < max).collect();
    kept.push(max);
    kept
}

/// The engine steps the profile's `engine_step_ms` tabulates (and `engine_step` is fitted to):
/// for every batch and prompt length, the engine prefills `batch` prompts of that length in one
/// step, then decodes them for `decode_steps` steps; the run is repeated `warmup` times untimed,
/// then `repeats` times (the timed runs going round the points, so that a slow stretch of the
/// machine spreads over many points' runs); the prefill's median time is kept, and the median of every decode step
/// of every repeat, at the decode steps' middle context; the spread of the timed runs about
/// those medians (a run's prefill; the mean of its decode steps) is the profile's
/// `step_variation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStepGrid {
    /// Sequences per step.
    pub batch: Vec<usize>,
    /// Prompt lengths.
    pub prompt_tokens: Vec<usize>,
    /// Decode steps timed after each prefill.
    pub decode_steps: usize,
    /// Untimed runs of each point, before the timed ones.
    pub warmup: usize,
    /// Timed runs per point (the median is kept).
    pub repeats: usize,
}

impl EngineStepGrid {
    /// Seconds on a CPU, for tests and small models.
    pub fn small() -> Self {
        Self { batch: vec![1, 2, 4], prompt_tokens: vec![8, 32], decode_steps: 4, warmup: 1, repeats: 3 }
    }

    /// The grid matching [`ProfileGrid::serving`]`(max_batch)`: every batch up to 4 (a CPU's
    /// step time can jump between one row and two), then doublings; prompts (and so decode
    /// contexts) of 16, 64 and 256 tokens, so that long prompts' prefills and long outputs'
    /// decode steps are read near measured points, not extended from the slope between 16 and
    /// 64.
    pub fn serving(max_batch: usize) -> Self {
        Self {
            batch: upto(&[1, 2, 3, 4, 8, 16, 32], max_batch.max(1)),
            prompt_tokens: vec![16, 64, 256],
            decode_steps: 4,
            warmup: 1,
            // Five prefills per point: 60 timings at least for the prefill steps' variation.
            repeats: 5,
        }
    }

    /// The grid matching [`ProfileGrid::full`].
    pub fn full() -> Self {
        Self { batch: vec![1, 2, 4, 8, 16, 32], prompt_tokens: vec![16, 128], decode_steps: 4, warmup: 1, repeats: 5 }
    }
}

fn keep(axis: &[usize], fits: impl Fn(usize) -> bool) -> Vec<usize> {
    axis.iter().copied().filter(|&p| fits(p)).collect()
}

/// Why a profile could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The grid cannot be measured on this model.
    #[error("bad profile grid: {0}")]
    Grid(String),
    /// The model could not be built or run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The device reported an error while synchronising.
    #[error("the device failed while profiling: {0}; check that the device works (e.g. with `--device flex`)")]
    Device(String),
    /// A cached profile could not be written.
    #[error("cannot write the profile cache {path}: {reason}; check the directory's permissions and free space")]
    Cache {
        /// The cache file.
        path: std::path::PathBuf,
        /// What failed.
        reason: String,
    },
}

/// Where [`profile`] is, for a caller's progress display: called as each point starts, and once
/// more when every point is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileProgress<'a> {
    /// Points measured so far.
    pub done: usize,
    /// Points in all.
    pub total: usize,
    /// The point being measured now (e.g. `decode: 4 sequences after 128`); `None` once every
    /// point is done.
    pub point: Option<&'a str>,
}

/// A caller's progress display for [`profile`].
pub type ProgressHook<'a> = &'a mut dyn FnMut(ProfileProgress<'_>);

/// Measures `spec`'s costs on `device` over `grid` (see the module docs), reporting each point
/// to `progress` (the library draws nothing: the `plan profile` command can draw a bar from it).
/// The returned profile's `model` and `device` are left for the caller to name.
pub fn profile(
    spec: &DecoderSpec,
    device: &Device,
    grid: &ProfileGrid,
    progress: Option<ProgressHook<'_>>,
) -> Result<Profile, ProfileError> {
    let run = DecoderSpec { num_layers: run_layers(spec.num_layers), ..spec.clone() };
    let model = CausalLm::random(run, device)?;
    profile_model(&model, spec.num_layers, grid, progress)
}

/// Consecutive layers the profiler times between two synchronisations: as many as a stage of the
/// model may run back to back, up to [`RUN_LAYERS`].
pub fn run_layers(num_layers: usize) -> usize {
    num_layers.clamp(1, RUN_LAYERS)
}

/// The most consecutive layers a profiled step runs. A pipeline stage issues its layers back to
/// back and synchronises once (handing its output on); timing a run of layers, and one layer
/// alone, separates that fixed cost (`call_ms`) from the per-layer cost, where timing one layer
/// between synchronisations would charge every layer a whole round trip to a worker.
pub const RUN_LAYERS: usize = 4;

/// Measures `model`'s costs over `grid` on its device as [`profile`] does, for a model of
/// `num_layers` layers like `model`'s (`model` needs only its first few layers, [`run_layers`];
/// their weights, random or loaded from a checkpoint as stored, decide the timings and byte
/// counts). Prefill and decode steps run all of `model`'s layers between two synchronisations;
/// one decode step of the first layer alone gives the fixed cost per pass (`call_ms`), and the
/// tables hold the rest divided by the layers run.
pub fn profile_model(
    model: &CausalLm,
    num_layers: usize,
    grid: &ProfileGrid,
    progress: Option<ProgressHook<'_>>,
) -> Result<Profile, ProfileError> {
    let spec = model.spec();
    if model.layers.is_empty() {
        return Err(ProfileError::Grid("the model to profile has no decoder layer".into()));
    }
    let device = &model.device();
    let grid = grid.fitted_to(spec.max_positions)?;
    let pairs = grid.context_pairs(spec.max_positions);
    let progress = Progress::new(grid.points(pairs.len()), progress);
    let bench = Bench::new(model, device, grid.warmup, grid.repeats, &progress);

    // One untimed pass over the largest prefill first: allocators, thread pools and kernel
    // caches warm up before the first timed point.
    let largest = |axis: &[usize]| axis.last().copied().unwrap_or(1);
    bench.prefill_ms(largest(&grid.prefill_batch), largest(&grid.prefill_tokens), 0)?;
    let base_ms = table(&grid.prefill_batch, &grid.prefill_tokens, |b, t| bench.prefill_ms(b, t, 0))?;
    let mut samples = Vec::with_capacity(pairs.len());
    for &(i, j) in &pairs {
        // The same slice without context, as measured for the table when it has batch 1.
        let measured = grid.prefill_tokens.iter().position(|&t| t == i);
        let without = match measured {
            Some(k) if grid.prefill_batch[0] == 1 => base_ms[0][k],
            _ => bench.prefill_ms(1, i, 0)?,
        };
        samples.push(fit::ContextSample {
            tokens: i as f64,
            context: j as f64,
            // Both runs pay the one fixed cost: the difference is the layers' alone.
            overhead_ms: (bench.prefill_ms(1, i, j)? - without) / bench.layers() as f64,
        });
    }
    let context_ms = fit::context_overhead(&samples);
    // One untimed decode step first, as for prefill: the first decode point timed right after
    // the long prefills ran slower than the next (per layer slower without context than with
    // 64 tokens of it), which inflated the table's first point and, through it, hid `call_ms`.
    bench.decode_once_untimed(largest(&grid.decode_batch), largest(&grid.decode_context))?;
    let decode_ms = table(&grid.decode_batch, &grid.decode_context, |b, c| bench.decode_ms(b, c))?;
    let one_layer = bench.with_layers(1).decode_ms(grid.decode_batch[0], grid.decode_context[0])?;
    let call_ms = fit::call_ms(one_layer, decode_ms[0][0], bench.layers());
    let per_layer = |rows: Vec<Vec<f64>>| fit::per_layer(rows, call_ms, bench.layers());
    let (base_ms, decode_ms) = (per_layer(base_ms), per_layer(decode_ms));
    // The embedding and the head run inside a stage's pass: their fixed cost is the pass's.
    let without_call = |rows: Vec<Vec<f64>>| fit::per_layer(rows, call_ms, 1);
    let embed = without_call(table(&[1], &grid.prefill_tokens, |_, t| bench.embed_ms(t))?);
    let head = without_call(table(&[1], &grid.decode_batch, |_, b| bench.lm_head_ms(b))?);
    progress.finish();

    let head_bytes = match &model.lm_head {
        Some(head) => head.weight_bytes(),
        None => model.embed_tokens.size_bytes(),
    };
    let kv = model.kv_layout();
    Ok(Profile {
        version: burn_plan::profile::PROFILE_VERSION,
        model: None,
        device: None,
        layers: num_layers,
        prefill: PrefillTable {
            batch: as_f64(&grid.prefill_batch),
            tokens: as_f64(&grid.prefill_tokens),
            base_ms,
            context_ms,
        },
        decode: DecodeTable { batch: as_f64(&grid.decode_batch), context: as_f64(&grid.decode_context), ms: decode_ms },
        weight_bytes_per_layer: model.layers[0].weight_bytes() as u64,
        kv_bytes_per_token_per_layer: kv.bytes_per_token() as u64 / kv.num_layers as u64,
        embedding: Extra {
            weight_bytes: model.embed_tokens.size_bytes() as u64,
            ms_per_token: fit::slope_through_origin(&as_f64(&grid.prefill_tokens), &embed[0]),
        },
        lm_head: Extra {
            weight_bytes: head_bytes as u64,
            ms_per_token: fit::slope_through_origin(&as_f64(&grid.decode_batch), &head[0]),
        },
        tensor_parallel: Vec::new(),
        engine_step: None,
        engine_step_ms: None,
        step_variation: None,
        call_ms,
    })
}

/// `time(row, column)` for every point of the two axes, as rows of the table.
fn table(
    rows: &[usize],
    columns: &[usize],
    mut time: impl FnMut(usize, usize) -> Result<f64, ProfileError>,
) -> Result<Vec<Vec<f64>>, ProfileError> {
    rows.iter().map(|&r| columns.iter().map(|&c| time(r, c)).collect()).collect()
}

fn as_f64(axis: &[usize]) -> Vec<f64> {
    axis.iter().map(|&p| p as f64).collect()
}

/// A random Llama of hidden size 32 with `vocab` ids and `layers` layers on Flex, for the
/// profiler's tests.
#[cfg(test)]
pub(crate) fn tiny_llama(vocab: usize, layers: usize) -> CausalLm {
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    });
    let spec = DecoderSpec::from_json(&config.to_string(), std::path::Path::new("tiny")).expect("a tiny spec parses");
    CausalLm::random(spec, &Device::flex()).expect("a tiny model builds")
}

#[cfg(test)]
mod tests {
    use super::ProfileGrid;

    #[test]
    fn a_request_grid_measures_the_requests_own_prompt_and_last_context() {
        let grid = ProfileGrid::request(256, 4);
        assert_eq!(grid.prefill_tokens, [1, 16, 64, 256]);
        assert_eq!(grid.decode_context, [0, 64, 259]);
        // A shape already on the grid adds nothing; the axes stay increasing, as the profiler
        // requires.
        let grid = ProfileGrid::request(16, 49);
        assert_eq!(grid.prefill_tokens, [1, 16, 64]);
        assert_eq!(grid.decode_context, [0, 64]);
        assert_eq!(ProfileGrid::request(0, 0).prefill_tokens, [1, 16, 64]);
    }
}
