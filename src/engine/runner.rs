//! The engine thread's loop: continuous batching.
//!
//! Up to `max_seqs` sequences run at once. Between steps the loop admits queued jobs and
//! stops sequences as the [`scheduler`](super::scheduler) decides (a sequence whose client
//! left, whose deadline passed, or every one at shutdown stops within one step and its
//! cache is freed at once), then runs the step it plans: one forward pass over one new token
//! of every generating sequence plus a chunk of the waiting prompts, and sampling for each
//! sequence that got logits ([`Running`]). A panic in the forward pass fails the sequences
//! in it; one in sampling only its own.
//!
//! Tracing: each step is an `engine_step` span (batch size, decode rows, prefill rows) that
//! holds the backend's kernel spans. Each request is a `request` span holding, per step it
//! took part in, a `prefill` span (tokens, position) or a `decode_step` span (step,
//! position), which follow from that step's `engine_step`.

use super::generate::{FinishReason, Step};
use super::job::{Event, JobError, Outcome};
use super::kv_pool::KvPool;
use super::limits::Limits;
use super::loader::EngineAssets;
use super::running::{End, Running};
use super::scheduler::{self, Role, Verdict};
use super::shared::Shared;
use crate::model::{Model, Scratch, SeqStep};
use crate::sampling::constraint::MaskWorker;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;
use tracing::{debug_span, info, warn, Span};

/// Serves jobs until the queue is closed and every sequence has ended.
pub(super) fn run(shared: &Shared, assets: &EngineAssets, limits: Limits) {
    let model = &assets.model;
    let mut scratch = model.new_scratch(limits.step_rows(), limits.max_seqs);
    let mut pool = KvPool::new(limits.kv_budget);
    // Computes constrained sequences' next masks while the forward pass runs; without it
    // (the thread could not start) they are computed in line.
    let masks = match MaskWorker::start(limits.max_seqs) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(error = %e, "cannot start the grammar mask thread; masks are computed in line");
            None
        }
    };
    let mut active: Vec<Running<'_>> = Vec::with_capacity(limits.max_seqs);
    let mut steps: Vec<SeqStep<'static>> = Vec::with_capacity(limits.max_seqs);
    shared.publish_kv(pool.usage());
    loop {
        if active.is_empty() {
            shared.set_busy(false);
            if !shared.queue().wait_nonempty() {
                break;
            }
            shared.set_busy(true);
        }
        admit(
            shared,
            assets,
            &limits,
            &mut pool,
            masks.as_ref(),
            &mut active,
        );
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
    shared.set_busy(false);
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
    masks: Option<&MaskWorker>,
    active: &mut Vec<Running<'t>>,
) {
    let obs = shared.observer();
    while active.len() < limits.max_seqs {
        let mut verdict = Verdict::Wait;
        let job = shared.queue().pop_if(|job| {
            verdict = scheduler::admission(job, shared.cancelling(), Instant::now(), pool, limits);
            verdict != Verdict::Wait
        });
        let Some(job) = job else { break };
        // Metrics are recorded before the client hears the outcome, so a client that has
        // seen its stream end also sees it counted.
        match verdict {
            Verdict::Gone => {
                info!(request_id = %job.request_id, "client gone while queued; dropped before prefill");
                obs.finished(Outcome::Cancelled, job.protocol);
            }
            Verdict::Shutdown => {
                obs.finished(Outcome::Unavailable, job.protocol);
                let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
            }
            Verdict::Expired => {
                obs.finished(Outcome::DeadlineExceeded, job.protocol);
                let _ = job.events.send(Event::Failed(JobError::DeadlineExceeded));
            }
            Verdict::Never => {
                let msg = format!(
                    "the prompt ({} tokens) plus max_tokens ({}) needs {} KV-cache positions \
                     but the server's KV cache holds {} (--kv-cache-tokens)",
                    job.prompt.len(),
                    job.options.max_tokens,
                    limits.reservation(job.prompt.len(), job.options.max_tokens),
                    limits.kv_budget
                );
                warn!(request_id = %job.request_id, "{msg}");
                obs.finished(Outcome::InvalidArgument, job.protocol);
                let _ = job
                    .events
                    .send(Event::Failed(JobError::InvalidArgument(msg)));
            }
            Verdict::Wait | Verdict::Start => {
                if let Some(r) = Running::start(shared, assets, limits, pool, masks, job) {
                    active.push(r);
                }
            }
        }
    }
    shared.publish_kv(pool.usage());
}

/// Ends the sequences whose client left, whose deadline passed, or all of them when the
/// server is cancelling everything.
fn reap(shared: &Shared, pool: &mut KvPool, active: &mut Vec<Running<'_>>) {
    let shutdown = shared.cancelling();
    let now = Instant::now();
    let mut i = 0;
    while i < active.len() {
        if active[i].must_stop(shutdown, now) {
            let r = active.remove(i);
            conclude(shared, pool, r, End::Finished(FinishReason::Cancelled));
        } else {
            i += 1;
        }
    }
    shared.publish_kv(pool.usage());
}

/// One forward pass over every running sequence as planned, then sampling for each that
/// got logits. `steps` is an empty list whose allocation is reused; it comes back empty.
fn step(
    shared: &Shared,
    model: &Model,
    limits: &Limits,
    scratch: &mut Scratch,
    steps: Vec<SeqStep<'static>>,
    pool: &mut KvPool,
    active: &mut Vec<Running<'_>>,
) -> Vec<SeqStep<'static>> {
    let plan = scheduler::plan(limits, &mut active[..], Running::slot);
    let step_span = debug_span!(
        "engine_step",
        batch_size = plan.seqs,
        decode_rows = plan.decode_rows,
        prefill_rows = plan.prefill_rows
    );
    shared
        .observer()
        .step(plan.seqs, plan.decode_rows, plan.prefill_rows);
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
            if active[i].role() == Role::Idle {
                i += 1;
                continue;
            }
            let r = active.remove(i);
            conclude(shared, pool, r, end.clone());
        }
        shared.publish_kv(pool.usage());
        return steps;
    }

    let mut i = 0;
    while i < active.len() {
        let r = &mut active[i];
        if !r.ran(took) {
            i += 1;
            continue;
        }
        if let Err(e) = r.check_logits() {
            let r = active.remove(i);
            let err = JobError::Internal(e.to_string());
            conclude(shared, pool, r, End::Failed(err, Outcome::Internal));
            continue;
        }
        let seq_span = r.take_step_span();
        let outcome = {
            let _e = seq_span.enter();
            catch_unwind(AssertUnwindSafe(|| r.sample(shared)))
        };
        match outcome {
            Ok(Step::Feed(id)) => {
                r.feed(id);
                i += 1;
            }
            Ok(Step::Finished(reason)) => {
                let r = active.remove(i);
                conclude(shared, pool, r, End::Finished(reason));
            }
            Err(p) => {
                let r = active.remove(i);
                conclude(shared, pool, r, End::Panicked(panic_message(&p)));
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
    active: &mut [Running<'_>],
    step_span: &Span,
) -> (Vec<SeqStep<'static>>, ForwardResult) {
    let mut batch = recycle(steps);
    batch.extend(active.iter_mut().filter_map(|r| r.rows(step_span)));
    let result = {
        let _e = step_span.enter();
        catch_unwind(AssertUnwindSafe(|| {
            model.forward_batch(&mut batch, scratch)
        }))
    };
    (recycle(batch), result)
}

/// Ends a request: records it, tells its client, and returns its cache to the pool.
fn conclude(shared: &Shared, pool: &mut KvPool, r: Running<'_>, end: End) {
    let obs = shared.observer();
    let ending = r.finish(obs, end);
    pool.release(ending.kv, ending.history.as_deref());
    // Recorded before the client hears the outcome, so one that saw its stream end sees its
    // cache released too.
    shared.publish_kv(pool.usage());
    obs.finished(ending.outcome, ending.job.protocol);
    for ev in ending.events {
        let _ = ending.job.events.send(ev);
    }
}

/// The text of a caught panic.
pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
