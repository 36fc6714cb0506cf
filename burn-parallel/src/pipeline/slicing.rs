//! `--prefill-slices auto`: TeraPipe's slicing planner ([`burn_plan::slices`], Algorithm 1)
//! run for each prefill from the stages' measured costs, as the engines'
//! [`PrefillSlicing`].
//!
//! The pipeline's `t_fwd(i, j)` (a slice of `i` tokens after `j` of context) is its slowest
//! stage's: each stage's layer count × its device profile's one-layer prefill time
//! ([`CostModel::prefill_layer_ms`]: the measured table plus the fitted context term), plus the
//! embedding on the first stage and the hand-over of the slice's hidden states into the stage.
//! The planner minimises `Σ t_i + (K−1)·max t_i` over slicings, plus the stage devices'
//! interference when they slow each other computing at once
//! ([`with_interference`](PlannedSlices::with_interference), [`slices::pipelined_latency_ms`]);
//! results are memoized per
//! (length, context). Long prefills are planned in units of `⌈len / 64⌉` tokens (the last slice
//! takes the remainder), which keeps each plan to milliseconds.
//!
//! [`stage_costs`] (feature `profiler`) assembles the stages' costs from each stage device's
//! profile and the measured links between them, which the caller supplies (the facade's
//! `--prefill-slices auto` reads them from the cached per-device profiler that
//! `--stage-layers auto` uses).

use std::collections::HashMap;
use std::sync::Mutex;

use burn_llm_models::slicing::PrefillSlicing;

use burn_plan::check::InputError;
use burn_plan::profile::{CostModel, Profile};
use burn_plan::slices::{self, SlicesInput, SlicesOutput};

/// Most slicing units a plan uses (a prefill longer than this is planned in groups of tokens).
const MAX_UNITS: usize = 64;
/// Plans remembered before the memo starts over (contexts vary with cached prefixes).
const MAX_MEMO: usize = 4096;

/// One stage's measured costs.
#[derive(Debug, Clone)]
pub struct StageCost {
    /// Its device's profile of the model (one layer's costs; `layers` there is ignored).
    pub profile: Profile,
    /// Decoder layers the stage runs.
    pub layers: usize,
    /// Milliseconds to hand one token's hidden states into the stage from the one before (0 for
    /// the first stage, and between stages in one process).
    pub handover_ms_per_token: f64,
    /// The fixed cost of one hand-over into the stage, in milliseconds (a measured link's latency;
    /// 0 for the first stage).
    pub handover_ms: f64,
}

/// [`PrefillSlicing`] from the TeraPipe planner over measured stage costs (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct PlannedSlices {
    stages: Vec<(CostModel, StageCost)>,
    /// The stage devices' interference `κ` (0: they overlap without slowing each other).
    kappa: f64,
    memo: Mutex<HashMap<(usize, usize), SlicesOutput>>,
}

impl PlannedSlices {
    /// Checks every stage's profile; errors name the stage and field.
    pub fn new(stages: Vec<StageCost>) -> Result<Self, InputError> {
        if stages.is_empty() {
            return Err(InputError::new("stages", "is empty: a pipeline has at least one stage"));
        }
        let stages = stages
            .into_iter()
            .enumerate()
            .map(|(s, cost)| {
                let model = cost.profile.cost_model(&format!("stages[{s}].profile"))?;
                let field = format!("stages[{s}].handover_ms_per_token");
                burn_plan::check::non_negative(&field, cost.handover_ms_per_token)?;
                burn_plan::check::non_negative(&format!("stages[{s}].handover_ms"), cost.handover_ms)?;
                Ok((model, cost))
            })
            .collect::<Result<Vec<_>, InputError>>()?;
        Ok(Self { stages, kappa: 0.0, memo: Mutex::new(HashMap::new()) })
    }

    /// Plans and predicts with the stage devices' measured interference `kappa` (on a prefill
    /// step, [`crate::profiler::Interference::kappa`]): the overlapped slices' work is stretched
    /// as [`slices::pipelined_latency_ms`] says. A negative or non-finite `κ` is refused.
    pub fn with_interference(mut self, kappa: f64) -> Result<Self, InputError> {
        self.kappa = burn_plan::check::non_negative("interference", kappa)?;
        if let Ok(mut memo) = self.memo.lock() {
            memo.clear();
        }
        Ok(self)
    }

    /// The interference `κ` it plans with.
    pub fn interference(&self) -> f64 {
        self.kappa
    }

    /// Pipeline stages `K`.
    pub fn num_stages(&self) -> usize {
        self.stages.len()
    }

    /// The pipeline's `t_fwd(tokens, context)`: its slowest stage's time for the slice.
    pub fn t_fwd_ms(&self, tokens: usize, context: usize) -> f64 {
        let (i, j) = (tokens as f64, context as f64);
        self.stages
            .iter()
            .enumerate()
            .map(|(s, (model, cost))| {
                let embed = if s == 0 { model.profile().embedding.ms_per_token * i } else { 0.0 };
                cost.layers as f64 * model.prefill_layer_ms(1.0, i, j)
                    + embed
                    + cost.handover_ms
                    + cost.handover_ms_per_token * i
            })
            .fold(0.0, f64::max)
    }

    /// TeraPipe's predicted latency of a prefill cut into `slices` after `context` tokens:
    /// `Σ t_i + (K−1)·max t_i` and the interference term (the first token's time, up to sampling).
    pub fn predicted_ms(&self, slices: &[usize], context: usize) -> f64 {
        let mut at = context;
        let times = slices.iter().map(|&len| {
            let t = self.t_fwd_ms(len, at);
            at += len;
            t
        });
        slices::pipelined_latency_ms(times, self.stages.len(), self.kappa)
    }

    /// The planner's slicing of `len` new tokens after `context`, and its predicted latency.
    pub fn plan(&self, len: usize, context: usize) -> SlicesOutput {
        if len == 0 {
            return SlicesOutput { slices: Vec::new(), latency_ms: 0.0 };
        }
        if let Some(done) = self.memo.lock().ok().and_then(|memo| memo.get(&(len, context)).cloned()) {
            return done;
        }
        let planned = self.plan_uncached(len, context);
        if let Ok(mut memo) = self.memo.lock() {
            if memo.len() >= MAX_MEMO {
                memo.clear();
            }
            memo.insert((len, context), planned.clone());
        }
        planned
    }

    fn plan_uncached(&self, len: usize, context: usize) -> SlicesOutput {
        let unit = len.div_ceil(MAX_UNITS);
        let units = len.div_ceil(unit);
        // Slice of `k` units starting at unit `j`: the tokens it covers (the last unit may be
        // short).
        let tokens = |k: usize, j: usize| (k * unit).min(len - j * unit);
        let table: Vec<Vec<Option<f64>>> = (1..=units)
            .map(|k| (0..=units - k).map(|j| Some(self.t_fwd_ms(tokens(k, j), context + j * unit))).collect())
            .collect();
        let input = SlicesInput {
            seq_len: units,
            stages: self.stages.len(),
            t_fwd_ms: Some(table),
            interference: Some(self.kappa),
            ..SlicesInput::default()
        };
        let slices = match slices::plan(&input) {
            Ok(out) => {
                let mut at = 0;
                out.slices
                    .iter()
                    .map(|&k| {
                        let n = tokens(k, at);
                        at += k;
                        n
                    })
                    .collect()
            }
            // The table is built finite and in bounds; should the planner still refuse it, the
            // prefill runs unsliced.
            Err(_) => vec![len],
        };
        let latency_ms = self.predicted_ms(&slices, context);
        SlicesOutput { slices, latency_ms }
    }

    /// Predicted time to the first token of a `len`-token prompt with nothing cached, under the
    /// planner's slicing.
    pub fn predicted_ttft_ms(&self, len: usize) -> f64 {
        self.plan(len, 0).latency_ms
    }
}

impl PrefillSlicing for PlannedSlices {
    fn slices(&self, len: usize, context: usize) -> Vec<usize> {
        self.plan(len, context).slices
    }
}

#[cfg(feature = "profiler")]
pub use measured::{in_stage_pool, slicing_grid, stage_costs};

#[cfg(feature = "profiler")]
mod measured {
    use burn::tensor::Device;
    use burn_llm_models::device::is_host_device;

    use super::StageCost;
    use crate::pipeline::threaded::stage_threads;
    use crate::pipeline::{LinkProfile, PipelinePlan};
    use crate::profiler::ProfileGrid;
    use burn_plan::profile::Profile;

    /// The points `--prefill-slices auto` profiles: prefill slices of 16 to 2048 tokens at batch
    /// 1 (up to a long prompt's unsliced pass, so that it is read, not extended from shorter
    /// ones), after up to 1024 tokens of context (decode is not planned here: one point).
    pub fn slicing_grid() -> ProfileGrid {
        ProfileGrid {
            prefill_batch: vec![1],
            prefill_tokens: vec![16, 64, 256, 1024, 2048],
            prefill_context: vec![256, 1024],
            decode_batch: vec![1],
            decode_context: vec![0],
            warmup: 1,
            repeats: 3,
        }
    }

    /// Runs `f` in a rayon pool of `threads` threads (`None`: the caller's pool), as a stage on
    /// the host CPU runs when stages run concurrently; a pool that cannot be made runs `f` as is.
    pub fn in_stage_pool<T>(threads: Option<usize>, f: impl FnOnce() -> T + Send) -> T
    where
        T: Send,
    {
        match threads.map(|n| rayon::ThreadPoolBuilder::new().num_threads(n).build()) {
            Some(Ok(pool)) => pool.install(f),
            _ => f(),
        }
    }

    /// The costs of each stage of `plan`, for [`PlannedSlices`](super::PlannedSlices).
    ///
    /// `profile(stage, device, threads)` gives the profile of the stage's device (rank 0),
    /// measured with `threads` CPU threads: for a stage on the host CPU, the share it runs with
    /// when stages run concurrently (`host_threads`, else [`stage_threads`]' even share of the
    /// cores; see [`in_stage_pool`]); `None` on other devices. A device appearing in several
    /// stages is asked for once. `link(stage, from, to)` gives the measured link into each stage
    /// after the first (from the previous stage's device), turned into a fixed cost plus
    /// `hidden_bytes_per_token` per token; hand-overs between two stages on one device cost
    /// nothing.
    pub fn stage_costs<E>(
        plan: &PipelinePlan,
        host_threads: Option<usize>,
        hidden_bytes_per_token: usize,
        mut profile: impl FnMut(usize, &Device, Option<usize>) -> Result<Profile, E>,
        mut link: impl FnMut(usize, &Device, &Device) -> Result<LinkProfile, E>,
    ) -> Result<Vec<StageCost>, E> {
        let stages = plan.layout().stages();
        let devices: Vec<Device> = (0..stages.len()).map(|s| plan.stage_devices(s)[0].clone()).collect();
        let hosts = devices.iter().filter(|d| is_host_device(d)).count();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = stage_threads(hosts, cores, host_threads);
        let mut measured: Vec<(Device, Profile)> = Vec::new();
        let mut out = Vec::with_capacity(stages.len());
        for (s, (range, device)) in stages.iter().zip(&devices).enumerate() {
            let known = measured.iter().find(|(d, _)| d == device).map(|(_, p)| p.clone());
            let stage_profile = match known {
                Some(p) => p,
                None => {
                    let p = profile(s, device, is_host_device(device).then_some(threads))?;
                    measured.push((device.clone(), p.clone()));
                    p
                }
            };
            let handover = match s.checked_sub(1).map(|prev| &devices[prev]) {
                Some(prev) if prev != device => Some(link(s, prev, device)?),
                _ => None,
            };
            out.push(StageCost {
                profile: stage_profile,
                layers: range.len(),
                handover_ms_per_token: handover.map_or(0.0, |l| l.ms_per_byte * hidden_bytes_per_token as f64),
                handover_ms: handover.map_or(0.0, |l| l.latency_ms),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_plan::profile::{DecodeTable, Extra, PrefillTable};

    /// A profile whose one-layer prefill costs `fixed + per_token · tokens` ms (plus a context
    /// term `per_ctx · tokens · context`).
    fn linear_profile(fixed: f64, per_token: f64, per_ctx: f64) -> Profile {
        let tokens = vec![1.0, 64.0, 4096.0];
        Profile {
            version: 1,
            model: None,
            device: None,
            layers: 1,
            prefill: PrefillTable {
                batch: vec![1.0],
                tokens: tokens.clone(),
                base_ms: vec![tokens.iter().map(|t| fixed + per_token * t).collect()],
                context_ms: [0.0, 0.0, 0.0, per_ctx],
            },
            decode: DecodeTable { batch: vec![1.0], context: vec![0.0], ms: vec![vec![1.0]] },
            weight_bytes_per_layer: 1,
            kv_bytes_per_token_per_layer: 1,
            embedding: Extra { weight_bytes: 1, ms_per_token: 0.0 },
            lm_head: Extra { weight_bytes: 1, ms_per_token: 0.0 },
            tensor_parallel: Vec::new(),
            engine_step: None,
            engine_step_ms: None,
            call_ms: 0.0,
            step_variation: None,
        }
    }

    fn two_stages(fixed: f64) -> PlannedSlices {
        let stage = |layers| StageCost {
            profile: linear_profile(fixed, 0.01, 1e-6),
            layers,
            handover_ms_per_token: 0.0,
            handover_ms: 0.0,
        };
        PlannedSlices::new(vec![stage(3), stage(2)]).unwrap()
    }

    #[test]
    fn planned_slices_cover_the_prefill_and_match_the_planner() {
        let planner = two_stages(0.5);
        for (len, context) in [(1, 0), (7, 3), (64, 0), (300, 100), (2048, 0)] {
            let slices = planner.slices(len, context);
            assert_eq!(slices.iter().sum::<usize>(), len, "{len} after {context}: {slices:?}");
            assert!(slices.iter().all(|&s| s > 0), "{slices:?}");
        }
        // Up to 64 tokens the plan is in single tokens: exactly the planner's optimum over the
        // pipeline's table.
        let len = 48;
        let table = (1..=len).map(|i| (0..=len - i).map(|j| Some(planner.t_fwd_ms(i, j))).collect()).collect();
        let input = SlicesInput { seq_len: len, stages: 2, t_fwd_ms: Some(table), ..SlicesInput::default() };
        let expected = slices::plan(&input).unwrap();
        let got = planner.plan(len, 0);
        assert_eq!(got.slices, expected.slices);
        assert!((got.latency_ms - expected.latency_ms).abs() < 1e-9);
        assert!(planner.slices(0, 0).is_empty());
    }

    #[test]
    fn the_slowest_stage_sets_t_fwd_and_slicing_beats_one_pass() {
        let planner = two_stages(0.5);
        // Stage 0 has 3 layers: 3 · (0.5 + 0.01 · 100).
        assert!((planner.t_fwd_ms(100, 0) - 4.5).abs() < 1e-9);
        let sliced = planner.plan(2048, 0);
        assert!(sliced.slices.len() > 1, "{sliced:?}");
        assert!(sliced.latency_ms < planner.predicted_ms(&[2048], 0));
        assert!((planner.predicted_ttft_ms(2048) - sliced.latency_ms).abs() < 1e-9);
        // A large fixed cost per slice makes one pass best.
        let costly = two_stages(1e6);
        assert_eq!(costly.slices(256, 0), vec![256]);
    }

    #[test]
    fn interference_lengthens_the_prediction_and_can_undo_slicing() {
        let free = two_stages(0.5);
        let sliced = free.plan(2048, 0);
        assert!(sliced.slices.len() > 1, "{sliced:?}");
        let slowed = two_stages(0.5).with_interference(0.5).unwrap();
        assert_eq!(slowed.interference(), 0.5);
        assert!(slowed.predicted_ms(&sliced.slices, 0) > free.predicted_ms(&sliced.slices, 0));
        // One pass overlaps nothing: interference leaves it as it was.
        assert!((slowed.predicted_ms(&[2048], 0) - free.predicted_ms(&[2048], 0)).abs() < 1e-9);
        // At κ = 1 over two stages the overlap costs what taking turns does, so the least total
        // work wins: one pass, which has no fixed costs per slice and no context to attend to.
        let turns = two_stages(0.5).with_interference(1.0).unwrap();
        assert_eq!(turns.slices(2048, 0), vec![2048]);
        assert!(two_stages(0.5).with_interference(-1.0).is_err());
        assert!(two_stages(0.5).with_interference(f64::NAN).is_err());
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_stage() {
        let mut bad = linear_profile(0.5, 0.01, 0.0);
        bad.version = 7;
        let err = PlannedSlices::new(vec![StageCost {
            profile: bad,
            layers: 1,
            handover_ms_per_token: 0.0,
            handover_ms: 0.0,
        }])
        .unwrap_err();
        assert!(err.to_string().contains("stages[0].profile.version"), "{err}");
        assert!(PlannedSlices::new(Vec::new()).is_err());
    }
}
