//! Timing one point: warm-up runs, then the median of timed runs, each between two device
//! synchronisations, of a prefill or decode step through the model's consecutive layers (issued
//! back to back, as a pipeline stage issues them), the embedding or the LM head.

use std::cell::{Cell, RefCell};
use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm_models::model::Hidden;
use burn_llm_models::{CausalLm, ContiguousKvCache, ModelError};

use super::{ProfileError, ProfileProgress, ProgressHook};

/// What one timed step runs: `batch` sequences of `tokens` new tokens after `context` cached ones,
/// through `layers` layers (the model's layers in order, from the first again when it has fewer),
/// ending with the final norm and LM head over each sequence's last position where `head`.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepShape {
    pub(super) batch: usize,
    pub(super) tokens: usize,
    pub(super) context: usize,
    pub(super) layers: usize,
    pub(super) head: bool,
}

/// One timed step of `model` of `shape`, the device drained before and after: the profiler's
/// prefill run ([`Bench::prefill_once_ms`]). A panic inside it (a device's backend failing within
/// an operation) is an error, so that a thread timing it beside others never leaves them waiting.
pub(super) fn guarded_step_ms(model: &CausalLm, shape: StepShape) -> Result<f64, ProfileError> {
    let step = || {
        let device = model.device();
        let progress = Progress::new(0, None);
        let bench = Bench::new(model, &device, 0, 1, &progress).cycling_layers(shape.layers).with_head(shape.head);
        bench.prefill_once_ms(shape.batch, shape.tokens, shape.context)
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)).unwrap_or_else(|panic| {
        Err(ProfileError::Device(format!("the step panicked: {}", burn_llm_models::error::panic_message(panic))))
    })
}

/// Each of `count` devices' median step alone (`time(i)` times device `i` once), `warmup`
/// untimed and `repeats` timed runs each, the devices taking turns run by run (so that whatever
/// drifts while they are timed, the host's load or a device warming up, reaches all of them alike).
pub(super) fn alone_in_turns_ms(
    count: usize,
    warmup: usize,
    repeats: usize,
    mut time: impl FnMut(usize) -> Result<f64, ProfileError>,
) -> Result<Vec<f64>, ProfileError> {
    let mut runs = vec![Vec::with_capacity(repeats); count];
    for run in 0..warmup + repeats {
        for (i, times) in runs.iter_mut().enumerate() {
            let ms = time(i)?;
            if run >= warmup {
                times.push(ms);
            }
        }
    }
    Ok(runs.into_iter().map(super::fit::median).collect())
}

/// Reports each point as it starts, and once when all are done, to the caller's hook, if any (the
/// library draws nothing itself).
pub(super) struct Progress<'h> {
    hook: RefCell<Option<ProgressHook<'h>>>,
    done: Cell<usize>,
    total: usize,
}

impl<'h> Progress<'h> {
    pub(super) fn new(total: usize, hook: Option<ProgressHook<'h>>) -> Self {
        Self { hook: RefCell::new(hook), done: Cell::new(0), total }
    }

    fn report(&self, point: Option<&str>) {
        if let Some(hook) = self.hook.borrow_mut().as_mut() {
            hook(ProfileProgress { done: self.done.get(), total: self.total, point });
        }
    }

    fn start(&self, what: &str) {
        self.report(Some(what));
    }

    fn done(&self) {
        self.done.set(self.done.get() + 1);
    }

    pub(super) fn finish(&self) {
        self.report(None);
    }
}

/// Times parts of a model of a few layers on its device.
#[derive(Clone, Copy)]
pub(super) struct Bench<'a, 'h> {
    model: &'a CausalLm,
    device: &'a Device,
    warmup: usize,
    repeats: usize,
    progress: &'a Progress<'h>,
    /// Layers a prefill or decode step runs between its two synchronisations (the first ones).
    layers: usize,
    /// Whether [`Bench::prefill_once_ms`] ends with the final norm and the LM head over each
    /// sequence's last position, as a pipeline's last stage ends its step.
    head: bool,
}

impl<'a, 'h> Bench<'a, 'h> {
    pub(super) fn new(
        model: &'a CausalLm,
        device: &'a Device,
        warmup: usize,
        repeats: usize,
        progress: &'a Progress<'h>,
    ) -> Self {
        Self { model, device, warmup, repeats, progress, layers: model.layers.len(), head: false }
    }

    /// The same bench running only the first `layers` layers per step.
    pub(super) fn with_layers(self, layers: usize) -> Self {
        Self { layers: layers.clamp(1, self.model.layers.len()), ..self }
    }

    /// The same bench running `layers` layers per step: the model's layers in order, from the
    /// first again when it has fewer (a layer run again writes the same cache slots again: the
    /// cost of a layer, not new positions), so that a model of a few layers times a stage's share
    /// of a deep one.
    pub(super) fn cycling_layers(self, layers: usize) -> Self {
        Self { layers: layers.max(1), ..self }
    }

    /// The same bench ending [`Bench::prefill_once_ms`]'s step with the final norm and the LM
    /// head over each sequence's last position (`head`), as a pipeline's last stage does.
    pub(super) fn with_head(self, head: bool) -> Self {
        Self { head, ..self }
    }

    /// Layers a step runs.
    pub(super) fn layers(&self) -> usize {
        self.layers
    }

    /// The bench's layers over `hidden`, issued back to back.
    fn run_layers(&self, mut hidden: Hidden, cache: &mut ContiguousKvCache) -> Result<Tensor<3>, ModelError> {
        let built = self.model.layers.len().max(1);
        for layer in 0..self.layers {
            hidden = self.model.run_layer(layer % built, hidden, cache)?;
        }
        Ok(hidden.states)
    }

    /// The layers' forward over `batch` sequences of `tokens` new tokens after `context` cached
    /// tokens each (a fresh cache per run, so every run sees the same context).
    pub(super) fn prefill_ms(&self, batch: usize, tokens: usize, context: usize) -> Result<f64, ProfileError> {
        let what = format!("prefill: {batch} × {tokens} tokens after {context}, {} layers", self.layers);
        self.median_ms(what, || self.prefill_once_ms(batch, tokens, context))
    }

    /// One timed run of [`Bench::prefill_ms`].
    pub(super) fn prefill_once_ms(&self, batch: usize, tokens: usize, context: usize) -> Result<f64, ProfileError> {
        let mut cache = ContiguousKvCache::new(self.model.kv_layout(), batch, context + tokens, self.device);
        if context > 0 {
            // Lays the context out without computing it: its slots stay zero.
            cache.begin_step(&vec![self.token_ids(context).as_slice(); batch])?;
        }
        let step = cache.begin_step(&vec![self.token_ids(tokens).as_slice(); batch])?;
        let hidden = self.model.embed(&step);
        self.timed(|| {
            let states = self.run_layers(hidden, &mut cache)?;
            Ok(if self.head { self.head_of_last(states) } else { states })
        })
    }

    /// Final norm and logits of each sequence's last position of `states` (`[batch, seq,
    /// hidden]`), as `[batch, 1, vocab]`.
    fn head_of_last(&self, states: Tensor<3>) -> Tensor<3> {
        let [batch, seq, _] = states.dims();
        let last = states.narrow(1, seq.saturating_sub(1), 1);
        let finished = self.model.finish(Hidden { states: last, rotary: None });
        let logits = self.model.logits(finished.reshape([batch, self.model.spec().embed_dim]));
        let vocab = logits.dims()[1];
        logits.reshape([batch, 1, vocab])
    }

    /// One decode step of the layers: `batch` sequences, one new token each, after `context`
    /// cached tokens (the runs share one cache, so the context grows by one token per run).
    pub(super) fn decode_ms(&self, batch: usize, context: usize) -> Result<f64, ProfileError> {
        let capacity = context + self.warmup + self.repeats;
        let mut cache = ContiguousKvCache::new(self.model.kv_layout(), batch, capacity, self.device);
        if context > 0 {
            cache.begin_step(&vec![self.token_ids(context).as_slice(); batch])?;
        }
        let token = self.token_ids(1);
        let what = format!("decode: {batch} sequences after {context}, {} layers", self.layers);
        self.median_ms(what, || {
            let step = cache.begin_step(&vec![token.as_slice(); batch])?;
            let hidden = self.model.embed(&step);
            self.timed(|| self.run_layers(hidden, &mut cache))
        })
    }

    /// The same bench's warm-up and timed decode steps of `batch` sequences after `context`
    /// cached tokens, their times discarded: decode's allocations, thread pools and caches warmed
    /// before its first timed point.
    pub(super) fn decode_once_untimed(&self, batch: usize, context: usize) -> Result<(), ProfileError> {
        let progress = Progress::new(0, None);
        Bench { progress: &progress, ..*self }.decode_ms(batch, context).map(|_| ())
    }

    /// Token (and position) embeddings of `tokens` tokens of one sequence.
    pub(super) fn embed_ms(&self, tokens: usize) -> Result<f64, ProfileError> {
        let ids = self.token_ids(tokens);
        self.median_ms(format!("embedding: {tokens} tokens"), || {
            let mut cache = ContiguousKvCache::new(self.model.kv_layout(), 1, tokens, self.device);
            let step = cache.begin_step(&[ids.as_slice()])?;
            self.timed(|| Ok(self.model.embed(&step).states))
        })
    }

    /// Final norm and logits of `rows` positions (one per sequence of a decode step).
    pub(super) fn lm_head_ms(&self, rows: usize) -> Result<f64, ProfileError> {
        let spec = self.model.spec();
        let states = Tensor::<3>::random([rows, 1, spec.hidden_size], Distribution::Uniform(-1.0, 1.0), self.device);
        let embed_dim = spec.embed_dim;
        self.median_ms(format!("LM head: {rows} rows"), || {
            let hidden = Hidden { states: states.clone(), rotary: None };
            self.timed(|| {
                let last = self.model.finish(hidden);
                Ok(self.model.logits(last.reshape([rows, embed_dim])))
            })
        })
    }

    /// `warmup` untimed runs, then the median of `repeats` timed ones.
    fn median_ms(&self, what: String, mut run: impl FnMut() -> Result<f64, ProfileError>) -> Result<f64, ProfileError> {
        self.progress.start(&what);
        for _ in 0..self.warmup {
            run()?;
        }
        let mut samples = (0..self.repeats).map(|_| run()).collect::<Result<Vec<_>, _>>()?;
        samples.sort_by(f64::total_cmp);
        self.progress.done();
        Ok(samples[samples.len() / 2])
    }

    /// Milliseconds of `f` with the device drained before and after. The output is kept until
    /// after the second synchronisation so that a lazy backend cannot skip the work.
    fn timed<T>(&self, f: impl FnOnce() -> Result<T, ModelError>) -> Result<f64, ProfileError> {
        self.sync()?;
        let started = Instant::now();
        let out = f()?;
        self.sync()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        drop(out);
        Ok(ms)
    }

    fn sync(&self) -> Result<(), ProfileError> {
        self.device.sync().map_err(|e| ProfileError::Device(e.to_string()))
    }

    /// `n` token ids cycling through the vocabulary.
    fn token_ids(&self, n: usize) -> Vec<u32> {
        super::probe_ids(n, self.model.spec().vocab_size)
    }
}
