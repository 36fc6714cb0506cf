//! `bench-results/placement.{json,md,png}`: SLO attainment and p99 latency per mode, CV and rate,
//! each beside the simulator's prediction, and the two charts (attainment against CV, against
//! rate).

use std::path::Path;

use serde::Serialize;

use crate::bench::plot::{self, Axes, Panel};
use crate::bench::process_cpu::CpuShares;
use crate::report::{self, Align::Left, Align::Right, Header, percentile, table};

/// One trace replayed on one mode's server.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub cv: f64,
    /// Each model's rate as a fraction of one device's capacity for it.
    pub load: f64,
    /// Each model's requests per second.
    pub rate: f64,
    pub requests: usize,
    pub attainment: f64,
    pub predicted_attainment: f64,
    /// Share of the requests rejected at arrival (`--admission slo`), measured and predicted.
    pub rejected: f64,
    pub predicted_rejected: f64,
    /// p99 latency of the requests served (not rejected).
    pub p99_s: f64,
    pub predicted_p99_s: f64,
    /// The cores the bench process (server and client) and each worker kept busy during the
    /// replay (`None` where `/proc` cannot say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuShares>,
}

impl Point {
    /// The point of `measured` and `predicted` latencies (seconds, same requests; `None`:
    /// rejected at arrival) under `slo_s`.
    pub fn new(cv: f64, load: f64, rate: f64, slo_s: f64, measured: &[Option<f64>], predicted: &[Option<f64>]) -> Self {
        let share = |l: &[Option<f64>], f: &dyn Fn(Option<f64>) -> bool| {
            l.iter().filter(|&&x| f(x)).count() as f64 / l.len().max(1) as f64
        };
        let within = |l: &[Option<f64>]| share(l, &|x| x.is_some_and(|x| x <= slo_s));
        let rejected = |l: &[Option<f64>]| share(l, &|x| x.is_none());
        let p99 = |l: &[Option<f64>]| percentile(&l.iter().flatten().copied().collect::<Vec<_>>(), 99.0);
        Self {
            cv,
            load,
            rate,
            requests: measured.len(),
            attainment: within(measured),
            predicted_attainment: within(predicted),
            rejected: rejected(measured),
            predicted_rejected: rejected(predicted),
            p99_s: p99(measured),
            predicted_p99_s: p99(predicted),
            cpu: None,
        }
    }
}

/// One placement mode's server and its points.
#[derive(Debug, Clone, Serialize)]
pub struct Mode {
    /// `auto`, `replicate` or `pipeline` (`bench placement --modes`).
    pub mode: String,
    /// The placement as the server printed it.
    pub placement: Vec<String>,
    pub points: Vec<Point>,
}

impl Mode {
    /// The placement's groups (its lines naming them), to tell modes that placed alike.
    fn groups(&self) -> Vec<&str> {
        self.placement.iter().map(String::as_str).filter(|l| l.trim_start().starts_with("group ")).collect()
    }
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// One request's predicted latency on one device (the capacity and SLO unit).
    pub one_device_s: f64,
    pub slo_s: f64,
    pub model_bytes: u64,
    pub device_memory_bytes: u64,
    pub modes: Vec<Mode>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    #[serde(flatten)]
    results: Results,
}

/// Writes the report and the charts.
pub fn write(out: &Path, command: &str, model: &str, results: Results) -> Result<(), Box<dyn std::error::Error>> {
    let header = Header::new("placement", command.to_string(), Some("2 × worker --threads 1 (flex)"), model);
    let mut md = header.markdown("AlpaServe placement vs replication");
    md.push_str(&format!(
        "- models: `a` and `b`, two copies of {model}; each device's memory {} bytes ({} bytes of weights per model)\n\
         - one request on one device (predicted): {:.3} s; SLO {:.3} s\n\n",
        results.device_memory_bytes, results.model_bytes, results.one_device_s, results.slo_s
    ));
    for mode in &results.modes {
        md.push_str(&format!("## `--placement {}`\n\n```\n{}\n```\n\n", mode.mode, mode.placement.join("\n")));
    }
    let rows = results.modes.iter().flat_map(|m| {
        m.points.iter().map(move |p| {
            vec![
                m.mode.clone(),
                format!("{}", p.cv),
                format!("{} ({:.2}/s)", p.load, p.rate),
                p.requests.to_string(),
                format!("{:.1}%", 100.0 * p.attainment),
                format!("{:.1}%", 100.0 * p.predicted_attainment),
                format!("{:+.1}", 100.0 * (p.predicted_attainment - p.attainment)),
                format!("{:.0}% ({:.0}%)", 100.0 * p.rejected, 100.0 * p.predicted_rejected),
                format!("{:.2}", p.p99_s),
                format!("{:.2}", p.predicted_p99_s),
                p.cpu.as_ref().map_or("–".into(), CpuShares::sum_cell),
            ]
        })
    });
    md.push_str(&table(
        &[
            ("mode", Left),
            ("CV", Right),
            ("load (rate per model)", Right),
            ("requests", Right),
            ("SLO attainment", Right),
            ("predicted", Right),
            ("prediction − measured (points)", Right),
            ("rejected (predicted)", Right),
            ("p99 served (s)", Right),
            ("predicted p99 (s)", Right),
            ("cores busy", Right),
        ],
        rows,
    ));
    if let Some(c) = results.modes.iter().flat_map(|m| &m.points).find_map(|p| p.cpu.as_ref()) {
        md.push_str(&format!(
            "\ncores busy: CPU seconds over the replay's seconds of {}, and their sum, against the host's {} cores.\n",
            c.names(),
            c.host_cores
        ));
    }
    md.push_str(&claims(&results));
    let png = out.join("placement.png");
    match plot::line_png(
        &png,
        &panels(&results),
        &Axes { x: "CV (left) · load (right)", y: "SLO attainment", log_x: false },
    ) {
        Ok(path) => {
            md.push_str(&format!("\n![attainment](./{})\n", path.file_name().unwrap_or_default().to_string_lossy()))
        }
        Err(e) => eprintln!("no chart: {e}"),
    }
    report::write(out, "placement", &Report { header, results }, &md)?;
    Ok(())
}

/// The paper's claim and the prediction target, checked on the points.
fn claims(results: &Results) -> String {
    let mut md = String::from("\n");
    if let Some(rep) = results.modes.iter().find(|m| m.mode == "replicate") {
        for mode in results.modes.iter().filter(|m| m.mode != "replicate") {
            let pairs: Vec<(&Point, &Point)> = mode
                .points
                .iter()
                .filter(|p| p.cv >= 3.0)
                .filter_map(|p| rep.points.iter().find(|q| q.cv == p.cv && q.load == p.load).map(|q| (p, q)))
                .collect();
            let held = pairs.iter().filter(|(p, q)| p.attainment >= q.attainment).count();
            let same = if mode.groups() == rep.groups() { " (the same groups as `replicate`)" } else { "" };
            md.push_str(&format!(
                "- `{}`{same} ≥ replication in measured attainment at CV ≥ 3: {held} of {} points\n",
                mode.mode,
                pairs.len()
            ));
        }
    }
    let all: Vec<&Point> = results.modes.iter().flat_map(|m| &m.points).collect();
    let close = all.iter().filter(|p| (p.predicted_attainment - p.attainment).abs() <= 0.10).count();
    md.push_str(&format!("- prediction within 10 points of measurement: {close} of {} points\n", all.len()));
    md
}

/// Attainment against CV at the highest load, and against load at the CV nearest 3.
fn panels(results: &Results) -> Vec<Panel> {
    let loads: Vec<f64> = results.modes.iter().flat_map(|m| m.points.iter().map(|p| p.load)).collect();
    let top = loads.iter().copied().fold(0.0, f64::max);
    let cvs: Vec<f64> = results.modes.iter().flat_map(|m| m.points.iter().map(|p| p.cv)).collect();
    let mid = cvs.iter().copied().min_by(|a, b| (a - 3.0).abs().total_cmp(&(b - 3.0).abs())).unwrap_or(3.0);
    let series = |pick: &dyn Fn(&Point) -> Option<f64>| {
        let mut out: Vec<plot::Series> = Vec::new();
        for m in &results.modes {
            for (label, predicted) in [("measured", false), ("predicted", true)] {
                let points: Vec<(f64, Option<f64>)> = m
                    .points
                    .iter()
                    .filter_map(|p| {
                        let x = pick(p)?;
                        Some((x, Some(if predicted { p.predicted_attainment } else { p.attainment })))
                    })
                    .collect();
                out.push((format!("{} {label}", m.mode), points));
            }
        }
        out
    };
    vec![
        Panel { title: format!("load {top}"), series: series(&|p| (p.load == top).then_some(p.cv)) },
        Panel { title: format!("CV {mid}"), series: series(&|p| (p.cv == mid).then_some(p.load)) },
    ]
}
