//! What a benchmark ran on, recorded next to every figure.

use serde::Serialize;

/// The host machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// Hardware threads available to the process.
    pub threads: usize,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// Operating system and architecture.
    pub os: String,
}

impl Machine {
    /// Reads the current machine.
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        }
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!("{} ({} threads, {} GiB, {})", self.cpu, self.threads, self.memory_gib, self.os)
    }
}
