//! Where the systems of `bench schedule` run: one device, every system on it; or two (local
//! devices or `ws://` workers), where FCFS and static batching run the model as a PP=2 pipeline
//! over both (iteration-level scheduling, ExeGPT's comparison) and ExeGPT runs what its planner
//! chooses for two devices: WAA (prefill on the first, decode on the second, KV moved between
//! them) or RRA over the same pipeline.

use burn::module::Module;
use burn::tensor::Device;
use burn_llm::models::CausalLm;
use burn_llm::paged::{DisaggEngine, EngineConfig, LlmEngine, SchedulingPolicy};
use burn_llm::parallel::pipeline::threaded::stage_pool_threads;
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use burn_llm::parallel::plan::profile::Profile;
use burn_llm::parallel::plan::schedule::{ScheduleOutput, Strategy};
use burn_llm::parallel::profiler::{Interference, OverlapDevice, OverlapStep, pipeline_interference};
use burn_llm::schedule::{PlanError, ScheduleWorkload, phased_policy, pipelined_policy, plan_for, waa_config};
use burn_llm::spec::PagedSpec;
use burn_llm::{Engine, EngineKind, EngineSpec, Purpose};

type BoxError = Box<dyn std::error::Error>;

/// The devices and the model on them.
pub(super) enum Devices {
    /// Every system on one device.
    One(Box<CausalLm>),
    /// Two devices, named as given, with a replica of the model on each.
    Two { names: [String; 2], devices: Box<[Device; 2]>, replicas: Box<[CausalLm; 2]> },
}

impl Devices {
    /// `model` (on `first`) alone, or replicated onto the second device too.
    pub(super) fn new(model: CausalLm, first: (String, Device), second: Option<(String, Device)>) -> Self {
        match second {
            None => Self::One(Box::new(model)),
            Some((second_name, second)) => {
                let replica = model.clone().to_device(&second);
                Self::Two {
                    names: [first.0, second_name],
                    devices: Box::new([first.1, second]),
                    replicas: Box::new([model, replica]),
                }
            }
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
            Self::Two { names, .. } => format!("two devices ({}, {})", names[0], names[1]),
        }
    }

    /// A baseline (FCFS or static batching, by `config`): on the device, or as a PP=2 pipeline
    /// over both, every call counted at the default matmul precision as every system is.
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
                let engine = LlmEngine::from_parts(self.pipeline()?, None, vec![], config)?;
                Ok(EngineSpec::default().with_precision(Box::new(engine)))
            }
        }
    }

    /// The model split in two even stages, one on each device.
    fn pipeline(&self) -> Result<PipelineLm, BoxError> {
        let Self::Two { replicas, devices, .. } = self else { return Err("a pipeline needs two devices".into()) };
        let layers = replicas[0].spec.num_layers;
        let plan = PipelinePlan::new(StageLayout::even(layers, 2)?, 1, devices.to_vec())?;
        Ok(PipelineLm::from_model(replicas[0].clone(), &plan)?)
    }

    /// ExeGPT's plan for `workload` under `bound` on these devices, working at once with
    /// `interference` ([`Devices::interference`]).
    pub(super) fn plan(
        &self,
        profile: &Profile,
        workload: &ScheduleWorkload,
        bound: f64,
        interference: f64,
    ) -> Result<ScheduleOutput, PlanError> {
        plan_for(profile.clone(), workload, bound, self.count(), interference)
    }

    /// How much the two devices slow each other down when both work (pipeline stages, WAA's
    /// prefill beside its decode), measured as `--schedule exegpt` over two `--devices` measures
    /// it: each replica's decode step through half the layers, alone and in a pipelined pass. One
    /// device: nothing measured.
    pub(super) fn interference(&self) -> Result<Interference, BoxError> {
        let Self::Two { names, devices, replicas } = self else { return Ok(Interference::none()) };
        let threads = stage_pool_threads(devices.as_slice(), None)?;
        let runs: Vec<OverlapDevice<'_>> = replicas
            .iter()
            .zip(&threads)
            .map(|(model, &threads)| OverlapDevice { model, threads, layers: None })
            .collect();
        let step = OverlapStep::decode_share(replicas[0].spec.num_layers, 2);
        let measured = pipeline_interference(&runs, step)?;
        eprintln!("{}", measured.summary(names.as_slice()));
        Ok(measured)
    }

    /// The engine that runs `plan` (with the rest of `base`), and its `max_num_seqs`.
    pub(super) fn exegpt(
        &self,
        plan: &ScheduleOutput,
        base: &EngineConfig,
    ) -> Result<(Box<dyn Engine>, usize), BoxError> {
        let phased = |policy: SchedulingPolicy| -> Result<EngineConfig, BoxError> {
            let SchedulingPolicy::Phased { encode_batch, decode_batch, .. } = policy else {
                return Err("the plan's policy is not phased".into());
            };
            Ok(EngineConfig { max_num_seqs: encode_batch.max(decode_batch), scheduling: policy, ..base.clone() })
        };
        let engine: Box<dyn Engine> = match self {
            Self::One(_) => {
                let config = phased(phased_policy(plan)?)?;
                let seqs = config.max_num_seqs;
                return Ok((self.baseline(config)?, seqs));
            }
            Self::Two { .. } if plan.strategy == Strategy::Rra => {
                let config = EngineConfig {
                    micro_batches: Some(plan.decoder_micro_batches.max(1)),
                    ..phased(pipelined_policy(plan, 2)?)?
                };
                let seqs = config.max_num_seqs;
                return Ok((self.baseline(config)?, seqs));
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
