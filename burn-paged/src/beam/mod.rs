//! Beam search bookkeeping, step for step identical to Hugging Face transformers'
//! `model.generate(num_beams=W, do_sample=False)` for decoder-only models (transformers 5.x,
//! `GenerationMixin._beam_search`; checked against 5.23.0).
//!
//! This module only does the bookkeeping: it never touches tensors. The engine keeps one sequence
//! per *live beam*, runs the model, hands [`BeamSearch::step`] the log-softmax of every live
//! beam's next-token logits, and gets back, for each next live beam, the old beam it continues
//! and the token it appends. The engine forks the parent's KV blocks for each child (vLLM §5.4.4,
//! "Beam search") and frees the beams that got no child. Finished hypotheses are kept here and
//! returned by [`BeamSearch::finish`].
//!
//! The user chooses the [`BeamSearchParams`] (width, length penalty, stopping rule); the engine
//! adds what the rest of the request implies: how many hypotheses to return (`n`), the token
//! budget (`max_new_tokens`) and the EOS ids.
//!
//! # The algorithm (what Hugging Face does)
//!
//! Notation: `W` = [`width`](BeamSearchParams::width), `V` = vocabulary size,
//! `g` = tokens generated so far (before the step), `lp` =
//! [`length_penalty`](BeamSearchParams::length_penalty). All scores are `f32`, with the same
//! operations in the same order as PyTorch, so rankings match bit for bit. Each phase below is
//! one function of [`BeamSearch`], named after it; a step runs them in this order.
//!
//! * **State** (`BeamSearch::new`). `W` live beams with running scores (sums of token
//!   log-probabilities), and `W` *hypothesis slots* (HF's `sequences` / `beam_scores` /
//!   `is_sent_finished`), sorted best first, initially empty placeholders scored `-1e9`. Before
//!   the first step HF runs `W` copies of the prompt, the first with score 0 and the others with
//!   `-1e9`; here the engine runs the prompt once (one live beam) and the copies are emulated
//!   (they only matter when `V` is tiny).
//! * **Candidates** (`candidates`). The accumulated score of `(beam b, token t)` is
//!   `logprob[b][t] + score[b]`. The best `K = max(2, 1 + n_eos) * W` candidates over all `W * V`
//!   are kept, where `n_eos` is the number of EOS ids (so at least `W` of them are not EOS).
//! * **Stopping** (`hits_stop`). A candidate *hits a stopping criterion* if its token is an EOS
//!   id, or if it is the `max_new_tokens`-th generated token (then every candidate hits).
//! * **Next live beams** (`next_live_beams`). Candidates that hit get `-1e9` added; the best `W`
//!   become the live beams (best first), with those scores.
//! * **Hypotheses** (`hypotheses`). Only candidates that hit *and* rank among the first `W` of
//!   the `K` can become hypotheses (an EOS candidate ranked `W..K` is dropped). A candidate's
//!   hypothesis score is `sum_logprobs / (g + 1)^lp` — the **generated** length, EOS included,
//!   prompt excluded. `-1e9` is further added when all slots are finished and `early_stopping` is
//!   [`Eager`](EarlyStopping::Eager) (HF `True`), when the "improvement possible" flag (below)
//!   is already false, and when the candidate did not just finish. The `W` old slots and the
//!   `K` candidates are merged and the best `W` kept.
//! * **Done rule** (`done_rule`). After the step (generated length now `n = g + 1`), with
//!   `best = live[0].score / L^lp` where `L = max_new_tokens` if `early_stopping` is
//!   [`Never`](EarlyStopping::Never) and `lp > 0`, else `L = n`: the sticky flag
//!   "improvement possible" stays true iff for some slot `best > (slot finished ? min of all slot
//!   scores : -1e9)` — i.e. it turns false only once all `W` slots are finished and `best` is no
//!   better than the worst of them. The search is done when that flag is false, or all slots are
//!   finished and `early_stopping` is [`Eager`](EarlyStopping::Eager) (HF `True`), or every
//!   candidate hit a stopping criterion (`max_new_tokens` reached). At `max_new_tokens` the best
//!   `W` candidates (live continuations and EOS alike, by raw accumulated score) are merged into
//!   the slots like any finished candidate, with their length penalty.
//! * **Result** ([`finish`](BeamSearch::finish)). The first `num_return` slots, best first; the
//!   score is HF's `sequences_scores`.
//!
//! With `width == 1`, `generate` does not run beam search at all but **greedy search**: take
//! the argmax token, stop at an EOS id or at `max_new_tokens`. [`BeamSearch`] does the same then
//! (HF returns no `sequences_scores` in that mode; [`Hypothesis::score`] is still
//! `sum_logprobs / len^lp`). `length_penalty` and `early_stopping` do not change the tokens.
//! (HF's greedy argmax is over the logits; over the log-softmax it is the same token unless
//! rounding makes two values equal.)
//!
//! # Ties
//!
//! PyTorch's CPU `topk` compares values only (it uses `std::partial_sort` / `std::nth_element`),
//! so the order of exactly equal scores is an implementation detail that is not reproducible in
//! general (e.g. `torch.topk(torch.zeros(10), 3)` gives indices `[8, 6, 7]`). Every ranking here
//! uses one stable rule instead: higher value first, NaN above everything (as `torch.topk` and
//! `torch.argmax` treat NaN), and on equal values the lower index first — the lower flat index
//! `b * V + t` among candidates, and the old slot before a new candidate when merging
//! hypotheses. Greedy search breaks ties like `torch.argmax` (first maximum). Results equal HF
//! whenever no exact tie decides a ranking.

mod error;
mod ranking;

use burn_llm_models::{BeamSearchParams, EarlyStopping};

pub use error::BeamError;
use ranking::{NEG_LARGE, TopK, length_denominator, torch_min};

/// What one search needs besides the user's [`BeamSearchParams`]: values the engine derives from
/// the rest of the request. Internal to the engine; users set these through the request (`n`,
/// `max_new_tokens`, EOS and stop token ids).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BeamRun {
    /// Number of hypotheses [`BeamSearch::finish`] returns (HF `num_return_sequences`, the
    /// request's `n`), `1..=width`.
    pub(crate) num_return: usize,
    /// Maximum number of generated tokens (HF `max_new_tokens`), at least 1.
    pub(crate) max_new_tokens: usize,
    /// End-of-sequence token ids (HF `eos_token_id`); empty for none. Their count also sets the
    /// number of candidates kept per step, duplicates included, as in HF.
    pub(crate) eos_token_ids: Vec<u32>,
}

/// Candidates kept per step, HF's `beams_to_keep = max(2, 1 + n_eos) * width`; `None` when it
/// overflows.
fn candidates_per_step(width: usize, n_eos: usize) -> Option<usize> {
    n_eos.checked_add(1)?.max(2).checked_mul(width)
}

/// Outcome of one [`BeamSearch::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepResult {
    /// The next live beams, best first, as `(parent, token)`: live beam `i` of the next step is
    /// the old live beam `parent` (an index into the rows just passed) with `token` appended.
    /// Several children may share a parent (fork its KV blocks); parents without a child end.
    /// Empty when `done`.
    pub beams: Vec<(usize, u32)>,
    /// The search is over: run no more steps, call [`BeamSearch::finish`].
    pub done: bool,
}

impl StepResult {
    fn done() -> Self {
        Self { beams: Vec::new(), done: true }
    }
}

/// One finished sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated tokens (prompt excluded), EOS included when it ended on one.
    pub tokens: Vec<u32>,
    /// Length-normalised score `sum_logprobs / tokens.len()^length_penalty` — HF's
    /// `sequences_scores`.
    pub score: f32,
    /// Sum of the log-probabilities of the generated tokens (`f32`, accumulated in order).
    pub sum_logprobs: f32,
}

#[derive(Debug, Clone)]
struct LiveBeam {
    tokens: Vec<u32>,
    /// Running score: sum of log-probabilities, plus `-1e9` for HF's penalised beams.
    score: f32,
}

/// A next live beam: the old live beam it continues and the token it appends.
struct Child {
    parent: usize,
    token: u32,
    beam: LiveBeam,
}

#[derive(Debug, Clone)]
struct Slot {
    tokens: Vec<u32>,
    /// Penalised score (`-1e9` for an empty slot).
    score: f32,
    sum_logprobs: f32,
    finished: bool,
}

impl Slot {
    fn empty() -> Self {
        Self { tokens: Vec::new(), score: NEG_LARGE, sum_logprobs: NEG_LARGE, finished: false }
    }
}

/// One of the best `K` continuations of a step.
struct Candidate {
    /// Index of the engine's live beam it continues.
    parent: usize,
    token: u32,
    /// Accumulated score (running score + token log-probability).
    acc: f32,
    /// EOS token or `max_new_tokens` reached.
    hits_stop: bool,
}

/// Beam search state of one request; see the [module docs](self) for the exact semantics.
///
/// The engine creates one per beam-search request and drives it with [`step`](Self::step) —
/// first with the prompt's last-position log-probabilities (one live beam), then once per decode
/// step with one row per live beam — until the result says `done`, then calls
/// [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct BeamSearch {
    params: BeamSearchParams,
    run: BeamRun,
    prompt_len: usize,
    candidates: usize,
    generated: usize,
    live: Vec<LiveBeam>,
    slots: Vec<Slot>,
    improvement_possible: bool,
    done: bool,
}

impl BeamSearch {
    /// **State**: a new search with one live beam (the prompt) and `width` empty hypothesis
    /// slots. Checks the parameters (HF's `GenerationConfig.validate` checks, plus a finite
    /// length penalty and a candidate count that fits in `usize`). `prompt_len` is only recorded
    /// ([`prompt_len`](Self::prompt_len)): HF's length penalty and `max_new_tokens` count
    /// generated tokens only.
    pub(crate) fn new(params: BeamSearchParams, run: BeamRun, prompt_len: usize) -> Result<Self, BeamError> {
        params.validate().map_err(|e| BeamError::Params(e.to_string()))?;
        if run.num_return == 0 {
            return Err(BeamError::ZeroNumReturn);
        }
        if run.num_return > params.width {
            return Err(BeamError::NumReturnExceedsBeamWidth { num_return: run.num_return, beam_width: params.width });
        }
        if run.max_new_tokens == 0 {
            return Err(BeamError::ZeroMaxNewTokens);
        }
        let candidates =
            candidates_per_step(params.width, run.eos_token_ids.len()).ok_or(BeamError::TooManyCandidates)?;
        Ok(Self {
            params,
            run,
            prompt_len,
            candidates,
            generated: 0,
            live: vec![LiveBeam { tokens: Vec::new(), score: 0.0 }],
            slots: vec![Slot::empty(); params.width],
            improvement_possible: true,
            done: false,
        })
    }

    /// The user's parameters.
    pub fn params(&self) -> &BeamSearchParams {
        &self.params
    }

    /// Candidates kept per step (HF's `beams_to_keep`).
    pub fn candidates_per_step(&self) -> usize {
        self.candidates
    }

    /// The prompt length given to `new`.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Tokens generated so far (steps taken).
    pub fn generated_len(&self) -> usize {
        self.generated
    }

    /// Whether the search is over.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Rows the next [`step`](Self::step) expects: 1 before the first step (and always with
    /// `width == 1`), `width` afterwards, 0 once done.
    pub fn num_live_beams(&self) -> usize {
        self.live.len()
    }

    /// Generated tokens of live beam `beam`, or `None` if there is no such beam.
    pub fn live_beam_tokens(&self, beam: usize) -> Option<&[u32]> {
        self.live.get(beam).map(|b| b.tokens.as_slice())
    }

    /// Running score of live beam `beam` (sum of log-probabilities, `-1e9` added to beams HF
    /// penalises), or `None` if there is no such beam.
    pub fn live_beam_score(&self, beam: usize) -> Option<f32> {
        self.live.get(beam).map(|b| b.score)
    }

    /// Advances by one token. `logprobs` is row-major, one row of `vocab` log-softmax values per
    /// live beam in live-beam order ([`num_live_beams`](Self::num_live_beams) rows): exactly the
    /// vector HF ranks with, i.e. after any logits processors. Returns the next live beams and
    /// whether the search is over; records finished hypotheses. On `Err` nothing changed.
    pub fn step(&mut self, logprobs: &[f32], vocab: usize) -> Result<StepResult, BeamError> {
        if self.done {
            return Err(BeamError::AlreadyDone);
        }
        if vocab == 0 || u32::try_from(vocab - 1).is_err() {
            return Err(BeamError::InvalidVocab(vocab));
        }
        let live_beams = self.live.len();
        if live_beams.checked_mul(vocab) != Some(logprobs.len()) {
            return Err(BeamError::LogprobsShape { live_beams, vocab, got: logprobs.len() });
        }
        let width = self.params.width;
        if width == 1 {
            return Ok(self.greedy_step(logprobs));
        }
        if width.checked_mul(vocab).is_none_or(|n| n < self.candidates) {
            return Err(BeamError::VocabTooSmall { vocab, candidates: self.candidates });
        }
        Ok(self.beam_step(logprobs, vocab))
    }

    /// Greedy search (`width == 1`): the argmax token, done at a stopping criterion.
    fn greedy_step(&mut self, row: &[f32]) -> StepResult {
        let mut best = TopK::new(1);
        for (t, &v) in row.iter().enumerate() {
            best.push(v, t);
        }
        // `row` is non-empty (vocab >= 1) and fits u32 (checked by `step`).
        let (value, index) = best.items[0];
        let token = index as u32;
        let beam = &mut self.live[0];
        beam.tokens.push(token);
        beam.score += value;
        self.generated += 1;
        if !self.hits_stop(token, self.generated) {
            return StepResult { beams: vec![(0, token)], done: false };
        }
        let beam = self.live.pop().expect("greedy search has one live beam");
        let denominator = length_denominator(self.generated, self.params.length_penalty);
        self.slots[0] =
            Slot { score: beam.score / denominator, sum_logprobs: beam.score, tokens: beam.tokens, finished: true };
        self.done = true;
        StepResult::done()
    }

    /// One beam-search step: the phases of the [module docs](self), in order.
    fn beam_step(&mut self, logprobs: &[f32], vocab: usize) -> StepResult {
        let candidates = self.candidates(logprobs, vocab);
        let next_live = self.next_live_beams(&candidates);
        self.slots = self.hypotheses(&candidates);
        self.generated += 1;
        self.done = self.done_rule(next_live[0].beam.score, &candidates);
        if self.done {
            self.live.clear();
            return StepResult::done();
        }
        let beams = next_live.iter().map(|c| (c.parent, c.token)).collect();
        self.live = next_live.into_iter().map(|c| c.beam).collect();
        StepResult { beams, done: false }
    }

    /// **Candidates**: the top `K` continuations over all `width` beams (HF's
    /// `_get_top_k_continuations`), best first. At the first step HF's beams are copies of the
    /// prompt scored 0, -1e9, -1e9, …, all continuing the engine's single prompt beam.
    fn candidates(&self, logprobs: &[f32], vocab: usize) -> Vec<Candidate> {
        let first = self.generated == 0;
        let mut top = TopK::new(self.candidates);
        for b in 0..self.params.width {
            let (row, base) = if first {
                (&logprobs[..vocab], if b == 0 { 0.0 } else { NEG_LARGE })
            } else {
                (&logprobs[b * vocab..(b + 1) * vocab], self.live[b].score)
            };
            for (t, &lp) in row.iter().enumerate() {
                top.push(lp + base, b * vocab + t);
            }
        }
        let new_len = self.generated + 1;
        top.items
            .iter()
            .map(|&(acc, index)| {
                let token = (index % vocab) as u32;
                Candidate {
                    parent: if first { 0 } else { index / vocab },
                    token,
                    acc,
                    hits_stop: self.hits_stop(token, new_len),
                }
            })
            .collect()
    }

    /// **Stopping**: whether `token`, the `generated_len`-th generated token, is an EOS id or
    /// the last token allowed.
    fn hits_stop(&self, token: u32, generated_len: usize) -> bool {
        generated_len >= self.run.max_new_tokens || self.run.eos_token_ids.contains(&token)
    }

    /// **Next live beams** (HF's `_get_running_beams_for_next_iteration`): the best `width`
    /// candidates, those that hit a stopping criterion penalised by `-1e9`, best first.
    fn next_live_beams(&self, candidates: &[Candidate]) -> Vec<Child> {
        let mut running = TopK::new(self.params.width);
        for (i, c) in candidates.iter().enumerate() {
            running.push(if c.hits_stop { c.acc + NEG_LARGE } else { c.acc }, i);
        }
        running
            .items
            .iter()
            .map(|&(score, i)| {
                let c = &candidates[i];
                Child { parent: c.parent, token: c.token, beam: LiveBeam { tokens: self.extended(c), score } }
            })
            .collect()
    }

    /// **Hypotheses** (HF's `_update_finished_beams`): the best `width` of the old slots and the
    /// candidates scored as hypotheses, best first.
    fn hypotheses(&self, candidates: &[Candidate]) -> Vec<Slot> {
        let width = self.params.width;
        let denominator = length_denominator(self.generated + 1, self.params.length_penalty);
        let slots_full = self.params.early_stopping == EarlyStopping::Eager && self.slots.iter().all(|s| s.finished);
        let mut merged = TopK::new(width);
        for (j, slot) in self.slots.iter().enumerate() {
            merged.push(slot.score, j);
        }
        for (i, c) in candidates.iter().enumerate() {
            let mut score = c.acc / denominator;
            if slots_full {
                score += NEG_LARGE;
            }
            if !self.improvement_possible {
                score += NEG_LARGE;
            }
            if !(c.hits_stop && i < width) {
                score += NEG_LARGE;
            }
            merged.push(score, width + i);
        }
        merged
            .items
            .iter()
            .map(|&(score, j)| match j.checked_sub(width) {
                None => self.slots[j].clone(),
                Some(i) => {
                    let c = &candidates[i];
                    Slot { tokens: self.extended(c), score, sum_logprobs: c.acc, finished: c.hits_stop && i < width }
                }
            })
            .collect()
    }

    /// **Done rule** (HF's `_check_early_stop_heuristic` and
    /// `_beam_search_has_unfinished_sequences`), once the step's hypotheses are in the slots and
    /// the generated length counts the step: updates the sticky "improvement possible" flag and
    /// says whether the search is over. `best_live_score` is the best next live beam's score.
    fn done_rule(&mut self, best_live_score: f32, candidates: &[Candidate]) -> bool {
        let lp = self.params.length_penalty;
        let hypothetical_len = if self.params.early_stopping == EarlyStopping::Never && lp > 0.0 {
            self.run.max_new_tokens
        } else {
            self.generated
        };
        let best_running = best_live_score / length_denominator(hypothetical_len, lp);
        let worst_slot = torch_min(self.slots.iter().map(|s| s.score));
        let can_improve = self.slots.iter().any(|s| best_running > if s.finished { worst_slot } else { NEG_LARGE });
        self.improvement_possible &= can_improve;
        let all_finished = self.slots.iter().all(|s| s.finished);
        let open_beam = !(all_finished && self.params.early_stopping == EarlyStopping::Eager);
        let valid_continuation = !candidates.iter().all(|c| c.hits_stop);
        !(self.improvement_possible && open_beam && valid_continuation)
    }

    /// The tokens of candidate `c`: its parent's tokens and its own.
    fn extended(&self, c: &Candidate) -> Vec<u32> {
        let parent = &self.live[c.parent].tokens;
        let mut tokens = Vec::with_capacity(parent.len() + 1);
        tokens.extend_from_slice(parent);
        tokens.push(c.token);
        tokens
    }

    /// **Result**: the best `num_return` hypotheses, best first (HF's `sequences` /
    /// `sequences_scores`). Call it once [`step`](Self::step) reported `done`; when called
    /// earlier (an aborted request) it returns the hypotheses finished so far.
    ///
    /// Only finished hypotheses are returned, so the result can be shorter than `num_return` in
    /// the degenerate case where a slot is still empty at the end (possible only when candidates
    /// score below `-1e9`, e.g. `-inf` log-probabilities); HF would return a padded placeholder.
    pub fn finish(self) -> Vec<Hypothesis> {
        self.slots
            .into_iter()
            .take(self.run.num_return)
            .filter(|s| s.finished)
            .map(|s| Hypothesis { tokens: s.tokens, score: s.score, sum_logprobs: s.sum_logprobs })
            .collect()
    }
}

#[cfg(test)]
mod tests;
