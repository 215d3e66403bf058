//! The engine thread's loop: continuous batching.
//!
//! Up to `max_batch` sequences run at once. Each engine step is one forward pass over one
//! new token of every generating sequence plus at most `prefill_chunk` prompt tokens of the
//! starting sequences (the oldest first, so several short prompts start together), so a
//! long prompt delays running streams by one chunk at a time. Requests join between steps when the KV budget has room for their prompt plus
//! `max_tokens` ([`KvPool`]); one that does not fit waits at the head of the queue. Before
//! every step each sequence's client, deadline and the server's shutdown are checked, so a
//! sequence stops within one step and its cache is freed at once.
//!
//! Tracing: each step is an `engine_step` span (batch size, decode rows, prefill rows) that
//! holds the backend's kernel spans. Each request is a `request` span holding, per step it
//! took part in, a `prefill` span (tokens, position) or a `decode_step` span (step,
//! position), which follow from that step's `engine_step`.

use super::generate::{FinishReason, Flow, GenerateError, Sequence, Step};
use super::kv_pool::{Fit, KvPool};
use super::worker::{
    logprobs_of, panic_message, Done, EngineAssets, Event, Job, JobError, Outcome, Shared, Timings,
    TokenOut, FAULT_PANIC_REQUEST_ID, MAX_LOGPROBS,
};
use crate::model::{KvCache, Logits, Model, Scratch, SeqStep};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tracing::{debug_span, error, info, info_span, warn, Span};

/// The engine's limits, fixed when it starts.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_batch: usize,
    pub prefill_chunk: usize,
    /// The prefill chunk while other sequences are decoding (at most `prefill_chunk`).
    pub prefill_chunk_running: usize,
    /// Positions one sequence may hold.
    pub ctx: usize,
    /// KV-cache positions for all sequences.
    pub kv_budget: usize,
}

impl Limits {
    /// Positions a job reserves: its prompt plus `max_tokens`, capped at the context.
    fn need(&self, job: &Job) -> usize {
        (job.prompt.len() + job.options.max_tokens).min(self.ctx)
    }
}

/// Why a running sequence was stopped from outside.
#[derive(Clone, Copy, Debug, PartialEq)]
enum StopCause {
    ClientGone,
    Deadline,
    Shutdown,
}

/// What a sequence does in the current step.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Idle,
    Decode,
    /// Runs this many prompt tokens.
    Prefill(usize),
}

/// A running request.
struct Active<'t> {
    job: Job,
    seq: Sequence<'t>,
    kv: KvCache,
    /// The logits of the sequence's last forward row.
    logits: Vec<f32>,
    lp_buf: Vec<f32>,
    /// Prompt tokens whose keys and values are in the cache.
    prefilled: usize,
    /// The sampled token to run next, once the prompt is done.
    next: [u32; 1],
    decoding: bool,
    role: Role,
    span: Span,
    /// This step's `prefill`/`decode_step` span.
    step_span: Span,
    queue_wait: Duration,
    started: Instant,
    last_token_at: Option<Instant>,
    tail: String,
    stop_cause: Option<StopCause>,
    inject_panic: bool,
}

/// How a running request ends.
enum End {
    Finished(FinishReason),
    Panicked(String),
    Failed(JobError, Outcome),
}

/// What to do with the job at the head of the queue.
#[derive(Clone, Copy, PartialEq)]
enum Verdict {
    Wait,
    Start,
    Gone,
    Shutdown,
    Expired,
    Never,
}

/// Serves jobs until the queue is closed and every sequence has ended.
pub(super) fn run(shared: &Shared, assets: &EngineAssets, limits: Limits) {
    let model = &assets.model;
    let mut scratch = model.new_scratch(limits.max_batch + limits.prefill_chunk, limits.max_batch);
    let mut pool = KvPool::new(limits.kv_budget);
    let mut active: Vec<Active<'_>> = Vec::with_capacity(limits.max_batch);
    let mut steps: Vec<SeqStep<'static>> = Vec::with_capacity(limits.max_batch);
    shared.publish_kv(pool.usage());
    loop {
        if active.is_empty() {
            shared.busy.store(false, Ordering::SeqCst);
            if !shared.queue.wait_nonempty() {
                break;
            }
            shared.busy.store(true, Ordering::SeqCst);
        }
        admit(shared, assets, &limits, &mut pool, &mut active);
        reap(shared, &mut pool, &mut active);
        if active.is_empty() {
            continue;
        }
        steps = step(
            shared,
            model,
            &limits,
            &mut scratch,
            steps,
            &mut pool,
            &mut active,
        );
    }
    shared.busy.store(false, Ordering::SeqCst);
}

/// Empties a vector and gives its allocation back for items of another lifetime, so the
/// per-step list of sequences is not reallocated every step (the collect reuses the
/// buffer in place).
// The `filter_map` changes the item type (its lifetime), which `filter` cannot.
#[allow(clippy::unnecessary_filter_map)]
fn recycle<'b>(mut v: Vec<SeqStep<'_>>) -> Vec<SeqStep<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Starts queued jobs, oldest first, while there are free slots and they fit the budget.
fn admit<'t>(
    shared: &Shared,
    assets: &'t EngineAssets,
    limits: &Limits,
    pool: &mut KvPool,
    active: &mut Vec<Active<'t>>,
) {
    let obs = shared.observer.as_ref();
    while active.len() < limits.max_batch {
        let mut verdict = Verdict::Wait;
        let job = shared.queue.pop_if(|job| {
            verdict = if job.client_gone() {
                Verdict::Gone
            } else if shared.cancel_all.load(Ordering::SeqCst) {
                Verdict::Shutdown
            } else if job.deadline.is_some_and(|d| Instant::now() >= d) {
                Verdict::Expired
            } else {
                match pool.fit(&job.prompt, limits.need(job)) {
                    Fit::Now => Verdict::Start,
                    Fit::Later => Verdict::Wait,
                    Fit::Never => Verdict::Never,
                }
            };
            verdict != Verdict::Wait
        });
        let Some(job) = job else { break };
        // Metrics are recorded before the client hears the outcome, so a client that has
        // seen its stream end also sees it counted.
        match verdict {
            Verdict::Gone => {
                info!(request_id = %job.request_id, "client gone while queued; dropped before prefill");
                obs.finished(Outcome::Cancelled);
            }
            Verdict::Shutdown => {
                obs.finished(Outcome::Unavailable);
                let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
            }
            Verdict::Expired => {
                obs.finished(Outcome::DeadlineExceeded);
                let _ = job.events.send(Event::Failed(JobError::DeadlineExceeded));
            }
            Verdict::Never => {
                let msg = format!(
                    "the prompt ({} tokens) plus max_tokens ({}) needs {} KV-cache positions \
                     but the server's KV cache holds {} (--kv-cache-tokens)",
                    job.prompt.len(),
                    job.options.max_tokens,
                    limits.need(&job),
                    limits.kv_budget
                );
                warn!(request_id = %job.request_id, "{msg}");
                obs.finished(Outcome::InvalidArgument);
                let _ = job
                    .events
                    .send(Event::Failed(JobError::InvalidArgument(msg)));
            }
            Verdict::Wait | Verdict::Start => {
                if let Some(a) = start(shared, assets, limits, pool, job) {
                    active.push(a);
                }
            }
        }
    }
    shared.publish_kv(pool.usage());
}

/// Sets a job up as a running sequence with its KV cache.
fn start<'t>(
    shared: &Shared,
    assets: &'t EngineAssets,
    limits: &Limits,
    pool: &mut KvPool,
    job: Job,
) -> Option<Active<'t>> {
    let obs = shared.observer.as_ref();
    let model = &assets.model;
    let queue_wait = job.enqueued_at.elapsed();
    obs.queue_wait(queue_wait);
    let span = info_span!(
        "request",
        request_id = %job.request_id,
        prompt_tokens = job.prompt.len(),
        cached_prompt_tokens = tracing::field::Empty,
    );
    let started = Instant::now();
    let fail = |job: &Job, err: JobError, outcome: Outcome| {
        let _e = span.enter();
        warn!(error = %err, "generation failed");
        obs.finished(outcome);
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
                GenerateError::Model(m) => (JobError::Internal(m.to_string()), Outcome::Internal),
                e => (
                    JobError::InvalidArgument(e.to_string()),
                    Outcome::InvalidArgument,
                ),
            };
            fail(&job, err, outcome);
            return None;
        }
    };
    let Some(granted) = pool.acquire(model, &job.prompt, limits.need(&job)) else {
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
    let lp_buf = if job.logprobs > 0 {
        vec![0.0f32; model.config.vocab]
    } else {
        Vec::new()
    };
    let inject_panic = shared.fault_injection && job.request_id == FAULT_PANIC_REQUEST_ID;
    Some(Active {
        seq,
        kv: granted.kv,
        logits: vec![0.0f32; model.config.vocab],
        lp_buf,
        prefilled: granted.reused,
        next: [0],
        decoding: false,
        role: Role::Idle,
        span,
        step_span: Span::none(),
        queue_wait,
        started,
        last_token_at: None,
        tail: String::new(),
        stop_cause: None,
        inject_panic,
        job,
    })
}

/// Ends the sequences whose client left, whose deadline passed, or all of them when the
/// server is cancelling everything.
fn reap(shared: &Shared, pool: &mut KvPool, active: &mut Vec<Active<'_>>) {
    let shutdown = shared.cancel_all.load(Ordering::SeqCst);
    let now = Instant::now();
    let mut i = 0;
    while i < active.len() {
        let a = &mut active[i];
        a.stop_cause = if a.job.client_gone() {
            Some(StopCause::ClientGone)
        } else if shutdown {
            Some(StopCause::Shutdown)
        } else if a.job.deadline.is_some_and(|d| now >= d) {
            Some(StopCause::Deadline)
        } else {
            None
        };
        if a.stop_cause.is_some() {
            let a = active.remove(i);
            conclude(shared, pool, a, End::Finished(FinishReason::Cancelled));
        } else {
            i += 1;
        }
    }
    shared.publish_kv(pool.usage());
}

/// One forward pass over every running sequence, then sampling for each that got logits.
/// `steps` is an empty list whose allocation is reused; it comes back empty.
fn step(
    shared: &Shared,
    model: &Model,
    limits: &Limits,
    scratch: &mut Scratch,
    steps: Vec<SeqStep<'static>>,
    pool: &mut KvPool,
    active: &mut Vec<Active<'_>>,
) -> Vec<SeqStep<'static>> {
    let (mut decode_rows, mut prefill_rows) = (0, 0);
    // A prompt chunk lengthens the step every running stream waits on: while any stream is
    // decoding, take the smaller chunk so their inter-token latency stays even; with none
    // running, the large one so the prompt's first token comes soon.
    let chunk = if active.iter().any(|a| a.decoding) {
        limits.prefill_chunk_running
    } else {
        limits.prefill_chunk
    };
    for a in active.iter_mut() {
        a.role = if a.decoding {
            decode_rows += 1;
            Role::Decode
        } else if prefill_rows < chunk {
            // Waiting prompts share the chunk in arrival order, so several short prompts
            // start in one step instead of one step each.
            let n = (a.seq.prompt().len() - a.prefilled).min(chunk - prefill_rows);
            prefill_rows += n;
            Role::Prefill(n)
        } else {
            Role::Idle
        };
    }
    let n_seqs = active.iter().filter(|a| a.role != Role::Idle).count();
    let step_span = debug_span!(
        "engine_step",
        batch_size = n_seqs,
        decode_rows,
        prefill_rows
    );
    shared.observer.step(n_seqs, decode_rows, prefill_rows);
    let t = Instant::now();
    let (steps, result) = forward(model, scratch, steps, active, &step_span);
    let took = t.elapsed();
    let failure = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(End::Failed(
            JobError::Internal(e.to_string()),
            Outcome::Internal,
        )),
        Err(p) => Some(End::Panicked(panic_message(&p))),
    };
    if let Some(end) = failure {
        // The forward pass ran for every sequence in it: none of their caches can be
        // trusted now. The others (waiting for their prefill) go on.
        let mut i = 0;
        while i < active.len() {
            if active[i].role == Role::Idle {
                i += 1;
                continue;
            }
            let a = active.remove(i);
            let end = match &end {
                End::Panicked(m) => End::Panicked(m.clone()),
                End::Failed(e, o) => End::Failed(e.clone(), *o),
                End::Finished(r) => End::Finished(*r),
            };
            conclude(shared, pool, a, end);
        }
        shared.publish_kv(pool.usage());
        return steps;
    }

    let mut i = 0;
    while i < active.len() {
        let a = &mut active[i];
        match a.role {
            Role::Idle => {
                i += 1;
                continue;
            }
            Role::Prefill(n) => {
                a.prefilled += n;
                a.seq.record_prefill(took);
                if a.prefilled < a.seq.prompt().len() {
                    a.step_span = Span::none();
                    i += 1;
                    continue;
                }
            }
            Role::Decode => a.seq.record_decode(took),
        }
        if let Err(e) = crate::sampling::check_logits(&a.logits) {
            let a = active.remove(i);
            let err = JobError::Internal(e.to_string());
            conclude(shared, pool, a, End::Failed(err, Outcome::Internal));
            continue;
        }
        let seq_span = std::mem::replace(&mut a.step_span, Span::none());
        let outcome = {
            let _e = seq_span.enter();
            catch_unwind(AssertUnwindSafe(|| sample(shared, a)))
        };
        match outcome {
            Ok(Step::Feed(id)) => {
                a.next = [id];
                a.decoding = true;
                i += 1;
            }
            Ok(Step::Finished(reason)) => {
                let a = active.remove(i);
                conclude(shared, pool, a, End::Finished(reason));
            }
            Err(p) => {
                let a = active.remove(i);
                conclude(shared, pool, a, End::Panicked(panic_message(&p)));
            }
        }
    }
    shared.publish_kv(pool.usage());
    steps
}

type ForwardResult = std::thread::Result<Result<(), crate::model::ModelError>>;

/// Runs the forward pass of one step over the sequences' planned rows.
fn forward(
    model: &Model,
    scratch: &mut Scratch,
    steps: Vec<SeqStep<'static>>,
    active: &mut [Active<'_>],
    step_span: &Span,
) -> (Vec<SeqStep<'static>>, ForwardResult) {
    let mut batch = recycle(steps);
    for a in active.iter_mut() {
        let Active {
            seq,
            kv,
            logits,
            next,
            role,
            prefilled,
            span,
            step_span: seq_span,
            ..
        } = a;
        let (tokens, out) = match *role {
            Role::Idle => continue,
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
                let prompt = seq.prompt();
                let end = *prefilled + n;
                *seq_span = debug_span!(parent: &*span, "prefill", tokens = n, position = kv.len());
                let out = if end == prompt.len() {
                    Logits::Last(&mut logits[..])
                } else {
                    Logits::None
                };
                (&prompt[*prefilled..end], out)
            }
        };
        seq_span.follows_from(step_span);
        batch.push(SeqStep {
            kv,
            tokens,
            logits: out,
        });
    }
    let result = {
        let _e = step_span.enter();
        catch_unwind(AssertUnwindSafe(|| {
            model.forward_batch(&mut batch, scratch)
        }))
    };
    (recycle(batch), result)
}

/// Samples the sequence's next token from its logits and streams it to the client.
fn sample(shared: &Shared, a: &mut Active<'_>) -> Step {
    let obs = shared.observer.as_ref();
    let room = a.kv.room() > 0;
    let Active {
        seq,
        logits,
        job,
        lp_buf,
        started,
        last_token_at,
        stop_cause,
        inject_panic,
        tail,
        ..
    } = a;
    let n_logprobs = job.logprobs.min(MAX_LOGPROBS);
    seq.advance(logits, room, |ev| {
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
        if *inject_panic && ev.index >= 1 {
            panic!("injected engine fault");
        }
        let logprobs = (job.logprobs > 0).then(|| logprobs_of(ev.logits, id, n_logprobs, lp_buf));
        let sent = job.events.send(Event::Token(TokenOut {
            index: ev.index,
            id,
            text: ev.text.to_string(),
            logprobs,
        }));
        if sent.is_err() {
            *stop_cause = Some(StopCause::ClientGone);
        } else if shared.cancel_all.load(Ordering::Relaxed) {
            *stop_cause = Some(StopCause::Shutdown);
        } else if job.deadline.is_some_and(|d| now >= d) {
            *stop_cause = Some(StopCause::Deadline);
        }
        if stop_cause.is_some() {
            Flow::Stop
        } else {
            Flow::Continue
        }
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
        seed: job.options.sampling.seed.unwrap_or(0),
        timings: Timings {
            queue_wait,
            total: started.elapsed(),
            ..Timings::default()
        },
    }
}

/// Ends a request: records it, tells its client, and returns its cache to the pool (kept
/// for prefix reuse only when the generation ended normally).
fn conclude(shared: &Shared, pool: &mut KvPool, a: Active<'_>, end: End) {
    let obs = shared.observer.as_ref();
    let Active {
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
    } = a;
    let _e = span.enter();
    let completion = seq.completion_tokens();
    let cached = seq.cached_prompt_tokens();
    obs.tokens_generated(completion);
    let failed = |err: JobError| {
        vec![
            Event::Done(failed_done(&job, cached, completion, queue_wait, started)),
            Event::Failed(err),
        ]
    };
    // What the cache holds (prompt and generated tokens), when it is worth keeping.
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
    pool.release(kv, history.as_deref());
    // Recorded before the client hears the outcome, so one that saw its stream end sees its
    // cache released too.
    shared.publish_kv(pool.usage());
    obs.finished(outcome);
    for ev in events {
        let _ = job.events.send(ev);
    }
}
