//! Which layers each pipeline stage runs, and on which devices: pure checks, run before anything
//! is loaded, so that a bad layout is an error naming the problem and never half a model.
//!
//! `--stage-layers` takes **inclusive** ranges, `0-11,12-23` for a 24-layer model (a single layer
//! may be written `7`), the way layer ranges are written in Megatron-LM's and DeepSpeed's logs
//! and in this project's issue; internally a stage is the half-open range `start..end`.

use std::fmt;
use std::ops::Range;

/// What is wrong with a pipeline layout or its devices.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Zero stages, or zero tensor-parallel ranks.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// More stages than layers: some stage would hold nothing.
    #[error("{stages} pipeline stages for a model of {layers} layers: every stage needs a layer; use at most {layers}")]
    TooManyStages {
        /// Stages asked for.
        stages: usize,
        /// Decoder layers of the model.
        layers: usize,
    },
    /// `--stage-layers` does not describe a split of the model's layers.
    #[error("--stage-layers `{text}`: {reason}")]
    BadStageLayers {
        /// The flag's value.
        text: String,
        /// What is wrong, and what a good value looks like.
        reason: String,
    },
    /// `--stage-layers` and `--pipeline-parallel-size` disagree.
    #[error("--stage-layers gives {ranges} stages but --pipeline-parallel-size is {size}: make them agree or drop one")]
    StageCountMismatch {
        /// Stages in `--stage-layers`.
        ranges: usize,
        /// `--pipeline-parallel-size`.
        size: usize,
    },
    /// The device list does not match stages × ranks.
    #[error(
        "{given} devices given for {stages} pipeline stages × {tp} tensor-parallel ranks: list exactly {needed} \
         (stage s, rank r runs on entry s·{tp} + r of --devices)"
    )]
    DeviceCount {
        /// Devices listed.
        given: usize,
        /// Pipeline stages.
        stages: usize,
        /// Tensor-parallel degree.
        tp: usize,
        /// `stages × tp`.
        needed: usize,
    },
    /// A list of per-stage tensor-parallel degrees that does not match the stages.
    #[error(
        "{degrees} tensor-parallel degrees given for {stages} pipeline stages: give one degree per stage \
         (--tensor-parallel-size 2,1 runs stage 0 on two devices and stage 1 on one)"
    )]
    DegreeCount {
        /// Degrees listed.
        degrees: usize,
        /// Pipeline stages.
        stages: usize,
    },
    /// The device list does not match the per-stage degrees.
    #[error(
        "{given} devices given for stages of tensor-parallel degrees {degrees}: list exactly {needed} \
         (each stage takes the next `degree` entries of --devices, in stage order)"
    )]
    GroupDeviceCount {
        /// Devices listed.
        given: usize,
        /// The degrees, comma-separated.
        degrees: String,
        /// Their sum.
        needed: usize,
    },
    /// A layer cannot be split over the tensor-parallel ranks.
    #[error(transparent)]
    TensorParallel(#[from] crate::tensor::TensorParallelError),
    /// A device entry cannot be used.
    #[error("device `{entry}`: {reason}")]
    Device {
        /// The entry as given.
        entry: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The stage planner found no split (`--stage-layers auto`).
    #[error(transparent)]
    Stages(#[from] burn_plan::stages::StagesError),
    /// The stage-and-degree planner found no split (`--tensor-parallel-size auto`).
    #[error(transparent)]
    Groups(#[from] burn_plan::stage_groups::GroupStagesError),
    /// Loading or moving the model failed.
    #[cfg(feature = "runtime")]
    #[error(transparent)]
    Model(#[from] burn_llm_models::ModelError),
}

/// Result of pipeline construction.
pub type Result<T> = std::result::Result<T, PipelineError>;

/// Contiguous, non-empty layer ranges covering `0..num_layers` in order, one per stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageLayout {
    stages: Vec<Range<usize>>,
}

impl StageLayout {
    /// `stages` stages of as equal a size as possible (the first ones one layer longer).
    pub fn even(num_layers: usize, stages: usize) -> Result<Self> {
        if stages == 0 {
            return Err(PipelineError::Zero("the number of pipeline stages"));
        }
        if stages > num_layers {
            return Err(PipelineError::TooManyStages { stages, layers: num_layers });
        }
        let (per, extra) = (num_layers / stages, num_layers % stages);
        let mut start = 0;
        let ranges = (0..stages)
            .map(|i| {
                let end = start + per + usize::from(i < extra);
                let range = start..end;
                start = end;
                range
            })
            .collect();
        Ok(Self { stages: ranges })
    }

    /// Stages of `counts[i]` layers each, in order (a planner's split, as
    /// [`burn_plan::schedule::balanced_stage_layers`] gives it).
    pub fn from_counts(counts: &[usize]) -> Result<Self> {
        if counts.is_empty() {
            return Err(PipelineError::Zero("the number of pipeline stages"));
        }
        if counts.contains(&0) {
            return Err(PipelineError::Zero("the layers of a pipeline stage"));
        }
        let mut start = 0;
        let stages = counts
            .iter()
            .map(|&n| {
                start += n;
                start - n..start
            })
            .collect();
        Ok(Self { stages })
    }

    /// The layers of each stage, in order ([`StageLayout::from_counts`] back).
    pub fn counts(&self) -> Vec<usize> {
        self.stages.iter().map(|r| r.len()).collect()
    }

    /// Parses `--stage-layers` (`0-11,12-23`: inclusive ranges in layer order) for a model of
    /// `num_layers` layers, rejecting gaps, overlaps, reversed or out-of-range ranges.
    pub fn parse(text: &str, num_layers: usize) -> Result<Self> {
        let bad = |reason: String| PipelineError::BadStageLayers { text: text.to_string(), reason };
        let mut ranges = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let number = |t: &str| {
                t.trim().parse::<usize>().map_err(|_| {
                    bad(format!("`{part}` is not a layer range: write FIRST-LAST (inclusive) or one layer number"))
                })
            };
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(part)?;
                    (n, n)
                }
            };
            if last < first {
                return Err(bad(format!("`{part}` runs backwards: write the first layer first")));
            }
            ranges.push(first..last + 1);
        }
        let layers = num_layers;
        if ranges.len() > layers {
            return Err(PipelineError::TooManyStages { stages: ranges.len(), layers });
        }
        let mut expected = 0;
        for r in &ranges {
            if r.end > layers {
                return Err(bad(format!(
                    "layer {} is out of range: the model has {layers} layers, 0-{}",
                    r.end - 1,
                    layers.saturating_sub(1)
                )));
            }
            if r.start > expected {
                return Err(bad(format!("layers {expected}-{} belong to no stage", r.start - 1)));
            }
            if r.start < expected {
                return Err(bad(format!(
                    "layers {}-{} are in two stages (stages must follow each other in layer order)",
                    r.start,
                    (expected - 1).min(r.end - 1)
                )));
            }
            expected = r.end;
        }
        if expected < layers {
            return Err(bad(format!("layers {expected}-{} belong to no stage", layers - 1)));
        }
        Ok(Self { stages: ranges })
    }

    /// The stages' layer ranges (half-open).
    pub fn stages(&self) -> &[Range<usize>] {
        &self.stages
    }

    /// Number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether there is no stage (never, for a layout built by this type).
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Layers covered.
    pub fn num_layers(&self) -> usize {
        self.stages.last().map_or(0, |r| r.end)
    }
}

impl fmt::Display for StageLayout {
    /// The `--stage-layers` spelling: inclusive ranges.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.stages.iter().map(|r| format!("{}-{}", r.start, r.end - 1)).collect();
        f.write_str(&parts.join(","))
    }
}

/// Checks that `given` devices serve `stages × tp` (stage, rank) pairs, one each.
pub fn check_device_count(given: usize, stages: usize, tp: usize) -> Result<()> {
    if tp == 0 {
        return Err(PipelineError::Zero("the tensor-parallel size"));
    }
    let needed = stages * tp;
    if given != needed {
        return Err(PipelineError::DeviceCount { given, stages, tp, needed });
    }
    Ok(())
}

/// Checks that `given` devices serve stages of `degrees` ranks (one degree ≥ 1 per stage), one
/// device per (stage, rank).
pub fn check_group_devices(given: usize, stages: usize, degrees: &[usize]) -> Result<()> {
    if degrees.len() != stages {
        return Err(PipelineError::DegreeCount { degrees: degrees.len(), stages });
    }
    if degrees.contains(&0) {
        return Err(PipelineError::Zero("every stage's tensor-parallel size"));
    }
    let needed = degrees.iter().sum();
    if given != needed {
        let degrees = degrees.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        return Err(PipelineError::GroupDeviceCount { given, degrees, needed });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_and_inclusive_ranges_round_trip() {
        let even = StageLayout::even(24, 2).unwrap();
        assert_eq!(even.stages(), &[0..12, 12..24]);
        assert_eq!(even.to_string(), "0-11,12-23");
        assert_eq!(StageLayout::parse("0-11,12-23", 24).unwrap(), even);
        assert_eq!(StageLayout::even(5, 3).unwrap().stages(), &[0..2, 2..4, 4..5]);
        assert_eq!(StageLayout::parse("0, 1-3 ,4", 5).unwrap().stages(), &[0..1, 1..4, 4..5]);
    }

    #[test]
    fn bad_layouts_name_the_problem() {
        let message = |r: Result<StageLayout>| r.unwrap_err().to_string();
        assert!(message(StageLayout::even(2, 3)).contains("3 pipeline stages for a model of 2 layers"));
        assert!(message(StageLayout::even(2, 0)).contains("at least 1"));
        assert!(message(StageLayout::parse("0-5,7-11", 12)).contains("layers 6-6 belong to no stage"));
        assert!(message(StageLayout::parse("0-5,5-11", 12)).contains("in two stages"));
        assert!(message(StageLayout::parse("0-5,6-12", 12)).contains("out of range"));
        assert!(message(StageLayout::parse("0-5,6-10", 12)).contains("layers 11-11 belong to no stage"));
        assert!(message(StageLayout::parse("1-11", 12)).contains("layers 0-0 belong to no stage"));
        assert!(message(StageLayout::parse("5-0", 12)).contains("backwards"));
        assert!(message(StageLayout::parse("a-b", 12)).contains("not a layer range"));
        assert!(message(StageLayout::parse("0,1,2", 2)).contains("3 pipeline stages"));
        assert!(check_device_count(3, 2, 2).unwrap_err().to_string().contains("list exactly 4"));
        assert!(check_device_count(2, 2, 1).is_ok());
        assert!(check_group_devices(3, 2, &[2, 1]).is_ok());
        assert!(check_group_devices(4, 2, &[2, 1]).unwrap_err().to_string().contains("list exactly 3"));
        assert!(check_group_devices(3, 3, &[2, 1]).unwrap_err().to_string().contains("2 tensor-parallel degrees"));
        assert!(check_group_devices(2, 2, &[2, 0]).unwrap_err().to_string().contains("at least 1"));
    }
}
