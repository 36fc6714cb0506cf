//! `--placement manual:SPEC`: which device groups serve which model, by hand.
//!
//! `SPEC` is `NAME=GROUP[|GROUP…]` for each served model, separated by `;`. A `GROUP` is the
//! comma-separated indices (from 0) of `--devices` entries that run the model as a pipeline, one
//! stage per device in that order; several groups separated by `|` are replicas. Models given the
//! same group share its devices. `manual:a=0,1;b=0,1` runs both models as two-stage pipelines over
//! devices 0 and 1 (AlpaServe's model-parallel placement); `manual:a=0|1;b=0|1` replicates both on
//! each device; `manual:a=0;b=1` gives each model a device of its own.

/// A parsed manual placement: each model's groups, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manual {
    /// `(served name, its groups: each a list of device indices, one per stage)`.
    pub models: Vec<(String, Vec<Vec<usize>>)>,
}

/// How to write the syntax, quoted in every error.
const SYNTAX: &str = "write manual:NAME=GROUP[|GROUP…];NAME=…, each GROUP the comma-separated --devices indices \
     of one pipeline (e.g. manual:a=0,1;b=2)";

impl std::str::FromStr for Manual {
    type Err = String;

    /// Parses the text after `manual:`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut models: Vec<(String, Vec<Vec<usize>>)> = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, groups)) = part.split_once('=') else {
                return Err(format!("`{part}` has no `=`: {SYNTAX}"));
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("`{part}` names no model: {SYNTAX}"));
            }
            if models.iter().any(|(n, _)| n == name) {
                return Err(format!(
                    "model `{name}` is placed twice: give all its groups in one entry, separated by |"
                ));
            }
            let mut parsed = Vec::new();
            for group in groups.split('|') {
                let mut devices = Vec::new();
                for index in group.split(',').map(str::trim) {
                    let device: usize = index.parse().map_err(|_| {
                        format!(
                            "`{index}` in `{part}` is not a device index (0 for the first --devices entry): {SYNTAX}"
                        )
                    })?;
                    if devices.contains(&device) {
                        return Err(format!(
                            "device {device} appears twice in one group of `{part}`: a pipeline runs one stage per device"
                        ));
                    }
                    devices.push(device);
                }
                parsed.push(devices);
            }
            models.push((name.to_string(), parsed));
        }
        if models.is_empty() {
            return Err(format!("places no model: {SYNTAX}"));
        }
        Ok(Self { models })
    }
}

impl Manual {
    /// Checks the placement against the served names and the `pool` devices: every served model
    /// placed, no other name, every index a device.
    pub fn check(&self, served: &[String], pool: usize) -> Result<(), String> {
        for (name, groups) in &self.models {
            if !served.contains(name) {
                return Err(format!("places `{name}`, which is not served; the served models are {}", list(served)));
            }
            if let Some(&bad) = groups.iter().flatten().find(|&&d| d >= pool) {
                return Err(format!(
                    "gives `{name}` device {bad}, but --devices lists {pool} (indices 0 to {})",
                    pool.saturating_sub(1)
                ));
            }
        }
        let missing: Vec<String> =
            served.iter().filter(|s| !self.models.iter().any(|(n, _)| n == *s)).cloned().collect();
        if !missing.is_empty() {
            return Err(format!("does not place {}: give every served model its group", list(&missing)));
        }
        Ok(())
    }
}

fn list(names: &[String]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_placements_parse_groups_and_replicas() {
        let m: Manual = "a=0,1; b=2|0".parse().unwrap();
        assert_eq!(m.models, [("a".to_string(), vec![vec![0, 1]]), ("b".to_string(), vec![vec![2], vec![0]])]);
        let served = ["a".to_string(), "b".to_string()];
        m.check(&served, 3).unwrap();
        assert!(m.check(&served, 2).unwrap_err().contains("device 2"));
        let only_a: Manual = "a=0".parse().unwrap();
        assert!(only_a.check(&served, 1).unwrap_err().contains("does not place `b`"));
        let other: Manual = "a=0;c=0".parse().unwrap();
        assert!(other.check(&served, 1).unwrap_err().contains("`c`, which is not served"));
        for (bad, words) in [
            ("", "places no model"),
            ("a", "no `=`"),
            ("=0", "names no model"),
            ("a=x", "`x`"),
            ("a=0,", "`` in"),
            ("a=-1", "`-1`"),
            ("a=0,0", "twice in one group"),
            ("a=0;a=1", "placed twice"),
        ] {
            let err = bad.parse::<Manual>().unwrap_err();
            assert!(err.contains(words), "{bad}: {err}");
        }
    }
}
