//! The tables a [`super::Profile`] is read through: a grid over (batch, second axis),
//! piecewise-linear along each axis and held to its [`Shape`] along the batch (module docs of
//! [`super`]).

use super::MAX_POINTS;
use crate::check::{self, InputError};

/// How a table is read along its batch axis (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Non-decreasing, with a time per sequence that never grows (the layer tables).
    Sublinear,
    /// Non-decreasing only (the engine's measured steps).
    NonDecreasing,
}

/// How a table is read along its second axis between (and beyond) its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Along {
    /// The value is piecewise linear (a decode step's time against its context: `c + a·j`).
    Linear,
    /// Through quadratics of three neighbouring points: exact for `c + a·x + b·x²`, a prefill's
    /// time against its tokens (a fixed cost, projections linear, attention quadratic), where
    /// the chord between two points overstates every length between them. Between two points,
    /// the mean of the quadratics through the triples that hold both; beyond the last point, the
    /// last triple's, never below the last segment's line.
    Quadratic,
}

/// A table over (batch, second axis), read as described in the module docs.
#[derive(Debug, Clone)]
pub(super) struct Grid {
    batch: Vec<f64>,
    other: Vec<f64>,
    values: Vec<Vec<f64>>,
    shape: Shape,
    along: Along,
}

impl Grid {
    pub(super) fn new(
        field: &str,
        (batch_name, batch, batch_min): (&str, &[f64], f64),
        (other_name, other, other_min): (&str, &[f64], f64),
        (values_name, values): (&str, &[Vec<f64>]),
        shape: Shape,
    ) -> Result<Self, InputError> {
        for (name, axis, min) in [(batch_name, batch, batch_min), (other_name, other, other_min)] {
            let name = format!("{field}.{name}");
            check::count(&name, axis.len(), MAX_POINTS)?;
            for (i, &p) in axis.iter().enumerate() {
                if !p.is_finite() || p < min || (i > 0 && p <= axis[i - 1]) {
                    return Err(InputError::new(
                        format!("{name}[{i}]"),
                        format!("{p} must be finite, at least {min} and larger than the point before"),
                    ));
                }
            }
        }
        let values_field = format!("{field}.{values_name}");
        check::same_len(&values_field, values, batch.len(), "batch sizes")?;
        for (b, row) in values.iter().enumerate() {
            let row_field = format!("{values_field}[{b}]");
            check::same_len(&row_field, row, other.len(), other_name)?;
            for (i, &v) in row.iter().enumerate() {
                check::non_negative(&format!("{row_field}[{i}]"), v)?;
            }
        }
        Ok(Self { batch: batch.to_vec(), other: other.to_vec(), values: values.to_vec(), shape, along: Along::Linear })
    }

    /// The same table read `along` its second axis.
    pub(super) fn along(self, along: Along) -> Self {
        Self { along, ..self }
    }

    /// The same points holding `max(0, value − f(batch, other))`, read [`Shape::NonDecreasing`].
    pub(super) fn minus(&self, f: impl Fn(f64, f64) -> f64) -> Self {
        let values = self
            .batch
            .iter()
            .zip(&self.values)
            .map(|(&b, row)| self.other.iter().zip(row).map(|(&o, &v)| (v - f(b, o)).max(0.0)).collect())
            .collect();
        Self { values, shape: Shape::NonDecreasing, ..self.clone() }
    }

    /// The batch curve at `other`, at the batch points, made monotone as its [`Shape`] says.
    pub(super) fn curve(&self, other: f64) -> Vec<f64> {
        // Read every batch row at `other`, then make the batch curve monotone.
        let read = |row: &[f64]| match self.along {
            Along::Linear => interpolate(&self.other, row, other),
            Along::Quadratic => quadratic(&self.other, row, other),
        };
        let mut curve: Vec<f64> = self.values.iter().map(|row| read(row).max(0.0)).collect();
        for i in 1..curve.len() {
            curve[i] = curve[i].max(curve[i - 1]);
        }
        if self.shape == Shape::Sublinear {
            for i in 1..curve.len() {
                let per_seq = curve[i - 1] / self.batch[i - 1];
                curve[i] = curve[i].min(per_seq * self.batch[i]);
            }
        }
        curve
    }

    pub(super) fn eval(&self, batch: f64, other: f64) -> f64 {
        interpolate(&self.batch, &self.curve(other), batch).max(0.0)
    }

    /// Whether the time per sequence never grows with the batch at `other`: checking the batch
    /// points suffices, since the curve is piecewise linear between them and extended with its
    /// last segment (a segment from `t1/b1 ≥ t2/b2` has a non-negative intercept).
    pub(super) fn sublinear_at(&self, other: f64) -> bool {
        let curve = self.curve(other);
        (1..curve.len()).all(|i| curve[i] / self.batch[i] <= curve[i - 1] / self.batch[i - 1] * (1.0 + 1e-12))
    }
}

/// Piecewise-linear `ys` over increasing `xs` at `x`: constant below the first point, extended
/// with the last segment's slope beyond the last.
fn interpolate(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    if xs.len() == 1 || x <= xs[0] {
        return ys[0];
    }
    let seg = xs[..xs.len() - 1].iter().rposition(|&p| p <= x).unwrap_or(0);
    let w = (x - xs[seg]) / (xs[seg + 1] - xs[seg]);
    ys[seg] + w * (ys[seg + 1] - ys[seg])
}

/// [`Along::Quadratic`] at `x`: below the first point the first value; with fewer than three
/// points, [`interpolate`].
fn quadratic(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    let n = xs.len();
    if n < 3 || x <= xs[0] {
        return interpolate(xs, ys, x);
    }
    let through = |first: usize| {
        let (px, py) = (&xs[first..first + 3], &ys[first..first + 3]);
        (0..3)
            .map(|i| {
                let weight: f64 = (0..3).filter(|&j| j != i).map(|j| (x - px[j]) / (px[i] - px[j])).product();
                weight * py[i]
            })
            .sum::<f64>()
    };
    if x >= xs[n - 1] {
        return through(n - 3).max(interpolate(xs, ys, x));
    }
    // The triples holding segment `seg`'s two points start at `seg − 1` and `seg`, where they
    // exist: at the ends both are the one triple there.
    let seg = xs[..n - 1].iter().rposition(|&p| p <= x).unwrap_or(0);
    (through(seg.saturating_sub(1).min(n - 3)) + through(seg.min(n - 3))) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(values: Vec<Vec<f64>>) -> Grid {
        Grid::new(
            "g",
            ("batch", &[1.0, 2.0, 4.0], 1.0),
            ("tokens", &[1.0, 10.0], 1.0),
            ("v", &values),
            Shape::Sublinear,
        )
        .unwrap()
    }

    #[test]
    fn profile_grid_interpolates_and_extrapolates() {
        let g = grid(vec![vec![1.0, 10.0], vec![2.0, 20.0], vec![4.0, 40.0]]);
        assert!((g.eval(1.0, 5.5) - 5.5).abs() < 1e-12);
        assert!((g.eval(3.0, 1.0) - 3.0).abs() < 1e-12);
        assert!((g.eval(8.0, 1.0) - 8.0).abs() < 1e-12);
        assert!((g.eval(1.0, 19.0) - 19.0).abs() < 1e-12);
        assert_eq!(g.eval(0.5, 1.0), 1.0);
    }

    #[test]
    fn profile_grid_is_monotone_in_batch_with_non_increasing_time_per_sequence() {
        // Noisy: batch 2 faster than batch 1, batch 4 superlinear.
        let g = grid(vec![vec![2.0, 2.0], vec![1.0, 1.0], vec![20.0, 20.0]]);
        assert_eq!(g.eval(2.0, 1.0), 2.0);
        assert_eq!(g.eval(4.0, 1.0), 4.0);
    }

    #[test]
    fn profile_engine_grid_keeps_a_jump_and_interpolates_piecewise_linearly() {
        // Batch 1 → 2 triples the step (per sequence: 30, 45, 31.7, 25 ms), then grows slowly.
        let g = Grid::new(
            "g",
            ("batch", &[1.0, 2.0, 3.0, 4.0], 1.0),
            ("context", &[0.0, 100.0], 0.0),
            ("ms", &[vec![30.0, 40.0], vec![90.0, 100.0], vec![95.0, 105.0], vec![100.0, 110.0]]),
            Shape::NonDecreasing,
        )
        .unwrap();
        assert_eq!(g.eval(2.0, 0.0), 90.0);
        assert!((g.eval(1.5, 50.0) - 65.0).abs() < 1e-12);
        assert!((g.eval(8.0, 0.0) - 120.0).abs() < 1e-12, "extended with the last slope");
        assert!(!g.sublinear_at(50.0));
        // A noisy dip is held at the running maximum, never cheaper at a larger batch.
        let dip = Grid::new(
            "g",
            ("batch", &[1.0, 2.0, 4.0], 1.0),
            ("context", &[0.0], 0.0),
            ("ms", &[vec![30.0], vec![25.0], vec![40.0]]),
            Shape::NonDecreasing,
        )
        .unwrap();
        assert_eq!(dip.eval(2.0, 0.0), 30.0);
        assert!(dip.sublinear_at(0.0));
        // The overhead over a compute model is never negative.
        let over = dip.minus(|b, _| 10.0 * b);
        assert_eq!((over.eval(1.0, 0.0), over.eval(4.0, 0.0)), (20.0, 20.0));
        assert_eq!(dip.minus(|_, _| 100.0).eval(2.0, 0.0), 0.0);
    }

    #[test]
    fn profile_grid_quadratic_is_exact_for_a_fixed_linear_and_quadratic_cost() {
        // 2 + 0.05·t + 1e-4·t² ms, tabulated as a profile's prompt lengths.
        let f = |t: f64| 2.0 + 0.05 * t + 1e-4 * t * t;
        let tokens = [16.0, 64.0, 256.0, 1024.0, 2048.0];
        let row: Vec<f64> = tokens.iter().map(|&t| f(t)).collect();
        let read = |along| {
            Grid::new(
                "g",
                ("batch", &[1.0], 1.0),
                ("tokens", &tokens, 1.0),
                ("v", std::slice::from_ref(&row)),
                Shape::Sublinear,
            )
            .unwrap()
            .along(along)
        };
        let g = read(Along::Quadratic);
        for t in [16.0, 40.0, 100.0, 512.0, 700.0, 1500.0, 2048.0, 4096.0] {
            assert!((g.eval(1.0, t) - f(t)).abs() < 1e-9, "{t}: {} vs {}", g.eval(1.0, t), f(t));
        }
        // The chord at 512 overstates it; below the first point the first value holds.
        assert!(read(Along::Linear).eval(1.0, 512.0) > f(512.0) * 1.1);
        assert_eq!(g.eval(1.0, 8.0), f(16.0));
        // A concave tail is not extended below the last segment's line; two points read linearly.
        let concave = Grid::new(
            "g",
            ("batch", &[1.0], 1.0),
            ("tokens", &[1.0, 2.0, 3.0], 1.0),
            ("v", &[vec![1.0, 1.8, 2.4]]),
            Shape::Sublinear,
        )
        .unwrap()
        .along(Along::Quadratic);
        assert!((concave.eval(1.0, 5.0) - 3.6).abs() < 1e-12);
        let two = Grid::new(
            "g",
            ("batch", &[1.0], 1.0),
            ("tokens", &[1.0, 3.0], 1.0),
            ("v", &[vec![1.0, 3.0]]),
            Shape::Sublinear,
        )
        .unwrap()
        .along(Along::Quadratic);
        assert!((two.eval(1.0, 2.0) - 2.0).abs() < 1e-12);
    }

    #[test]
    fn profile_rejects_bad_tables() {
        let shape = Shape::Sublinear;
        let bad =
            Grid::new("g", ("batch", &[2.0, 1.0], 1.0), ("tokens", &[1.0], 1.0), ("v", &[vec![1.0], vec![1.0]]), shape);
        assert!(bad.is_err());
        let short = Grid::new("g", ("batch", &[1.0], 1.0), ("tokens", &[1.0, 2.0], 1.0), ("v", &[vec![1.0]]), shape);
        assert!(short.is_err());
    }
}
