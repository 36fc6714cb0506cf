//! Rotary position embeddings (Su et al., 2021) in HF's rotate-half form (dimension `i` pairs with
//! `i + d/2`), computed from a per-token positions tensor so that every sequence of a batch can sit
//! at a different position (needed by continuous batching). The rotation itself is
//! [`burn_llm_kernels::rotate_half`].

use burn::tensor::{Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// Frequency scaling schemes of HF `rope_scaling` / `rope_parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (Chen et al., 2023).
    Linear {
        /// Interpolation factor.
        factor: f64,
    },
    /// Dynamic NTK: the base grows once the sequence exceeds `max_positions`.
    Dynamic {
        /// Scaling factor.
        factor: f64,
        /// The context length the base was trained for.
        max_positions: usize,
    },
    /// LLaMA 3.1's wavelength-dependent scaling.
    Llama3 {
        /// Scaling factor for low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are not scaled.
        high_freq_factor: f64,
        /// The context length of the original model.
        original_max_positions: f64,
    },
    /// Each frequency divided by its own factor (llama.cpp's `rope_freqs.weight`, which GGUF
    /// files of LLaMA 3.x carry instead of the `llama3` parameters).
    Factors(Vec<f32>),
}

/// Parameters of a model's rotary embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// Base of the geometric frequency series.
    pub theta: f64,
    /// Rotated width (the head dimension).
    pub dim: usize,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

impl RopeSpec {
    /// Inverse frequencies for a step whose longest sequence spans `seq_len` positions (only
    /// dynamic scaling depends on it), as HF computes them in `f32`.
    pub fn inv_freq(&self, seq_len: usize) -> Vec<f32> {
        let d = self.dim;
        let base = match &self.scaling {
            RopeScaling::Dynamic { factor, max_positions } if seq_len > *max_positions => {
                let ratio = factor * seq_len as f64 / *max_positions as f64 - (factor - 1.0);
                self.theta * ratio.powf(d as f64 / (d as f64 - 2.0))
            }
            _ => self.theta,
        };
        let plain = (0..d / 2).map(|i| {
            let exponent = (2 * i) as f32 / d as f32;
            1.0 / (base as f32).powf(exponent)
        });
        match &self.scaling {
            RopeScaling::None | RopeScaling::Dynamic { .. } => plain.collect(),
            RopeScaling::Linear { factor } => plain.map(|f| f / *factor as f32).collect(),
            RopeScaling::Factors(factors) => plain.zip(factors).map(|(f, factor)| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                let (factor, low, high, original) =
                    (*factor as f32, *low_freq_factor as f32, *high_freq_factor as f32, *original_max_positions as f32);
                let low_freq_wavelen = original / low;
                let high_freq_wavelen = original / high;
                plain
                    .map(|f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        let scaled = if wavelen > low_freq_wavelen { f / factor } else { f };
                        let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                        if medium {
                            let smooth = (original / wavelen - low) / (high - low);
                            (1.0 - smooth) * scaled / factor + smooth * scaled
                        } else {
                            scaled
                        }
                    })
                    .collect()
            }
        }
    }

    /// `cos` and `sin` of every token's angles, shaped `[batch, seq, 1, dim / 2]` to broadcast over
    /// the heads of a `[batch, seq, heads, dim]` projection ([`rotate_half`](burn_llm_kernels::rotate_half)).
    /// `max_position` is the largest position in `positions`.
    pub fn cos_sin(&self, positions: &Tensor<2, Int>, max_position: usize) -> (Tensor<4>, Tensor<4>) {
        let device = positions.device();
        let [batch, seq] = positions.dims();
        let half = self.dim / 2;
        let inv_freq = self.inv_freq(max_position + 1);
        let inv_freq: Tensor<3> = Tensor::from_data(TensorData::new(inv_freq, [1, 1, half]), &device);
        let angles = positions.clone().float().reshape([batch, seq, 1]) * inv_freq;
        let angles = angles.reshape([batch, seq, 1, half]);
        (angles.clone().cos(), angles.sin())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_scaling_divides_frequencies() {
        let plain = RopeSpec { theta: 10_000.0, dim: 8, scaling: RopeScaling::None };
        let linear = RopeSpec { scaling: RopeScaling::Linear { factor: 2.0 }, ..plain.clone() };
        for (a, b) in plain.inv_freq(1).iter().zip(linear.inv_freq(1)) {
            assert!((a / 2.0 - b).abs() < 1e-7);
        }
        assert_eq!(plain.inv_freq(1)[0], 1.0);
    }

    #[test]
    fn llama3_keeps_high_and_scales_low_frequencies() {
        let spec = RopeSpec {
            theta: 500_000.0,
            dim: 64,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 8192.0,
            },
        };
        let plain = RopeSpec { scaling: RopeScaling::None, ..spec.clone() };
        let (s, p) = (spec.inv_freq(1), plain.inv_freq(1));
        assert_eq!(s[0], p[0], "highest frequency unchanged");
        assert!((s[31] - p[31] / 8.0).abs() < 1e-12, "lowest frequency divided by factor");
    }

    #[test]
    fn dynamic_grows_base_only_past_the_context() {
        let spec =
            RopeSpec { theta: 10_000.0, dim: 16, scaling: RopeScaling::Dynamic { factor: 2.0, max_positions: 64 } };
        let plain = RopeSpec { scaling: RopeScaling::None, ..spec.clone() };
        assert_eq!(spec.inv_freq(64), plain.inv_freq(64));
        assert!(spec.inv_freq(128)[3] < plain.inv_freq(128)[3]);
    }
}
