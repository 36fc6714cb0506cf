//! Where the systems of `bench schedule` run: one device, every system on it; or two (local
//! devices or `ws://` workers), where FCFS and static batching run the model as a PP=2 pipeline
//! over both (iteration-level scheduling, ExeGPT's comparison), on virtual engines as vLLM runs
//! pipeline parallelism, and ExeGPT runs what its planner chooses for two devices: WAA (prefill on
//! the first, decode on the second, KV moved between them) or RRA on virtual engines over the same
//! pipeline, one per decoder micro-batch.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::Device;
use burn_llm::engine::paged_engines;
use burn_llm::models::CausalLm;
use burn_llm::paged::{DisaggEngine, EngineConfig, KvCacheMemory, SchedulingPolicy};
use burn_llm::parallel::pipeline::threaded::stage_pool_threads;
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use burn_llm::parallel::profiler::{Interference, OverlapDevice, OverlapStep, SideBySide, pipeline_interference};
use burn_llm::plan::profile::Profile;
use burn_llm::plan::schedule::{ScheduleOutput, Strategy};
use burn_llm::schedule::{
    DeviceInterference, EngineInterference, PlanError, ScheduleWorkload, engine_interference, phased_policy,
    pipelined_engines, plan_for, waa_config, waa_interference,
};
use burn_llm::spec::PagedSpec;
use burn_llm::{Engine, EngineKind, EngineSpec, Purpose};

type BoxError = Box<dyn std::error::Error>;

/// The devices and the model on them.
pub(super) enum Devices {
    /// Every system on one device.
    One(Box<CausalLm>),
    /// Two devices, named as given, with a replica of the model on each, and the layers of each
    /// stage of the pipeline over them.
    Two { names: [String; 2], devices: Box<[Device; 2]>, replicas: Box<[CausalLm; 2]>, stage_layers: Vec<usize> },
}

impl Devices {
    /// `model` (on `first`) alone, or replicated onto the second device too, with the pipeline
    /// over both split into stages of `stage_layers` layers each: every pipeline over the two
    /// devices (FCFS's, static batching's, RRA's) runs that split, and the planner prices it.
    pub(super) fn new(model: CausalLm, first: (String, Device), second: Option<(String, Device, Vec<usize>)>) -> Self {
        match second {
            None => Self::One(Box::new(model)),
            Some((second_name, second, stage_layers)) => {
                let replica = model.clone().to_device(&second);
                Self::Two {
                    names: [first.0, second_name],
                    devices: Box::new([first.1, second]),
                    replicas: Box::new([model, replica]),
                    stage_layers,
                }
            }
        }
    }

    /// The layers of each stage of the pipeline (two devices).
    pub(super) fn stage_layers(&self) -> Option<&[usize]> {
        match self {
            Self::One(_) => None,
            Self::Two { stage_layers, .. } => Some(stage_layers),
        }
    }

    /// How many.
    pub(super) fn count(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Two { .. } => 2,
        }
    }

    /// The devices, for the report.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::One(_) => "one device".into(),
            Self::Two { names, stage_layers, .. } => {
                format!("two devices ({}, {}), stages of {stage_layers:?} layers", names[0], names[1])
            }
        }
    }

    /// A baseline (FCFS or static batching, by `config`): on the device, or as a PP=2 pipeline
    /// over both, every call counted at the default matmul precision as every system is. Over
    /// two devices the pipeline runs as vLLM runs pipeline parallelism: one virtual engine per
    /// stage (one when there is one seat), `config`'s seats and KV pool divided between them,
    /// each step one micro-batch, so that one engine's step runs on the second device while the
    /// other's runs on the first.
    pub(super) fn baseline(&self, config: EngineConfig) -> Result<Box<dyn Engine>, BoxError> {
        match self {
            Self::One(model) => {
                let spec = EngineSpec {
                    engine: Some(EngineKind::Paged),
                    paged: PagedSpec::from(&config),
                    ..EngineSpec::default()
                };
                spec.init_model((**model).clone(), None, vec![], Purpose::Serve, &mut std::io::sink())
            }
            Self::Two { .. } => {
                let seats = config.max_num_seqs.max(1);
                let engines = seats.min(2);
                let per_engine = seats.div_ceil(engines);
                let kv_cache_memory = match (config.scheduling, config.kv_cache_memory) {
                    // Static batching's pool holds every seat's whole-context reservation (plus a
                    // block, `static_config`): keep that true of each engine's share.
                    (SchedulingPolicy::Static, KvCacheMemory::Blocks(n)) => {
                        KvCacheMemory::Blocks(n.div_ceil(seats) * per_engine * engines)
                    }
                    (_, memory) => memory,
                };
                let config =
                    EngineConfig { max_num_seqs: per_engine, micro_batches: Some(1), kv_cache_memory, ..config };
                self.on_pipeline(config, engines)
            }
        }
    }

    /// `engines` paged engines (virtual engines when several) over the two-stage pipeline.
    fn on_pipeline(&self, config: EngineConfig, engines: usize) -> Result<Box<dyn Engine>, BoxError> {
        let engine = paged_engines(self.pipeline()?, None, vec![], config, engines)?;
        Ok(EngineSpec::default().with_precision(engine))
    }

    /// The model split in two stages, one on each device.
    fn pipeline(&self) -> Result<PipelineLm, BoxError> {
        let Self::Two { replicas, devices, stage_layers, .. } = self else {
            return Err("a pipeline needs two devices".into());
        };
        let plan = PipelinePlan::new(StageLayout::from_counts(stage_layers)?, 1, devices.to_vec())?;
        Ok(PipelineLm::from_model(replicas[0].clone(), &plan)?)
    }

    /// ExeGPT's plan for `workload` under `bound` on these devices, working at once with
    /// `interference` ([`Devices::engine_interference`], [`Devices::waa_interference`]), chosen
    /// among `strategies` (all when `None`).
    pub(super) fn plan(
        &self,
        profile: &Profile,
        workload: &ScheduleWorkload,
        bound: f64,
        interference: DeviceInterference,
        strategies: Option<&[Strategy]>,
    ) -> Result<ScheduleOutput, PlanError> {
        plan_for(profile.clone(), workload, bound, self.count(), interference, self.stage_layers(), strategies)
    }

    /// How much the two devices slow each other down when both work (pipeline stages, WAA's
    /// prefill beside its decode) over their layers alone: each replica's decode step through half
    /// the layers (the second's ending with the LM head, as the last stage's does), alone and in a
    /// pipelined pass. One device: nothing measured.
    pub(super) fn interference(&self) -> Result<Interference, BoxError> {
        let Self::Two { names, devices, replicas, .. } = self else { return Ok(Interference::none()) };
        let threads = stage_pool_threads(devices.as_slice(), None)?;
        let runs: Vec<OverlapDevice<'_>> = replicas
            .iter()
            .zip(&threads)
            .enumerate()
            .map(|(d, (model, &threads))| OverlapDevice { model, threads, layers: None, head: d == 1 })
            .collect();
        let step = OverlapStep::decode_share(replicas[0].spec.num_layers, 2);
        let measured = pipeline_interference(&runs, step)?;
        eprintln!("{}", measured.summary(names.as_slice()));
        Ok(measured)
    }

    /// How much WAA's prefill device and decode device slow each other down on `workload`'s steps
    /// ([`waa_interference`]: the first replica prefilling beside the second decoding), where
    /// WAA is among `strategies` over two devices; `None` otherwise.
    pub(super) fn waa_interference(
        &self,
        workload: &ScheduleWorkload,
        strategies: Option<&[Strategy]>,
    ) -> Result<Option<SideBySide>, BoxError> {
        let Self::Two { devices, replicas, .. } = self else { return Ok(None) };
        if strategies.is_some_and(|s| s.iter().all(|&s| s == Strategy::Rra)) {
            return Ok(None);
        }
        let threads = stage_pool_threads(devices.as_slice(), None)?;
        let [a, b] = &**replicas;
        let measured = waa_interference(workload, [a, b], [threads[0], threads[1]], a.spec.num_layers)?;
        Ok(Some(measured))
    }

    /// How much the pipeline's stages slow each other down when its engines, not its layers
    /// alone, overlap (two devices; `None` on one): [`engine_interference`], the `κ` the planner
    /// gets. The layers' pass ([`Devices::interference`]) sees neither the engines' work on the
    /// host nor two engines' threads sharing the client, which the plans' cycling decode
    /// iterations pay.
    /// `seats`: the most sequences a plan's engine may hold, where the engines are timed again.
    pub(super) fn engine_interference(
        &self,
        profile: &Profile,
        seats: usize,
    ) -> Result<Option<EngineInterference>, BoxError> {
        let Some(layers) = self.stage_layers() else { return Ok(None) };
        let measured = engine_interference(&Arc::new(self.pipeline()?), layers, profile, seats)?;
        eprintln!("{}", measured.summary());
        Ok(Some(measured))
    }

    /// The engine that runs `plan` (with the rest of `base`), and its `max_num_seqs`.
    pub(super) fn exegpt(
        &self,
        plan: &ScheduleOutput,
        base: &EngineConfig,
    ) -> Result<(Box<dyn Engine>, usize), BoxError> {
        let engine: Box<dyn Engine> = match self {
            Self::One(_) => {
                let scheduling = phased_policy(plan)?;
                let SchedulingPolicy::Phased { encode_batch, decode_batch, .. } = scheduling else {
                    return Err("the plan's policy is not phased".into());
                };
                let seqs = encode_batch.max(decode_batch);
                let config = EngineConfig { max_num_seqs: seqs, scheduling, ..base.clone() };
                return Ok((self.baseline(config)?, seqs));
            }
            Self::Two { .. } if plan.strategy == Strategy::Rra => {
                let (config, engines) = pipelined_engines(plan, 2, base.clone())?;
                let seqs = config.max_num_seqs * engines;
                return Ok((self.on_pipeline(config, engines)?, seqs));
            }
            Self::Two { replicas, .. } => {
                let config = waa_config(plan, base.clone())?;
                let [a, b] = (**replicas).clone();
                Box::new(DisaggEngine::from_parts(a, b, None, vec![], config)?)
            }
        };
        Ok((EngineSpec::default().with_precision(engine), plan.decode_batch))
    }
}
