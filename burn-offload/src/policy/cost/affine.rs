//! Affine expressions over the nine placement variables `[wg, wc, wd, cg, cc, cd, hg, hc, hd]`,
//! the form every term and peak of the cost model takes, so that the LP can use them as they are.

/// Index of `wg` in the placement vector.
pub(crate) const WG: usize = 0;
/// Index of `wc`.
pub(crate) const WC: usize = 1;
/// Index of `wd`.
pub(crate) const WD: usize = 2;
/// Index of `cg`.
pub(crate) const CG: usize = 3;
/// Index of `cc`.
pub(crate) const CC: usize = 4;
/// Index of `cd`.
pub(crate) const CD: usize = 5;
/// Index of `hg`.
pub(crate) const HG: usize = 6;
/// Index of `hc`.
pub(crate) const HC: usize = 7;
/// Index of `hd`.
pub(crate) const HD: usize = 8;

/// `c + Σ k[i]·x[i]` over the nine placement variables.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Affine {
    /// Constant part.
    pub c: f64,
    /// Coefficient of each placement variable.
    pub k: [f64; 9],
}

impl Affine {
    /// A constant.
    pub fn constant(c: f64) -> Self {
        Self { c, k: [0.0; 9] }
    }

    /// `coef · x[i]`.
    pub fn var(i: usize, coef: f64) -> Self {
        let mut k = [0.0; 9];
        if let Some(slot) = k.get_mut(i) {
            *slot = coef;
        }
        Self { c: 0.0, k }
    }

    /// `coef · Σ x[i]` over `vars`.
    pub fn vars(vars: &[usize], coef: f64) -> Self {
        vars.iter().fold(Self::default(), |acc, &i| acc + Self::var(i, coef))
    }

    /// Value at `x`.
    pub fn eval(&self, x: &[f64; 9]) -> f64 {
        self.c + self.k.iter().zip(x).map(|(k, x)| k * x).sum::<f64>()
    }
}

impl std::ops::Add for Affine {
    type Output = Affine;
    fn add(mut self, rhs: Affine) -> Affine {
        self.c += rhs.c;
        for (a, b) in self.k.iter_mut().zip(rhs.k) {
            *a += b;
        }
        self
    }
}

impl std::ops::Mul<f64> for Affine {
    type Output = Affine;
    fn mul(mut self, rhs: f64) -> Affine {
        self.c *= rhs;
        for a in &mut self.k {
            *a *= rhs;
        }
        self
    }
}

/// `base + max(alternatives)`: a peak-memory expression whose working set is the largest of a
/// few intermediate buffers. `≤ capacity` is linear: one constraint per alternative.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MaxAffine {
    /// Always-present part.
    pub base: Affine,
    /// Alternatives of which the largest is added (may be empty).
    pub alts: Vec<Affine>,
}

impl MaxAffine {
    /// Value at `x`.
    pub fn eval(&self, x: &[f64; 9]) -> f64 {
        let extra = self.alts.iter().map(|a| a.eval(x)).fold(0.0_f64, f64::max);
        self.base.eval(x) + extra
    }

    /// The expressions that must each stay under the capacity.
    pub fn constraints(&self) -> Vec<Affine> {
        if self.alts.is_empty() { vec![self.base] } else { self.alts.iter().map(|a| self.base + *a).collect() }
    }
}
