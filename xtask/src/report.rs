//! Writing benchmark results: one JSON file for machines, one Markdown file for people, both
//! opening with the same [`Header`] (what ran, where, when) and laying figures out with [`table`].

use std::path::Path;

use serde::Serialize;

use crate::machine::Machine;

/// What every report records about its run. Embedded in each report with `#[serde(flatten)]`,
/// so its fields sit at the top level of the JSON next to the benchmark's own.
#[derive(Debug, Clone, Serialize)]
pub struct Header {
    /// The benchmark's name (`generate`, `serve`, ...).
    pub benchmark: &'static str,
    /// The `cargo xtask` command line that reproduces the run.
    pub command: String,
    /// The host machine.
    pub machine: Machine,
    /// The device backend; absent for tasks that do not choose one in their report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<&'static str>,
    /// The model that ran.
    pub model: String,
    /// Seconds since the Unix epoch when the report was made.
    pub unix_time: u64,
}

impl Header {
    /// A header for a run finishing now, on this machine.
    pub fn new(
        benchmark: &'static str,
        command: String,
        device: Option<&'static str>,
        model: impl Into<String>,
    ) -> Self {
        Self { benchmark, command, machine: Machine::current(), device, model: model.into(), unix_time: unix_time() }
    }

    /// The Markdown report's opening: the title, then the command, machine and device as list
    /// items; the caller appends its own items (model, workload) after it.
    pub fn markdown(&self, title: &str) -> String {
        let mut md = format!("# {title}\n\n- command: `{}`\n- machine: {}\n", self.command, self.machine.describe());
        if let Some(device) = self.device {
            md.push_str(&format!("- device: {device}\n"));
        }
        md
    }
}

/// How a table column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text (`|---|`).
    Left,
    /// Figures (`|---:|`).
    Right,
}

/// A Markdown table: the header row from the columns' titles, the alignment row from their
/// [`Align`]s, then one row per item of `rows` (one cell per column).
pub fn table(columns: &[(&str, Align)], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let line = |cells: &[&str]| format!("| {} |\n", cells.join(" | "));
    let titles: Vec<&str> = columns.iter().map(|(title, _)| *title).collect();
    let mut md = line(&titles);
    for (_, align) in columns {
        md.push_str(match align {
            Align::Left => "|---",
            Align::Right => "|---:",
        });
    }
    md.push_str("|\n");
    for row in rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        md.push_str(&line(&cells));
    }
    md
}

/// Writes `bench-results/<name>.json` and `bench-results/<name>.md` (creating the directory),
/// each through a temporary file renamed into place so an interrupted run leaves no half file,
/// and says where on stderr.
pub fn write(dir: &Path, name: &str, json: &impl Serialize, markdown: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let text = serde_json::to_string_pretty(json).map_err(std::io::Error::other)?;
    for (ext, body) in [("json", text.as_str()), ("md", markdown)] {
        let path = dir.join(format!("{name}.{ext}"));
        let tmp = dir.join(format!("{name}.{ext}.tmp"));
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, &path)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `text` with this machine's home directory written `~`, so that logs a report quotes name no
/// path of the machine that ran it.
pub fn home_relative(text: &str) -> String {
    match std::env::var("HOME") {
        Ok(home) if home.len() > 1 => text.replace(home.trim_end_matches('/'), "~"),
        _ => text.to_string(),
    }
}

/// The `percent`th percentile of `values` by nearest rank: the smallest value that at least
/// `percent`% of them do not exceed (the sorted sample's element `⌈percent/100 · n⌉`, counting
/// from 1), so that every reported figure is one that was measured. The same convention as
/// `burn_llm::plan::schedule::Lengths::percentile` over a length distribution. `0` for
/// an empty sample.
pub fn percentile(values: &[f64], percent: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((percent / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(0.0)
}

/// Seconds since the Unix epoch, for stamping reports.
fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_relative_writes_the_home_directory_as_a_tilde() {
        let Ok(home) = std::env::var("HOME") else { return };
        if home.len() > 1 {
            let quoted = format!("model {home}/.cache/m.gguf, done");
            assert_eq!(home_relative(&quoted), "model ~/.cache/m.gguf, done");
        }
        assert_eq!(home_relative("no path here"), "no path here");
    }

    #[test]
    fn percentile_is_the_nearest_rank() {
        let ten: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        // ⌈p/100 · 10⌉-th smallest: p50 is the 5th, p99 and p100 the largest, p0 the smallest.
        assert_eq!([0.0, 10.0, 50.0, 51.0, 99.0, 100.0].map(|p| percentile(&ten, p)), [1.0, 1.0, 5.0, 6.0, 10.0, 10.0]);
        assert_eq!(percentile(&[3.5], 50.0), 3.5);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }

    #[test]
    fn table_has_header_alignment_and_rows() {
        let md = table(
            &[("name", Align::Left), ("tokens/s", Align::Right)],
            [vec!["a".into(), "1.0".into()], vec!["b".into(), "2.5".into()]],
        );
        assert_eq!(md, "| name | tokens/s |\n|---|---:|\n| a | 1.0 |\n| b | 2.5 |\n");
    }

    #[test]
    fn header_flattens_into_the_report_and_skips_a_missing_device() {
        #[derive(Serialize)]
        struct Report {
            #[serde(flatten)]
            header: Header,
            results: Vec<u32>,
        }
        let header = Header::new("ppl", "cargo xtask eval ppl".into(), None, "m");
        let json = serde_json::to_value(Report { header, results: vec![1] }).unwrap_or_default();
        let mut keys: Vec<&str> = json.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(keys, ["benchmark", "command", "machine", "model", "results", "unix_time"]);
        assert_eq!(json["model"], "m");
        let md = Header::new("generate", "cargo xtask bench generate".into(), Some("flex"), "m").markdown("Title");
        assert!(md.starts_with("# Title\n\n- command: `cargo xtask bench generate`\n- machine: "), "{md}");
        assert!(md.ends_with("- device: flex\n"), "{md}");
    }
}
