//! One running request on the engine thread: set up with its KV cache ([`Running::start`]),
//! its rows of each step ([`Running::rows`]), its sampled tokens streamed to the client as
//! they come ([`Running::sample`]), and its end packaged as the client's final events
//! ([`Running::finish`]).

use super::generate::{FinishReason, Flow, GenerateError, Sequence, Step};
use super::job::{Done, Event, Job, JobError, Logprobs, Outcome, TokenLogprob, TokenOut};
use super::job::{Timings, MAX_LOGPROBS};
use super::kv_pool::KvPool;
use super::limits::Limits;
use super::loader::EngineAssets;
use super::observer::Observer;
use super::scheduler::{self, Role, Slot, StopCause};
use super::shared::Shared;
use crate::model::{KvCache, Logits, SeqStep};
use crate::sampling::constraint::MaskWorker;
use std::time::{Duration, Instant};
use tracing::{debug_span, error, info, info_span, warn, Span};

/// How a running request ends.
pub(super) enum End {
    Finished(FinishReason),
    Panicked(String),
    Failed(JobError, Outcome),
}

impl Clone for End {
    fn clone(&self) -> Self {
        match self {
            End::Panicked(m) => End::Panicked(m.clone()),
            End::Failed(e, o) => End::Failed(e.clone(), *o),
            End::Finished(r) => End::Finished(*r),
        }
    }
}

/// What is left to do once a request has ended: return its cache, count it, tell its
/// client.
pub(super) struct Ending {
    pub kv: KvCache,
    /// What the cache holds (prompt and generated tokens), when it is worth keeping.
    pub history: Option<Vec<u32>>,
    pub outcome: Outcome,
    pub events: Vec<Event>,
    pub job: Job,
}

/// A running request.
pub(super) struct Running<'t> {
    job: Job,
    seq: Sequence<'t>,
    kv: KvCache,
    slot: Slot,
    /// The logits of the sequence's last forward row.
    logits: Vec<f32>,
    lp_buf: Vec<f32>,
    /// The sampled token to run next, once the prompt is done.
    next: [u32; 1],
    span: Span,
    /// This step's `prefill`/`decode_step` span.
    step_span: Span,
    queue_wait: Duration,
    started: Instant,
    last_token_at: Option<Instant>,
    tail: String,
    stop_cause: Option<StopCause>,
    #[cfg(feature = "fault-injection")]
    inject_panic: bool,
}

impl<'t> Running<'t> {
    /// Sets a job up as a running sequence with its KV cache. A job that cannot start is
    /// failed here (its client told, the outcome counted).
    pub(super) fn start(
        shared: &Shared,
        assets: &'t EngineAssets,
        limits: &Limits,
        pool: &mut KvPool,
        masks: Option<&MaskWorker>,
        job: Job,
    ) -> Option<Self> {
        let obs = shared.observer();
        let model = &assets.model;
        let queue_wait = job.enqueued_at.elapsed();
        obs.queue_wait(queue_wait);
        let span = info_span!(
            "request",
            request_id = %job.request_id,
            protocol = job.protocol.as_str(),
            prompt_tokens = job.prompt.len(),
            cached_prompt_tokens = tracing::field::Empty,
        );
        let started = Instant::now();
        let fail = |job: &Job, err: JobError, outcome: Outcome| {
            let _e = span.enter();
            warn!(error = %err, "generation failed");
            obs.finished(outcome, job.protocol);
            let _ = job
                .events
                .send(Event::Done(failed_done(job, 0, 0, queue_wait, started)));
            let _ = job.events.send(Event::Failed(err));
        };
        let mut seq = match Sequence::new(
            &assets.tokenizer,
            model.config.vocab,
            &job.prompt,
            job.options.clone(),
            limits.ctx,
        ) {
            Ok(s) => s,
            Err(e) => {
                let (err, outcome) = match e {
                    GenerateError::Model(m) => {
                        (JobError::Internal(m.to_string()), Outcome::Internal)
                    }
                    e => (
                        JobError::InvalidArgument(e.to_string()),
                        Outcome::InvalidArgument,
                    ),
                };
                fail(&job, err, outcome);
                return None;
            }
        };
        let need = limits.reservation(job.prompt.len(), job.options.max_tokens);
        let Some(granted) = pool.acquire(model, &job.prompt, need) else {
            // Admission checked the fit; this is a bug, not the client's fault.
            fail(
                &job,
                JobError::Internal("no KV-cache room for an admitted request".into()),
                Outcome::Internal,
            );
            return None;
        };
        seq.set_cached_prompt_tokens(granted.reused);
        span.record("cached_prompt_tokens", granted.reused);
        obs.prompt_tokens_reused(granted.reused);
        obs.started(job.prompt.len());
        if seq.is_constrained() {
            obs.constrained_request();
            if let Some(w) = masks {
                seq.use_mask_worker(w.handle());
            }
        }
        let lp_buf = if job.logprobs > 0 {
            vec![0.0f32; model.config.vocab]
        } else {
            Vec::new()
        };
        Some(Self {
            slot: Slot::new(job.prompt.len(), granted.reused),
            seq,
            kv: granted.kv,
            logits: vec![0.0f32; model.config.vocab],
            lp_buf,
            next: [0],
            span,
            step_span: Span::none(),
            queue_wait,
            started,
            last_token_at: None,
            tail: String::new(),
            stop_cause: None,
            #[cfg(feature = "fault-injection")]
            inject_panic: shared.injects_panic(&job),
            job,
        })
    }

    pub(super) fn slot(&mut self) -> &mut Slot {
        &mut self.slot
    }

    pub(super) fn role(&self) -> Role {
        self.slot.role()
    }

    /// Checks, between steps, whether the request must stop: its client left, its
    /// deadline passed, or the server is shutting down.
    pub(super) fn must_stop(&mut self, shutdown: bool, now: Instant) -> bool {
        self.stop_cause = scheduler::stop_cause(&self.job, shutdown, now);
        self.stop_cause.is_some()
    }

    /// This step's rows of the sequence (its decode token or its share of the prompt), with
    /// the span they run in, which follows from the step's; `None` when it sits this step
    /// out.
    pub(super) fn rows(&mut self, step_span: &Span) -> Option<SeqStep<'_>> {
        let Self {
            seq,
            kv,
            logits,
            next,
            slot,
            span,
            step_span: seq_span,
            ..
        } = self;
        let (tokens, out) = match slot.role() {
            Role::Idle => return None,
            Role::Decode => {
                *seq_span = debug_span!(
                    parent: &*span,
                    "decode_step",
                    step = seq.completion_tokens(),
                    position = kv.len()
                );
                (&next[..], Logits::Last(&mut logits[..]))
            }
            Role::Prefill(n) => {
                let from = slot.prefilled();
                *seq_span = debug_span!(parent: &*span, "prefill", tokens = n, position = kv.len());
                let out = if slot.finishes_prompt() {
                    Logits::Last(&mut logits[..])
                } else {
                    Logits::None
                };
                (&seq.prompt()[from..from + n], out)
            }
        };
        seq_span.follows_from(step_span);
        Some(SeqStep {
            kv,
            tokens,
            logits: out,
        })
    }

    /// Records that the step's forward pass ran (taking `took`); returns whether the
    /// sequence now has logits to sample.
    pub(super) fn ran(&mut self, took: Duration) -> bool {
        let role = self.slot.role();
        let ready = self.slot.ran();
        match role {
            Role::Idle => {}
            Role::Decode => self.seq.record_decode(took),
            Role::Prefill(_) => self.seq.record_prefill(took),
        }
        if !ready {
            self.step_span = Span::none();
        }
        ready
    }

    /// Whether the logits to sample are all finite (corrupt weights give NaN or infinity).
    pub(super) fn check_logits(&self) -> Result<(), crate::sampling::SamplingError> {
        crate::sampling::check_logits(&self.logits)
    }

    /// The span of the step that just ran, taken (for sampling in it).
    pub(super) fn take_step_span(&mut self) -> Span {
        std::mem::replace(&mut self.step_span, Span::none())
    }

    /// Feeds the sampled token into the next step.
    pub(super) fn feed(&mut self, id: u32) {
        self.next = [id];
        self.slot.start_decoding();
    }

    /// Samples the sequence's next token from its logits and streams it to the client.
    pub(super) fn sample(&mut self, shared: &Shared) -> Step {
        let obs = shared.observer();
        let room = self.kv.room() > 0;
        #[cfg(feature = "fault-injection")]
        let inject_panic = self.inject_panic;
        let Self {
            seq,
            logits,
            job,
            lp_buf,
            started,
            last_token_at,
            stop_cause,
            tail,
            ..
        } = self;
        let n_logprobs = job.logprobs.min(MAX_LOGPROBS);
        let step = seq.advance(logits, room, |ev| {
            let Some(id) = ev.id else {
                tail.push_str(ev.text);
                return Flow::Continue;
            };
            let now = Instant::now();
            match *last_token_at {
                None => obs.time_to_first_token(now - *started),
                Some(prev) => obs.decode_step(now - prev),
            }
            *last_token_at = Some(now);
            #[cfg(feature = "fault-injection")]
            if inject_panic && ev.index >= 1 {
                panic!("injected engine fault");
            }
            let logprobs =
                (job.logprobs > 0).then(|| logprobs_of(ev.logits, id, n_logprobs, lp_buf));
            let sent = job.events.send(Event::Token(TokenOut {
                index: ev.index,
                id,
                text: ev.text.to_string(),
                logprobs,
            }));
            *stop_cause = if sent.is_err() {
                Some(StopCause::ClientGone)
            } else {
                scheduler::stop_cause(job, shared.cancelling(), now)
            };
            if stop_cause.is_some() {
                Flow::Stop
            } else {
                Flow::Continue
            }
        });
        if let Some((took, waited)) = seq.take_mask_time() {
            obs.grammar_mask(took);
            obs.grammar_mask_wait(waited);
        }
        step
    }

    /// Ends the request: the events its client gets, how it is counted, and whether its
    /// cache is kept for prefix reuse (only when the generation ended normally).
    pub(super) fn finish(self, obs: &dyn Observer, end: End) -> Ending {
        let Self {
            job,
            seq,
            kv,
            logits,
            span,
            queue_wait,
            started,
            mut tail,
            stop_cause,
            ..
        } = self;
        let _e = span.enter();
        let completion = seq.completion_tokens();
        let cached = seq.cached_prompt_tokens();
        obs.tokens_generated(completion);
        obs.ended();
        let failed = |err: JobError| {
            vec![
                Event::Done(failed_done(&job, cached, completion, queue_wait, started)),
                Event::Failed(err),
            ]
        };
        let mut history: Option<Vec<u32>> = None;
        let (events, outcome) = match end {
            End::Panicked(msg) => {
                error!(panic = %msg, "the engine panicked while serving a request");
                (
                    failed(JobError::Internal(format!("panic: {msg}"))),
                    Outcome::Internal,
                )
            }
            End::Failed(err, outcome) => {
                warn!(error = %err, "generation failed");
                (failed(err), outcome)
            }
            End::Finished(reason) => {
                if stop_cause.is_none() {
                    history = Some(seq.tokens().to_vec());
                }
                let g = seq.finish(reason, &logits, |ev| {
                    tail.push_str(ev.text);
                    Flow::Continue
                });
                let m = &g.metrics;
                let done = Done {
                    finish_reason: Some(g.finish_reason),
                    text: tail,
                    prompt_tokens: m.prompt_tokens,
                    cached_prompt_tokens: m.cached_prompt_tokens,
                    completion_tokens: m.completion_tokens,
                    seed: g.seed,
                    timings: Timings {
                        queue_wait,
                        time_to_first_token: Duration::from_secs_f64(
                            m.time_to_first_token_ms.max(0.0) / 1e3,
                        ),
                        prefill_tokens_per_second: m.prefill_tokens_per_second,
                        decode_tokens_per_second: m.decode_tokens_per_second,
                        total: started.elapsed(),
                    },
                };
                info!(
                    finish_reason = ?g.finish_reason,
                    completion_tokens = m.completion_tokens,
                    cached_prompt_tokens = m.cached_prompt_tokens,
                    ttft_ms = m.time_to_first_token_ms,
                    decode_tokens_per_second = m.decode_tokens_per_second,
                    "request finished"
                );
                match stop_cause {
                    None => (vec![Event::Done(done)], Outcome::Ok),
                    Some(StopCause::ClientGone) => (Vec::new(), Outcome::Cancelled),
                    Some(StopCause::Deadline) => (
                        vec![Event::Failed(JobError::DeadlineExceeded)],
                        Outcome::DeadlineExceeded,
                    ),
                    Some(StopCause::Shutdown) => (
                        vec![Event::Done(done), Event::Failed(JobError::ShuttingDown)],
                        Outcome::Unavailable,
                    ),
                }
            }
        };
        Ending {
            kv,
            history,
            outcome,
            events,
            job,
        }
    }
}

/// The final message of a request that failed.
fn failed_done(
    job: &Job,
    cached: usize,
    completion_tokens: usize,
    queue_wait: Duration,
    started: Instant,
) -> Done {
    Done {
        finish_reason: None,
        text: String::new(),
        prompt_tokens: job.prompt.len(),
        cached_prompt_tokens: cached,
        completion_tokens,
        seed: job.options.sampling.seed.unwrap_or(0),
        timings: Timings {
            queue_wait,
            total: started.elapsed(),
            ..Timings::default()
        },
    }
}

/// The chosen token's log-probability and the `n` most likely tokens'.
fn logprobs_of(logits: &[f32], chosen: u32, n: usize, buf: &mut [f32]) -> Logprobs {
    crate::sampling::log_softmax(logits, buf);
    let mut top: Vec<TokenLogprob> = Vec::with_capacity(n + 1);
    for (id, &lp) in buf.iter().enumerate() {
        if top.len() == n && top.last().is_none_or(|t| lp <= t.logprob) {
            continue;
        }
        let at = top.partition_point(|t| t.logprob >= lp);
        top.insert(
            at,
            TokenLogprob {
                id: id as u32,
                logprob: lp,
            },
        );
        top.truncate(n);
    }
    Logprobs {
        chosen: TokenLogprob {
            id: chosen,
            logprob: buf
                .get(chosen as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
        },
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_pick_the_most_likely_in_order() {
        let logits = [0.5f32, 3.0, -1.0, 2.0, 2.5];
        let mut buf = vec![0.0; logits.len()];
        let lp = logprobs_of(&logits, 3, 3, &mut buf);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 4, 3]);
        assert_eq!(lp.chosen.id, 3);
        let total: f32 = buf.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!((lp.chosen.logprob - buf[3]).abs() < 1e-7);
        assert!(lp.top[0].logprob > lp.top[1].logprob);
        assert!(logprobs_of(&logits, 0, 0, &mut buf).top.is_empty());
    }
}
