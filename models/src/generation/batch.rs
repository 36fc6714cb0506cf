//! The static-batch run that the plain and the offloading engines share: every prompt prepared
//! and started at once, prefilled together (left-padded), then decoded one token per step until
//! every request has stopped. An engine gives only its forward pass: one model call over one KV
//! cache, or a layer schedule over several (the offloading engine's GPU batches).
//!
//! Also here: the one way every engine measures a call ([`GenerationClock`] → [`Timing`]).

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};

use super::events::StreamEvent;
use super::request::{Prompt, RequestState, Timing, histories, prepare_prompt, record_sampled};
use super::sampling::{Sampled, SamplingParams, ids_of, sample, sample_on_device};
use crate::config::DecoderSpec;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Tokenizes and checks every prompt against the model, and starts a request for each (its
/// constraint, if any, compiled for outputs ending at `eos_token_ids`).
pub fn prepare_requests(
    prompts: &[Prompt],
    params: &SamplingParams,
    tokenizer: Option<&Tokenizer>,
    spec: &DecoderSpec,
    eos_token_ids: &[u32],
) -> Result<Vec<RequestState>> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (text, ids) = prepare_prompt(i, p, tokenizer, spec.vocab_size, spec.max_positions)?;
            RequestState::constrained(
                text,
                ids,
                params,
                spec.max_positions,
                tokenizer,
                (spec.vocab_size, eos_token_ids),
            )
        })
        .collect()
}

/// KV slots per sequence that a static batch of `requests` writes: the first step writes the
/// longest prompt (shorter ones left-padded to it), each later step one slot, and the run lasts
/// as many steps as the longest budget. The token sampled by the last step is never fed back, so
/// the total is `longest prompt + longest budget − 1`, at most the model's context
/// ([`RequestState::budget`] caps the budget there).
pub fn static_kv_capacity(requests: &[RequestState]) -> usize {
    let longest_prompt = requests.iter().map(|r| r.prompt_ids().len()).max().unwrap_or(0);
    let longest_budget = requests.iter().map(RequestState::budget).max().unwrap_or(1);
    longest_prompt + longest_budget.max(1) - 1
}

/// Prompt tokens of a batch of requests.
pub fn prompt_tokens(requests: &[RequestState]) -> usize {
    requests.iter().map(|r| r.prompt_ids().len()).sum()
}

/// Times a generation call as [`Timing`] means it for every engine: started when the call
/// starts; prefill ends when the first token is sampled (time to first token), decode is the
/// rest, and every step after the one that sampled the first token is a decode step.
#[derive(Debug, Clone, Copy)]
pub struct GenerationClock {
    started: Instant,
    first_token_s: Option<f64>,
    decode_steps: usize,
}

impl GenerationClock {
    /// Starts timing now (call it first thing in the call).
    pub fn start() -> Self {
        Self { started: Instant::now(), first_token_s: None, decode_steps: 0 }
    }

    /// Seconds since the start.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Marks the end of a step that sampled `tokens` tokens.
    pub fn step(&mut self, tokens: usize) {
        if self.first_token_s.is_some() {
            self.decode_steps += 1;
        } else if tokens > 0 {
            self.first_token_s = Some(self.elapsed_s());
        }
    }

    /// The call's timing, now.
    pub fn finish(&self, prompt_tokens: usize, generated_tokens: usize) -> Timing {
        let total = self.elapsed_s();
        let prefill_s = self.first_token_s.unwrap_or(total);
        Timing {
            prefill_s,
            decode_s: total - prefill_s,
            prompt_tokens,
            generated_tokens,
            decode_steps: self.decode_steps,
        }
    }
}

/// One static-batch run: how its requests sample and stop, and how its rows split into groups
/// that each run as one forward over one KV cache.
#[derive(Debug, Clone, Copy)]
pub struct StaticBatch<'a> {
    /// Sampling and stopping of every request.
    pub params: &'a SamplingParams,
    /// Ids that end a request unless `ignore_eos` is set.
    pub eos_token_ids: &'a [u32],
    /// Decodes the output text (none: no text, no stop strings).
    pub tokenizer: Option<&'a Tokenizer>,
    /// Rows per group (at least one); the last group may be shorter.
    pub group_rows: usize,
    /// The engine's name, for the step spans.
    pub engine: &'static str,
    /// Whether decode steps may be fed the previous step's sampled ids while they are still on
    /// the device ([`FedIds`]), reading them back while the next step runs. Set it for a forward
    /// that honours `fed` on a device that runs asynchronously (a GPU, a remote worker).
    pub feed_on_device: bool,
}

/// One step's new tokens per group: for each row of the group, the tokens it adds (its prompt at
/// the first step, its last sampled token later, nothing once it has finished); `None` for a
/// group whose rows have all finished, which sits the step out.
pub type GroupTokens<'t> = [Option<Vec<&'t [u32]>>];

/// Per group, the ids a decode step feeds when they come from the device: `Some(ids)`
/// (`[rows, 1]`, the previous step's choices) replaces the group's tokens, which are then one
/// placeholder per feeding row and give only the step's layout. `None`: the tokens are the ids.
pub type FedIds = [Option<Tensor<2, Int>>];

/// Placeholder of a row fed from the device: one token, whose id the device supplies.
const FED: [u32; 1] = [0];

/// A decode step whose choices are still on the device: each group's sampled ids (`None` for a
/// group that sat out), being read back.
struct InFlight {
    ids: Vec<Option<Tensor<2, Int>>>,
    reads: Vec<Option<PendingIds>>,
}

impl StaticBatch<'_> {
    /// Runs `requests` to completion. Each step, `forward` lays out every running group's new
    /// tokens on its KV cache and returns each group's last-token logits, `[rows, vocab]` (`None`
    /// for a group that sat out); each row then samples with its own random stream and records
    /// its token (stop rules applied), `on_token` seeing it (request indices within
    /// `requests`). `clock` marks every step. Returns the number of tokens generated.
    ///
    /// With [`StaticBatch::feed_on_device`], when nothing needs a step's choices on the host
    /// before the next step (no log-probabilities, penalties or constraints), decode steps
    /// overlap: step `i + 1` is given step `i`'s ids on the device (`fed`) for every row that
    /// still has budget, and step `i`'s ids are read back while it runs. A row that stopped at
    /// step `i` (an end id, a stop string) has then fed one token too many: that token's row is
    /// masked garbage and its choice is dropped, so the output is the same. The prompt step is
    /// always read at once, so the time to the first token is exact.
    pub fn run<E: From<ModelError>>(
        &self,
        requests: &mut [RequestState],
        clock: &mut GenerationClock,
        mut forward: impl FnMut(&GroupTokens<'_>, &FedIds) -> std::result::Result<Vec<Option<Tensor<2>>>, E>,
        mut on_token: impl FnMut(StreamEvent<'_>),
    ) -> std::result::Result<usize, E> {
        let group_rows = self.group_rows.max(1);
        let overlap = self.feed_on_device && self.may_overlap(requests);
        let mut rngs: Vec<_> = requests.iter().map(|_| self.params.rng()).collect();
        let mut new_tokens: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt_ids().to_vec()).collect();
        let (mut generated, mut step) = (0, 0);
        let mut in_flight: Option<InFlight> = None;
        while in_flight.is_some() || requests.iter().any(|r| !r.is_finished()) {
            let _span = tracing::debug_span!("step", engine = self.engine, step, first = step == 0).entered();
            let (groups, fed) = match &in_flight {
                None => (host_groups(&new_tokens, group_rows), vec![None; new_tokens.len().div_ceil(group_rows)]),
                Some(f) => (fed_groups(requests, group_rows), f.ids.clone()),
            };
            let logits = if groups.iter().any(Option::is_some) { forward(&groups, &fed)? } else { Vec::new() };
            drop(groups);
            let decode = step > 0;
            let mut sampled_now = 0;
            let mut next = InFlight { ids: Vec::new(), reads: Vec::new() };
            for (k, logits) in logits.into_iter().enumerate() {
                let rows = k * group_rows..((k + 1) * group_rows).min(requests.len());
                let Some(logits) = logits else {
                    next.ids.push(None);
                    next.reads.push(None);
                    continue;
                };
                if overlap && decode {
                    let ids = sample_on_device(logits, self.params, &mut rngs[rows], &[], &[])?;
                    next.reads.push(Some(PendingIds::start(ids.clone())));
                    next.ids.push(Some(ids));
                    continue;
                }
                let allowed = requests[rows.clone()]
                    .iter_mut()
                    .filter_map(|r| r.allowed_tokens().transpose())
                    .collect::<Result<Vec<_>>>()?;
                let sampled = sample(
                    logits,
                    self.params,
                    &mut rngs[rows.clone()],
                    &histories(&requests[rows.clone()]),
                    &allowed,
                )?;
                sampled_now += self.record(requests, &mut new_tokens, rows, sampled, &mut on_token)?;
            }
            // The step before this one, read back now that this one is under way.
            if let Some(previous) = in_flight.take() {
                for (k, read) in previous.reads.into_iter().enumerate() {
                    let Some(read) = read else { continue };
                    let rows = k * group_rows..((k + 1) * group_rows).min(requests.len());
                    let sampled = Sampled { ids: read.finish()?, logprobs: None };
                    sampled_now += self.record(requests, &mut new_tokens, rows, sampled, &mut on_token)?;
                }
            }
            if next.ids.iter().any(Option::is_some) {
                in_flight = Some(next);
            }
            generated += sampled_now;
            clock.step(sampled_now);
            step += 1;
        }
        Ok(generated)
    }

    /// Whether a step's choices may stay on the device until the next step has been issued:
    /// nothing in the sampling reads them (or the logits) on the host first.
    fn may_overlap(&self, requests: &[RequestState]) -> bool {
        self.params.logprobs.is_none()
            && self.params.constraint.is_none()
            && requests.iter().all(|r| r.token_counts().is_none())
    }

    /// Records one group's choices for the requests of `rows` ([`record_sampled`]).
    fn record(
        &self,
        requests: &mut [RequestState],
        new_tokens: &mut [Vec<u32>],
        rows: std::ops::Range<usize>,
        sampled: Sampled,
        on_token: &mut impl FnMut(StreamEvent<'_>),
    ) -> Result<usize> {
        let start = rows.start;
        record_sampled(
            &mut requests[rows.clone()],
            &mut new_tokens[rows],
            sampled,
            self.params,
            self.eos_token_ids,
            self.tokenizer,
            |i, token, text, finished| on_token(StreamEvent { request: start + i, sequence: 0, token, text, finished }),
        )
    }
}

/// Each group's tokens from the host: what every row feeds next (`None` when none of its rows
/// feeds anything).
fn host_groups(new_tokens: &[Vec<u32>], group_rows: usize) -> Vec<Option<Vec<&[u32]>>> {
    new_tokens
        .chunks(group_rows)
        .map(|rows| rows.iter().any(|t| !t.is_empty()).then(|| rows.iter().map(Vec::as_slice).collect()))
        .collect()
}

/// Each group's layout for a step fed from the device while the previous step's choices are
/// unread: a row feeds (one placeholder) unless it has finished or the unread token is its
/// last one by budget. A row that the unread token stops some other way feeds one token too
/// many, whose choice [`record_sampled`] then skips.
fn fed_groups(requests: &[RequestState], group_rows: usize) -> Vec<Option<Vec<&'static [u32]>>> {
    requests
        .chunks(group_rows)
        .map(|rows| {
            let feeds = |r: &RequestState| !r.is_finished() && r.generated().len() + 1 < r.budget();
            rows.iter().any(feeds).then(|| rows.iter().map(|r| if feeds(r) { &FED[..] } else { &[][..] }).collect())
        })
        .collect()
}

/// Sampled ids being read back from the device: the read is issued at once (polled once, which
/// queues the copy behind the work that produces them) and waited for by [`PendingIds::finish`].
struct PendingIds {
    read: std::pin::Pin<Box<dyn Future<Output = ReadResult> + Send>>,
    ready: Option<ReadResult>,
}

/// A read's data, or the device's error as text.
type ReadResult = std::result::Result<TensorData, String>;

impl PendingIds {
    fn start(ids: Tensor<2, Int>) -> Self {
        let mut read: std::pin::Pin<Box<dyn Future<Output = ReadResult> + Send>> =
            Box::pin(async move { ids.into_data_async().await.map_err(|e| format!("{e:?}")) });
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let ready = match read.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(data) => Some(data),
            std::task::Poll::Pending => None,
        };
        Self { read, ready }
    }

    fn finish(self) -> Result<Vec<u32>> {
        let data = match self.ready {
            Some(data) => data,
            None => burn::tensor::try_read_sync(self.read)
                .ok_or_else(|| ModelError::Device("this platform cannot wait for a read from the device".into()))?,
        };
        ids_of(data.map_err(|e| ModelError::Device(format!("reading sampled ids back: {e}")))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_longest_prompt_plus_longest_budget_minus_one() {
        let params = SamplingParams::greedy(4);
        let requests =
            [RequestState::new(None, vec![1; 3], &params, 64), RequestState::new(None, vec![1; 5], &params, 64)];
        // 5 prompt slots, then one per later step: tokens 1..=3 are fed back, token 4 is not.
        assert_eq!(static_kv_capacity(&requests), 5 + 4 - 1);
        // Capped by the context: a 5-token prompt in a 6-position model generates 2 tokens.
        let capped = [RequestState::new(None, vec![1; 5], &params, 6)];
        assert_eq!(static_kv_capacity(&capped), 6);
        assert_eq!(static_kv_capacity(&[]), 0);
    }

    /// Runs a scripted "model" whose next token is `(3·last + row + 1) mod 8` (8 is the vocabulary,
    /// 7 the end id) and returns every request's ids and finish, plus how many steps were fed
    /// from the device and how many forwards ran.
    fn scripted_run(feed_on_device: bool, params: &SamplingParams) -> (Vec<(Vec<u32>, String)>, usize, usize) {
        use burn::tensor::Device;
        let device = Device::flex();
        let mut requests: Vec<_> =
            [vec![1, 2], vec![4], vec![2, 6, 5]].into_iter().map(|p| RequestState::new(None, p, params, 64)).collect();
        let batch =
            StaticBatch { params, eos_token_ids: &[7], tokenizer: None, group_rows: 2, engine: "test", feed_on_device };
        let (mut fed_steps, mut forwards) = (0, 0);
        let mut clock = GenerationClock::start();
        batch
            .run(
                &mut requests,
                &mut clock,
                |groups: &GroupTokens<'_>, fed: &FedIds| {
                    forwards += 1;
                    let mut out = Vec::new();
                    for (k, (rows, fed)) in groups.iter().zip(fed).enumerate() {
                        let Some(rows) = rows else {
                            out.push(None);
                            continue;
                        };
                        let fed_ids = fed.as_ref().map(|ids| {
                            fed_steps += 1;
                            assert!(rows.iter().all(|t| t.len() <= 1), "a fed step feeds one token per row");
                            ids.clone().into_data().try_into_vec_as::<i64>().unwrap()
                        });
                        let mut logits = vec![0f32; rows.len() * 8];
                        for (i, tokens) in rows.iter().enumerate() {
                            let last = match (&fed_ids, tokens.last()) {
                                (Some(ids), Some(_)) => ids[i] as u32,
                                (None, Some(&t)) => t,
                                (_, None) => 0,
                            };
                            let row = (k * 2 + i) as u32;
                            logits[i * 8 + ((3 * last + row + 1) % 8) as usize] = 1.0;
                        }
                        out.push(Some(Tensor::from_data(TensorData::new(logits, [rows.len(), 8]), &device)));
                    }
                    Ok::<_, ModelError>(out)
                },
                |_| {},
            )
            .unwrap();
        let outputs =
            requests.into_iter().map(|r| r.into_output()).map(|o| (o.generated_ids, format!("{:?}", o.finish_reason)));
        (outputs.collect(), fed_steps, forwards)
    }

    #[test]
    fn device_fed_steps_give_the_same_tokens() {
        let params = SamplingParams::greedy(6);
        let (host, host_fed, host_forwards) = scripted_run(false, &params);
        let (device, device_fed, device_forwards) = scripted_run(true, &params);
        assert_eq!(host_fed, 0);
        assert!(device_fed > 0, "no step was fed from the device");
        assert_eq!(device, host);
        // Some request stops on the end id before its budget, some at the budget.
        assert!(host.iter().any(|(ids, f)| ids.last() == Some(&7) && f == "Stop"), "{host:?}");
        assert!(host.iter().any(|(ids, f)| ids.len() == 6 && f == "Length"), "{host:?}");
        // Rows stopped by an end id are discovered one step late: at most one extra forward.
        assert!(device_forwards <= host_forwards + 1, "{device_forwards} vs {host_forwards}");
        // Log-probabilities need each step's choice on the host: no device feeding then.
        let (with_logprobs, fed, _) = scripted_run(true, &SamplingParams { logprobs: Some(1), ..params.clone() });
        assert_eq!(fed, 0);
        assert_eq!(with_logprobs, host);
    }

    #[test]
    fn clock_ends_prefill_at_the_first_token() {
        let mut clock = GenerationClock::start();
        clock.step(0); // a step that sampled nothing (a prompt chunk) is still prefill
        clock.step(2);
        clock.step(2);
        clock.step(1);
        let timing = clock.finish(7, 5);
        assert_eq!((timing.decode_steps, timing.prompt_tokens, timing.generated_tokens), (2, 7, 5));
        assert!(timing.prefill_s >= 0.0 && timing.decode_s >= 0.0);
    }
}
