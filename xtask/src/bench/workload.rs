//! Seeded synthetic serving workloads shared by the serving benchmarks (`bench serve`,
//! `bench schedule`): ShareGPT-like and Alpaca-like request lengths.
//!
//! Lengths are drawn from log-normal distributions whose means are those of the ShareGPT and
//! Alpaca traces in the vLLM paper (§5.6.1), scaled by a factor so that a run fits a small
//! machine; the parameters are written into the results.

use rand::Rng;
use serde::Serialize;

/// A length distribution: log-normal with this mean and shape, clamped.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LengthDist {
    pub mean: f64,
    pub sigma: f64,
    pub min: usize,
    pub max: usize,
}

impl LengthDist {
    /// One length.
    pub fn draw(&self, rng: &mut impl Rng) -> usize {
        // ln X ~ N(μ, σ²) with E[X] = exp(μ + σ²/2) = mean.
        let mu = self.mean.ln() - self.sigma * self.sigma / 2.0;
        let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        ((mu + self.sigma * z).exp().round() as usize).clamp(self.min, self.max)
    }
}

/// A named pair of prompt and output length distributions.
#[derive(Debug, Clone, Serialize)]
pub struct SyntheticWorkload {
    pub name: &'static str,
    pub prompt: LengthDist,
    pub output: LengthDist,
}

/// One request: prompt token ids and the number of tokens it generates.
pub type Request = (Vec<u32>, usize);

impl SyntheticWorkload {
    /// The ShareGPT-like and Alpaca-like workloads, the paper's means multiplied by `scale`
    /// (Alpaca's by at least 1: its requests are short already), each length capped at four
    /// times its mean and half of `max_len`.
    pub fn standard(scale: f64, max_len: usize) -> [SyntheticWorkload; 2] {
        let cap = |m: f64| ((m * 4.0) as usize).min(max_len / 2);
        let (s, a) = (scale, scale.max(1.0));
        [
            SyntheticWorkload {
                name: "ShareGPT-like",
                prompt: LengthDist { mean: 161.0 * s, sigma: 0.9, min: 4, max: cap(161.0 * s) },
                output: LengthDist { mean: 338.0 * s, sigma: 0.9, min: 4, max: cap(338.0 * s) },
            },
            SyntheticWorkload {
                name: "Alpaca-like",
                prompt: LengthDist { mean: 19.3 * a, sigma: 0.7, min: 2, max: cap(19.3 * a) },
                output: LengthDist { mean: 58.5 * a, sigma: 0.9, min: 2, max: cap(58.5 * a) },
            },
        ]
    }

    /// `n` requests with random prompt tokens in `3..vocab`, prompt + output within `max_len`.
    pub fn requests(&self, n: usize, vocab: usize, max_len: usize, rng: &mut impl Rng) -> Vec<Request> {
        (0..n)
            .map(|_| {
                let prompt_len = self.prompt.draw(rng);
                let output_len = self.output.draw(rng).min(max_len - prompt_len).max(1);
                let prompt = (0..prompt_len).map(|_| rng.random_range(3..vocab as u32)).collect();
                (prompt, output_len)
            })
            .collect()
    }
}
