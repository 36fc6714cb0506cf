//! Sequence-length distributions `P_E(S)` and `P_D(S)` (ExeGPT §6): a histogram, an explicit
//! trace of lengths, or a seeded sample of a truncated normal (the shape ExeGPT fits to its
//! datasets, §7.1).

use serde::{Deserialize, Serialize};

use crate::check::{self, InputError};
use crate::sim;

/// Longest sequence length accepted.
const MAX_LEN: usize = 1 << 20;
/// Most samples a truncated normal may draw.
const MAX_SAMPLES: usize = 1_000_000;

/// A length distribution in the input JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LengthDistribution {
    /// `{"histogram": [[length, weight], …]}`: weights need not sum to 1.
    Histogram(Vec<(usize, f64)>),
    /// `{"trace": [length, …]}`: the empirical distribution of these lengths.
    Trace(Vec<usize>),
    /// `{"truncated_normal": {"mean", "std", "max", "count", "seed"}}`: `count` seeded samples of
    /// a normal, rounded, kept within `1..=max`.
    TruncatedNormal(TruncatedNormal),
}

/// Parameters of [`LengthDistribution::TruncatedNormal`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruncatedNormal {
    /// Mean before truncation.
    pub mean: f64,
    /// Standard deviation before truncation.
    pub std: f64,
    /// Longest length kept.
    pub max: usize,
    /// Samples to draw (default 10000).
    #[serde(default)]
    pub count: Option<usize>,
    /// Seed (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
}

/// A checked distribution: lengths in increasing order with probabilities summing to 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Lengths {
    points: Vec<(usize, f64)>,
}

impl Lengths {
    /// Checks `dist` (named `field` in errors).
    pub fn new(field: &str, dist: &LengthDistribution) -> Result<Self, InputError> {
        let mut points: Vec<(usize, f64)> = match dist {
            LengthDistribution::Histogram(h) => {
                check::count(&format!("{field}.histogram"), h.len(), MAX_SAMPLES)?;
                for (i, &(len, w)) in h.iter().enumerate() {
                    check::count(&format!("{field}.histogram[{i}][0]"), len, MAX_LEN)?;
                    check::non_negative(&format!("{field}.histogram[{i}][1]"), w)?;
                }
                h.clone()
            }
            LengthDistribution::Trace(t) => {
                check::count(&format!("{field}.trace"), t.len(), MAX_SAMPLES)?;
                for (i, &len) in t.iter().enumerate() {
                    check::count(&format!("{field}.trace[{i}]"), len, MAX_LEN)?;
                }
                t.iter().map(|&l| (l, 1.0)).collect()
            }
            LengthDistribution::TruncatedNormal(n) => truncated_normal(&format!("{field}.truncated_normal"), n)?,
        };
        points.sort_by_key(|p| p.0);
        let mut merged: Vec<(usize, f64)> = Vec::with_capacity(points.len());
        for (len, w) in points {
            match merged.last_mut() {
                Some(last) if last.0 == len => last.1 += w,
                _ => merged.push((len, w)),
            }
        }
        let total: f64 = merged.iter().map(|p| p.1).sum();
        if !(total > 0.0 && total.is_finite()) {
            return Err(InputError::new(field, "has no weight; give at least one length with a positive weight"));
        }
        merged.retain(|p| p.1 > 0.0);
        for p in &mut merged {
            p.1 /= total;
        }
        Ok(Self { points: merged })
    }

    /// `(length, probability)` in increasing length.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// Expected length.
    pub fn mean(&self) -> f64 {
        self.points.iter().map(|&(l, p)| l as f64 * p).sum()
    }

    /// Standard deviation of the length.
    pub fn std(&self) -> f64 {
        let mean = self.mean();
        self.points.iter().map(|&(l, p)| p * (l as f64 - mean).powi(2)).sum::<f64>().sqrt()
    }

    /// Longest length with positive probability.
    pub fn max(&self) -> usize {
        self.points.last().map_or(1, |p| p.0)
    }

    /// Smallest length whose cumulative probability reaches `percent`%.
    pub fn percentile(&self, percent: f64) -> usize {
        let target = percent / 100.0 - 1e-12;
        let mut acc = 0.0;
        for &(len, p) in &self.points {
            acc += p;
            if acc >= target {
                return len;
            }
        }
        self.max()
    }
}

/// The standard normal's quantile at probability `p` (Acklam's rational approximation without
/// its refinement step: within 1.3e-5 of the true value in the tails, 1.4e-9 in the middle); `p` is
/// clamped to `[1e-9, 1 − 1e-9]`.
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.38357751867269e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549671010366372,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let p = p.clamp(1e-9, 1.0 - 1e-9);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

fn truncated_normal(field: &str, n: &TruncatedNormal) -> Result<Vec<(usize, f64)>, InputError> {
    let mean = check::non_negative(&format!("{field}.mean"), n.mean)?;
    let std = check::non_negative(&format!("{field}.std"), n.std)?;
    let max = check::count(&format!("{field}.max"), n.max, MAX_LEN)?;
    let count = check::count(&format!("{field}.count"), n.count.unwrap_or(10_000), MAX_SAMPLES)?;
    let mut rng = sim::rng(n.seed.unwrap_or(0), 0);
    let mut out = Vec::with_capacity(count);
    let mut tries = 0usize;
    while out.len() < count {
        tries += 1;
        if tries > 100 * count {
            return Err(InputError::new(field, "almost no samples fall within 1..=max; check mean, std and max"));
        }
        let x = (mean + std * sim::normal(&mut rng)).round();
        if x >= 1.0 && x <= max as f64 {
            out.push((x as usize, 1.0));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_lengths_normalise_and_give_percentiles() {
        let l = Lengths::new("d", &LengthDistribution::Histogram(vec![(10, 1.0), (20, 2.0), (10, 1.0)])).unwrap();
        assert_eq!(l.points(), &[(10, 0.5), (20, 0.5)]);
        assert_eq!(l.mean(), 15.0);
        assert_eq!(l.percentile(50.0), 10);
        assert_eq!(l.percentile(99.0), 20);
        assert_eq!(l.std(), 5.0);
        let n = LengthDistribution::TruncatedNormal(TruncatedNormal {
            mean: 50.0,
            std: 10.0,
            max: 80,
            count: Some(2000),
            seed: Some(3),
        });
        let a = Lengths::new("d", &n).unwrap();
        assert!((a.mean() - 50.0).abs() < 2.0);
        assert_eq!(a, Lengths::new("d", &n).unwrap());
        assert!(Lengths::new("d", &LengthDistribution::Trace(vec![])).is_err());
        assert!(Lengths::new("d", &LengthDistribution::Histogram(vec![(3, 0.0)])).is_err());
    }

    #[test]
    fn schedule_normal_quantile_matches_tables() {
        for (p, z) in
            [(0.5, 0.0), (0.9, 1.2815515655), (0.99, 2.3263478740), (0.01, -2.3263478740), (0.999, 3.0902323062)]
        {
            assert!((normal_quantile(p) - z).abs() < 2e-5, "{p}: {}", normal_quantile(p));
        }
    }
}
