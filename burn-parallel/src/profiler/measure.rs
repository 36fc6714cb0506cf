//! Timing one point: warm-up runs, then the median of timed runs, each between two device
//! synchronisations, of one layer's prefill or decode step, the embedding or the LM head.

use std::time::Instant;

use burn::tensor::{Device, Distribution, Tensor};
use burn_llm_models::model::Hidden;
use burn_llm_models::{CausalLm, ContiguousKvCache};

use super::ProfileError;

/// The progress bar (hidden when not asked for, or when stderr is not a terminal).
pub(super) struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub(super) fn new(points: u64, show: bool) -> Self {
        Self(show.then(|| {
            let bar = indicatif::ProgressBar::new(points);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points · {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        }))
    }

    fn start(&self, what: String) {
        if let Some(bar) = &self.0 {
            bar.set_message(what);
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Times parts of a one-layer model on its device.
pub(super) struct Bench<'a> {
    model: &'a CausalLm,
    device: &'a Device,
    warmup: usize,
    repeats: usize,
    progress: &'a Progress,
}

impl<'a> Bench<'a> {
    pub(super) fn new(
        model: &'a CausalLm,
        device: &'a Device,
        warmup: usize,
        repeats: usize,
        progress: &'a Progress,
    ) -> Self {
        Self {
            model,
            device,
            warmup,
            repeats,
            progress,
        }
    }

    /// The layer's forward over `batch` sequences of `tokens` new tokens after `context` cached
    /// tokens each (a fresh cache per run, so every run sees the same context).
    pub(super) fn prefill_ms(
        &self,
        batch: usize,
        tokens: usize,
        context: usize,
    ) -> Result<f64, ProfileError> {
        let slice = self.token_ids(tokens);
        let before = self.token_ids(context);
        let what = format!("prefill: {batch} × {tokens} tokens after {context}");
        self.median_ms(what, || {
            let mut cache = ContiguousKvCache::new(
                self.model.kv_layout(),
                batch,
                context + tokens,
                self.device,
            );
            if context > 0 {
                // Lays the context out without computing it: its slots stay zero.
                cache.begin_step(&vec![before.as_slice(); batch])?;
            }
            let step = cache.begin_step(&vec![slice.as_slice(); batch])?;
            let hidden = self.model.embed(&step);
            self.timed(|| self.model.run_layer(0, hidden, &mut cache).states)
        })
    }

    /// One decode step of the layer: `batch` sequences, one new token each, after `context`
    /// cached tokens (the runs share one cache, so the context grows by one token per run).
    pub(super) fn decode_ms(&self, batch: usize, context: usize) -> Result<f64, ProfileError> {
        let capacity = context + self.warmup + self.repeats;
        let mut cache =
            ContiguousKvCache::new(self.model.kv_layout(), batch, capacity, self.device);
        if context > 0 {
            cache.begin_step(&vec![self.token_ids(context).as_slice(); batch])?;
        }
        let token = self.token_ids(1);
        let what = format!("decode: {batch} sequences after {context}");
        self.median_ms(what, || {
            let step = cache.begin_step(&vec![token.as_slice(); batch])?;
            let hidden = self.model.embed(&step);
            self.timed(|| self.model.run_layer(0, hidden, &mut cache).states)
        })
    }

    /// Token (and position) embeddings of `tokens` tokens of one sequence.
    pub(super) fn embed_ms(&self, tokens: usize) -> Result<f64, ProfileError> {
        let ids = self.token_ids(tokens);
        self.median_ms(format!("embedding: {tokens} tokens"), || {
            let mut cache = ContiguousKvCache::new(self.model.kv_layout(), 1, tokens, self.device);
            let step = cache.begin_step(&[ids.as_slice()])?;
            self.timed(|| self.model.embed(&step).states)
        })
    }

    /// Final norm and logits of `rows` positions (one per sequence of a decode step).
    pub(super) fn lm_head_ms(&self, rows: usize) -> Result<f64, ProfileError> {
        let spec = self.model.spec();
        let states = Tensor::<3>::random(
            [rows, 1, spec.hidden_size],
            Distribution::Uniform(-1.0, 1.0),
            self.device,
        );
        let embed_dim = spec.embed_dim;
        self.median_ms(format!("LM head: {rows} rows"), || {
            let hidden = Hidden {
                states: states.clone(),
                rotary: None,
            };
            self.timed(|| {
                let last = self.model.finish(hidden);
                self.model.logits(last.reshape([rows, embed_dim]))
            })
        })
    }

    /// `warmup` untimed runs, then the median of `repeats` timed ones.
    fn median_ms(
        &self,
        what: String,
        mut run: impl FnMut() -> Result<f64, ProfileError>,
    ) -> Result<f64, ProfileError> {
        self.progress.start(what);
        for _ in 0..self.warmup {
            run()?;
        }
        let mut samples = (0..self.repeats)
            .map(|_| run())
            .collect::<Result<Vec<_>, _>>()?;
        samples.sort_by(f64::total_cmp);
        self.progress.done();
        Ok(samples[samples.len() / 2])
    }

    /// Milliseconds of `f` with the device drained before and after. The output is kept until
    /// after the second synchronisation so that a lazy backend cannot skip the work.
    fn timed<T>(&self, f: impl FnOnce() -> T) -> Result<f64, ProfileError> {
        self.sync()?;
        let started = Instant::now();
        let out = f();
        self.sync()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        drop(out);
        Ok(ms)
    }

    fn sync(&self) -> Result<(), ProfileError> {
        self.device
            .sync()
            .map_err(|e| ProfileError::Device(e.to_string()))
    }

    /// `n` token ids cycling through the vocabulary.
    fn token_ids(&self, n: usize) -> Vec<u32> {
        let vocab = self.model.spec().vocab_size;
        (0..n).map(|k| ((k * 7 + 1) % vocab) as u32).collect()
    }
}
