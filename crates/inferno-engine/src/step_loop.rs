//! The engine thread's step loop: continuous batching.
//!
//! Up to `max_seqs` sequences run at once. Between steps the loop admits queued jobs and
//! stops sequences as the [`scheduler`](super::scheduler) decides (a sequence whose client
//! left, whose deadline passed, or every one at shutdown stops within one step and its
//! cache is freed at once), then runs the step it plans: one forward pass over one new token
//! of every generating sequence plus a chunk of the waiting prompts, and sampling for each
//! sequence that got logits ([`Running`]). A panic in the forward pass fails the sequences
//! in it; one in sampling only its own.
//!
//! With speculative decoding on, each decoding sequence may add draft tokens to its row
//! ([`draft`]): its proposer offers them, the step's draft rows are shared out by expected
//! yield against what the longer step costs all its sequences ([`share_rows`]), a draft
//! model drafts the rows its sequences won in batched passes of its own, and sampling then
//! verifies them ([`Running::sample`]).
//!
//! Tracing: each step is an `engine_step` span (batch size, decode rows, draft rows, prefill
//! rows) that holds the backend's kernel spans. Each request is a `request` span holding,
//! per step it took part in, a `prefill` span (tokens, position) or a `decode_step` span
//! (step, position, drafts), which follow from that step's `engine_step`, and a `verify`
//! span for a step that verified drafts.

use super::active::{End, Running};
use super::generate::{FinishReason, Step};
use super::job::{Event, JobError, Outcome};
use super::kv_pool::KvPool;
use super::limits::Limits;
use super::loader::EngineAssets;
use super::scheduler::{self, Role, StepClock, StepPlan, StepTimes, Verdict};
use super::shared::Shared;
use super::speculative::draft::{self, DraftModel};
use super::speculative::{share_rows, DraftCost, Method, Speculation, StepCost};
use inferno_backend::exec::recycle;
use inferno_model::{Model, Scratch, SeqStep};
use inferno_sampling::constraint::MaskWorker;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;
use tracing::{debug_span, info, warn, Span};

/// Serves jobs until the queue is closed and every sequence has ended.
pub(super) fn run(shared: &Shared, assets: &EngineAssets, limits: Limits, spec: &Speculation) {
    let model = &assets.model;
    let mut scratch = model.new_scratch(limits.step_rows(), limits.logit_rows());
    let mut drafting = Drafting::new(spec, assets.draft.as_ref(), &limits);
    // What steps cost here, every step's rows counted: sizes the prompt rows of steps
    // with streams decoding, and estimates when a queued prompt gets its first token.
    let mut times = StepClock::new();
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
            times.times(),
            &mut pool,
            masks.as_ref(),
            spec,
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
            &mut drafting,
            &mut times,
        );
    }
    shared.set_busy(false);
}

/// When a queued prompt of `prompt` tokens would get its first token: after the prompts
/// running that are shorter (they go first), in steps sized as [`scheduler::plan`] sizes them.
fn first_token_eta(
    limits: &Limits,
    times: Option<StepTimes>,
    active: &[Running<'_>],
    prompt: usize,
) -> Option<std::time::Duration> {
    let times = times?;
    let decode_rows = active.iter().filter(|r| r.prompt_remaining() == 0).count();
    let ahead: usize = active
        .iter()
        .map(Running::prompt_remaining)
        .filter(|&n| n <= prompt)
        .sum();
    Some(scheduler::first_token_eta(
        limits,
        times,
        decode_rows,
        ahead,
        prompt,
    ))
}

/// Starts queued jobs, oldest first, while there are free slots and they fit the budget.
#[allow(clippy::too_many_arguments)]
fn admit<'t>(
    shared: &Shared,
    assets: &'t EngineAssets,
    limits: &Limits,
    times: Option<StepTimes>,
    pool: &mut KvPool,
    masks: Option<&MaskWorker>,
    spec: &Speculation,
    active: &mut Vec<Running<'t>>,
) {
    let obs = shared.observer();
    while active.len() < limits.max_seqs {
        let mut verdict = Verdict::Wait;
        let job = shared.queue().pop_if(|job| {
            let eta = job
                .deadline
                .and_then(|_| first_token_eta(limits, times, active, job.prompt.len()));
            verdict =
                scheduler::admission(job, shared.cancelling(), Instant::now(), pool, limits, eta);
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
            Verdict::TooLate => {
                info!(
                    request_id = %job.request_id,
                    prompt_tokens = job.prompt.len(),
                    "refused: its first token would come after its deadline"
                );
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
                if let Some(r) = Running::start(shared, assets, limits, pool, masks, spec, job) {
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

/// One forward pass over every running sequence as planned (with their drafts), then
/// sampling for each that got logits. `steps` is an empty list whose allocation is reused;
/// it comes back empty.
#[allow(clippy::too_many_arguments)]
fn step(
    shared: &Shared,
    model: &Model,
    limits: &Limits,
    scratch: &mut Scratch,
    steps: Vec<SeqStep<'static>>,
    pool: &mut KvPool,
    active: &mut Vec<Running<'_>>,
    drafting: &mut Drafting<'_>,
    times: &mut StepClock,
) -> Vec<SeqStep<'static>> {
    // One reading of the measured costs sizes both the prompt rows and the drafts' share.
    let now = times.times();
    let plan = scheduler::plan(limits, now, &mut active[..], Running::slot);
    let mut rows = scratch.rows();
    if plan.prefill_rows > 0 {
        if let Some(budget) = scheduler::row_budget(limits, now) {
            rows = rows.min(budget.max(plan.decode_rows + plan.prefill_rows));
        }
    }
    let draft_rows = draft(drafting, &plan, rows, active);
    let step_span = debug_span!(
        "engine_step",
        batch_size = plan.seqs,
        decode_rows = plan.decode_rows,
        draft_rows,
        prefill_rows = plan.prefill_rows
    );
    shared
        .observer()
        .step(plan.seqs, plan.decode_rows, plan.prefill_rows);
    let t = Instant::now();
    let (steps, result) = forward(model, scratch, steps, active, &step_span);
    let took = t.elapsed();
    times.observe(
        plan.decode_rows + draft_rows + plan.prefill_rows,
        took.as_secs_f64(),
    );
    if plan.prefill_rows == 0 {
        drafting
            .cost
            .observe(plan.decode_rows + draft_rows, took.as_secs_f64());
    }
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
        let seq_span = r.take_step_span();
        let outcome = {
            let _e = seq_span.enter();
            catch_unwind(AssertUnwindSafe(|| r.sample(shared)))
        };
        match outcome {
            Ok(Ok(Step::Feed(id))) => {
                r.feed(id);
                i += 1;
            }
            Ok(Ok(Step::Finished(reason))) => {
                let r = active.remove(i);
                conclude(shared, pool, r, End::Finished(reason));
            }
            Ok(Err(e)) => {
                // Non-finite logits (corrupt weights) or a failure of the grammar engine:
                // not the client's doing.
                let r = active.remove(i);
                let err = JobError::Internal(e.to_string());
                conclude(shared, pool, r, End::Failed(err, Outcome::Internal));
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

/// What the engine keeps for speculative decoding: how steps cost, and the draft model
/// with its buffers.
struct Drafting<'t> {
    spec: Speculation,
    on: bool,
    cost: StepCost,
    draft_cost: DraftCost,
    draft: Option<(&'t DraftModel, Scratch)>,
    steps: Vec<SeqStep<'static>>,
    jobs: Vec<draft::DraftJob<'static>>,
}

impl<'t> Drafting<'t> {
    fn new(spec: &Speculation, draft: Option<&'t DraftModel>, limits: &Limits) -> Self {
        let draft = match (spec.method, draft) {
            (Method::Draft, Some(d)) => Some((d, d.new_scratch(limits.step_rows(), 0))),
            _ => None,
        };
        Self {
            spec: spec.clone(),
            on: spec.is_on(),
            cost: StepCost::new(),
            draft_cost: DraftCost::default(),
            draft,
            steps: Vec::with_capacity(limits.max_seqs),
            jobs: Vec::with_capacity(limits.max_seqs),
        }
    }
}

/// Gives the decoding sequences of the planned step their drafts: each proposes and bids,
/// the draft rows (at most `rows` in the step in all) go where they are expected to pay,
/// and a draft model drafts what its sequences won (catching their draft caches up, and
/// keeping pace with the prompts being prefilled). Returns the step's draft rows.
fn draft(
    drafting: &mut Drafting<'_>,
    plan: &StepPlan,
    rows: usize,
    active: &mut [Running<'_>],
) -> usize {
    if !drafting.on {
        return 0;
    }
    for r in active.iter_mut() {
        r.prepare_drafts();
    }
    let used = plan.decode_rows + plan.prefill_rows;
    share_rows(
        active,
        Running::bid,
        plan.seqs,
        used,
        drafting
            .spec
            .costs_now(&drafting.cost, &drafting.draft_cost),
        rows.saturating_sub(used),
    );
    if let Some((model, scratch)) = &mut drafting.draft {
        if active.iter().any(Running::needs_draft_pass) {
            let mut budget = scratch.rows();
            let mut jobs = draft::recycle_jobs(std::mem::take(&mut drafting.jobs));
            jobs.extend(active.iter_mut().filter_map(|r| r.draft_job(&mut budget)));
            let passes = jobs.iter().map(|j| j.want).max().unwrap_or(0);
            let t = Instant::now();
            let steps = std::mem::take(&mut drafting.steps);
            let ran = catch_unwind(AssertUnwindSafe(|| {
                draft::draft_step(model, scratch, steps, &mut jobs)
            }));
            match ran {
                Ok((steps, Ok(()))) => {
                    drafting.steps = steps;
                    drafting
                        .draft_cost
                        .observe(passes, t.elapsed().as_secs_f64());
                }
                Ok((steps, Err(e))) => {
                    drafting.steps = steps;
                    warn!(error = %e, "a draft-model pass failed; its sequences draft no more");
                }
                Err(p) => {
                    warn!(panic = %panic_message(&p), "a draft-model pass panicked; its sequences draft no more");
                    for j in jobs.iter_mut() {
                        j.cache.break_off();
                    }
                }
            }
            drafting.jobs = draft::recycle_jobs(jobs);
        }
    }
    active.iter_mut().map(|r| r.take_drafts()).sum()
}

type ForwardResult = std::thread::Result<Result<(), inferno_model::ModelError>>;

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
