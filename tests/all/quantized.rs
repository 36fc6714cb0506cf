//! Weights quantized with the kernels crate: the fused decode path (one row) and the
//! dequantize-then-matmul prefill path agree inside the model, and 8-bit weights stay close to HF.

use burn::tensor::Device;
use burn_llm::kernels::QuantSpec;
use burn_llm::models::cache::{KV_QUANT_AXIS, fit_kv_quant};
use burn_llm::models::layers::projection::WEIGHT_QUANT_AXIS;
use burn_llm::models::{ContiguousKvCache, Pretrained};

use crate::common::{FIXTURES, devices, fixture, max_abs_diff, reference};

#[test]
fn fused_decode_equals_prefill_path_and_w8_stays_close() {
    for (device_name, device) in devices() {
        for name in FIXTURES {
            let reference = reference(name);
            let model = Pretrained::load(&fixture(name), &device)
                .unwrap()
                .model
                .quantize_weights(QuantSpec::new(8, 32, WEIGHT_QUANT_AXIS).unwrap())
                .unwrap();
            let prompt = &reference.prompts[2];
            let ids = &prompt.input_ids;
            assert!(ids.len() > 16, "this prompt must take the dequantize-then-matmul path");
            let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
            let step = cache.begin_step(&[ids]).unwrap();
            let prefill =
                model.forward_all_logits(&step, &mut cache).unwrap().into_data().try_into_vec_as::<f32>().unwrap();

            let mut cache = ContiguousKvCache::new(model.kv_layout(), 1, ids.len(), &device);
            let mut decode = Vec::new();
            for id in ids {
                let step = cache.begin_step(&[&[*id]]).unwrap();
                decode.extend(
                    model.forward_all_logits(&step, &mut cache).unwrap().into_data().try_into_vec_as::<f32>().unwrap(),
                );
            }
            let diff = max_abs_diff(&prefill, &decode);
            assert!(diff <= 1e-4, "{name} on {device_name}: fused vs dequantized paths differ by {diff}");

            let range = prompt.logits.iter().fold(0f32, |m, v| m.max(v.abs()));
            let error = max_abs_diff(&prefill, &prompt.logits);
            assert!(error <= 0.05 * range, "{name} on {device_name}: w8 logits off by {error} (range {range})");
        }
    }
}

#[test]
fn group_sizes_that_do_not_divide_a_layer_are_errors() {
    let model = Pretrained::load(&fixture("llama"), &Device::flex()).unwrap().model;
    let err = model.quantize_weights(QuantSpec::new(4, 48, WEIGHT_QUANT_AXIS).unwrap()).unwrap_err().to_string();
    assert!(err.contains("layer 0") && err.contains("group size 48"), "{err}");
    // Weights are grouped along their output channel only.
    let model = Pretrained::load(&fixture("llama"), &Device::flex()).unwrap().model;
    let err = model.quantize_weights(QuantSpec::new(4, 32, 0).unwrap()).unwrap_err().to_string();
    assert!(err.contains("axis 1"), "{err}");
}

/// An 8-bit KV cache stays close to HF's logits and decodes; 4-bit runs through the same path.
#[test]
fn quantized_kv_cache() {
    use burn_llm::models::SamplingParams;
    for (device_name, device) in devices() {
        for name in ["opt", "llama", "gpt2"] {
            let reference = reference(name);
            let pretrained = Pretrained::load(&fixture(name), &device).unwrap();
            let prompt = &reference.prompts[1];
            let ids = &prompt.input_ids;
            let kv8 = QuantSpec::new(8, 16, KV_QUANT_AXIS).unwrap();
            let mut cache =
                ContiguousKvCache::quantized(pretrained.model.kv_layout(), 1, ids.len(), &device, kv8).unwrap();
            // 8-bit codes plus f32 scale and min per group of 16: 1.5 bytes a value instead of 4.
            assert!(
                cache.memory_bytes() * 2
                    < ContiguousKvCache::new(pretrained.model.kv_layout(), 1, ids.len(), &device).memory_bytes()
            );
            let step = cache.begin_step(&[ids]).unwrap();
            let logits = pretrained
                .model
                .forward_all_logits(&step, &mut cache)
                .unwrap()
                .into_data()
                .try_into_vec_as::<f32>()
                .unwrap();
            let range = prompt.logits.iter().fold(0f32, |m, v| m.max(v.abs()));
            let error = max_abs_diff(&logits, &prompt.logits);
            assert!(error <= 0.05 * range, "{name} on {device_name}: kv8 logits off by {error} (range {range})");

            for bits in [8, 4] {
                let generator = burn_llm::Generator::from(Pretrained::load(&fixture(name), &device).unwrap());
                // FlexGen's groups of 64, fitted to the fixtures' 16-value heads.
                let spec =
                    fit_kv_quant(generator.model().kv_layout(), QuantSpec::new(bits, 64, KV_QUANT_AXIS).unwrap())
                        .unwrap();
                assert_eq!(spec, QuantSpec::new(bits, 16, KV_QUANT_AXIS).unwrap());
                let generator = generator.with_kv_quantization(spec).unwrap();
                let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
                let out = generator.generate(&[prompt.text.as_str().into(), "GNU".into()], &params).unwrap();
                assert!(out.requests.iter().all(|r| r.generated_ids.len() == 6), "{name} kv{bits}");
            }
        }
    }
    let generator = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    // Exactly the groups asked for: 32 do not tile a 16-value head, and keys are grouped along
    // the head dimension only.
    let err = generator.with_kv_quantization(QuantSpec::new(4, 32, KV_QUANT_AXIS).unwrap()).unwrap_err().to_string();
    assert!(err.contains("group size 32"), "{err}");
    let generator = burn_llm::Generator::from(Pretrained::load(&fixture("opt"), &Device::flex()).unwrap());
    assert!(generator.with_kv_quantization(QuantSpec::new(4, 16, 2).unwrap()).is_err());
}
