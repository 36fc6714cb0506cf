//! WAA's two devices timed side by side on the workload's own steps, the interference its price
//! takes ([`DeviceInterference::waa`](super::DeviceInterference)).
//!
//! WAA's prefill device prefills whole prompts while its decode device decodes a large batch;
//! on a host the two share, each slows the other, and not as pipeline stages handing one
//! micro-batch on do ([`super::engine_interference`], what RRA's price takes). So the planner
//! prices WAA's period `max + κ·min` of its encoder's step and decoder's iteration at the `κ` of
//! [`side_by_side`]: a prompt of the workload's mean length on the prefill device beside a
//! decode step of the engine's `max_num_seqs` sequences at the workload's mean context on the
//! decode device (WAA's decoder holds `B_E·(S̄_D − 1)` sequences, up to that cap).

use burn_llm_models::CausalLm;
use burn_parallel::profiler::{Side, SideBySide, side_by_side};

use super::{PlanError, ScheduleWorkload};

/// Untimed steps of each side before the timed ones.
const WARMUP: usize = 2;
/// Timed steps of each side, alone and at once (the median is kept).
const REPEATS: usize = 7;

/// Times WAA's two devices side by side on `workload` (see the module docs): `models[0]` on the
/// prefill device, `models[1]` on the decode device, each in the rayon pool of `threads` where it
/// is the host CPU, running `layers` layers per step (their own layers in order, again from the
/// first when they hold fewer, as the profiler's run models do).
pub fn waa_interference(
    workload: &ScheduleWorkload,
    models: [&CausalLm; 2],
    threads: [Option<usize>; 2],
    layers: usize,
) -> Result<SideBySide, PlanError> {
    let prompt = workload.mean_prompt().round().max(1.0) as usize;
    let context = workload.mean_context().round() as usize;
    let prefill = Side { model: models[0], threads: threads[0], batch: 1, tokens: prompt, context: 0, layers };
    let decode =
        Side { model: models[1], threads: threads[1], batch: workload.max_num_seqs.max(1), tokens: 1, context, layers };
    side_by_side([prefill, decode], WARMUP, REPEATS)
        .map_err(|e| PlanError::Profile(format!("timing WAA's prefill beside its decode: {e}")))
}
