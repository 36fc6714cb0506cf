//! TeraPipe token slices through pipeline stages, each stage on a thread of its own over its view
//! of the paged KV cache: the threaded order equals the one-thread order bit for bit, a sliced
//! prefill is greedy-identical to one pass (also after cached context, as after prefix caching or
//! a recompute preemption), the stage threads keep the caller's matmul precision, a cache that
//! cannot be split falls back, and a failing stage is an error, not a hang.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_llm_kernels::{MatmulPrecision, matmul_precision, with_matmul_precision};
use burn_llm_models::language_model::forward_micro_batches_in_turn;
use burn_llm_models::{
    CausalLm, KvCache, LanguageModel, MicroBatchCache, PrefillSlicing, RandomWeights, StageCache, StepInput,
    UniformSlices,
};
use burn_paged::cache::{PagedKvCache, PagedStep};
use burn_parallel::pipeline::{PipelineLm, PipelinePlan, StageLayout};

use super::{ARCHES, deeper};

const PROMPT: [u32; 13] = [5, 17, 42, 9, 3, 77, 12, 8, 2, 31, 4, 60, 11];
const BLOCK: usize = 4;
const BLOCKS: usize = 8;
const DECODE_STEPS: usize = 4;

/// What a run produced: every slice's final hidden states (flattened), then the greedy tokens and
/// logits of the prefill's last token and of each decode step.
#[derive(Debug, PartialEq)]
struct Run {
    states: Vec<Vec<f32>>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// One sequence's tokens at positions `start..` as micro-batches of `slices` tokens: block `b`
/// holds positions `b·BLOCK..`, so a token's slot is its position.
fn lay_out(device: &Device, tokens: &[u32], start: usize, slices: &[usize]) -> (Vec<PagedStep>, Vec<StepInput>) {
    let mut at = 0;
    slices
        .iter()
        .map(|&n| {
            let positions: Vec<usize> = (start + at..start + at + n).collect();
            let ids: Vec<i64> = tokens[at..at + n].iter().map(|&t| t as i64).collect();
            at += n;
            let step = PagedStep {
                slots: positions.iter().map(|&p| p as u32).collect(),
                block_tables: (0..BLOCKS as u32).collect(),
                max_blocks: BLOCKS,
                query_seq: vec![0; n],
                context_lens: positions.iter().map(|&p| p as u32 + 1).collect(),
            };
            let pos: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
            let input = StepInput {
                tokens: Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), device),
                positions: Tensor::<2, Int>::from_data(TensorData::new(pos, [1, n]), device),
                max_position: start + at - 1,
                last: vec![Some(n - 1)],
            };
            (step, input)
        })
        .unzip()
}

fn flat<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().unwrap()
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold(0, |best, (i, v)| if *v > row[best] { i } else { best }) as u32
}

/// How a prefill's micro-batches are run.
#[derive(Clone, Copy)]
enum Order {
    /// `forward_micro_batches`: the pipeline's threads.
    Threaded,
    /// The one-thread default.
    InTurn,
}

/// Prefills [`PROMPT`]: the first `cached` tokens in one pass first (context already in the
/// cache), the rest cut into `slices`; then decodes greedily.
fn run(model: &PipelineLm, cache: &mut dyn CacheUnderTest, cached: usize, slices: &[usize], order: Order) -> Run {
    let device = model.device();
    let mut states = Vec::new();
    if cached > 0 {
        let (steps, inputs) = lay_out(&device, &PROMPT[..cached], 0, &[cached]);
        cache.begin(&steps);
        states.push(flat(model.forward(&inputs[0], cache.as_kv()).unwrap()));
    }
    let (steps, inputs) = lay_out(&device, &PROMPT[cached..], cached, slices);
    cache.begin(&steps);
    let out = match order {
        Order::Threaded => model.forward_micro_batches(&inputs, cache.as_micro()).unwrap(),
        Order::InTurn => forward_micro_batches_in_turn(model, &inputs, cache.as_micro()).unwrap(),
    };
    let last = out.last().unwrap().clone();
    states.extend(out.into_iter().map(flat));
    let mut logits = vec![flat(model.last_logits(last, &inputs.last().unwrap().last))];
    let mut tokens = vec![argmax(&logits[0])];
    for i in 0..DECODE_STEPS {
        let position = PROMPT.len() + i;
        let (steps, inputs) = lay_out(&device, &tokens[i..=i], position, &[1]);
        cache.begin(&steps);
        let row = flat(model.forward_last_logits(&inputs[0], cache.as_kv()).unwrap());
        tokens.push(argmax(&row));
        logits.push(row);
    }
    Run { states, tokens, logits }
}

/// The paged cache, or a wrapper that cannot be split.
trait CacheUnderTest {
    fn begin(&mut self, steps: &[PagedStep]);
    fn as_kv(&mut self) -> &mut dyn KvCache;
    fn as_micro(&mut self) -> &mut dyn MicroBatchCache;
}

impl CacheUnderTest for PagedKvCache {
    fn begin(&mut self, steps: &[PagedStep]) {
        self.begin_micro_batches(steps).unwrap();
    }
    fn as_kv(&mut self) -> &mut dyn KvCache {
        self
    }
    fn as_micro(&mut self) -> &mut dyn MicroBatchCache {
        self
    }
}

/// A [`MicroBatchCache`] with the default `split_layers` (cannot split).
struct Unsplittable(PagedKvCache);

impl KvCache for Unsplittable {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.0.attend(layer, q, k, v, scale, window)
    }
}

impl MicroBatchCache for Unsplittable {
    fn select_micro_batch(&mut self, index: usize) {
        self.0.select_micro_batch(index);
    }
}

impl CacheUnderTest for Unsplittable {
    fn begin(&mut self, steps: &[PagedStep]) {
        self.0.begin_micro_batches(steps).unwrap();
    }
    fn as_kv(&mut self) -> &mut dyn KvCache {
        self
    }
    fn as_micro(&mut self) -> &mut dyn MicroBatchCache {
        self
    }
}

fn paged(model: &impl LanguageModel) -> PagedKvCache {
    PagedKvCache::placed(model.kv_layout(), BLOCK, BLOCKS, 0, model.kv_devices(), None).unwrap()
}

/// The pipelines under test: 2 stages and 3 (even and uneven) over four layers, on flex, with one
/// thread per stage.
fn pipelines(name: &str) -> Vec<(String, PipelineLm)> {
    let spec = deeper(name);
    ["0-1,2-3", "0,1-2,3", "0-2,3"]
        .into_iter()
        .map(|layers| {
            let layout = StageLayout::parse(layers, spec.num_layers).unwrap();
            let plan = PipelinePlan::new(layout.clone(), 1, vec![Device::flex(); layout.len()]).unwrap();
            let model = PipelineLm::from_checkpoint(spec.clone(), &RandomWeights::default(), &plan, None).unwrap();
            (format!("{name} {layers}"), model.with_stage_threads(1))
        })
        .collect()
}

#[test]
fn threaded_stages_equal_the_in_turn_order_bit_for_bit() {
    for name in ARCHES {
        for (what, model) in pipelines(name) {
            for slices in [&[5, 4, 4][..], &[1; 13], &[12, 1]] {
                let threaded = run(&model, &mut paged(&model), 0, slices, Order::Threaded);
                let in_turn = run(&model, &mut paged(&model), 0, slices, Order::InTurn);
                assert_eq!(threaded, in_turn, "{what}, slices {slices:?}");
            }
        }
    }
}

#[test]
fn sliced_prefill_is_greedy_identical_to_one_pass() {
    for name in ARCHES {
        let single = CausalLm::random(deeper(name), &Device::flex()).unwrap();
        let mut cache = paged(&single);
        let (steps, inputs) = lay_out(&single.device(), &PROMPT, 0, &[PROMPT.len()]);
        cache.begin_micro_batches(&steps).unwrap();
        let one_device = flat(LanguageModel::forward_last_logits(&single, &inputs[0], &mut cache).unwrap());
        for (what, model) in pipelines(name) {
            let whole = run(&model, &mut paged(&model), 0, &[PROMPT.len()], Order::Threaded);
            assert_eq!(whole.tokens[0], argmax(&one_device), "{what}: one pass against one device");
            let uniform = UniformSlices::new(3).unwrap().slices(PROMPT.len(), 0);
            for slices in [uniform, vec![1; 13], vec![2, 6, 5]] {
                let sliced = run(&model, &mut paged(&model), 0, &slices, Order::Threaded);
                assert_eq!(sliced.tokens, whole.tokens, "{what}, slices {slices:?}");
                let diff = whole.logits.iter().flatten().zip(sliced.logits.iter().flatten());
                let diff = diff.map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(diff <= 1e-4, "{what}, slices {slices:?}: logits differ by {diff}");
            }
            // After 5 tokens already cached (a cached prefix, or a recomputed preempted
            // sequence's first pass), the rest sliced.
            let after = run(&model, &mut paged(&model), 5, &[3, 3, 2], Order::Threaded);
            assert_eq!(after.tokens, whole.tokens, "{what}, sliced after a cached prefix");
        }
    }
}

/// A paged cache whose views record the matmul precision in force on the thread that attends.
struct Recording {
    inner: PagedKvCache,
    seen: Arc<Mutex<Vec<MatmulPrecision>>>,
}

/// One view of a [`Recording`] cache.
struct RecordingView<'a> {
    inner: StageCache<'a>,
    seen: Arc<Mutex<Vec<MatmulPrecision>>>,
}

impl KvCache for RecordingView<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.seen.lock().unwrap().push(matmul_precision());
        self.inner.attend(layer, q, k, v, scale, window)
    }
}

impl MicroBatchCache for RecordingView<'_> {
    fn select_micro_batch(&mut self, index: usize) {
        self.inner.select_micro_batch(index);
    }
}

impl KvCache for Recording {
    fn attend(
        &mut self,
        layer: usize,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        scale: f32,
        window: Option<usize>,
    ) -> burn_llm_models::Result<Tensor<4>> {
        self.inner.attend(layer, q, k, v, scale, window)
    }
}

impl MicroBatchCache for Recording {
    fn select_micro_batch(&mut self, index: usize) {
        self.inner.select_micro_batch(index);
    }

    fn split_layers(&mut self, layers: &[Range<usize>]) -> Option<Vec<StageCache<'_>>> {
        let seen = &self.seen;
        let views = self.inner.split_layers(layers)?;
        Some(
            views
                .into_iter()
                .map(|inner| -> StageCache<'_> { Box::new(RecordingView { inner, seen: seen.clone() }) })
                .collect(),
        )
    }
}

/// The stage threads compute in the caller's matmul precision (`--exact-matmul` is a
/// thread-local setting of the kernels, which quantized projections read).
#[test]
fn stage_threads_inherit_the_matmul_precision() {
    let (what, model) = pipelines("llama").remove(0);
    for precision in [MatmulPrecision::Exact, MatmulPrecision::Int8Activations] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut cache = Recording { inner: paged(&model), seen: seen.clone() };
        let (steps, inputs) = lay_out(&model.device(), &PROMPT, 0, &[5, 4, 4]);
        cache.inner.begin_micro_batches(&steps).unwrap();
        with_matmul_precision(precision, || model.forward_micro_batches(&inputs, &mut cache).unwrap());
        let seen = seen.lock().unwrap();
        // Four layers, three slices, all attended on the stage threads.
        assert_eq!(seen.len(), 12, "{what}");
        assert!(seen.iter().all(|&p| p == precision), "{what}: {precision:?} asked, {seen:?} seen");
    }
}

#[test]
fn a_cache_that_cannot_split_runs_the_stages_in_turn() {
    let (what, model) = pipelines("llama").remove(1);
    let threaded = run(&model, &mut paged(&model), 0, &[5, 4, 4], Order::Threaded);
    let fallback = run(&model, &mut Unsplittable(paged(&model)), 0, &[5, 4, 4], Order::Threaded);
    assert_eq!(threaded, fallback, "{what}");
}

#[test]
fn a_failing_stage_is_an_error_not_a_hang() {
    for (what, model) in pipelines("opt") {
        let mut cache = paged(&model);
        let (steps, inputs) = lay_out(&model.device(), &PROMPT, 0, &[5, 4, 4]);
        // Only two of the three micro-batches laid out: every stage fails on the third.
        cache.begin_micro_batches(&steps[..2]).unwrap();
        let err = model.forward_micro_batches(&inputs, &mut cache).unwrap_err().to_string();
        assert!(err.contains("micro-batch 2 before begin_step"), "{what}: {err}");
    }
}
