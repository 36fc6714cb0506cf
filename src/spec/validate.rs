//! Every combination of [`EngineSpec`] settings that an engine cannot honour, checked in one place
//! before anything loads. Each is a [`SpecError`] naming the flag and what to do instead.

use burn_llm_models::Precision;

use super::parallel::PrefillSlices;
use super::{EngineKind, EngineSpec, Purpose, ScheduleKind};

/// A setting the engine cannot honour: which flag, why, and what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {problem}; {fix}")]
pub struct SpecError {
    /// The flag (or flags) at fault, as written on the command line.
    pub flag: String,
    /// What is wrong with it.
    pub problem: String,
    /// What to do instead.
    pub fix: String,
}

impl SpecError {
    pub(super) fn new(flag: impl Into<String>, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { flag: flag.into(), problem: problem.into(), fix: fix.into() }
    }
}

type Check = Result<(), SpecError>;

/// The first flag of `flags` that was given, if any.
fn first_given(flags: &[(&'static str, bool)]) -> Option<&'static str> {
    flags.iter().find(|(_, given)| *given).map(|(flag, _)| *flag)
}

impl EngineSpec {
    /// Checks that the engine of kind `kind`, built for `purpose`, can honour every setting; the
    /// error names the first one it cannot and what to do instead.
    pub fn validate(&self, kind: EngineKind, purpose: Purpose<'_>) -> Check {
        self.check_engine_flags(kind)?;
        self.check_purpose(kind, purpose)?;
        self.check_quantization(kind)?;
        self.check_schedule()?;
        self.check_offload()?;
        self.check_parallel(kind)
    }

    /// The paged engine's flags with `paged`, the offloading engine's with `offload`.
    fn check_engine_flags(&self, kind: EngineKind) -> Check {
        let (p, o) = (&self.paged, &self.offload);
        let paged_only = [
            ("--kv-cache-memory", p.kv_cache_memory.is_some()),
            ("--block-size", p.block_size.is_some()),
            ("--max-num-seqs", p.max_num_seqs.is_some()),
            ("--max-num-batched-tokens", p.max_num_batched_tokens.is_some()),
            ("--preemption", p.preemption.is_some()),
            ("--no-enable-prefix-caching", p.no_enable_prefix_caching),
            ("--no-chunked-prefill", p.no_chunked_prefill),
            ("PagedSpec::scheduling", p.scheduling.is_some()),
            ("--schedule", p.schedule.is_some()),
            ("--plan", p.plan.is_some()),
            ("--latency-bound-s", p.latency_bound_s.is_some()),
            ("--profile-json", p.profile_json.is_some()),
            ("--micro-batches", self.parallel.micro_batches.is_some()),
            ("--virtual-engines", self.parallel.virtual_engines.is_some()),
        ];
        let offload_only = [
            ("--gpu-mem", o.gpu_mem.is_some()),
            ("--cpu-mem", o.cpu_mem.is_some()),
            ("--offload-dir", o.offload_dir.is_some()),
            ("--policy", o.policy.is_some()),
            ("--percent", o.percent.is_some()),
            ("--gbs", o.gbs.is_some()),
            ("--num-gb", o.num_gb.is_some()),
            ("--cpu-attention", o.cpu_attention),
            ("--no-overlap", o.no_overlap),
            ("--attn-sparsity", o.attn_sparsity.is_some()),
            ("--thread-control", o.thread_control),
            ("--profile", o.profile.is_some()),
        ];
        for (only, flags) in [(EngineKind::Paged, &paged_only[..]), (EngineKind::Offload, &offload_only[..])] {
            if kind != only
                && let Some(flag) = first_given(flags)
            {
                return Err(SpecError::new(
                    flag,
                    format!("applies to --engine {}, not {}", only.name(), kind.name()),
                    format!("add --engine {} or drop {flag}", only.name()),
                ));
            }
        }
        Ok(())
    }

    /// What a server needs: an engine that runs requests step by step, and no planning from
    /// prompts it does not have.
    fn check_purpose(&self, kind: EngineKind, purpose: Purpose<'_>) -> Check {
        if !matches!(purpose, Purpose::Serve) {
            return Ok(());
        }
        if kind != EngineKind::Paged {
            return Err(SpecError::new(
                "--engine",
                format!("the {} engine cannot serve requests (it has no add_request / step / abort)", kind.name()),
                "serve with --engine paged (the server's default)",
            ));
        }
        if self.paged.latency_bound_s.is_some() {
            return Err(SpecError::new(
                "--latency-bound-s",
                "plans an ExeGPT schedule for the run's prompts, and a server has none at start-up",
                "plan offline (`cargo run --example plan -- schedule`) and serve with --plan FILE.json",
            ));
        }
        Ok(())
    }

    /// Weight and KV-cache quantization: one spelling each, groups only with `--quantize`, and no
    /// quantized KV cache where the engine's cache cannot store one (paged blocks over several
    /// devices).
    fn check_quantization(&self, kind: EngineKind) -> Check {
        if self.quantize.is_some() && self.compress_weight {
            return Err(SpecError::new(
                "--quantize, --compress-weight",
                "both quantize the weights",
                "give one (--compress-weight is --quantize w4 --group-size 64)",
            ));
        }
        if self.group_size.is_some() && self.quantize.is_none() {
            return Err(SpecError::new(
                "--group-size",
                "sets the groups of --quantize, which is not given (--compress-weight always uses 64)",
                "add --quantize w4|w8 or drop --group-size",
            ));
        }
        if self.kv_quant.is_some() && self.compress_cache {
            return Err(SpecError::new(
                "--kv-quant, --compress-cache",
                "both quantize the KV cache",
                "give one (--compress-cache is --kv-quant 4)",
            ));
        }
        self.kv_quant_spec().map_err(|e| {
            SpecError::new("--kv-group-size", e, "give --kv-quant 4|8 with a group size that tiles the head")
        })?;
        let kv_flag = if self.compress_cache { "--compress-cache" } else { "--kv-quant" };
        if kind == EngineKind::Paged && (self.kv_quant.is_some() || self.compress_cache) && self.parallel.is_set() {
            return Err(SpecError::new(
                kv_flag,
                "the paged engine quantizes its KV blocks on one device only, not over several (--devices, \
                 pipeline or tensor-parallel stages, disaggregated prefill and decode)",
                format!("run the paged engine on one device for a quantized KV cache, or drop {kv_flag}"),
            ));
        }
        self.weight_quant().map_err(|e| SpecError::new("--quantize/--group-size", e, "choose another group size"))?;
        Ok(())
    }

    /// `--schedule exegpt` and the flags that give or make its plan, which mean nothing without it.
    fn check_schedule(&self) -> Check {
        let p = &self.paged;
        let exegpt = p.schedule == Some(ScheduleKind::Exegpt);
        let planning = [
            ("--plan", p.plan.is_some()),
            ("--latency-bound-s", p.latency_bound_s.is_some()),
            ("--profile-json", p.profile_json.is_some()),
        ];
        if p.scheduling.is_some() && p.schedule.is_some() {
            return Err(SpecError::new(
                "--schedule",
                "names a policy, and PagedSpec::scheduling gives one",
                "set one of them",
            ));
        }
        if !exegpt && let Some(flag) = first_given(&planning) {
            return Err(SpecError::new(
                flag,
                "gives or makes an ExeGPT plan, and --schedule exegpt is not set",
                format!("add --schedule exegpt or drop {flag}"),
            ));
        }
        if exegpt && p.plan.is_none() && p.latency_bound_s.is_none() {
            return Err(SpecError::new(
                "--schedule exegpt",
                "needs a plan",
                "give --plan FILE.json, or --latency-bound-s SECONDS (with --profile-json FILE to reuse a saved profile)",
            ));
        }
        if let Some(bound) = p.latency_bound_s.filter(|b| !(b.is_finite() && *b > 0.0)) {
            return Err(SpecError::new(
                "--latency-bound-s",
                format!("must be a positive number of seconds, got {bound}"),
                "give the latency bound in seconds, e.g. 5",
            ));
        }
        if (p.schedule.is_some() || p.scheduling.is_some()) && self.parallel.is_set() && !self.exegpt_over_two_devices()
        {
            return Err(SpecError::new(
                "--schedule",
                "plans and runs schedules on one device, or ExeGPT's on exactly two --devices",
                "drop --schedule or the parallelism flags, or give --schedule exegpt with two --devices and no other parallelism flag",
            ));
        }
        // ExeGPT's `--stage-layers auto` splits from the ExeGPT profile, not from the devices'
        // own profiles and memory caps.
        let stage_flags = [
            ("--device-memory", self.parallel.device_memory.is_some()),
            ("--stage-profile-dir", self.parallel.stage_profile_dir.is_some()),
        ];
        if self.exegpt_over_two_devices()
            && let Some(flag) = first_given(&stage_flags)
        {
            return Err(SpecError::new(
                flag,
                "applies to --stage-layers auto over profiled devices, and --schedule exegpt splits its pipeline from the ExeGPT profile",
                format!("drop {flag}"),
            ));
        }
        Ok(())
    }

    /// The offloading policy: searched (`--policy auto`) or given (`--percent` with `--gbs`,
    /// `--num-gb`), not both, and each number in range.
    fn check_offload(&self) -> Check {
        let o = &self.offload;
        match (o.policy.as_deref(), &o.percent) {
            (Some(other), _) if other != "auto" => {
                return Err(SpecError::new(
                    "--policy",
                    format!("`{other}` is not a policy"),
                    "use --policy auto, or give the policy with --percent wg wc cg cc hg hc",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(SpecError::new(
                    "--policy auto, --percent",
                    "the first searches the policy and the second gives one",
                    "give one of them",
                ));
            }
            (None, None) => {
                if let Some(flag) = first_given(&[("--gbs", o.gbs.is_some()), ("--num-gb", o.num_gb.is_some())]) {
                    return Err(SpecError::new(
                        flag,
                        "sizes the batches of a policy given with --percent; the search (--policy auto) chooses them",
                        format!("add --percent wg wc cg cc hg hc, or drop {flag}"),
                    ));
                }
            }
            _ => {}
        }
        if let Some(percent) = &o.percent {
            check_percent(percent)?;
        }
        if o.gbs == Some(0) || o.num_gb == Some(0) {
            return Err(SpecError::new("--gbs/--num-gb", "must be at least 1", "give a positive batch size and count"));
        }
        if let Some(s) = o.attn_sparsity.filter(|s| !(s.is_finite() && *s > 0.0 && *s <= 1.0)) {
            return Err(SpecError::new(
                "--attn-sparsity",
                format!("is the fraction of keys kept, in (0, 1], got {s}"),
                "give e.g. 0.1",
            ));
        }
        Ok(())
    }

    /// Parallelism: plain and paged engines only, in f32, with the worker flags only for workers.
    fn check_parallel(&self, kind: EngineKind) -> Check {
        let parallel = &self.parallel;
        let workers = !parallel.workers().is_empty();
        for (flag, given) in [
            ("--worker-token", self.worker_token.is_some()),
            ("--worker-timeout-s", parallel.worker_timeout_s.is_some()),
        ] {
            if given && !workers {
                return Err(SpecError::new(
                    flag,
                    "applies to remote workers, and --devices names none (ws://HOST:PORT entries)",
                    format!("add the workers to --devices, or drop {flag}"),
                ));
            }
        }
        for (flag, given) in [
            ("--device-memory", parallel.device_memory.is_some()),
            ("--stage-profile-dir", parallel.stage_profile_dir.is_some()),
        ] {
            if given && !parallel.is_auto() {
                return Err(SpecError::new(
                    flag,
                    "applies to planned stages (--stage-layers auto)",
                    format!("add --stage-layers auto, or drop {flag}"),
                ));
            }
        }
        if let Some(timeout) = parallel.worker_timeout_s.filter(|t| !(t.is_finite() && *t > 0.0)) {
            return Err(SpecError::new(
                "--worker-timeout-s",
                format!("must be a positive number of seconds, got {timeout}"),
                "give e.g. 120",
            ));
        }
        if !parallel.is_set() {
            return Ok(());
        }
        self.check_prefill_slices(kind)?;
        self.check_virtual_engines()?;
        if kind == EngineKind::Offload {
            return Err(SpecError::new(
                "--devices, --pipeline-parallel-size, --tensor-parallel-size, --stage-layers, --micro-batches",
                "apply to --engine plain and paged: the offload engine places weights itself",
                "drop them, or use --engine plain or paged",
            ));
        }
        if self.device.is_some() && parallel.devices.is_some() {
            return Err(SpecError::new(
                "--device",
                "is the device of every stage when --devices is absent, and --devices names each stage's",
                "drop --device, or drop --devices",
            ));
        }
        if self.dtype.is_some_and(|p| p != Precision::F32) {
            return Err(SpecError::new(
                "--dtype",
                "f16 and bf16 are not available over several devices yet (stages run in f32)",
                "use --dtype f32 or drop the parallelism flags",
            ));
        }
        Ok(())
    }
}

impl EngineSpec {
    /// `--prefill-slices` (other than `off`) needs the paged engine over two stages or more.
    fn check_prefill_slices(&self, kind: EngineKind) -> Check {
        let slicing = self.parallel.prefill_slices.filter(|s| *s != PrefillSlices::Off);
        if slicing.is_none() {
            return Ok(());
        }
        if kind != EngineKind::Paged {
            return Err(SpecError::new(
                "--prefill-slices",
                format!(
                    "slices prompts in the paged engine's steps, and the {} engine prefills in one pass",
                    kind.name()
                ),
                "add --engine paged, or drop --prefill-slices",
            ));
        }
        let stages = self.parallel.stages_hint();
        if stages < 2 {
            return Err(SpecError::new(
                "--prefill-slices",
                "overlaps token slices across pipeline stages, and this run has one stage",
                "split the model with --pipeline-parallel-size N (N ≥ 2) or --devices, or drop --prefill-slices (one device: chunked prefill cuts long prompts)",
            ));
        }
        Ok(())
    }

    /// `--virtual-engines`: at least one, and more only over pipeline stages and without ExeGPT's
    /// schedule (which sets the batches itself). Paged-only is checked with the other paged flags.
    fn check_virtual_engines(&self) -> Check {
        let Some(n) = self.parallel.virtual_engines else { return Ok(()) };
        if n == 0 {
            return Err(SpecError::new(
                "--virtual-engines",
                "must be at least 1",
                "give the number of pipeline stages, or 1",
            ));
        }
        if n > 1 && self.parallel.stages_hint() < 2 {
            return Err(SpecError::new(
                "--virtual-engines",
                "overlaps engines' steps across pipeline stages, and this run has one stage",
                "split the model with --pipeline-parallel-size N (N ≥ 2) or --devices, or drop --virtual-engines",
            ));
        }
        if n > 1 && self.paged.schedule == Some(ScheduleKind::Exegpt) {
            return Err(SpecError::new(
                "--virtual-engines",
                "ExeGPT's plan sets the batches and the devices' roles itself",
                "drop --virtual-engines, or drop --schedule exegpt",
            ));
        }
        Ok(())
    }
}

/// FlexGen's six placement percentages: each in [0, 100], and each tensor's GPU and CPU shares
/// together at most 100 (the rest goes to disk).
fn check_percent(percent: &[f64]) -> Check {
    let bad = |problem: String| SpecError::new("--percent", problem, "give six percentages wg wc cg cc hg hc");
    let [wg, wc, cg, cc, hg, hc] = percent else {
        return Err(bad(format!("takes 6 numbers, got {}", percent.len())));
    };
    if let Some(v) = percent.iter().find(|v| !(v.is_finite() && (0.0..=100.0).contains(*v))) {
        return Err(bad(format!("{v} is not a percentage in [0, 100]")));
    }
    for (what, g, c) in [("weights", wg, wc), ("cache", cg, cc), ("activations", hg, hc)] {
        if g + c > 100.0 + 1e-9 {
            return Err(bad(format!("the {what}' GPU and CPU shares add up to {} > 100", g + c)));
        }
    }
    Ok(())
}
