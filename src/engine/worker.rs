//! The engine thread: one OS thread that loads and owns the model, its backend stack and
//! its one sequence state, and runs queued generation requests one at a time, streaming
//! each request's tokens back through its own channel.
//!
//! Callers never touch the model. They [`Engine::submit`] a [`Job`] (refused at once when
//! the bounded queue is full) and read [`Event`]s from the job's channel. A request whose
//! receiver is dropped (the client went away) stops within one decode step, and one still
//! queued is dropped before its prefill. A panic while serving one request fails only that
//! request; the thread resets the sequence and goes on with the next.

use super::generate::{generate, FinishReason, Flow, GenerateError, GenerateOptions};
use super::queue::{BoundedQueue, PushError};
use crate::model::{Model, ModelConfig, State};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, info_span, warn};

/// Most alternatives a request may ask for per token.
pub const MAX_LOGPROBS: usize = 20;

/// A request id that, with [`EngineConfig::fault_injection`] on, makes the engine panic
/// after the request's first token. Only tests turn fault injection on.
#[doc(hidden)]
pub const FAULT_PANIC_REQUEST_ID: &str = "__inferno_fault_panic__";

/// Everything the engine thread needs, produced by the loader on that thread.
pub struct EngineAssets {
    pub model: Model,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    /// Positions of the one sequence state (prompt plus completion).
    pub ctx_size: usize,
    /// Prompt tokens processed per forward call during prefill.
    pub max_batch: usize,
    pub description: ModelDescription,
}

/// How the served model is described to clients.
#[derive(Clone, Debug, Default)]
pub struct ModelDescription {
    pub name: String,
    pub backend: String,
    pub threads: usize,
    pub demo: bool,
}

/// What the request handlers may use once the model is loaded: the tokenizer side and the
/// model's hyper-parameters, never the model itself.
pub struct Served {
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    pub config: ModelConfig,
    pub ctx_size: usize,
    pub quantization: String,
    pub description: ModelDescription,
}

/// The engine's life cycle as the handlers see it.
#[derive(Clone)]
pub enum EngineState {
    Loading,
    Ready(Arc<Served>),
    Failed(Arc<str>),
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Requests that may wait behind the running one.
    pub queue_capacity: usize,
    /// Honour [`FAULT_PANIC_REQUEST_ID`]. Tests only.
    #[doc(hidden)]
    pub fault_injection: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 16,
            fault_injection: false,
        }
    }
}

/// One generation request.
pub struct Job {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    /// Alternatives to report per token (0 = no logprobs).
    pub logprobs: usize,
    /// The client's deadline: past it the request ends with [`JobError::DeadlineExceeded`].
    pub deadline: Option<Instant>,
    /// Where the engine sends this request's events.
    pub events: mpsc::UnboundedSender<Event>,
    enqueued_at: Instant,
}

impl Job {
    pub fn new(
        request_id: String,
        prompt: Vec<u32>,
        options: GenerateOptions,
        events: mpsc::UnboundedSender<Event>,
    ) -> Self {
        Self {
            request_id,
            prompt,
            options,
            logprobs: 0,
            deadline: None,
            events,
            enqueued_at: Instant::now(),
        }
    }

    fn client_gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// A token's log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub chosen: TokenLogprob,
    /// Most likely first.
    pub top: Vec<TokenLogprob>,
}

/// One generated token.
#[derive(Clone, Debug)]
pub struct TokenOut {
    pub index: usize,
    pub id: u32,
    /// Text that became final with this token (valid UTF-8, possibly empty).
    pub text: String,
    pub logprobs: Option<Logprobs>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    pub queue_wait: Duration,
    pub time_to_first_token: Duration,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub total: Duration,
}

/// How a generation ended.
#[derive(Clone, Debug)]
pub struct Done {
    /// `None` when the engine failed (a [`Event::Failed`] follows).
    pub finish_reason: Option<FinishReason>,
    /// Text released only at the end.
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub seed: u64,
    pub timings: Timings,
}

/// Why a request failed after it was queued.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum JobError {
    #[error("the request's deadline passed")]
    DeadlineExceeded,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the engine failed: {0}")]
    Internal(String),
}

/// What the engine sends back for a job: tokens, then `Done`, then `Failed` when the
/// generation did not end normally. A job that fails before it starts gets only `Failed`.
#[derive(Clone, Debug)]
pub enum Event {
    Token(TokenOut),
    Done(Done),
    Failed(JobError),
}

/// Why [`Engine::submit`] refused a job.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full (capacity {capacity}); retry later")]
    QueueFull { capacity: usize },
    #[error("the model is still loading")]
    Loading,
    #[error("the model failed to load: {0}")]
    LoadFailed(Arc<str>),
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// How a request ended, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The client went away (before or during the generation).
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    /// Cancelled by the server's shutdown.
    Unavailable,
    Internal,
}

impl Outcome {
    /// The gRPC status code name this outcome is reported as.
    pub fn code_name(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Cancelled => "CANCELLED",
            Outcome::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Outcome::InvalidArgument => "INVALID_ARGUMENT",
            Outcome::Unavailable => "UNAVAILABLE",
            Outcome::Internal => "INTERNAL",
        }
    }
}

/// Receives the engine's measurements (the service's metrics implement it).
pub trait Observer: Send + Sync {
    fn queue_wait(&self, _wait: Duration) {}
    fn time_to_first_token(&self, _ttft: Duration) {}
    /// Time between two consecutive tokens of one request (a decode step and its sampling).
    fn decode_step(&self, _step: Duration) {}
    fn tokens_generated(&self, _n: usize) {}
    fn finished(&self, _outcome: Outcome) {}
}

/// An observer that ignores everything.
pub struct NoObserver;
impl Observer for NoObserver {}

type Loader = Box<dyn FnOnce() -> Result<EngineAssets, String> + Send>;

struct Shared {
    queue: BoundedQueue<Job>,
    cancel_all: AtomicBool,
    /// A job is being served.
    busy: AtomicBool,
    state: watch::Sender<EngineState>,
    fault_injection: bool,
    observer: Arc<dyn Observer>,
}

/// A handle to the engine thread.
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread, which first runs `loader` (so the model and its backend
    /// are created on, and stay on, that thread), then serves jobs.
    pub fn start(
        config: EngineConfig,
        loader: impl FnOnce() -> Result<EngineAssets, String> + Send + 'static,
        observer: Arc<dyn Observer>,
    ) -> std::io::Result<Self> {
        let (state, _) = watch::channel(EngineState::Loading);
        let shared = Arc::new(Shared {
            queue: BoundedQueue::new(config.queue_capacity.max(1)),
            cancel_all: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            state,
            fault_injection: config.fault_injection,
            observer,
        });
        let thread_shared = Arc::clone(&shared);
        let loader: Loader = Box::new(loader);
        let thread = std::thread::Builder::new()
            .name("inferno-engine".into())
            .spawn(move || engine_main(thread_shared, loader))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Follows the engine's state (loading, ready, failed).
    pub fn subscribe(&self) -> watch::Receiver<EngineState> {
        self.shared.state.subscribe()
    }

    pub fn state(&self) -> EngineState {
        self.shared.state.borrow().clone()
    }

    pub fn queue_capacity(&self) -> usize {
        self.shared.queue.capacity()
    }

    /// Requests waiting now (not counting the running one).
    pub fn queue_depth(&self) -> usize {
        self.shared.queue.len()
    }

    /// No job is running and none is queued.
    pub fn is_idle(&self) -> bool {
        !self.shared.busy.load(Ordering::SeqCst) && self.shared.queue.is_empty()
    }

    /// Whether a job submitted now would be refused for lack of room: a cheap check before
    /// the work of preparing one. [`submit`](Self::submit) still decides.
    pub fn queue_full(&self) -> bool {
        self.shared.queue.is_full(|j| self.shed_if_gone(j))
    }

    /// Queues a job, or refuses it at once.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        match &*self.shared.state.borrow() {
            EngineState::Loading => return Err(SubmitError::Loading),
            EngineState::Failed(e) => return Err(SubmitError::LoadFailed(Arc::clone(e))),
            EngineState::Ready(_) => {}
        }
        // A full queue first sheds requests whose clients have gone.
        match self.shared.queue.try_push(job, |j| self.shed_if_gone(j)) {
            Ok(()) => Ok(()),
            Err(PushError::Full { capacity, .. }) => Err(SubmitError::QueueFull { capacity }),
            Err(PushError::Closed(_)) => Err(SubmitError::ShuttingDown),
        }
    }

    /// Whether a queued job's client has gone; such a job is counted as cancelled, since
    /// the queue is about to drop it.
    fn shed_if_gone(&self, job: &Job) -> bool {
        let gone = job.client_gone();
        if gone {
            self.shared.observer.finished(Outcome::Cancelled);
        }
        gone
    }

    /// Stops accepting jobs; queued and running ones still complete.
    pub fn close(&self) {
        self.shared.queue.close();
    }

    pub fn is_closed(&self) -> bool {
        self.shared.queue.is_closed()
    }

    /// Ends the running job and every queued one with [`JobError::ShuttingDown`].
    pub fn cancel_all(&self) {
        self.shared.cancel_all.store(true, Ordering::SeqCst);
        self.close();
    }

    /// Closes the queue and waits for the engine thread to finish what it has.
    pub fn join(&self) {
        self.close();
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.cancel_all();
        self.join();
    }
}

fn engine_main(shared: Arc<Shared>, loader: Loader) {
    let assets = match catch_unwind(AssertUnwindSafe(loader)) {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            error!(error = %e, "cannot load the model");
            fail_all(&shared, e.into());
            return;
        }
        Err(p) => {
            let msg = format!("the model loader panicked: {}", panic_message(&p));
            error!("{msg}");
            fail_all(&shared, msg.into());
            return;
        }
    };
    let mut state = assets
        .model
        .new_state(assets.ctx_size, assets.max_batch.max(1));
    let served = Arc::new(Served {
        tokenizer: Arc::clone(&assets.tokenizer),
        chat_template: Arc::clone(&assets.chat_template),
        config: assets.model.config.clone(),
        ctx_size: state.capacity(),
        quantization: assets.model.weights.main_dtype().name().to_string(),
        description: assets.description.clone(),
    });
    shared.state.send_replace(EngineState::Ready(served));
    info!(
        ctx_size = state.capacity(),
        queue_capacity = shared.queue.capacity(),
        "engine ready"
    );
    while let Some(job) = shared.queue.pop() {
        shared.busy.store(true, Ordering::SeqCst);
        serve_job(&shared, &assets, &mut state, job);
        shared.busy.store(false, Ordering::SeqCst);
    }
}

fn fail_all(shared: &Shared, msg: Arc<str>) {
    shared.state.send_replace(EngineState::Failed(msg));
    shared.queue.close();
    for job in shared.queue.drain() {
        let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Why the token callback asked the generation to stop.
#[derive(Clone, Copy, PartialEq)]
enum StopCause {
    ClientGone,
    Deadline,
    Shutdown,
}

fn serve_job(shared: &Shared, assets: &EngineAssets, state: &mut State, job: Job) {
    let obs = shared.observer.as_ref();
    if job.client_gone() {
        info!(request_id = %job.request_id, "client gone while queued; dropped before prefill");
        obs.finished(Outcome::Cancelled);
        return;
    }
    // Metrics are recorded before the client hears the outcome, so a client that has seen
    // its stream end also sees it counted.
    if shared.cancel_all.load(Ordering::SeqCst) {
        obs.finished(Outcome::Unavailable);
        let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
        return;
    }
    if job.deadline.is_some_and(|d| Instant::now() >= d) {
        obs.finished(Outcome::DeadlineExceeded);
        let _ = job.events.send(Event::Failed(JobError::DeadlineExceeded));
        return;
    }
    let queue_wait = job.enqueued_at.elapsed();
    obs.queue_wait(queue_wait);
    let span = info_span!(
        "request",
        request_id = %job.request_id,
        prompt_tokens = job.prompt.len()
    );
    let _entered = span.enter();

    let started = Instant::now();
    let mut last_token_at: Option<Instant> = None;
    let mut completion_tokens = 0usize;
    let mut tail = String::new();
    let mut stop_cause = None;
    let mut lp_buf = if job.logprobs > 0 {
        vec![0.0f32; assets.model.config.vocab]
    } else {
        Vec::new()
    };
    let n_logprobs = job.logprobs.min(MAX_LOGPROBS);
    let inject_panic = shared.fault_injection && job.request_id == FAULT_PANIC_REQUEST_ID;

    let result = catch_unwind(AssertUnwindSafe(|| {
        generate(
            &assets.model,
            &assets.tokenizer,
            state,
            &job.prompt,
            &job.options,
            |ev| {
                let Some(id) = ev.id else {
                    // The final flush: text held back until the end.
                    tail.push_str(ev.text);
                    return Flow::Continue;
                };
                let now = Instant::now();
                match last_token_at {
                    None => obs.time_to_first_token(now - started),
                    Some(prev) => obs.decode_step(now - prev),
                }
                last_token_at = Some(now);
                completion_tokens += 1;
                if inject_panic && ev.index >= 1 {
                    panic!("injected engine fault");
                }
                let logprobs =
                    (job.logprobs > 0).then(|| logprobs_of(ev.logits, id, n_logprobs, &mut lp_buf));
                let sent = job.events.send(Event::Token(TokenOut {
                    index: ev.index,
                    id,
                    text: ev.text.to_string(),
                    logprobs,
                }));
                if sent.is_err() {
                    stop_cause = Some(StopCause::ClientGone);
                } else if shared.cancel_all.load(Ordering::Relaxed) {
                    stop_cause = Some(StopCause::Shutdown);
                } else if job.deadline.is_some_and(|d| now >= d) {
                    stop_cause = Some(StopCause::Deadline);
                }
                if stop_cause.is_some() {
                    Flow::Stop
                } else {
                    Flow::Continue
                }
            },
        )
    }));
    obs.tokens_generated(completion_tokens);

    let failed_done = |completion_tokens| Done {
        finish_reason: None,
        text: String::new(),
        prompt_tokens: job.prompt.len(),
        completion_tokens,
        seed: job.options.sampling.seed.unwrap_or(0),
        timings: Timings {
            queue_wait,
            total: started.elapsed(),
            ..Timings::default()
        },
    };
    let (events, outcome): (Vec<Event>, Outcome) = match result {
        Err(p) => {
            let msg = panic_message(&p);
            error!(panic = %msg, "the engine panicked while serving a request");
            // The sequence may have been left mid-step; start the next one clean.
            state.reset();
            (
                vec![
                    Event::Done(failed_done(completion_tokens)),
                    Event::Failed(JobError::Internal(format!("panic: {msg}"))),
                ],
                Outcome::Internal,
            )
        }
        Ok(Err(e)) => {
            let (err, outcome) = match e {
                GenerateError::EmptyPrompt
                | GenerateError::PromptTooLong { .. }
                | GenerateError::Sampling(_) => (
                    JobError::InvalidArgument(e.to_string()),
                    Outcome::InvalidArgument,
                ),
                GenerateError::Model(m) => (JobError::Internal(m.to_string()), Outcome::Internal),
            };
            warn!(error = %err, "generation failed");
            (
                vec![
                    Event::Done(failed_done(completion_tokens)),
                    Event::Failed(err),
                ],
                outcome,
            )
        }
        Ok(Ok(g)) => {
            let m = &g.metrics;
            let done = Done {
                finish_reason: Some(g.finish_reason),
                text: tail,
                prompt_tokens: m.prompt_tokens,
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
    obs.finished(outcome);
    for ev in events {
        let _ = job.events.send(ev);
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
