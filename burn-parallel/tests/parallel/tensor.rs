//! Tensor parallelism against single-device execution on the OPT (pre- and post-norm), LLaMA
//! (GQA: 4 query heads over 2 kv heads, replicated at TP=4) and GPT-2 (fused QKV) fixtures: the
//! whole model run through [`TensorParallelLayer`] blocks over a cache of `layers · tp` rank
//! layers, greedy for a few steps, logits within 1e-4 and tokens identical; quantized weights
//! (input-grouped as GGUF stores them, and `--quantize`'s); and every bad degree.

use std::path::PathBuf;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};
use burn_llm_models::layers::projection::{Projection, QLinear};
use burn_llm_models::weights::TensorSource;
use burn_llm_models::{
    CausalLm, Checkpoint, ContiguousKvCache, DecoderSpec, GroupQuantized, KvLayout, ModelError, QuantSpec, StepInput,
};
use burn_parallel::block::LayerBlock;
use burn_parallel::tensor::{ReducePath, ShardPlan, TensorParallelError, TensorParallelLayer, rank_kv_layout};

const TOLERANCE: f32 = 1e-4;
const STEPS: usize = 4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// Two prompts of different lengths (the shorter one left-padded within the step).
fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 15, 9, 23, 7], vec![3, 44, 2]]
}

/// Greedy decoding of [`prompts`] for [`STEPS`] steps through `run` (one step's last-token
/// logits, `[batch, vocab]`, over a cache of `layout`): every step's logits and the tokens chosen.
fn greedy(
    layout: KvLayout,
    run: impl Fn(&StepInput, &mut ContiguousKvCache) -> Tensor<2>,
) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let device = Device::flex();
    let mut cache = ContiguousKvCache::new(layout, prompts().len(), 16, &device);
    let mut new = prompts();
    let (mut logits, mut tokens) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let refs: Vec<&[u32]> = new.iter().map(Vec::as_slice).collect();
        let step = cache.begin_step(&refs).expect("the cache holds the fixture prompts");
        let out = run(&step, &mut cache);
        let [_, vocab] = out.dims();
        let values: Vec<f32> = out.into_data().try_to_vec::<f32>().expect("f32 logits");
        let chosen: Vec<u32> = values
            .chunks_exact(vocab)
            .map(|row| row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best }) as u32)
            .collect();
        new = chosen.iter().map(|t| vec![*t]).collect();
        logits.push(values);
        tokens.push(chosen);
    }
    (logits, tokens)
}

/// The model on one device.
fn single(model: &CausalLm) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    greedy(model.kv_layout(), |step, cache| model.forward_last_logits(step, cache).unwrap())
}

/// The model's embeddings and head with `blocks` as its layers.
fn parallel(model: &CausalLm, blocks: &[TensorParallelLayer]) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let tp = blocks[0].degree();
    greedy(rank_kv_layout(model.kv_layout(), tp), |step, cache| {
        let mut hidden = model.embed(step);
        for (l, block) in blocks.iter().enumerate() {
            hidden.states = block.forward(hidden.states, l, hidden.rotary.as_ref(), cache).unwrap();
        }
        model.last_logits(model.finish(hidden), &step.last)
    })
}

/// Asserts that two runs agree: logits within [`TOLERANCE`], tokens identical.
fn assert_same(what: &str, expected: &(Vec<Vec<f32>>, Vec<Vec<u32>>), found: &(Vec<Vec<f32>>, Vec<Vec<u32>>)) {
    assert_eq!(expected.0.len(), found.0.len(), "{what}: steps");
    for (step, (a, b)) in expected.0.iter().zip(&found.0).enumerate() {
        assert!(!a.is_empty() && a.len() == b.len(), "{what}: step {step} has {} and {} logits", a.len(), b.len());
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff <= TOLERANCE, "{what}: step {step} logits differ by {diff}");
    }
    assert_eq!(expected.1, found.1, "{what}: greedy tokens differ");
}

fn flex(n: usize) -> Vec<Device> {
    vec![Device::flex(); n]
}

fn load(name: &str) -> (DecoderSpec, Checkpoint, CausalLm) {
    let dir = fixture(name);
    let spec = DecoderSpec::from_dir(&dir).expect("fixture config");
    let ckpt = Checkpoint::open(&dir).expect("fixture weights");
    let model = CausalLm::from_checkpoint(spec.clone(), &ckpt, &Device::flex()).expect("fixture model");
    (spec, ckpt, model)
}

/// Every fixture at TP=2 and TP=4, ranks loaded from the checkpoint and cut from loaded layers.
#[test]
fn tensor_parallel_matches_single_device() {
    for name in ["opt", "opt-postln-proj", "llama", "gpt2"] {
        let (spec, ckpt, model) = load(name);
        let expected = single(&model);
        for tp in [2, 4] {
            let loaded: Vec<TensorParallelLayer> = (0..spec.num_layers)
                .map(|l| TensorParallelLayer::load(&spec, &ckpt, l, &flex(tp)).expect("shards load"))
                .collect();
            assert_eq!(loaded[0].reduce_path(), ReducePath::ToDevice);
            assert_eq!(loaded[0].kv_devices().len(), tp);
            assert_same(&format!("{name} TP={tp} loaded"), &expected, &parallel(&model, &loaded));

            let split: Vec<TensorParallelLayer> = (0..spec.num_layers)
                .map(|l| {
                    let layer = CausalLm::load_layer(&spec, &ckpt, l, &Device::flex()).expect("layer");
                    TensorParallelLayer::split(layer, &flex(tp)).expect("layer splits")
                })
                .collect();
            assert_same(&format!("{name} TP={tp} split"), &expected, &parallel(&model, &split));

            // Each rank holds 1/tp of the layer's projection weights, plus the k/v columns of
            // kv heads replicated on several ranks.
            let plan = loaded[0].plan();
            let replicated = (tp * plan.kv_heads_per_rank() - plan.kv_heads) * plan.head_dim * spec.hidden_size * 4 * 2;
            let whole = model.layers[0].weight_bytes();
            assert_eq!(loaded[0].rank_weight_bytes().iter().sum::<usize>(), whole + replicated, "{name} TP={tp}");
        }
    }
}

/// LLaMA's 2 kv heads over 4 ranks: each kv head replicated on two ranks, one cache layer per rank.
#[test]
fn gqa_kv_heads_are_replicated_when_fewer_than_ranks() {
    let (spec, _, model) = load("llama");
    assert_eq!((spec.num_heads, spec.num_kv_heads), (4, 2), "the fixture's head counts changed");
    let plan = ShardPlan::for_spec(&spec, 4).expect("4 divides 4 heads; 4 is a multiple of 2 kv heads");
    assert_eq!(plan.kv_heads_per_rank(), 1);
    let d = spec.head_dim;
    assert_eq!((0..4).map(|r| plan.kv_range(r)).collect::<Vec<_>>(), vec![0..d, 0..d, d..2 * d, d..2 * d]);
    let layout = rank_kv_layout(model.kv_layout(), 4);
    assert_eq!((layout.num_layers, layout.num_kv_heads), (spec.num_layers * 4, 1));
    let plan = ShardPlan::for_spec(&spec, 2).expect("2 divides both");
    assert_eq!((plan.kv_heads_per_rank(), plan.kv_range(1)), (1, d..2 * d));
}

/// Bytes moved per forward on the `to_device` path: the input scattered, the attention sum
/// gathered and scattered back, the MLP sum gathered: `4 · (tp − 1)` hidden states (OPT has no
/// rotary angles to send).
#[test]
fn transfer_bytes_are_counted() {
    let (spec, ckpt, model) = load("opt");
    let tp = 2;
    let blocks: Vec<TensorParallelLayer> =
        (0..spec.num_layers).map(|l| TensorParallelLayer::load(&spec, &ckpt, l, &flex(tp)).expect("shards")).collect();
    parallel(&model, &blocks);
    let batch = prompts().len();
    let longest = prompts().iter().map(Vec::len).max().unwrap_or(0);
    // The first step runs the padded prompts, each later step one token per row.
    let tokens = batch * (longest + STEPS - 1);
    let expected = (4 * (tp - 1) * tokens * spec.hidden_size * 4) as u64;
    for block in &blocks {
        let stats = block.transfer_stats();
        assert_eq!((stats.forwards, stats.bytes), (STEPS as u64, expected));
    }
}

/// A checkpoint whose LLaMA projections come back quantized `[out, in]` along `in`, as GGUF
/// files store them (8-bit, groups of 32).
struct Quantized(Checkpoint);

impl TensorSource for Quantized {
    fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.0.read_f32(name, expected)
    }

    fn quantized(
        &self,
        name: &str,
        shape: [usize; 2],
        device: &Device,
    ) -> Result<Option<GroupQuantized<2>>, ModelError> {
        if !(name.starts_with("model.layers.") && name.ends_with("_proj.weight")) {
            return Ok(None);
        }
        let values = self.0.read_f32(name, &shape)?;
        let weight = Tensor::from_data(TensorData::new(values, shape), device);
        let linear = Linear { weight: Param::from_tensor(weight), bias: None };
        let spec = QuantSpec::new(8, 32, 1).expect("8-bit groups of 32");
        Ok(Some(QLinear::from_linear(&linear, spec)?.weight()))
    }
}

/// Quantized projections keep their codes: shards of a GGUF-style checkpoint (cut on the host
/// side of the source) and of a `--quantize`d model match the quantized model on one device;
/// shards that would cut a quantization group are an error naming the tensor.
#[test]
fn quantized_projections_are_sharded_on_group_boundaries() {
    let (spec, ckpt, _) = load("llama");
    let source = Quantized(ckpt);
    let model = CausalLm::from_checkpoint(spec.clone(), &source, &Device::flex()).expect("quantized model");
    assert!(matches!(model.layers[0].attn.o, Projection::Quantized(_)), "projections are quantized");
    let blocks: Vec<TensorParallelLayer> = (0..spec.num_layers)
        .map(|l| TensorParallelLayer::load(&spec, &source, l, &flex(2)).expect("group-aligned shards"))
        .collect();
    assert_same("llama Q8 checkpoint TP=2", &single(&model), &parallel(&model, &blocks));
    // At TP=4 the o projection's rows of 64 inputs split into 16, half a group of 32.
    let err = TensorParallelLayer::load(&spec, &source, 0, &flex(4)).expect_err("o shards cut groups");
    let message = err.to_string();
    assert!(message.contains("o_proj") && message.contains("32"), "{message}");

    // `--quantize`: groups of 16 along the output channel of `[in, out]`.
    let (spec, ckpt, model) = load("llama");
    let q4 = QuantSpec::new(4, 16, 1).expect("4-bit groups of 16");
    let model = model.quantize_weights(q4).expect("quantized");
    let blocks: Vec<TensorParallelLayer> = model
        .layers
        .iter()
        .map(|layer| TensorParallelLayer::split(layer.clone(), &flex(2)).expect("group-aligned shards"))
        .collect();
    assert_same("llama --quantize TP=2 split", &single(&model), &parallel(&model, &blocks));
    // Loaded dense, quantized per rank: each rank's shard is quantized on its own.
    let per_rank: Vec<TensorParallelLayer> = (0..spec.num_layers)
        .map(|l| TensorParallelLayer::load(&spec, &ckpt, l, &flex(2)).and_then(|b| b.quantized(q4)).expect("quantized"))
        .collect();
    assert_same("llama --quantize TP=2 per rank", &single(&model), &parallel(&model, &per_rank));
    // Groups of 64 along k/v's 32 output columns per rank: an error, not a re-encoding.
    let coarse = CausalLm::load_layer(&spec, &ckpt, 0, &Device::flex())
        .and_then(|l| l.quantized(QuantSpec::new(4, 32, 1).expect("spec")))
        .expect("layer");
    let err = TensorParallelLayer::split(coarse, &flex(4)).expect_err("16-column shards cut groups of 32");
    assert!(matches!(err, TensorParallelError::Model(ModelError::Window { .. })), "{err}");
}

/// Degrees that do not fit are refused before anything is loaded, naming the numbers.
#[test]
fn bad_degrees_are_clear_errors() {
    let (spec, ckpt, _) = load("opt");
    let err = TensorParallelLayer::load(&spec, &ckpt, 0, &flex(3)).expect_err("3 does not divide 4 heads");
    assert!(matches!(err, TensorParallelError::Indivisible { degree: 3, count: 4, .. }), "{err}");
    assert!(err.to_string().contains("degree 3 does not divide the 4 query heads"), "{err}");
    let err = TensorParallelLayer::load(&spec, &ckpt, 0, &[]).expect_err("no devices");
    assert!(matches!(err, TensorParallelError::NoDevices), "{err}");
    let err = TensorParallelLayer::load(&spec, &ckpt, spec.num_layers, &flex(2)).expect_err("no such layer");
    assert!(err.to_string().contains(&format!("the model has {} layers", spec.num_layers)), "{err}");
    let layer = CausalLm::load_layer(&spec, &ckpt, 0, &Device::flex()).expect("layer");
    let err = TensorParallelLayer::split(layer, &flex(8)).expect_err("8 does not divide 4 heads");
    assert!(matches!(err, TensorParallelError::Indivisible { degree: 8, count: 4, .. }), "{err}");

    let err = ShardPlan::new(2, 6, 3, 16, 128).expect_err("2 neither divides 3 kv heads nor is a multiple");
    assert!(err.to_string().contains("neither divides the 3 key/value heads"), "{err}");
    let err = ShardPlan::new(4, 8, 2, 16, 130).expect_err("4 does not divide 130 MLP columns");
    assert!(matches!(err, TensorParallelError::Indivisible { degree: 4, count: 130, .. }), "{err}");
    assert!(ShardPlan::new(4, 8, 2, 16, 128).is_ok(), "kv heads replicated: 4 is a multiple of 2");
}
