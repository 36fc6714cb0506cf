//! Worker processes on loopback for the benchmark's remote devices: the `worker` example started
//! with `--listen 127.0.0.1:0 --threads N --token …`, its address read from its ready line, and
//! every process ended when the [`Workers`] is dropped, so that an error or a panic in the
//! benchmark leaves none behind.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::super::process_cpu::Process;

/// How long a worker may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The line a ready worker prints, before its address.
const READY_PREFIX: &str = "worker ready on ";

/// Why the workers could not be started.
#[derive(Debug, thiserror::Error)]
pub enum WorkerStartError {
    /// The worker binary is not where the build put it and could not be built.
    #[error(
        "cannot build the worker example ({0}); build it with `cargo build --example worker` and pass its path with --worker-bin"
    )]
    Build(String),
    /// The process could not be started.
    #[error("cannot start the worker {path}: {reason}")]
    Spawn { path: String, reason: String },
    /// The process ended or stayed silent before its ready line.
    #[error("worker with --threads {threads} did not become ready: {reason} (its log: {log})")]
    NotReady { threads: usize, reason: String, log: String },
}

/// One started worker.
pub struct Worker {
    /// `ws://127.0.0.1:PORT`.
    pub url: String,
    /// Its `--threads`.
    pub threads: usize,
    child: Child,
}

/// Workers started by the benchmark; dropping it ends them.
pub struct Workers {
    /// The token every worker requires.
    pub token: String,
    workers: Vec<Worker>,
    /// The private copy of the built worker, removed with the workers.
    built: Option<PathBuf>,
}

impl Workers {
    /// Starts one worker per entry of `threads` (its `--threads`), on the flex device, each on a
    /// free loopback port, and waits for each to be ready. Their stderr goes to
    /// `log_dir/worker-<i>.log`.
    /// `binary`: the worker executable; `None` builds the `worker` example first.
    pub fn start(threads: &[usize], binary: Option<&Path>, log_dir: &Path) -> Result<Self, WorkerStartError> {
        let built = match binary {
            Some(_) => None,
            None => Some(build_worker()?),
        };
        let token = format!("bench-{}-{:016x}", std::process::id(), rand::random::<u64>());
        let mut started = Self { token, workers: Vec::new(), built };
        let binary = binary.map(Path::to_owned).or_else(|| started.built.clone()).unwrap_or_default();
        for (i, &n) in threads.iter().enumerate() {
            let log = log_dir.join(format!("worker-{i}.log"));
            let worker = start_one(&binary, n, &started.token, &log)?;
            eprintln!("started worker {} (--threads {n}, pid {})", worker.url, worker.child.id());
            started.workers.push(worker);
        }
        Ok(started)
    }

    /// The started workers, in the order of [`Workers::start`]'s `threads`.
    pub fn all(&self) -> &[Worker] {
        &self.workers
    }

    /// The started workers as processes to meter, named `worker 1`, `worker 2`, … in order.
    pub fn processes(&self) -> Vec<Process> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| Process { name: format!("worker {}", i + 1), pid: Some(w.child.id()) })
            .collect()
    }

    /// Whether every worker is still running (one that died is named).
    pub fn check_alive(&mut self) -> Result<(), String> {
        for w in &mut self.workers {
            if let Ok(Some(status)) = w.child.try_wait() {
                return Err(format!("worker {} (--threads {}) exited: {status}", w.url, w.threads));
            }
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Already exited is fine: kill only fails then.
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
        if let Some(path) = &self.built {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Starts one worker and reads its address from its ready line.
fn start_one(binary: &Path, threads: usize, token: &str, log: &Path) -> Result<Worker, WorkerStartError> {
    let spawn_error = |reason: String| WorkerStartError::Spawn { path: binary.display().to_string(), reason };
    let stderr =
        std::fs::File::create(log).map_err(|e| spawn_error(format!("cannot create {}: {e}", log.display())))?;
    let mut child = Command::new(binary)
        .args(["--listen", "127.0.0.1:0", "--device", "flex", "--threads", &threads.to_string(), "--token", token])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| spawn_error(e.to_string()))?;
    let not_ready = |reason: String| WorkerStartError::NotReady { threads, reason, log: log.display().to_string() };
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        return Err(not_ready("no stdout".into()));
    };
    let (tx, rx) = mpsc::channel();
    // Reads the ready line, then drains stdout so the worker never blocks on writing to it.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && let Some(rest) = line.strip_prefix(READY_PREFIX) {
                let url = rest.split_whitespace().next().unwrap_or_default().to_string();
                sent = tx.send(url).is_ok();
            }
        }
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(url) if url.starts_with("ws://") => Ok(Worker { url, threads, child }),
        Ok(url) => {
            let _ = (child.kill(), child.wait());
            Err(not_ready(format!("unexpected address `{url}` in its ready line")))
        }
        Err(_) => {
            let status = child.try_wait().ok().flatten().map(|s| format!("exited with {s}"));
            let _ = (child.kill(), child.wait());
            Err(not_ready(status.unwrap_or_else(|| format!("no ready line in {} s", READY_TIMEOUT.as_secs()))))
        }
    }
}

/// Builds the `worker` example in the profile xtask runs in (cargo does nothing when it is up to
/// date) and returns a private copy of the executable cargo reports, in the temporary directory:
/// another checkout sharing the target directory may overwrite the built file while the
/// benchmark runs.
fn build_worker() -> Result<PathBuf, WorkerStartError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--package", "burn-llm", "--example", "worker", "--message-format=json-render-diagnostics"]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let mut child = build.stdout(Stdio::piped()).spawn().map_err(|e| WorkerStartError::Build(e.to_string()))?;
    let mut binary = None;
    for line in child.stdout.take().map(|out| BufReader::new(out).lines()).into_iter().flatten().map_while(Result::ok) {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "worker" {
            binary = msg["executable"].as_str().map(PathBuf::from);
        }
    }
    let status = child.wait().map_err(|e| WorkerStartError::Build(e.to_string()))?;
    let binary = match binary {
        Some(path) if status.success() => path,
        _ => {
            return Err(WorkerStartError::Build(format!(
                "cargo build ended with {status} and named no worker executable"
            )));
        }
    };
    let copy = std::env::temp_dir().join(format!(
        "burn-llm-bench-worker-{}{}",
        std::process::id(),
        std::env::consts::EXE_SUFFIX
    ));
    std::fs::copy(&binary, &copy).map_err(|e| WorkerStartError::Build(format!("copying {}: {e}", binary.display())))?;
    Ok(copy)
}
