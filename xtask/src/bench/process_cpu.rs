//! Where a run's CPU time went: the CPU seconds the benchmark's own process and its worker
//! processes used over the run, each over the run's wall-clock seconds. On a host of few cores,
//! shared by a client and its workers, this says whether a device idled (a pipeline bubble, a
//! stage waiting on another) or whether the cores were full and no schedule could go faster.
//!
//! Read from Linux's `/proc/<pid>/stat` (user + system time of every thread of the process, the
//! ended ones included). Elsewhere the meter reads nothing and the reports leave the figures out.

use std::time::Instant;

use serde::Serialize;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's `USER_HZ`, 100 on every
/// architecture this project builds for.
const USER_HZ: f64 = 100.0;

/// One process to meter.
#[derive(Debug, Clone)]
pub struct Process {
    /// As reported (`bench`, `worker 1`, …).
    pub name: String,
    /// `None`: this process.
    pub pid: Option<u32>,
}

impl Process {
    /// This process, named `name`.
    pub fn this(name: &str) -> Self {
        Self { name: name.into(), pid: None }
    }

    /// CPU seconds it has used so far (`None` where `/proc` cannot say: not Linux, or it ended).
    fn cpu_s(&self) -> Option<f64> {
        let path = match self.pid {
            Some(pid) => format!("/proc/{pid}/stat"),
            None => "/proc/self/stat".into(),
        };
        cpu_s_of_stat(&std::fs::read_to_string(path).ok()?)
    }
}

/// User + system seconds from the text of a `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may hold spaces, so the fields are counted after its last `)`: utime and stime
/// are fields 14 and 15.
fn cpu_s_of_stat(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // `rest` starts at field 3 (the state).
    Some((ticks(11)? + ticks(12)?) as f64 / USER_HZ)
}

/// A meter started over some processes; [`CpuMeter::read`] gives their shares since.
pub struct CpuMeter<'a> {
    processes: &'a [Process],
    start: Vec<Option<f64>>,
    started: Instant,
}

impl<'a> CpuMeter<'a> {
    pub fn start(processes: &'a [Process]) -> Self {
        Self { processes, start: processes.iter().map(Process::cpu_s).collect(), started: Instant::now() }
    }

    /// Each process's CPU seconds since the start over the wall-clock seconds since; `None` when
    /// no process could be read (not Linux).
    pub fn read(&self) -> Option<CpuShares> {
        let wall_s = self.started.elapsed().as_secs_f64();
        let busy: Vec<ProcessShare> = self
            .processes
            .iter()
            .zip(&self.start)
            .filter_map(|(p, start)| {
                let used = p.cpu_s()? - (*start)?;
                Some(ProcessShare { name: p.name.clone(), cores: used / wall_s.max(f64::EPSILON) })
            })
            .collect();
        (!busy.is_empty()).then(|| CpuShares { wall_s, host_cores: host_cores(), processes: busy })
    }
}

/// One process's share of a run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessShare {
    pub name: String,
    /// Its CPU seconds over the run's seconds: 1.0 is one core busy all the run.
    pub cores: f64,
}

/// The metered processes' shares of one run.
#[derive(Debug, Clone, Serialize)]
pub struct CpuShares {
    pub wall_s: f64,
    /// The cores the host offers (`available_parallelism`).
    pub host_cores: usize,
    pub processes: Vec<ProcessShare>,
}

impl CpuShares {
    /// The cores all metered processes kept busy together.
    pub fn total(&self) -> f64 {
        self.processes.iter().map(|p| p.cores).sum()
    }

    /// A report's cell: each process's cores, then their sum (`CORES + … = SUM`).
    pub fn sum_cell(&self) -> String {
        let each: Vec<String> = self.processes.iter().map(|p| format!("{:.2}", p.cores)).collect();
        format!("{} = {:.2}", each.join(" + "), self.total())
    }

    /// The processes' names in [`CpuShares::sum_cell`]'s order (`NAME + …`).
    pub fn names(&self) -> String {
        self.processes.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(" + ")
    }

    /// Each process's name and cores, then their sum and the host's cores: `NAME CORES, … = SUM of N cores`.
    pub fn describe(&self) -> String {
        let each: Vec<String> = self.processes.iter().map(|p| format!("{} {:.2}", p.name, p.cores)).collect();
        format!("{} = {:.2} of {} cores", each.join(", "), self.total(), self.host_cores)
    }
}

fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_read_after_the_command_name_even_with_spaces_and_parentheses() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 3 0 100 0 0";
        assert_eq!(cpu_s_of_stat(stat), Some(3.25));
        assert_eq!(cpu_s_of_stat("4242 (truncated) S 1 2"), None);
        assert_eq!(cpu_s_of_stat("no parenthesis"), None);
    }

    #[test]
    fn this_process_is_metered_where_proc_exists() {
        let processes = [Process::this("bench")];
        let meter = CpuMeter::start(&processes);
        // Busy until the kernel has counted at least 50 ms of CPU time (a few ticks), however
        // loaded the host is.
        let first = processes[0].cpu_s();
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        while first.is_some_and(|f| processes[0].cpu_s().is_some_and(|now| now < f + 0.05)) && Instant::now() < deadline
        {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let Some(shares) = meter.read() else {
            assert!(!std::path::Path::new("/proc/self/stat").exists(), "/proc exists but was not read");
            return;
        };
        assert_eq!(shares.processes.len(), 1);
        let used_s = shares.processes[0].cores * shares.wall_s;
        assert!(used_s >= 0.05 - 1e-9, "spun for 50 ms of CPU time, metered {used_s} s");
        assert!(shares.describe().starts_with("bench "), "{}", shares.describe());
    }
}
