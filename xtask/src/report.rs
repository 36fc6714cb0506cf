//! Writing benchmark results: one JSON file for machines, one Markdown file for people.

use std::path::Path;

use serde::Serialize;

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

/// Seconds since the Unix epoch, for stamping reports.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
