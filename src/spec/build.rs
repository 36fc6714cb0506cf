//! [`EngineSpec::init`]: the one place every engine is built, on one device or over pipeline
//! stages, after [`EngineSpec::validate`].

use std::error::Error;
use std::io::Write;
use std::path::Path;

use burn::tensor::Device;
use burn_llm_kernels::MatmulPrecision;
use burn_llm_models::cache::{KvLayout, fit_kv_quant};
use burn_llm_models::{CausalLm, Generator, LanguageModel, Pretrained, PretrainedFiles, Prompt};
use burn_offload::policy::{OffloadWorkload, Placement, Policy, PolicyShape, SearchSpace};
use burn_offload::{OffloadConfig, OffloadEngine, PolicyChoice};
use burn_paged::{EngineConfig, LlmEngine, SchedulingPolicy};

use super::precision::Precise;
use super::quant::fit_cache_compression;
use super::{DEFAULT_CPU_MEM, DEFAULT_GPU_MEM, EngineKind, EngineSpec, Purpose, parallel};
use crate::device::DeviceChoice;
use crate::engine::Engine;
use crate::schedule;

/// The offload engine's default GPU batch size and batch count with `--percent`.
const DEFAULT_GBS: u32 = 4;
const DEFAULT_NUM_GB: u32 = 1;

impl EngineSpec {
    /// Validates the spec for `purpose`, then builds its engine for the model in `model` (a
    /// directory or a `.gguf` file, already resolved from the hub). Notes on what was chosen
    /// (precision fallbacks, placements, plans) go to `log`.
    pub fn init(
        &self,
        model: &Path,
        purpose: Purpose<'_>,
        log: &mut dyn Write,
    ) -> Result<Box<dyn Engine>, Box<dyn Error>> {
        let kind = self.kind();
        self.validate(kind, purpose)?;
        let choice = self.device_choice();
        let device = choice.device()?;
        if kind == EngineKind::Paged && self.exegpt_over_two_devices() {
            return super::disagg::build(self, model, purpose, log);
        }
        if self.parallel.is_set() {
            return parallel::build_parallel_engine(self, kind, model, (choice.name(), &device), log);
        }
        if kind == EngineKind::Offload {
            let engine = self.build_offload(model, &device, choice, purpose, log)?;
            return Ok(self.with_precision(Box::new(engine)));
        }
        let (precision, note) = choice.precision(self.dtype, &device)?;
        if let Some(note) = note {
            writeln!(log, "{note}")?;
        }
        let mut pretrained = PretrainedFiles::open(model)?.with_precision(precision).load(&device)?;
        if let Some(spec) = self.weight_quant()? {
            pretrained.model = pretrained.model.quantize_weights(spec)?;
        }
        pretrained.model = fuse_on_gpu(pretrained.model);
        let engine: Box<dyn Engine> = match kind {
            EngineKind::Paged => {
                let scheduling = self.scheduling_policy(&pretrained, purpose, log)?;
                Box::new(LlmEngine::new(pretrained, EngineConfig { scheduling, ..self.engine_config() })?)
            }
            _ => Box::new(self.plain_generator(Generator::from(pretrained))?),
        };
        Ok(self.with_precision(engine))
    }

    /// How the engine's CPU kernels multiply GGUF-layout weights: `--exact-matmul`, else on
    /// 8-bit input rows.
    pub fn matmul_precision(&self) -> MatmulPrecision {
        if self.exact_matmul { MatmulPrecision::Exact } else { MatmulPrecision::Int8Activations }
    }

    /// `engine`, running every call at the spec's matmul precision.
    pub fn with_precision(&self, engine: Box<dyn Engine>) -> Box<dyn Engine> {
        Box::new(Precise::new(engine, self.matmul_precision()))
    }

    /// The plain generator over `generator`'s model with the spec's KV-cache quantization.
    pub fn plain_generator<M: LanguageModel>(&self, generator: Generator<M>) -> burn_llm_models::Result<Generator<M>> {
        match self.kv_quant_spec().map_err(burn_llm_models::ModelError::Quantization)? {
            Some(spec) => {
                let spec = fit_kv_quant(generator.model().kv_layout(), spec)?;
                generator.with_kv_quantization(spec)
            }
            None => Ok(generator),
        }
    }

    /// The paged engine's scheduling policy for `model` (whose KV-cache pool is the planner's
    /// memory): FCFS or a baseline, a saved ExeGPT plan (`--plan`), or one made now
    /// (`--latency-bound-s`, from the run's prompts and `max_new_tokens`).
    fn scheduling_policy(
        &self,
        model: &Pretrained,
        purpose: Purpose<'_>,
        log: &mut dyn Write,
    ) -> Result<SchedulingPolicy, Box<dyn Error>> {
        if let Some(policy) = self.planless_policy() {
            return Ok(policy);
        }
        let p = &self.paged;
        let plan = match (&p.plan, p.latency_bound_s, purpose) {
            (Some(_), _, _) => return self.saved_plan(log),
            (None, Some(bound), Purpose::Generate { prompts, params }) => {
                let config = self.engine_config();
                let workload = schedule::ScheduleWorkload::new(model, &config, prompts, params.max_new_tokens)?;
                let profile =
                    schedule::load_or_profile(p.profile_json.as_deref(), &model.model, workload.max_num_seqs, log)?;
                schedule::plan_rra(profile, &workload, bound)?
            }
            // `validate` refuses the other combinations.
            _ => return Err(Box::new(self.validate(EngineKind::Paged, purpose).err().unwrap_or_else(refused))),
        };
        let policy = schedule::phased_policy(&plan)?;
        writeln!(log, "{}", schedule::describe(&plan))?;
        Ok(policy)
    }

    /// The phased policy of the ExeGPT plan saved in `--plan`.
    pub(super) fn saved_plan(&self, log: &mut dyn Write) -> Result<SchedulingPolicy, Box<dyn Error>> {
        let path = self.paged.plan.as_deref().ok_or_else(refused)?;
        let plan = schedule::read_plan(path)?;
        let policy = schedule::phased_policy(&plan)?;
        writeln!(log, "{}", schedule::describe(&plan))?;
        Ok(policy)
    }

    /// The offloading policy: `--percent` (with `--gbs`, `--num-gb` and the switches) or the
    /// search (`--policy auto`, the default). `--compress-weight` and `--compress-cache` are
    /// FlexGen's 4-bit groups of 64.
    pub fn offload_policy(&self) -> Result<PolicyChoice, String> {
        let (compress_weights, compress_cache) = self.compression()?;
        let o = &self.offload;
        match &o.percent {
            Some(p) if p.len() == 6 => {
                let [wg, wc, cg, cc, hg, hc] = [p[0], p[1], p[2], p[3], p[4], p[5]].map(|v| v / 100.0);
                let rest = |g: f64, c: f64| Placement::from_array([g, c, (1.0 - g - c).max(0.0)]);
                Ok(PolicyChoice::Fixed(Policy {
                    shape: PolicyShape {
                        gpu_batch_size: o.gbs.unwrap_or(DEFAULT_GBS),
                        num_gpu_batches: o.num_gb.unwrap_or(DEFAULT_NUM_GB),
                        cpu_attention: o.cpu_attention,
                        overlap: !o.no_overlap,
                        compress_weights,
                        compress_cache,
                    },
                    weights: rest(wg, wc),
                    cache: rest(cg, cc),
                    activations: rest(hg, hc),
                }))
            }
            Some(p) => Err(format!("--percent takes 6 numbers (wg wc cg cc hg hc), got {}", p.len())),
            None => {
                let mut space = SearchSpace { overlap: !o.no_overlap, ..SearchSpace::default() };
                if compress_weights.is_some() {
                    space.weight_compression = vec![compress_weights];
                }
                if compress_cache.is_some() {
                    space.cache_compression = vec![compress_cache];
                }
                if o.cpu_attention {
                    space.cpu_attention = vec![true];
                }
                Ok(PolicyChoice::Auto(space))
            }
        }
    }

    /// `--engine offload`: opens the weights without loading them, measures (or reads) the hardware
    /// profile, and places the weights per the chosen or searched policy for the run's workload.
    fn build_offload(
        &self,
        path: &Path,
        device: &Device,
        choice: DeviceChoice,
        purpose: Purpose<'_>,
        log: &mut dyn Write,
    ) -> Result<OffloadEngine, Box<dyn Error>> {
        let Purpose::Generate { prompts, params } = purpose else {
            return Err(Box::new(self.validate(EngineKind::Offload, purpose).err().unwrap_or_else(refused)));
        };
        let o = &self.offload;
        let (precision, note) = choice.precision(self.dtype, device)?;
        if let Some(note) = note {
            writeln!(log, "{note}")?;
        }
        let files = PretrainedFiles::open(path)?.with_precision(precision);
        let host = Device::flex();
        let cache = dirs_cache().join("offload");
        let offload_dir = o.offload_dir.clone().unwrap_or_else(|| cache.join("tensors"));
        let profile_path = o.profile.clone().unwrap_or_else(|| cache.join(format!("profile-{}.json", choice.name())));
        let hardware = burn_offload::profiler::load_or_profile(&profile_path, device, &host, &offload_dir)?;
        let prompt_len = longest_prompt(&files, prompts)?;
        let threads = if o.thread_control {
            let shape = burn_offload::model_shape(&files.spec);
            let profile = burn_offload::profiler::profile_threads(
                &host,
                &offload_dir,
                8,
                512,
                shape.layer_weight_bytes() as usize,
            )?;
            let plan = burn_offload::policy::choose_threads(&profile)?;
            writeln!(
                log,
                "thread control: {} intra-op threads for compute, {:?} for weight loading (predicted step {:.1} ms)",
                plan.intra_op_compute,
                plan.io_threads,
                plan.step_seconds * 1e3
            )?;
            Some(plan)
        } else {
            None
        };
        let config = OffloadConfig {
            gpu_mem: o.gpu_mem.unwrap_or(DEFAULT_GPU_MEM),
            cpu_mem: o.cpu_mem.unwrap_or(DEFAULT_CPU_MEM),
            offload_dir,
            policy: fit_cache_compression(self.offload_policy()?, KvLayout::of(&files.spec))?,
            hardware,
            workload: OffloadWorkload::new(prompt_len as u64, params.max_new_tokens as u64),
            host,
            attention_sparsity: o.attn_sparsity,
            threads,
        };
        Ok(OffloadEngine::new(
            files.spec.clone(),
            &files.files,
            Some(files.tokenizer),
            files.eos_token_ids,
            config,
            device,
        )?)
    }
}

/// The longest of `prompts` in tokens (1 when there are none): the offload policy's prompt length.
fn longest_prompt(files: &PretrainedFiles, prompts: &[Prompt]) -> burn_llm_models::Result<usize> {
    let lens = prompts.iter().map(|p| {
        let spec = &files.spec;
        burn_llm_models::generation::prepare_prompt(0, p, Some(&files.tokenizer), spec.vocab_size, spec.max_positions)
            .map(|(_, ids)| ids.len())
    });
    Ok(lens.collect::<Result<Vec<_>, _>>()?.into_iter().max().unwrap_or(1))
}

/// The error for a combination that `validate` refuses, should a caller skip it.
pub(super) fn refused() -> super::SpecError {
    super::SpecError {
        flag: "--schedule exegpt".into(),
        problem: "has no plan for this use".into(),
        fix: "give --plan FILE.json".into(),
    }
}

/// `~/.cache/burn-llm`.
pub(crate) fn dirs_cache() -> std::path::PathBuf {
    std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".cache/burn-llm")
}

/// `model` with q|k|v and gate|up fused into one projection each ([`CausalLm::fuse_projections`])
/// when it runs on a GPU, where every product is a kernel launch; on the host as it is (the Flex
/// loops gain nothing there that has been measured). For the plain and paged engines on one
/// device: tensor parallelism and offloading shard and move projections one by one.
pub(crate) fn fuse_on_gpu(model: CausalLm) -> CausalLm {
    if burn_llm_models::device::is_host_device(&model.device()) { model } else { model.fuse_projections() }
}
