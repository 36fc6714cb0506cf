//! The chunks a model on a group of several stages prefills its prompts in, chosen at start-up for
//! each stage count the placement can run, where the model's flags leave the choice open.
//!
//! A pipeline overlaps one prompt's work across its stages only when the prompt reaches them in
//! pieces: TeraPipe's token slices (thesis ch. 2 §2.3.3), here the paged engine's chunked prefill
//! (`--max-num-batched-tokens`), whose chunks follow each other through the stages, the second
//! computing one while the first computes the next. Chunks also let another engine's decode step
//! through a stage after one chunk rather than after a whole prompt. TeraPipe minimises the
//! latency of one prompt through the pipeline, `Σ t_i + (K−1)·max t_i`, from the slices' times;
//! here every chunk is an engine step over the workers, whose fixed costs (the step's hand-overs
//! to each worker, the scheduler) the layers' profile does not see and which grow with the chunk
//! count, so the latency is measured instead of priced: the prompt of the workload's shape is
//! prefilled over the pool's first `S` devices (for groups of `S` stages), whole, then in halves,
//! quarters and so on until a halving is clearly slower than the fastest so far, and the fastest
//! chunk size is kept for groups of that many stages.
//!
//! The choice applies to a model whose engines run FCFS with chunked prefill on, no
//! `--max-num-batched-tokens` and no `--prefill-slices` of their own (those flags choose for
//! themselves; `--no-chunked-prefill` keeps whole prompts), on groups of the stage count timed
//! (one device keeps whole prompts: nothing overlaps them). A step's token budget also bounds how
//! many sequences decode in it, so no size below the engine's `--max-num-seqs` is tried (vLLM asks
//! the same of `max_num_batched_tokens`): an engine batching 256 sequences (the default) keeps a
//! 256-token prompt whole, and one serving a sequence at a time, as AlpaServe's do, may chunk down
//! to one token.

use std::io::Write;

use burn_llm::paged::SchedulingPolicy;
use burn_parallel::profiler::probe_prompt;
use burn_plan::serving::ServingWorkload;

use super::super::ServerError;
use super::super::model_args::ServedModelSpec;
use super::ChunkChoice;
use super::pipelined::{probe_spec, request_shape, timed_runs_ms};
use super::profiles::ModelCosts;
use burn_llm::Purpose;
use burn_llm::spec::{EngineSpec, PrefillSlices};

/// How much slower than the fastest so far a halving may prefill the prompt and still be followed
/// by the next: the spread of the fastest of [`REPEATS`](super::pipelined::REPEATS) runs, so
/// that one noisy timing does not end the search before the fastest size.
const SPREAD: f64 = 0.02;

/// Whether the placement chooses `spec`'s chunk size (see the [module docs](self)).
pub(super) fn chosen_here(spec: &EngineSpec) -> bool {
    let config = spec.engine_config();
    config.chunked_prefill
        && config.max_num_batched_tokens.is_none()
        && spec.parallel.prefill_slices.is_none_or(|s| s == PrefillSlices::Off)
        && spec.planless_policy() == Some(SchedulingPolicy::Fcfs)
}

/// The chunk sizes tried after the whole prompt of `prompt` tokens: halves, quarters and so on,
/// each rounded up, down to `seqs` tokens (the engine's `--max-num-seqs`) or one.
pub(super) fn halvings(prompt: usize, seqs: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(prompt), |&c| (c > 1).then(|| c.div_ceil(2))).skip(1).take_while(move |&c| c >= seqs)
}

/// Which chunk size to keep, from the prefill times measured so far (`(chunk, ms)`, the whole
/// prompt first, then each halving): the fastest, and whether to try the next halving (the last
/// one came within [`SPREAD`] of the fastest). `None` before anything is measured.
pub(super) fn keep(measured: &[(usize, f64)]) -> Option<(usize, bool)> {
    let fastest = measured.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
    let last = measured.last()?.1;
    Some((fastest.0, last <= fastest.1 * (1.0 + SPREAD)))
}

/// The chunk size, for groups of as many stages as `devices`, of each of `models` (those
/// [`timed_on`](super::pipelined::timed_on) that many stages) whose chunk size the placement
/// chooses and for which chunks beat the whole prompt over `devices` (one stage per device).
pub(super) fn choose(
    models: &[ServedModelSpec],
    devices: &[String],
    workload: &ServingWorkload,
    costs: &ModelCosts,
    log: &mut dyn Write,
) -> Result<Vec<ChunkChoice>, ServerError> {
    let n = devices.len();
    if n < 2 {
        return Ok(Vec::new());
    }
    let route = devices.join(" → ");
    let mut out = Vec::new();
    for model in models.iter().filter(|m| chosen_here(&m.spec)) {
        let (dir, arch) = costs.model(&model.name);
        let (prompt, _) = request_shape(workload, &model.name, arch);
        let fail = |e: &dyn std::fmt::Display| {
            ServerError::Engine(format!(
                "placement: timing `{}`'s prefill in chunks over {route}: {e}; check that each device holds its \
                 share of the layers and that the workers run",
                model.name,
            ))
        };
        let seqs = model.spec.engine_config().max_num_seqs;
        if halvings(prompt, seqs).next().is_none() {
            let _ = writeln!(
                log,
                "placement: `{}` prefills whole prompts of {prompt} tokens on {n}-stage groups: half of that is \
                 under one token or under its --max-num-seqs {seqs}, which a step's token budget must hold",
                model.name
            );
            continue;
        }
        let stages = super::even_stages(arch.num_layers, n).map_err(|e| fail(&e))?;
        let ids = probe_prompt(prompt, arch.vocab_size, 0);
        let timed = |chunk| prefill_ms(model, devices, &stages, dir, chunk, &ids).map_err(|e| fail(&e));
        let mut measured = vec![(prompt, timed(None)?)];
        for chunk in halvings(prompt, seqs) {
            measured.push((chunk, timed(Some(chunk))?));
            if keep(&measured).is_some_and(|(_, go_on)| !go_on) {
                break;
            }
        }
        let chunk = keep(&measured).map_or(prompt, |(chunk, _)| chunk);
        let tried: Vec<String> = measured
            .iter()
            .map(|&(c, ms)| match c == prompt {
                true => format!("whole {ms:.0} ms"),
                false => format!("chunks of {c} {ms:.0} ms"),
            })
            .collect();
        let kept = match chunk < prompt {
            true => format!("prefills in chunks of {chunk} tokens on {n}-stage groups"),
            false => format!("prefills whole prompts on {n}-stage groups"),
        };
        let _ = writeln!(
            log,
            "placement: `{}`'s prefill of {prompt} tokens over {route}: {}; it {kept}",
            model.name,
            tried.join(", ")
        );
        if chunk < prompt {
            out.push(ChunkChoice { model: model.name.clone(), stages: n, tokens: chunk });
        }
    }
    Ok(out)
}

/// The fastest of [`REPEATS`](super::pipelined::REPEATS) prefills (one token generated) of `ids`
/// by `model` loaded as a pipeline over `devices` running `stages`, computing at most `chunk`
/// tokens a step (`None`: whole).
fn prefill_ms(
    model: &ServedModelSpec,
    devices: &[String],
    stages: &[[usize; 2]],
    dir: &std::path::Path,
    chunk: Option<usize>,
    ids: &[u32],
) -> Result<f64, Box<dyn std::error::Error>> {
    let spec = probe_spec(model, devices.to_vec(), stages, chunk);
    let mut engine = spec.init(dir, Purpose::Serve, &mut std::io::sink())?;
    Ok(timed_runs_ms(engine.as_mut(), &[ids.to_vec()], 1)?[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_halve_down_to_one_token_or_the_sequences_a_step_decodes() {
        assert_eq!(halvings(256, 1).collect::<Vec<_>>(), [128, 64, 32, 16, 8, 4, 2, 1]);
        assert_eq!(halvings(200, 1).take(4).collect::<Vec<_>>(), [100, 50, 25, 13]);
        assert_eq!(halvings(1, 1).count(), 0, "a one-token prompt has nothing to chunk");
        // A step of 16 sequences keeps at least 16 tokens of budget for their decodes.
        assert_eq!(halvings(256, 16).collect::<Vec<_>>(), [128, 64, 32, 16]);
        assert_eq!(halvings(200, 16).last(), Some(25));
        // vLLM's default of 256 sequences: a 256-token prompt stays whole.
        assert_eq!(halvings(256, 256).count(), 0);
        assert_eq!(halvings(1024, 256).collect::<Vec<_>>(), [512, 256]);
    }

    #[test]
    fn the_fastest_chunk_size_is_kept_once_a_halving_is_clearly_slower() {
        // Whole 610 ms, then 480, 410, 440: 64 is kept and 32 ends the search.
        assert_eq!(keep(&[(256, 610.0), (128, 480.0), (64, 410.0), (32, 440.0)]), Some((64, false)));
        // Still getting faster: try the next halving.
        assert_eq!(keep(&[(256, 610.0), (128, 480.0)]), Some((128, true)));
        // Within the timing's spread of the fastest: the search goes on, the fastest is kept.
        assert_eq!(keep(&[(256, 610.0), (128, 480.0), (64, 485.0)]), Some((128, true)));
        assert_eq!(keep(&[(256, 610.0), (128, 480.0), (64, 485.0), (32, 470.0)]), Some((32, true)));
        // Chunks slower than the whole prompt: whole prompts.
        assert_eq!(keep(&[(256, 610.0), (128, 650.0)]), Some((256, false)));
        assert_eq!(keep(&[(256, 610.0)]), Some((256, true)));
        assert_eq!(keep(&[]), None);
    }

    #[test]
    fn only_engines_whose_flags_leave_the_chunks_open_are_chosen_for() {
        let open = EngineSpec::default();
        assert!(chosen_here(&open));
        let mut own = open.clone();
        own.paged.max_num_batched_tokens = Some(64);
        assert!(!chosen_here(&own), "--max-num-batched-tokens chooses for itself");
        let mut whole = open.clone();
        whole.paged.no_chunked_prefill = true;
        assert!(!chosen_here(&whole), "--no-chunked-prefill keeps whole prompts");
        let mut sliced = open.clone();
        sliced.parallel.prefill_slices = Some(PrefillSlices::Auto);
        assert!(!chosen_here(&sliced), "--prefill-slices slices within a step");
        let mut off = open.clone();
        off.parallel.prefill_slices = Some(PrefillSlices::Off);
        assert!(chosen_here(&off));
        let mut fixed = open;
        fixed.paged.scheduling = Some(SchedulingPolicy::Static);
        assert!(!chosen_here(&fixed), "another scheduling policy batches as it plans");
    }
}
