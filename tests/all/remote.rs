//! Remote workers: `examples/worker.rs` processes started on free loopback ports serve a device;
//! our kernels, plain and paged generation and a quantized model run there with the same results
//! as on local Flex; bad tokens, bad addresses and unreachable workers are clear errors before
//! any work; a worker killed or stopped mid-generation is an error naming it within the timeout;
//! tensors move between two workers; a worker stops cleanly on SIGTERM.
//!
//! The worker binary is built by `cargo test` (or `cargo build --examples`) next to this test
//! executable, in `target/debug/examples/worker`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_llm::device::{RemoteDeviceError, WatchedEngine, WorkerError, remote_device};
use burn_llm::kernels::{self, QuantSpec};
use burn_llm::models::LanguageModel;
use burn_llm::models::cache::{KV_QUANT_AXIS, fit_kv_quant};
use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm::models::{ContiguousKvCache, PretrainedFiles, Prompt, SamplingParams};
use burn_llm::paged::{EngineConfig, KvCacheMemory, LlmEngine};
use burn_llm::parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};
use burn_llm::{Engine, EngineError, Generator, Pretrained};
use rand::{Rng, SeedableRng};

use crate::common::{fixture, max_abs_diff, reference};
use crate::parallel::{cli, text};

pub(crate) const TOKEN: &str = "test-token-0123";

/// A worker process, killed when dropped.
pub(crate) struct Worker {
    child: Child,
    /// `ws://127.0.X.Y:PORT` ([`loopback_address`]).
    pub(crate) url: String,
}

/// A loopback address no earlier worker of this test process listened on. Burn keeps one client
/// per worker address for the whole process, so a worker that got the port of one that died (a
/// killed or stalled worker's test) would be reached through the dead one's client, and every
/// read would wait forever. Linux routes all of 127.0.0.0/8 to the loopback interface; elsewhere
/// only 127.0.0.1 is certain, and the port alone tells workers apart.
fn loopback_address() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    if cfg!(target_os = "linux") {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % (254 * 254);
        format!("127.0.{}.{}:0", n / 254, n % 254 + 1)
    } else {
        "127.0.0.1:0".into()
    }
}

/// The worker example next to this test executable (`target/debug/examples/worker`).
fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("examples/worker");
    assert!(bin.exists(), "{} is missing: build it with `cargo test --workspace --no-run`", bin.display());
    bin
}

impl Worker {
    /// Starts a worker serving `device` with the test token on a free loopback port and waits
    /// (bounded) for its ready line.
    pub(crate) fn start(device: &str) -> Self {
        Self::start_with(device, &[])
    }

    /// [`Worker::start`] with `extra` worker flags (`--threads 1`).
    pub(crate) fn start_with(device: &str, extra: &[&str]) -> Self {
        let mut child = Command::new(worker_binary())
            .args(["--listen", &loopback_address(), "--device", device, "--token", TOKEN])
            .args(extra)
            .env_remove("BURN_LLM_WORKER_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let (tx, rx) = mpsc::channel();
        // Reads the ready line, then keeps draining stdout so the worker never blocks on it.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            lines.for_each(drop);
        });
        let line = match rx.recv_timeout(Duration::from_secs(180)) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                panic!("the {device} worker did not get ready: {other:?}");
            }
        };
        let url = line
            .strip_prefix("worker ready on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected ready line `{line}`"))
            .to_owned();
        Worker { child, url }
    }

    pub(crate) fn device(&self) -> Device {
        remote_device(&self.url, Some(TOKEN)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The worker's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`-KILL`, `-STOP`, `-TERM`) to the worker.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

fn random(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// Every kernel op of ours, run on `device` over fixed random inputs: the outputs, flattened.
fn kernel_outputs(device: &Device) -> Vec<(&'static str, Vec<f32>)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let t2 = |rng: &mut _, shape: [usize; 2]| {
        Tensor::<2>::from_data(TensorData::new(random(rng, shape[0] * shape[1]), shape), device)
    };
    let mut out = Vec::new();

    let w = t2(&mut rng, [64, 96]);
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 32, 1).unwrap();
        let q = kernels::quantize(w.clone(), spec).unwrap();
        let codes = q.codes.clone().into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
        // Each 32-bit word as two exact 16-bit halves.
        out.push(("codes", codes.iter().flat_map(|&c| [(c & 0xffff) as f32, (c >> 16) as f32]).collect()));
        out.push(("dequantize", values(kernels::dequantize(&q))));
        out.push(("qmatmul", values(kernels::qmatmul(t2(&mut rng, [3, 64]), &q).unwrap())));
        out.push(("qmatmul_transposed", values(kernels::qmatmul_transposed(t2(&mut rng, [2, 96]), &q).unwrap())));
        // Prefill-sized inputs, for which a worker's server picks the product it runs.
        let rows = kernels::MATVEC_MAX_ROWS + 8;
        out.push(("qmatmul, prefill rows", values(kernels::qmatmul(t2(&mut rng, [rows, 64]), &q).unwrap())));
        let x = t2(&mut rng, [rows, 96]);
        out.push(("qmatmul_transposed, prefill rows", values(kernels::qmatmul_transposed(x, &q).unwrap())));
    }

    let shape = [6, 2, 4, 8];
    let cache =
        |rng: &mut _| Tensor::<4>::from_data(TensorData::new(random(rng, shape.iter().product()), shape), device);
    let (mut k, mut v) = (cache(&mut rng), cache(&mut rng));
    let new = Tensor::<3>::from_data(TensorData::new(random(&mut rng, 5 * 2 * 8), [5, 2, 8]), device);
    let slots = [3, kernels::SKIP_SLOT, 17, 0, 23];
    kernels::reshape_and_cache_mut(&mut k, new.clone(), &slots).unwrap();
    kernels::reshape_and_cache_mut(&mut v, new, &slots).unwrap();
    kernels::copy_blocks_mut(&mut k, &[(1, 4), (1, 5)]).unwrap();
    let blocks = Tensor::<4>::from_data(TensorData::new(random(&mut rng, 2 * 2 * 4 * 8), [2, 2, 4, 8]), device);
    kernels::write_blocks_mut(&mut v, &[2, 0], blocks).unwrap();
    out.push(("read_blocks", values(kernels::read_blocks(&k, &[5, 2]).unwrap())));
    let q = Tensor::<3>::from_data(TensorData::new(random(&mut rng, 3 * 4 * 8), [3, 4, 8]), device);
    let attention = kernels::paged_attention(q, &k, &v, &[0, 2, 4, 1, 5, 3], 3, &[0, 1, 1], &[9, 5, 12], 0.35).unwrap();
    out.push(("paged_attention", values(attention)));
    out.push(("k_cache", values(k)));
    out.push(("v_cache", values(v)));
    out
}

fn assert_same_outputs(what: &str, remote: &[(&str, Vec<f32>)], local: &[(&str, Vec<f32>)]) {
    assert_eq!(remote.len(), local.len());
    for ((name, r), (_, l)) in remote.iter().zip(local) {
        let diff = max_abs_diff(r, l);
        assert!(diff <= 1e-5, "{what}: {name} differs from local flex by {diff}");
    }
}

/// Our kernels on a remote Flex worker (and a remote wgpu worker unless `BURN_LLM_TEST_WGPU=0`)
/// give local Flex's results: the Flex worker's in the caller's precision (8-bit input rows for
/// GGUF-layout matmuls by default, exact under `with_matmul_precision`), the wgpu worker's in the exact precision its kernels
/// compute in.
#[test]
fn kernels_on_remote_workers_equal_local() {
    let local = kernel_outputs(&Device::flex());
    let flex = Worker::start("flex");
    assert_same_outputs("flex worker", &kernel_outputs(&flex.device()), &local);
    // The client's precision travels with the op: an exact caller gets exact results from a
    // worker whose own default is 8-bit input rows.
    let exact = || kernels::with_matmul_precision(kernels::MatmulPrecision::Exact, || kernel_outputs(&flex.device()));
    let local_exact =
        kernels::with_matmul_precision(kernels::MatmulPrecision::Exact, || kernel_outputs(&Device::flex()));
    assert_same_outputs("flex worker, exact matmul", &exact(), &local_exact);
    if std::env::var("BURN_LLM_TEST_WGPU").map(|v| v != "0").unwrap_or(true) {
        let exact = kernels::with_matmul_precision(kernels::MatmulPrecision::Exact, || kernel_outputs(&Device::flex()));
        let wgpu = Worker::start("wgpu");
        assert_same_outputs("wgpu worker", &kernel_outputs(&wgpu.device()), &exact);
    }
}

/// Greedy tokens of `engine` for the fixture's reference prompts.
fn greedy_ids(engine: &mut dyn Engine, prompts: &[Prompt], tokens: usize) -> Vec<Vec<u32>> {
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(tokens) };
    let out = engine.generate(prompts, &params).unwrap();
    out.output.requests.iter().map(|r| r.generated_ids.clone()).collect()
}

/// All-position logits of `model` for `ids`.
fn logits(model: &Pretrained, ids: &[u32], device: &Device) -> Vec<f32> {
    let mut cache = ContiguousKvCache::new(model.model.kv_layout(), 1, ids.len(), device);
    let step = cache.begin_step(&[ids]).unwrap();
    values(model.model.forward_all_logits(&step, &mut cache).unwrap())
}

/// Loads the fixture on `device`, uploading its weights once; returns the model and the upload
/// time.
fn load(name: &str, device: &Device, quantize: bool) -> (Pretrained, Duration) {
    let files = PretrainedFiles::open(&fixture(name)).unwrap();
    let start = Instant::now();
    let mut model = files.load(device).unwrap();
    if quantize {
        model.model = model.model.quantize_weights(QuantSpec::new(8, 32, WEIGHT_QUANT_AXIS).unwrap()).unwrap();
    }
    device.sync().unwrap();
    (model, start.elapsed())
}

/// A whole model on a remote Flex worker: plain and paged greedy generation (float and 8-bit KV
/// blocks) and a model with 8-bit fused-matmul weights give local Flex's tokens, and logits
/// within 1e-4.
#[test]
fn models_on_a_remote_worker_equal_local() {
    let worker = Worker::start("flex");
    let remote = worker.device();
    let local = Device::flex();
    for name in ["llama", "opt", "gpt2"] {
        let reference = reference(name);
        let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
        for quantize in [false, true] {
            let (here, _) = load(name, &local, quantize);
            let (there, upload) = load(name, &remote, quantize);
            let bytes: u64 = std::fs::read_dir(fixture(name))
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.path().extension().is_some_and(|x| x == "safetensors")
                        && !e.path().ends_with("reference.safetensors")
                })
                .map(|e| e.metadata().unwrap().len())
                .sum();
            eprintln!(
                "{name} (quantized: {quantize}): weights ({bytes} bytes on disk) moved to the worker in {upload:?}"
            );
            for prompt in &reference.prompts {
                let diff = max_abs_diff(
                    &logits(&there, &prompt.input_ids, &remote),
                    &logits(&here, &prompt.input_ids, &local),
                );
                assert!(diff <= 1e-4, "{name} (quantized: {quantize}): remote logits differ by {diff}");
            }
            let expected = greedy_ids(&mut Generator::from(here), &prompts, 12);
            let config = || EngineConfig {
                block_size: 4,
                kv_cache_memory: KvCacheMemory::Blocks(128),
                swap_space: 1 << 26,
                ..EngineConfig::default()
            };
            if !quantize {
                let (again, _) = load(name, &remote, false);
                let mut paged = LlmEngine::new(again, config()).unwrap();
                assert_eq!(greedy_ids(&mut paged, &prompts, 12), expected, "{name}: paged engine on the worker");
                // 8-bit KV blocks on the worker: its dequantizing PagedAttention gives the local
                // plain engine's tokens with the same quantized cache.
                let kv8 = QuantSpec::new(8, 64, KV_QUANT_AXIS).unwrap();
                let (local_model, _) = load(name, &local, false);
                let spec = fit_kv_quant(local_model.model.kv_layout(), kv8).unwrap();
                let mut quantized = Generator::from(local_model).with_kv_quantization(spec).unwrap();
                let expected_kv8 = greedy_ids(&mut quantized, &prompts, 12);
                let (again, _) = load(name, &remote, false);
                let mut paged = LlmEngine::new(again, EngineConfig { kv_quant: Some(kv8), ..config() }).unwrap();
                assert_eq!(
                    greedy_ids(&mut paged, &prompts, 12),
                    expected_kv8,
                    "{name}: kv8 paged engine on the worker"
                );
            }
            assert_eq!(
                greedy_ids(&mut Generator::from(there), &prompts, 12),
                expected,
                "{name} (quantized: {quantize}): plain engine on the worker"
            );
        }
    }
}

/// Every fixture architecture split over worker processes — two stages on two workers (PP=2) and
/// one layer split over local Flex and a worker (TP=2) — gives logits within 1e-4 of one local
/// device for each reference prompt, and the same greedy tokens.
#[test]
fn fixtures_split_over_workers_equal_one_device() {
    let (a, b) = (Worker::start("flex"), Worker::start("flex"));
    let splits = [
        ("PP=2 on two workers", 2, 1, vec![a.device(), b.device()]),
        ("TP=2 on flex and a worker", 1, 2, vec![Device::flex(), a.device()]),
    ];
    let local = Device::flex();
    for name in ["llama", "opt", "gpt2"] {
        let reference = reference(name);
        let prompts: Vec<Prompt> = reference.prompts.iter().map(|p| Prompt::Text(p.text.clone())).collect();
        let (here, _) = load(name, &local, false);
        let expected_logits: Vec<Vec<f32>> =
            reference.prompts.iter().map(|p| logits(&here, &p.input_ids, &local)).collect();
        let expected = greedy_ids(&mut Generator::from(here), &prompts, 8);
        for (what, stages, tp, devices) in &splits {
            let files = PretrainedFiles::open(&fixture(name)).unwrap();
            let layout = StageLayout::even(files.spec.num_layers, *stages).unwrap();
            let plan = PipelinePlan::new(layout, *tp, devices.clone()).unwrap();
            let model = PipelineLm::from_checkpoint(files.spec.clone(), &files.files, &plan, None).unwrap();
            for (prompt, expected) in reference.prompts.iter().zip(&expected_logits) {
                let ids: &[u32] = &prompt.input_ids;
                let mut cache = ContiguousKvCache::placed(
                    model.kv_layout(),
                    1,
                    ids.len(),
                    &model.device(),
                    model.kv_devices(),
                    None,
                )
                .unwrap();
                let step = cache.begin_step(&[ids]).unwrap();
                let states = model.forward(&step, &mut cache).unwrap();
                let [_, seq, embed] = states.dims();
                let got = values(model.logits(states.reshape([seq, embed])).to_device(&local));
                let diff = max_abs_diff(&got, expected);
                assert!(diff <= 1e-4, "{name}, {what}: logits differ by {diff}");
            }
            let mut generator = Generator::new(model, Some(files.tokenizer), files.eos_token_ids);
            assert_eq!(greedy_ids(&mut generator, &prompts, 8), expected, "{name}, {what}");
        }
    }
}

/// Wrong token, unknown device index, bad address, nothing listening: each a clear error before
/// any work; a worker refuses to start without a token.
#[test]
fn bad_tokens_and_addresses_are_clear_errors() {
    let worker = Worker::start("flex");
    let err = remote_device(&worker.url, Some("wrong-token")).unwrap_err();
    assert!(matches!(err, RemoteDeviceError::Unauthorized { .. }), "{err}");
    assert!(err.to_string().contains(&worker.url) && err.to_string().contains("--worker-token"), "{err}");
    let err = remote_device(&format!("{}#3", worker.url), Some(TOKEN)).unwrap_err();
    assert!(matches!(err, RemoteDeviceError::NoSuchDevice { index: 3, count: 1, .. }), "{err}");
    let err = remote_device("ws://127.0.0.1", Some(TOKEN)).unwrap_err();
    assert!(matches!(err, RemoteDeviceError::Address { .. }), "{err}");

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let start = Instant::now();
    let err = remote_device(&format!("ws://127.0.0.1:{port}"), Some(TOKEN)).unwrap_err();
    assert!(matches!(err, RemoteDeviceError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(start.elapsed() < burn_llm::device::CONNECT_TIMEOUT + Duration::from_secs(5));

    let out = Command::new(worker_binary())
        .args(["--listen", "127.0.0.1:0", "--device", "flex"])
        .env_remove("BURN_LLM_WORKER_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Builds a plain engine for `name` on `worker` behind a [`WatchedEngine`] with `timeout`.
fn watched(worker: &Worker, name: &'static str, timeout: Duration) -> WatchedEngine {
    let url = worker.url.clone();
    WatchedEngine::spawn(url.clone(), timeout, move || {
        let device = remote_device(&url, Some(TOKEN)).map_err(|e| e.to_string())?;
        let pretrained = Pretrained::load(&fixture(name), &device).map_err(|e| e.to_string())?;
        Ok(Box::new(Generator::from(pretrained)))
    })
    .unwrap()
}

/// Generates until the first token, then runs `fault` on the worker; the call must end with a
/// worker error naming it within `timeout` (plus slack), and the engine must stay closed.
fn assert_fault_is_an_error(fault: &str, expect_stalled: bool) {
    let worker = Worker::start("flex");
    let timeout = Duration::from_secs(8);
    let mut engine = watched(&worker, "llama", timeout);
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(100) };
    let mut faulted_at = None;
    let result = engine.generate_stream(&[Prompt::Text("Hello".into())], &params, &mut |_| {
        if faulted_at.is_none() {
            worker.signal(fault);
            faulted_at = Some(Instant::now());
        }
    });
    let faulted_at = faulted_at.expect("no token came before the fault");
    let err = result.expect_err("generation went on after the worker's fault");
    assert!(faulted_at.elapsed() < timeout + Duration::from_secs(10), "took {:?}", faulted_at.elapsed());
    assert!(err.to_string().contains(&worker.url), "{err}");
    eprintln!("{fault} after the first token: error after {:?}: {err}", faulted_at.elapsed());
    match (&err, expect_stalled) {
        (EngineError::Worker(WorkerError::Stalled { .. }), true) => {}
        (EngineError::Worker(WorkerError::Failed { .. } | WorkerError::Stalled { .. }), false) => {}
        _ => panic!("unexpected error for {fault}: {err}"),
    }
    let again = engine.generate(&[Prompt::Text("Hello".into())], &SamplingParams::greedy(2)).unwrap_err();
    assert!(matches!(again, EngineError::Worker(WorkerError::Closed { .. })), "{again}");
    worker.signal("-KILL");
}

/// A worker killed mid-generation: an error naming it, within the timeout; this process lives on.
#[test]
fn killed_worker_mid_generation_is_an_error() {
    assert_fault_is_an_error("-KILL", false);
}

/// A worker stopped (stalled) mid-generation: an error naming it once the timeout passes.
#[test]
fn stalled_worker_mid_generation_is_an_error() {
    assert_fault_is_an_error("-STOP", true);
}

/// Pipeline and tensor parallelism over worker processes through the CLI's `--devices`: two
/// stages on two workers, a local stage and a worker's, two stages × two tensor-parallel ranks
/// over three workers and local Flex, and stages of degrees 2 and 1 mixing workers and Flex, on
/// the plain and the paged engine, give the same greedy text as one local device; the summary
/// names the workers.
#[test]
fn parallel_engines_over_workers_equal_one_device() {
    let workers = [Worker::start("flex"), Worker::start("flex"), Worker::start("flex")];
    let [a, b, c] = [&workers[0].url, &workers[1].url, &workers[2].url];
    let single = cli(&[]).unwrap();
    let cases: [Vec<String>; 5] = [
        vec!["--devices".into(), format!("{a},{b}")],
        vec!["--devices".into(), format!("flex,{a}")],
        vec!["--devices".into(), format!("{a},{b},{c},flex"), "--tensor-parallel-size".into(), "2".into()],
        // Stages of different degrees: two workers as one group beside local flex, and flex
        // with a worker as one group beside another worker.
        vec!["--devices".into(), format!("{a},{b},flex"), "--tensor-parallel-size".into(), "2,1".into()],
        vec!["--devices".into(), format!("flex,{a},{c}"), "--tensor-parallel-size".into(), "2,1".into()],
    ];
    for engine in ["plain", "paged"] {
        for case in &cases {
            let mut flags: Vec<&str> = case.iter().map(String::as_str).collect();
            flags.extend(["--engine", engine, "--worker-token", TOKEN]);
            let out = cli(&flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            assert_eq!(text(&out), text(&single), "{flags:?}");
        }
    }
    let err = cli(&["--devices", &format!("flex,{a}"), "--worker-token", "wrong-token"]).unwrap_err();
    assert!(err.contains(a.as_str()), "{err}");
}

/// `Tensor::to_device` from one worker to another (downloaded worker-to-worker) and back here.
#[test]
fn tensors_move_between_two_workers() {
    let (a, b) = (Worker::start("flex"), Worker::start("flex"));
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let on_a = Tensor::<2>::from_data(TensorData::new(data.clone(), [10, 100]), &a.device()) * 2.0;
    let on_b = on_a.to_device(&b.device()) + 1.0;
    let expected: Vec<f32> = data.iter().map(|x| x * 2.0 + 1.0).collect();
    assert_eq!(values(on_b.clone().to_device(&Device::flex())), expected);
    let ids = Tensor::<1, Int>::from_data(TensorData::new(vec![3u32, 1, 4], [3]), (&a.device(), DType::U32));
    assert_eq!(ids.to_device(&b.device()).into_data().convert::<i64>().try_into_vec::<i64>().unwrap(), vec![3, 1, 4]);
}

/// A worker stops on SIGTERM with a success status.
#[test]
fn worker_exits_cleanly_on_sigterm() {
    let mut worker = Worker::start("flex");
    // Burn installs its signal handlers inside `serve`, just after the ready line: a connected
    // session proves they are in place.
    let _device = worker.device();
    worker.signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = worker.child.try_wait().unwrap() {
            assert!(status.success(), "worker exited with {status}");
            return;
        }
        assert!(Instant::now() < deadline, "worker still running 20 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
