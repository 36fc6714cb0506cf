//! Pipeline parallelism: a decoder split by layers into contiguous stages, each on its own
//! device, run by the plain and the paged engines as one [`LanguageModel`](burn_llm_models::LanguageModel).
//!
//! - [`auto`]: `--stage-layers auto`, stages planned from each device's measured profile and
//!   link (Alpa's inter-operator pass) and the prediction printed before running.
//! - [`auto_groups`]: the same with a tensor-parallel degree per stage (`--tensor-parallel-size
//!   auto`): each stage on a group of consecutive devices, planned by [`burn_plan::stage_groups`].
//! - [`kv_map`] (feature `runtime`): the KV cache's layout when stages have different degrees.
//! - [`plan`] (feature `runtime`): [`PipelinePlan`], the checked split over devices.
//! - [`layout`]: which layers each stage runs (`--stage-layers 0-11,12-23`, inclusive, or an even
//!   split) and the device-count check, pure and run before anything loads.
//! - [`model`] (feature `runtime`): [`PipelineLm`], built from a checkpoint (each stage's weights
//!   loaded straight onto its device) or from a loaded `CausalLm` (layers moved with
//!   `Module::to_device`); blocks come from [`build_block`], the one place a layer becomes a
//!   whole or tensor-parallel block.
//!
//! - [`slicing`]: `--prefill-slices auto`, TeraPipe's planner as the engines' `PrefillSlicing`,
//!   from the stages' measured costs.
//! - [`threaded`] (feature `runtime`): each stage on a thread of its own for a step's
//!   micro-batches or a prefill's token slices.
//! - `turns` (feature `runtime`): callers that run pipelines at once (virtual engines, models on
//!   the same devices) take each device in turn, so that their steps follow each other through
//!   the stages.
//!
//! A token's path: the first stage's device embeds it; each stage runs its layers (attending
//! through its own cache layers on its own device) and hands the residual stream and the rotary
//! angles to the next with `Tensor::to_device` (bytes counted, [`LanguageModel::stage_transfer_bytes`](burn_llm_models::LanguageModel::stage_transfer_bytes));
//! the last stage's device applies the final norm and the LM head, and sampling happens there.
//! The paged engine splits each step's sequences into micro-batches and issues them in pipeline
//! order ([`LanguageModel::forward_micro_batches`](burn_llm_models::LanguageModel::forward_micro_batches)),
//! with each stage on a thread of its own ([`threaded`]), so that stages work on different
//! micro-batches (or TeraPipe token slices of one prompt) at once, on host CPUs as on asynchronous
//! devices.

pub mod auto;
pub mod auto_groups;
#[cfg(feature = "runtime")]
pub mod kv_map;
pub mod layout;
#[cfg(feature = "runtime")]
pub mod model;
#[cfg(feature = "runtime")]
pub mod plan;
pub mod slicing;
#[cfg(feature = "runtime")]
pub mod threaded;
#[cfg(feature = "runtime")]
mod turns;

pub use auto::{AutoStageDevice, AutoStages, Handover, LinkProfile, PredictedStage, StagePrediction, StageWorkload};
pub use auto_groups::{AutoGroup, AutoGroups};
#[cfg(feature = "runtime")]
pub use kv_map::KvMap;
pub use layout::{PipelineError, StageLayout, check_device_count, check_group_devices};
#[cfg(feature = "runtime")]
pub use model::{LayerWeights, PipelineLm, Stage, build_block};
#[cfg(feature = "runtime")]
pub use plan::PipelinePlan;
pub use slicing::{PlannedSlices, StageCost};
