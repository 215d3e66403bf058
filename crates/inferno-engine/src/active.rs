//! One active (running) request on the engine thread: set up with its KV cache
//! ([`Running::start`]), its drafts when it speculates ([`Running::prepare_drafts`]), its
//! rows of each step ([`Running::rows`]), its sampled tokens (verified against its drafts)
//! streamed to the client as they come ([`Running::sample`]), and its end packaged as the
//! client's final events ([`Running::finish`]).

use super::generate::{FinishReason, Flow, GenerateError, Sequence, Step};
use super::job::{Done, Event, Job, JobError, Logprobs, Outcome, TokenLogprob, TokenOut};
use super::job::{Timings, MAX_LOGPROBS};
use super::kv_pool::KvPool;
use super::limits::Limits;
use super::loader::EngineAssets;
use super::observer::Observer;
use super::scheduler::{self, Role, Slot, StopCause};
use super::shared::Shared;
use super::speculative::draft::{DraftCache, DraftJob, DraftModel};
use super::speculative::{ngram, Acceptance, Bid, Method, Proposer, Speculation};
use inferno_model::{KvCache, Logits, SeqStep};
use inferno_sampling::constraint::MaskWorker;
use inferno_sampling::SamplingError;
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

/// A sequence's speculation: where its drafts come from and how well they do.
struct SeqSpec {
    method: Method,
    source: Source,
    acc: Acceptance,
}

enum Source {
    Propose(Box<dyn Proposer>),
    Draft(DraftCache),
}

/// A running request.
pub(super) struct Running<'t> {
    job: Job,
    seq: Sequence<'t>,
    kv: KvCache,
    slot: Slot,
    /// The logits of the sequence's forward rows in the last step: one row, or one per
    /// token run when it verified drafts.
    logits: Vec<f32>,
    vocab: usize,
    lp_buf: Vec<f32>,
    /// The sampled token to run next, once the prompt is done, followed by this step's
    /// drafts (room for the most a step may hold).
    next: Vec<u32>,
    /// Drafts in `next` this step.
    drafts: usize,
    spec: Option<SeqSpec>,
    /// Its part in sharing the step's draft rows.
    bid: Bid,
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
        speculation: &Speculation,
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
        let vocab = model.config.vocab;
        let lp_buf = if job.logprobs > 0 {
            vec![0.0f32; vocab]
        } else {
            Vec::new()
        };
        let spec = seq_spec(speculation, assets.draft.as_ref(), &job, need);
        // Buffers for the most rows a step may give it (allocated once, here).
        let max_drafts = if spec.is_some() {
            speculation.max_drafts()
        } else {
            0
        };
        Some(Self {
            slot: Slot::new(job.prompt.len(), granted.reused),
            seq,
            kv: granted.kv,
            logits: vec![0.0f32; (1 + max_drafts) * vocab],
            vocab,
            lp_buf,
            next: vec![0; 1 + max_drafts],
            drafts: 0,
            spec,
            bid: Bid::default(),
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

    /// Prompt tokens it has still to run (0 once it decodes).
    pub(super) fn prompt_remaining(&self) -> usize {
        self.slot.remaining()
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
            vocab,
            next,
            drafts,
            slot,
            span,
            step_span: seq_span,
            ..
        } = self;
        let vocab = *vocab;
        let (tokens, out) = match slot.role() {
            Role::Idle => return None,
            Role::Decode => {
                *seq_span = debug_span!(
                    parent: &*span,
                    "decode_step",
                    step = seq.completion_tokens(),
                    position = kv.len(),
                    drafts = *drafts
                );
                let rows = 1 + *drafts;
                (&next[..rows], Logits::All(&mut logits[..rows * vocab]))
            }
            Role::Prefill(n) => {
                let from = slot.prefilled();
                *seq_span = debug_span!(parent: &*span, "prefill", tokens = n, position = kv.len());
                let out = if slot.finishes_prompt() {
                    Logits::Last(&mut logits[..vocab])
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

    /// The span of the step that just ran, taken (for sampling in it).
    pub(super) fn take_step_span(&mut self) -> Span {
        std::mem::replace(&mut self.step_span, Span::none())
    }

    /// Feeds the sampled token into the next step.
    pub(super) fn feed(&mut self, id: u32) {
        self.next[0] = id;
        self.slot.start_decoding();
    }

    /// Its part in sharing the step's draft rows (see [`Running::prepare_drafts`]).
    pub(super) fn bid(&mut self) -> &mut Bid {
        &mut self.bid
    }

    /// Before a step in which it decodes: proposes its drafts (a lookup fills them now; a
    /// draft model drafts once the rows are shared) and sets its bid for the step's draft
    /// rows: its acceptance rate and the most drafts it can take — what its proposer found,
    /// what `max_tokens` and its cache leave room for. A caller's proposer
    /// ([`Method::Custom`]) is not second-guessed: all it proposes (within those limits) runs.
    pub(super) fn prepare_drafts(&mut self) {
        self.drafts = 0;
        self.bid = Bid::default();
        let Some(sp) = &mut self.spec else { return };
        if self.slot.role() != Role::Decode {
            return;
        }
        let done = self.seq.completion_tokens() + 1;
        let left = self.seq.options().max_tokens.saturating_sub(done);
        // This step's first row takes one position; each draft one more.
        let room = self.kv.room().saturating_sub(1);
        let mut cap = (self.next.len() - 1).min(left).min(room);
        let tokens = self.seq.tokens();
        match &mut sp.source {
            Source::Propose(p) => cap = p.propose(tokens, &mut self.next[1..1 + cap]).min(cap),
            Source::Draft(c) => cap = cap.min(c.room(tokens.len())),
        }
        if sp.method == Method::Custom {
            // A caller's proposer sizes its drafts itself.
            self.drafts = cap;
            return;
        }
        self.bid = Bid {
            rate: sp.acc.bid(),
            cap,
            k: 0,
        };
    }

    /// Takes the drafts its bid won (for a draft model: those it drafted, after
    /// [`Running::draft_job`]); a sequence that could have drafted but won nothing sits out.
    /// Returns its draft rows in the step.
    pub(super) fn take_drafts(&mut self) -> usize {
        let Some(sp) = &mut self.spec else { return 0 };
        self.drafts = match &sp.source {
            Source::Propose(_) if sp.method == Method::Custom => self.drafts,
            Source::Propose(_) => self.bid.k,
            Source::Draft(c) if self.slot.role() == Role::Decode && !c.is_broken() => c.drafted(),
            Source::Draft(_) => 0,
        };
        if self.bid.cap > 0 && self.drafts == 0 {
            sp.acc.sat_out();
        }
        self.drafts
    }

    /// Its part in this step's draft-model passes: catching its draft cache up (with at most
    /// `budget` rows, which it reduces) and, when its bid won drafts, drafting them. `None`
    /// when it has nothing to do there.
    pub(super) fn draft_job(&mut self, budget: &mut usize) -> Option<DraftJob<'_>> {
        let Some(SeqSpec {
            source: Source::Draft(cache),
            ..
        }) = &mut self.spec
        else {
            return None;
        };
        if cache.is_broken() {
            return None;
        }
        let tokens = self.seq.tokens();
        let synced = tokens.len() - cache.behind(tokens.len());
        let (target, want) = match self.slot.role() {
            Role::Idle => return None,
            // Draft when the whole catch-up fits; else only catch up.
            Role::Decode if self.bid.k > 0 && cache.behind(tokens.len()) <= *budget => {
                (tokens.len(), self.bid.k)
            }
            Role::Decode => (tokens.len(), 0),
            // Keep pace with the prompt's chunks.
            Role::Prefill(n) => (self.slot.prefilled() + n, 0),
        };
        let upto = target.min(synced + *budget);
        if upto <= synced && want == 0 {
            return None;
        }
        *budget -= upto.saturating_sub(synced);
        Some(DraftJob {
            cache,
            tokens,
            upto,
            want,
            out: &mut self.next[1..1 + want],
        })
    }

    /// Whether its draft cache lags the tokens it will need for this step (a prompt chunk
    /// runs, or it decodes and its bid won drafts).
    pub(super) fn needs_draft_pass(&self) -> bool {
        let Some(SeqSpec {
            source: Source::Draft(cache),
            ..
        }) = &self.spec
        else {
            return false;
        };
        !cache.is_broken()
            && match self.slot.role() {
                Role::Idle => false,
                Role::Decode => self.bid.k > 0,
                Role::Prefill(_) => true,
            }
    }

    /// Picks the sequence's next token from its logits (checking its drafts against its
    /// picks, row by row, when it ran some), streams each picked token to the client, and
    /// drops the rejected drafts from its cache. A step that verified drafts is a `verify`
    /// span (DEBUG: method, drafted, accepted).
    pub(super) fn sample(&mut self, shared: &Shared) -> Result<Step, SamplingError> {
        let obs = shared.observer();
        #[cfg(feature = "fault-injection")]
        let inject_panic = self.inject_panic;
        let k = self.drafts;
        // Positions left after the step's first row (the drafts took some of them).
        let room = self.kv.room() + k;
        let Self {
            seq,
            logits,
            vocab,
            next,
            job,
            lp_buf,
            started,
            last_token_at,
            stop_cause,
            spec,
            ..
        } = self;
        let n_logprobs = job.logprobs.min(MAX_LOGPROBS);
        let method = spec.as_ref().map_or(Method::Off, |s| s.method);
        let span = if k > 0 {
            debug_span!(
                "verify",
                method = method.name(),
                drafted = k,
                accepted = tracing::field::Empty
            )
        } else {
            Span::none()
        };
        let _e = span.enter();
        let verified = seq.verify(&logits[..(1 + k) * *vocab], &next[1..1 + k], room, |ev| {
            let Some(id) = ev.id else {
                return Flow::Continue;
            };
            if let Some((took, waited)) = ev.mask {
                obs.grammar_mask(took);
                obs.grammar_mask_wait(waited);
            }
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
        })?;
        span.record("accepted", verified.accepted);
        // The rejected drafts' keys and values leave the cache (and so never reach the
        // prefix cache).
        let keep = self.kv.len() - (1 + k) + verified.rows;
        self.kv.truncate(keep);
        self.drafts = 0;
        if let Some(sp) = &mut self.spec {
            sp.acc.record(k, verified.accepted);
            if let Source::Draft(c) = &mut sp.source {
                c.settle(verified.accepted);
            }
            if k > 0 {
                obs.speculated(sp.method, k, verified.accepted);
            }
        }
        Ok(verified.step)
    }

    /// Ends the request: the events its client gets, how it is counted, and whether its
    /// cache is kept for prefix reuse (only when the generation ended normally).
    pub(super) fn finish(self, obs: &dyn Observer, end: End) -> Ending {
        let Self {
            job,
            seq,
            kv,
            logits,
            vocab,
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
                let g = seq.finish(reason, &logits[..vocab], |ev| {
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
                    drafted_tokens: m.drafted_tokens,
                    accepted_tokens: m.accepted_tokens,
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

/// A job's speculation, when the engine speculates and the job allows it: its proposer
/// (for a draft model, a draft cache of the `need` positions the job reserved).
fn seq_spec(
    spec: &Speculation,
    draft: Option<&DraftModel>,
    job: &Job,
    need: usize,
) -> Option<SeqSpec> {
    if !spec.is_on() || !job.options.speculate {
        return None;
    }
    let source = match spec.method {
        Method::Off => return None,
        Method::Ngram => Source::Propose(Box::new(ngram::NgramProposer)),
        Method::Custom => Source::Propose(spec.custom.as_ref()?()),
        Method::Draft => Source::Draft(draft?.new_cache(need)),
    };
    Some(SeqSpec {
        method: spec.method,
        source,
        acc: Acceptance::new(super::speculative::prior_rate(spec.method)),
    })
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
        drafted_tokens: 0,
        accepted_tokens: 0,
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
    inferno_sampling::log_softmax(logits, buf);
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
