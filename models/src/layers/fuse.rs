//! Projections that read the same input fused into one at load (q|k|v, gate|up): their weights
//! concatenated along the output axis once, so a decode step runs one product (one GPU kernel
//! launch) where it ran two or three; callers split the output with views.
//!
//! Every layout concatenates without re-encoding: a dense weight is `[in, out]` (columns); a
//! FlexGen-quantized one is `[in, out]` grouped along `out`, its codes packed along `out` too, so
//! codes, scales and minimums concatenate column-wise (each part's output width is a whole number
//! of groups and of `u32` words); a GGUF one is `[out, in]` grouped along `in`, so its rows stack.
//! Each output value is the same dot product over the same input in the same order as before, so
//! the fused layer computes what the separate ones did.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn_llm_kernels::{GroupQuantized, QuantSpec};

use super::projection::{Projection, QLinear};

impl Projection {
    /// One projection whose output is `parts`' outputs side by side, in order; `None` where they
    /// cannot be fused (dense and quantized mixed, different quantizations or layouts or input
    /// widths, a bias on some but not all).
    pub fn concat(parts: &[&Projection]) -> Option<Projection> {
        if parts.is_empty() {
            return None;
        }
        if let Some(dense) = parts.iter().map(|p| as_dense(p)).collect::<Option<Vec<_>>>() {
            return concat_dense(&dense).map(Projection::Dense);
        }
        let quantized = parts.iter().map(|p| as_quantized(p)).collect::<Option<Vec<_>>>()?;
        concat_quantized(&quantized).map(Projection::Quantized)
    }

    /// Output width.
    pub fn out_width(&self) -> usize {
        match self {
            Projection::Dense(l) => l.weight.val().dims()[1],
            Projection::Quantized(q) => q.d_output,
        }
    }
}

fn as_dense(p: &Projection) -> Option<&Linear> {
    match p {
        Projection::Dense(l) => Some(l),
        Projection::Quantized(_) => None,
    }
}

fn as_quantized(p: &Projection) -> Option<&QLinear> {
    match p {
        Projection::Quantized(q) => Some(q),
        Projection::Dense(_) => None,
    }
}

/// The biases of `parts` concatenated: `Some(None)` when none has one, `None` when only some do.
fn concat_biases(biases: Vec<Option<Tensor<1>>>) -> Option<Option<Param<Tensor<1>>>> {
    if biases.iter().all(Option::is_none) {
        return Some(None);
    }
    let biases = biases.into_iter().collect::<Option<Vec<_>>>()?;
    Some(Some(Param::from_tensor(Tensor::cat(biases, 0))))
}

fn concat_dense(parts: &[&Linear]) -> Option<Linear> {
    let weights: Vec<Tensor<2>> = parts.iter().map(|l| l.weight.val()).collect();
    let d_input = weights[0].dims()[0];
    if weights.iter().any(|w| w.dims()[0] != d_input || w.dtype() != weights[0].dtype()) {
        return None;
    }
    let bias = concat_biases(parts.iter().map(|l| l.bias.as_ref().map(Param::val)).collect())?;
    Some(Linear { weight: Param::from_tensor(Tensor::cat(weights, 1)), bias })
}

fn concat_quantized(parts: &[&QLinear]) -> Option<QLinear> {
    let first = parts[0];
    let alike = |q: &QLinear| {
        q.bits == first.bits
            && q.group_size == first.group_size
            && q.input_grouped == first.input_grouped
            && q.d_input == first.d_input
            && (q.input_grouped
                || (q.d_output.is_multiple_of(q.group_size) && (q.d_output * q.bits as usize).is_multiple_of(32)))
    };
    if !parts.iter().all(|q| alike(q)) {
        return None;
    }
    // `[in, out]` storage concatenates along its columns, `[out, in]` along its rows.
    let axis = if first.input_grouped { 0 } else { 1 };
    let cat2 = |f: &dyn Fn(&QLinear) -> Tensor<2>| Tensor::cat(parts.iter().map(|q| f(q)).collect(), axis);
    let bias = concat_biases(parts.iter().map(|q| q.bias.as_ref().map(Param::val)).collect())?;
    let d_output = parts.iter().map(|q| q.d_output).sum();
    // The minimums stay derivable where every part's are, with the same offset.
    let offset = first.symmetric_offset;
    let offset = if parts.iter().all(|q| q.symmetric_offset == offset) { offset } else { 0 };
    let spec = QuantSpec::new(first.bits, first.group_size, super::projection::WEIGHT_QUANT_AXIS)
        .ok()?
        .with_symmetric_offset(offset);
    let shape = if first.input_grouped { [d_output, first.d_input] } else { [first.d_input, d_output] };
    let weight = GroupQuantized {
        codes: Tensor::cat(parts.iter().map(|q| q.codes.val()).collect(), axis),
        scale: cat2(&|q| q.scale.val()),
        min: cat2(&|q| q.min.val()),
        shape,
        spec,
    };
    Some(QLinear::from_parts(weight, bias, [first.d_input, d_output], first.input_grouped))
}

/// `x`'s last dimension cut into consecutive parts of `widths` (views, no copy).
pub fn split_last<const D: usize>(x: Tensor<D>, widths: &[usize]) -> Vec<Tensor<D>> {
    let mut start = 0;
    widths
        .iter()
        .map(|&w| {
            let part = x.clone().narrow(D - 1, start, w);
            start += w;
            part
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use burn::nn::LinearConfig;
    use burn::tensor::{Device, Distribution};

    use super::*;

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_into_vec_as::<f32>().unwrap()
    }

    /// Three projections of one 64-wide input (widths 64, 32, 32, q|k|v-like), with or without biases.
    fn parts(bias: bool, device: &Device) -> Vec<Linear> {
        [64, 32, 32].iter().map(|&out| LinearConfig::new(64, out).with_bias(bias).init(device)).collect()
    }

    /// The fused projection's output is the parts' outputs side by side.
    fn assert_concatenates(parts: &[Projection], what: &str) {
        let device = Device::flex();
        let x = Tensor::<2>::random([5, 64], Distribution::Uniform(-1.0, 1.0), &device);
        let refs: Vec<&Projection> = parts.iter().collect();
        let fused = Projection::concat(&refs).unwrap_or_else(|| panic!("{what}: not fused"));
        assert_eq!(fused.out_width(), 128, "{what}");
        let expected = Tensor::cat(parts.iter().map(|p| p.forward(x.clone())).collect(), 1);
        let got = fused.forward(x);
        for (g, e) in values(got).iter().zip(values(expected)) {
            assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "{what}: {g} vs {e}");
        }
    }

    #[test]
    fn dense_quantized_and_gguf_layouts_concatenate() {
        let device = Device::flex();
        for bias in [false, true] {
            let dense: Vec<Projection> = parts(bias, &device).into_iter().map(Projection::Dense).collect();
            assert_concatenates(&dense, &format!("dense, bias {bias}"));
            for bits in [4, 8] {
                let spec = QuantSpec::new(bits, 32, super::super::projection::WEIGHT_QUANT_AXIS).unwrap();
                let flexgen: Vec<Projection> = parts(bias, &device)
                    .iter()
                    .map(|l| Projection::Quantized(QLinear::from_linear(l, spec).unwrap()))
                    .collect();
                assert_concatenates(&flexgen, &format!("FlexGen {bits}-bit, bias {bias}"));
                let gguf: Vec<Projection> = parts(bias, &device)
                    .iter()
                    .map(|l| {
                        let out_in = burn_llm_kernels::quantize(l.weight.val().transpose(), spec).unwrap();
                        Projection::Quantized(QLinear::from_out_in(out_in, l.bias.clone()))
                    })
                    .collect();
                assert_concatenates(&gguf, &format!("GGUF layout {bits}-bit, bias {bias}"));
            }
        }
    }

    #[test]
    fn mismatched_parts_stay_separate() {
        let device = Device::flex();
        let spec = QuantSpec::new(4, 32, super::super::projection::WEIGHT_QUANT_AXIS).unwrap();
        let [a, b, _] = <[Linear; 3]>::try_from(parts(false, &device)).unwrap();
        let quantized = Projection::Quantized(QLinear::from_linear(&b, spec).unwrap());
        assert!(Projection::concat(&[&Projection::Dense(a.clone()), &quantized]).is_none(), "dense + quantized");
        let with_bias = LinearConfig::new(64, 32).init(&device);
        let none = Projection::Dense(a.clone());
        assert!(Projection::concat(&[&none, &Projection::Dense(with_bias)]).is_none(), "bias on one part only");
        let other_input = LinearConfig::new(40, 32).with_bias(false).init(&device);
        assert!(Projection::concat(&[&none, &Projection::Dense(other_input)]).is_none(), "input widths differ");
        assert!(Projection::concat(&[]).is_none(), "nothing to fuse");
    }
}
