//! The engine spec a model runs on one group of the placement, and what the placement chose for
//! its engines on two-stage groups.

use burn_parallel::pipeline::{PipelineError, StageLayout};

use super::super::launch::ModelSpec;
use super::pipelined;

/// What the placement chose for a model's engines on two-stage groups, where its flags left it
/// open: the chunks it prefills in (`--max-num-batched-tokens`, [`super::chunks`]) and its virtual
/// engines (`--virtual-engines`, [`pipelined::measure`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct TwoStage {
    pub chunk: Option<usize>,
    pub engines: Option<usize>,
}

impl TwoStage {
    /// `, prefilling in chunks of N tokens, over M virtual engines` (what was chosen).
    pub(super) fn describe(&self) -> String {
        let chunk = self.chunk.map(|c| format!(", prefilling in chunks of {c} tokens")).unwrap_or_default();
        let engines = self.engines.map(|n| format!(", over {n} virtual engines")).unwrap_or_default();
        format!("{chunk}{engines}")
    }
}

/// `model`'s engine spec on a group of `devices` (`--devices` entries) running its layers in
/// `stages` (half-open ranges, as `--stage-layers`) over `pipeline_stages` stages: over several,
/// one virtual engine per stage unless the model's flags say otherwise, and on the two stages
/// [`super::chunks`] and [`pipelined`] time, what they `chose` (the pool's `--device-memory` and
/// `--stage-profile-dir` served the placement and are dropped).
pub(super) fn group_spec(
    model: &ModelSpec,
    devices: Vec<String>,
    stages: &[[usize; 2]],
    pipeline_stages: usize,
    chose: TwoStage,
) -> crate::spec::EngineSpec {
    let mut spec = model.spec.clone();
    spec.device = None;
    spec.parallel.devices = Some(devices);
    // The placement has checked the memory and read the profiles these name.
    spec.parallel.device_memory = None;
    spec.parallel.stage_profile_dir = None;
    spec.parallel.pipeline_parallel_size = None;
    spec.parallel.stage_layers =
        Some(stages.iter().map(|[a, b]| format!("{a}-{}", b.saturating_sub(1))).collect::<Vec<_>>().join(","));
    // The simulator's pipeline: a stage takes the next request once it has passed on the last,
    // which takes one engine per stage (each engine's step spans every stage). Virtual engines
    // overlap steps across stages, so a model's own `--virtual-engines` is for its groups of
    // several stages: one device has nothing to overlap, and its engine would refuse the flag.
    let timed = pipeline_stages == pipelined::STAGES;
    spec.parallel.virtual_engines = match pipeline_stages {
        0 | 1 => None,
        n => Some(spec.parallel.virtual_engines.or(chose.engines.filter(|_| timed)).unwrap_or(n)),
    };
    if timed && chose.chunk.is_some() {
        spec.paged.max_num_batched_tokens = chose.chunk;
    }
    spec
}

/// `layers` split as evenly as possible over `stages` stages, as half-open `[start, end]` ranges.
pub(super) fn even_stages(layers: usize, stages: usize) -> Result<Vec<[usize; 2]>, PipelineError> {
    Ok(StageLayout::even(layers, stages)?.stages().iter().map(|r| [r.start, r.end]).collect())
}

/// What was chosen for `name`, if anything, among `(model, value)`.
pub(super) fn chosen_for(chosen: &[(String, usize)], name: &str) -> Option<usize> {
    chosen.iter().find(|(m, _)| m == name).map(|&(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chosen_chunks_and_engines_run_on_two_stage_groups_only() {
        let model = ModelSpec {
            name: "a".into(),
            source: "a".into(),
            spec: Default::default(),
            chat_template: None,
            max_waiting: None,
        };
        let budget = |devices: usize, chunk: Option<usize>, engines: Option<usize>| {
            let stages: Vec<[usize; 2]> = (0..devices).map(|d| [d, d + 1]).collect();
            let pool = (0..devices).map(|_| "flex".to_string()).collect();
            let spec = group_spec(&model, pool, &stages, devices, TwoStage { chunk, engines });
            (spec.paged.max_num_batched_tokens, spec.parallel.virtual_engines)
        };
        assert_eq!(budget(2, Some(64), None), (Some(64), Some(2)));
        assert_eq!(budget(2, None, None), (None, Some(2)));
        assert_eq!(budget(2, Some(64), Some(4)), (Some(64), Some(4)));
        // Timed on two stages only: one device or three keep whole prompts and one engine per stage.
        assert_eq!(budget(1, Some(64), Some(4)), (None, None));
        assert_eq!(budget(3, Some(64), Some(4)), (None, Some(3)));
        let chosen = vec![("a".to_string(), 64)];
        assert_eq!((chosen_for(&chosen, "a"), chosen_for(&chosen, "b")), (Some(64), None));
        let described = TwoStage { chunk: Some(64), engines: Some(4) }.describe();
        assert_eq!(described, ", prefilling in chunks of 64 tokens, over 4 virtual engines");
    }

    #[test]
    fn a_models_own_virtual_engines_run_on_its_groups_of_several_stages() {
        let mut spec = crate::spec::EngineSpec::default();
        spec.parallel.virtual_engines = Some(4);
        let model = ModelSpec { name: "a".into(), source: "a".into(), spec, chat_template: None, max_waiting: None };
        let engines = |devices: usize| {
            let stages: Vec<[usize; 2]> = (0..devices).map(|d| [d, d + 1]).collect();
            let pool = (0..devices).map(|_| "flex".to_string()).collect();
            group_spec(&model, pool, &stages, devices, TwoStage { chunk: None, engines: Some(2) })
                .parallel
                .virtual_engines
        };
        assert_eq!(engines(2), Some(4), "the model's own flag over the placement's choice");
        assert_eq!(engines(3), Some(4));
        // A replica on one device runs one engine, where the flag would be refused.
        assert_eq!(engines(1), None);
    }
}
