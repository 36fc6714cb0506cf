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
//! # The algorithm (what Hugging Face does)
//!
//! Notation: `W` = [`beam_width`](BeamSearchParams::beam_width), `V` = vocabulary size,
//! `g` = tokens generated so far (before the step), `lp` =
//! [`length_penalty`](BeamSearchParams::length_penalty). All scores are `f32`, with the same
//! operations in the same order as PyTorch, so rankings match bit for bit.
//!
//! * **State.** `W` live beams with running scores (sums of token log-probabilities), and `W`
//!   *hypothesis slots* (HF's `sequences` / `beam_scores` / `is_sent_finished`), sorted best first,
//!   initially empty placeholders scored `-1e9`. Before the first step HF runs `W` copies of the
//!   prompt, the first with score 0 and the others with `-1e9`; here the engine runs the prompt
//!   once (one live beam) and the copies are emulated (they only matter when `V` is tiny).
//! * **Candidates.** The accumulated score of `(beam b, token t)` is `logprob[b][t] + score[b]`.
//!   The best `K = max(2, 1 + n_eos) * W` candidates over all `W * V` are kept, where `n_eos` is
//!   the number of EOS ids (so at least `W` of them are not EOS).
//! * **Stopping.** A candidate *hits a stopping criterion* if its token is an EOS id, or if it is
//!   the `max_new_tokens`-th generated token (then every candidate hits).
//! * **Next live beams.** Candidates that hit get `-1e9` added; the best `W` become the live beams
//!   (best first), with those scores.
//! * **Hypotheses.** Only candidates that hit *and* rank among the first `W` of the `K` can become
//!   hypotheses (an EOS candidate ranked `W..K` is dropped). A candidate's hypothesis score is
//!   `sum_logprobs / (g + 1)^lp` — the **generated** length, EOS included, prompt excluded.
//!   `-1e9` is further added when all slots are finished and `early_stopping` is
//!   [`Eager`](EarlyStopping::Eager) (HF `True`), when the "improvement possible" flag (below)
//!   is already false, and when the candidate did not just finish. The `W` old slots and the
//!   `K` candidates are merged and the best `W` kept.
//! * **Done rule.** After the step (generated length now `n = g + 1`), with
//!   `best = live[0].score / L^lp` where `L = max_new_tokens` if `early_stopping` is
//!   [`Never`](EarlyStopping::Never) and `lp > 0`, else `L = n`: the sticky flag
//!   "improvement possible" stays true iff for some slot `best > (slot finished ? min of all slot
//!   scores : -1e9)` — i.e. it turns false only once all `W` slots are finished and `best` is no
//!   better than the worst of them. The search is done when that flag is false, or all slots are
//!   finished and `early_stopping` is [`Eager`](EarlyStopping::Eager) (HF `True`), or every
//!   candidate hit a stopping criterion (`max_new_tokens` reached). At `max_new_tokens` the best
//!   `W` candidates (live continuations and EOS alike, by raw accumulated score) are merged into
//!   the slots like any finished candidate, with their length penalty.
//! * **Result.** The first [`num_return`](BeamSearchParams::num_return) slots, best first; the
//!   score is HF's `sequences_scores`.
//!
//! With `beam_width == 1`, `generate` does not run beam search at all but **greedy search**: take
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

use thiserror::Error;

/// The score HF uses for "impossible": running scores of copies of the prompt, penalties of
/// candidates that may not continue / may not become hypotheses, empty hypothesis slots.
const NEG_LARGE: f32 = -1.0e9;

/// When the search may stop before `max_new_tokens` (HF's `early_stopping`). Serialised in
/// lowercase (`"heuristic"`, `"eager"`, `"never"`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum EarlyStopping {
    /// HF's default, `early_stopping=False`: stop once all `beam_width` hypothesis slots are
    /// finished and the best live beam, scored with the *current* generated length, is no better
    /// than the worst hypothesis.
    #[default]
    Heuristic,
    /// `early_stopping=True`: stop as soon as all `beam_width` hypothesis slots are finished.
    Eager,
    /// `early_stopping="never"`: like [`Heuristic`](Self::Heuristic), but with a positive length
    /// penalty the best live beam is scored with the longest possible length (`max_new_tokens`),
    /// so the search only stops when no live beam can still win (canonical beam search).
    Never,
}

/// Parameters of one beam search request.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamSearchParams {
    /// Number of beams `W` (HF `num_beams`). `1` means greedy search, as in HF.
    pub beam_width: usize,
    /// Exponent of the length normalisation (HF `length_penalty`, default 1.0): a hypothesis
    /// scores `sum_logprobs / generated_len^length_penalty`. Positive values favour longer
    /// sequences, negative values shorter ones, 0 disables normalisation. The power is taken in
    /// `f64` (HF raises a Python int to a Python float) and rounded to `f32`.
    pub length_penalty: f32,
    /// Stopping rule (HF `early_stopping`).
    pub early_stopping: EarlyStopping,
    /// Number of hypotheses [`BeamSearch::finish`] returns (HF `num_return_sequences`),
    /// `1..=beam_width`.
    pub num_return: usize,
    /// Maximum number of generated tokens (HF `max_new_tokens`), at least 1.
    pub max_new_tokens: usize,
    /// End-of-sequence token ids (HF `eos_token_id`); empty for none. Their count also sets the
    /// number of candidates kept per step, duplicates included, as in HF.
    pub eos_token_ids: Vec<u32>,
}

impl BeamSearchParams {
    /// `beam_width` beams and at most `max_new_tokens` new tokens, with HF's defaults otherwise:
    /// length penalty 1.0, [`EarlyStopping::Heuristic`], one returned hypothesis, no EOS.
    pub fn new(beam_width: usize, max_new_tokens: usize) -> Self {
        Self {
            beam_width,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            num_return: 1,
            max_new_tokens,
            eos_token_ids: Vec::new(),
        }
    }

    /// The same parameters with another length penalty.
    pub fn with_length_penalty(mut self, length_penalty: f32) -> Self {
        self.length_penalty = length_penalty;
        self
    }

    /// The same parameters with another stopping rule.
    pub fn with_early_stopping(mut self, early_stopping: EarlyStopping) -> Self {
        self.early_stopping = early_stopping;
        self
    }

    /// The same parameters returning `num_return` hypotheses.
    pub fn with_num_return(mut self, num_return: usize) -> Self {
        self.num_return = num_return;
        self
    }

    /// The same parameters with these EOS token ids.
    pub fn with_eos_token_ids(mut self, eos_token_ids: Vec<u32>) -> Self {
        self.eos_token_ids = eos_token_ids;
        self
    }

    /// Checks the parameters (the checks HF's `GenerationConfig.validate` does, plus a finite
    /// length penalty and a candidate count that fits in `usize`).
    pub fn validate(&self) -> Result<(), BeamError> {
        if self.beam_width == 0 {
            return Err(BeamError::ZeroBeamWidth);
        }
        if self.num_return == 0 {
            return Err(BeamError::ZeroNumReturn);
        }
        if self.num_return > self.beam_width {
            return Err(BeamError::NumReturnExceedsBeamWidth {
                num_return: self.num_return,
                beam_width: self.beam_width,
            });
        }
        if self.max_new_tokens == 0 {
            return Err(BeamError::ZeroMaxNewTokens);
        }
        if !self.length_penalty.is_finite() {
            return Err(BeamError::NonFiniteLengthPenalty(self.length_penalty));
        }
        self.checked_candidates_per_step()
            .map(|_| ())
            .ok_or(BeamError::TooManyCandidates)
    }

    /// Candidates kept per step, HF's `beams_to_keep = max(2, 1 + n_eos) * beam_width`
    /// (saturating on absurd inputs; [`validate`](Self::validate) rejects those).
    pub fn candidates_per_step(&self) -> usize {
        self.checked_candidates_per_step().unwrap_or(usize::MAX)
    }

    fn checked_candidates_per_step(&self) -> Option<usize> {
        self.eos_token_ids
            .len()
            .checked_add(1)?
            .max(2)
            .checked_mul(self.beam_width)
    }
}

/// Errors of [`BeamSearch`]: invalid parameters or a malformed step input.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BeamError {
    /// `beam_width` is 0.
    #[error("beam_width must be at least 1")]
    ZeroBeamWidth,
    /// `num_return` is 0.
    #[error("num_return must be at least 1")]
    ZeroNumReturn,
    /// More hypotheses requested than there are beams (HF raises the same error).
    #[error("num_return ({num_return}) must not exceed beam_width ({beam_width})")]
    NumReturnExceedsBeamWidth {
        /// Requested hypotheses.
        num_return: usize,
        /// Beam width.
        beam_width: usize,
    },
    /// `max_new_tokens` is 0 (HF raises the same error).
    #[error("max_new_tokens must be at least 1")]
    ZeroMaxNewTokens,
    /// The length penalty is NaN or infinite.
    #[error("length_penalty must be finite, got {0}")]
    NonFiniteLengthPenalty(f32),
    /// `max(2, 1 + n_eos) * beam_width` overflows `usize`.
    #[error("max(2, 1 + number of EOS ids) * beam_width overflows")]
    TooManyCandidates,
    /// The vocabulary size is 0 or token ids would not fit in `u32`.
    #[error("invalid vocabulary size {0}")]
    InvalidVocab(usize),
    /// `beam_width * vocab` is smaller than the number of candidates HF keeps per step
    /// (`torch.topk` would fail).
    #[error(
        "vocabulary of {vocab} tokens too small: beam search keeps {candidates} candidates per step"
    )]
    VocabTooSmall {
        /// Vocabulary size.
        vocab: usize,
        /// Candidates per step.
        candidates: usize,
    },
    /// `logprobs.len()` is not `live_beams * vocab`.
    #[error("expected {live_beams} live beams x {vocab} log-probabilities, got {got} values")]
    LogprobsShape {
        /// Live beams expected ([`BeamSearch::num_live_beams`]).
        live_beams: usize,
        /// Vocabulary size passed.
        vocab: usize,
        /// Length of the slice passed.
        got: usize,
    },
    /// [`BeamSearch::step`] was called after it reported `done`.
    #[error("the beam search is already done")]
    AlreadyDone,
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
        Self {
            tokens: Vec::new(),
            score: NEG_LARGE,
            sum_logprobs: NEG_LARGE,
            finished: false,
        }
    }
}

/// Beam search state of one request; see the [module docs](self) for the exact semantics.
///
/// Drive it with [`step`](Self::step) — first with the prompt's last-position log-probabilities
/// (one live beam), then once per decode step with one row per live beam — until the result says
/// `done`, then call [`finish`](Self::finish).
#[derive(Debug, Clone)]
pub struct BeamSearch {
    params: BeamSearchParams,
    prompt_len: usize,
    candidates: usize,
    generated: usize,
    live: Vec<LiveBeam>,
    slots: Vec<Slot>,
    improvement_possible: bool,
    done: bool,
}

impl BeamSearch {
    /// A new search with one live beam (the prompt) and no hypotheses. `prompt_len` is only
    /// recorded ([`prompt_len`](Self::prompt_len)): HF's length penalty and `max_new_tokens`
    /// count generated tokens only.
    pub fn new(params: BeamSearchParams, prompt_len: usize) -> Result<Self, BeamError> {
        params.validate()?;
        let candidates = params.candidates_per_step();
        let slots = vec![Slot::empty(); params.beam_width];
        Ok(Self {
            params,
            prompt_len,
            candidates,
            generated: 0,
            live: vec![LiveBeam {
                tokens: Vec::new(),
                score: 0.0,
            }],
            slots,
            improvement_possible: true,
            done: false,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &BeamSearchParams {
        &self.params
    }

    /// Candidates kept per step (HF's `beams_to_keep`).
    pub fn candidates_per_step(&self) -> usize {
        self.candidates
    }

    /// The prompt length given to [`new`](Self::new).
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
    /// `beam_width == 1`), `beam_width` afterwards, 0 once done.
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
            return Err(BeamError::LogprobsShape {
                live_beams,
                vocab,
                got: logprobs.len(),
            });
        }
        if self.params.beam_width == 1 {
            return Ok(self.greedy_step(logprobs));
        }
        let width = self.params.beam_width;
        if width.checked_mul(vocab).is_none_or(|n| n < self.candidates) {
            return Err(BeamError::VocabTooSmall {
                vocab,
                candidates: self.candidates,
            });
        }
        Ok(self.beam_step(logprobs, vocab))
    }

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
        let done = self.params.eos_token_ids.contains(&token)
            || self.generated >= self.params.max_new_tokens;
        if done {
            let beam = self.live.pop().expect("greedy search has one live beam");
            let denominator = length_denominator(self.generated, self.params.length_penalty);
            self.slots[0] = Slot {
                score: beam.score / denominator,
                sum_logprobs: beam.score,
                tokens: beam.tokens,
                finished: true,
            };
            self.done = true;
            StepResult {
                beams: Vec::new(),
                done: true,
            }
        } else {
            StepResult {
                beams: vec![(0, token)],
                done: false,
            }
        }
    }

    fn beam_step(&mut self, logprobs: &[f32], vocab: usize) -> StepResult {
        let width = self.params.beam_width;
        let first = self.generated == 0;

        // c. top-K continuations over all `width` beams (HF's `_get_top_k_continuations`). At the
        // first step HF's beams are copies of the prompt scored 0, -1e9, -1e9, ...
        let mut top = TopK::new(self.candidates);
        for b in 0..width {
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
        let at_max_len = new_len >= self.params.max_new_tokens;
        let candidates: Vec<Candidate> = top
            .items
            .iter()
            .map(|&(acc, index)| {
                let token = (index % vocab) as u32;
                Candidate {
                    // every copy of the prompt is the engine's single prompt beam
                    parent: if first { 0 } else { index / vocab },
                    token,
                    acc,
                    hits_stop: at_max_len || self.params.eos_token_ids.contains(&token),
                }
            })
            .collect();

        // e. next live beams (`_get_running_beams_for_next_iteration`)
        let mut running = TopK::new(width);
        for (i, c) in candidates.iter().enumerate() {
            running.push(
                if c.hits_stop {
                    c.acc + NEG_LARGE
                } else {
                    c.acc
                },
                i,
            );
        }

        // f. finished hypotheses (`_update_finished_beams`)
        let denominator = length_denominator(new_len, self.params.length_penalty);
        let slots_full = self.params.early_stopping == EarlyStopping::Eager
            && self.slots.iter().all(|s| s.finished);
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
        let extend = |c: &Candidate| {
            let mut tokens = Vec::with_capacity(new_len);
            tokens.extend_from_slice(&self.live[c.parent].tokens);
            tokens.push(c.token);
            tokens
        };
        let new_slots: Vec<Slot> = merged
            .items
            .iter()
            .map(|&(score, j)| match j.checked_sub(width) {
                None => self.slots[j].clone(),
                Some(i) => {
                    let c = &candidates[i];
                    Slot {
                        tokens: extend(c),
                        score,
                        sum_logprobs: c.acc,
                        finished: c.hits_stop && i < width,
                    }
                }
            })
            .collect();
        let new_live: Vec<(usize, u32, LiveBeam)> = running
            .items
            .iter()
            .map(|&(score, i)| {
                let c = &candidates[i];
                (
                    c.parent,
                    c.token,
                    LiveBeam {
                        tokens: extend(c),
                        score,
                    },
                )
            })
            .collect();

        // g. stopping condition (`_check_early_stop_heuristic`,
        // `_beam_search_has_unfinished_sequences`)
        self.generated = new_len;
        self.slots = new_slots;
        let lp = self.params.length_penalty;
        let hypothetical_len = if self.params.early_stopping == EarlyStopping::Never && lp > 0.0 {
            self.params.max_new_tokens
        } else {
            new_len
        };
        let best_running = new_live[0].2.score / length_denominator(hypothetical_len, lp);
        let worst_slot = torch_min(self.slots.iter().map(|s| s.score));
        let can_improve = self
            .slots
            .iter()
            .any(|s| best_running > if s.finished { worst_slot } else { NEG_LARGE });
        self.improvement_possible &= can_improve;
        let all_finished = self.slots.iter().all(|s| s.finished);
        let open_beam = !(all_finished && self.params.early_stopping == EarlyStopping::Eager);
        let valid_continuation = !candidates.iter().all(|c| c.hits_stop);
        self.done = !(self.improvement_possible && open_beam && valid_continuation);

        if self.done {
            self.live.clear();
            StepResult {
                beams: Vec::new(),
                done: true,
            }
        } else {
            let beams = new_live
                .iter()
                .map(|(parent, token, _)| (*parent, *token))
                .collect();
            self.live = new_live.into_iter().map(|(_, _, beam)| beam).collect();
            StepResult { beams, done: false }
        }
    }

    /// The best [`num_return`](BeamSearchParams::num_return) hypotheses, best first (HF's
    /// `sequences` / `sequences_scores`). Call it once [`step`](Self::step) reported `done`; when
    /// called earlier (an aborted request) it returns the hypotheses finished so far.
    ///
    /// Only finished hypotheses are returned, so the result can be shorter than `num_return` in
    /// the degenerate case where a slot is still empty at the end (possible only when candidates
    /// score below `-1e9`, e.g. `-inf` log-probabilities); HF would return a padded placeholder.
    pub fn finish(self) -> Vec<Hypothesis> {
        let num_return = self.params.num_return;
        self.slots
            .into_iter()
            .take(num_return)
            .filter(|s| s.finished)
            .map(|s| Hypothesis {
                tokens: s.tokens,
                score: s.score,
                sum_logprobs: s.sum_logprobs,
            })
            .collect()
    }
}

struct Candidate {
    /// Index of the engine's live beam it continues.
    parent: usize,
    token: u32,
    /// Accumulated score (running score + token log-probability).
    acc: f32,
    /// EOS token or `max_new_tokens` reached.
    hits_stop: bool,
}

/// `generated_len ^ length_penalty`, computed like Python's `int ** float` and then rounded to
/// `f32`, as PyTorch does when dividing a `float32` tensor by a Python float.
fn length_denominator(generated_len: usize, length_penalty: f32) -> f32 {
    (generated_len as f64).powf(f64::from(length_penalty)) as f32
}

/// `torch.min` of the slot scores: NaN if any is NaN.
fn torch_min(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(f32::INFINITY, |m, v| {
        if m.is_nan() || v.is_nan() {
            f32::NAN
        } else {
            m.min(v)
        }
    })
}

/// Whether `(value, index)` `a` ranks before `b`: higher value first, NaN above everything, then
/// lower index first.
fn ranks_before(a: (f32, usize), b: (f32, usize)) -> bool {
    match (a.0.is_nan(), b.0.is_nan()) {
        (true, true) => a.1 < b.1,
        (true, false) => true,
        (false, true) => false,
        (false, false) => a.0 > b.0 || (a.0 == b.0 && a.1 < b.1),
    }
}

/// The best `k` `(value, index)` pairs pushed, best first (see [`ranks_before`]).
struct TopK {
    k: usize,
    items: Vec<(f32, usize)>,
}

impl TopK {
    fn new(k: usize) -> Self {
        Self {
            k,
            items: Vec::with_capacity(k.saturating_add(1).min(1024)),
        }
    }

    fn push(&mut self, value: f32, index: usize) {
        let item = (value, index);
        if self.items.len() == self.k {
            match self.items.last() {
                Some(&last) if ranks_before(item, last) => {}
                _ => return,
            }
        }
        let pos = self.items.partition_point(|&x| ranks_before(x, item));
        self.items.insert(pos, item);
        self.items.truncate(self.k);
    }
}

#[cfg(test)]
mod tests;
