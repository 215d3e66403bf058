//! The engine thread: one OS thread that loads and owns the model, its backend stack and
//! every sequence's KV cache, and serves queued generation requests in batches
//! ([`super::batch`]), streaming each request's tokens back through its own channel.
//!
//! Callers never touch the model. They [`Engine::submit`] a [`Job`] (refused at once when
//! the bounded queue is full) and read [`Event`]s from the job's channel. A request whose
//! receiver is dropped (the client went away) stops within one engine step, and one still
//! queued is dropped before its prefill. A panic while serving fails only the requests it
//! hit; the thread frees their caches and goes on with the others.

use super::batch::{self, Limits};
use super::generate::{FinishReason, GenerateOptions};
use super::kv_pool::KvUsage;
use super::queue::{BoundedQueue, PushError};
use crate::model::{Model, ModelConfig};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{error, info};

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
    /// Positions one sequence may hold (prompt plus completion).
    pub ctx_size: usize,
    /// Prompt tokens per forward call for a single-sequence [`crate::model::State`] (the
    /// engine itself uses [`EngineConfig::prefill_chunk`]).
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
    /// Sequences generated at once.
    pub max_batch: usize,
    /// Most prompt tokens one engine step runs for a waiting prompt.
    pub prefill_chunk: usize,
    /// KV-cache positions shared by all sequences (running and kept for reuse).
    pub kv_cache_tokens: usize,
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
    /// Requests that may wait to be admitted into the batch.
    pub queue_capacity: usize,
    /// Sequences generated at once (each engine step runs one token of each).
    pub max_batch: usize,
    /// Most prompt tokens one engine step runs for a waiting prompt, so a long prompt holds
    /// running streams up by one chunk at a time.
    pub prefill_chunk: usize,
    /// The prefill chunk while other streams are decoding: small, so admitting a long
    /// prompt adds little to their inter-token latency.
    pub prefill_chunk_running: usize,
    /// KV-cache positions shared by all sequences; `None`: `max_batch` full contexts, capped
    /// at [`DEFAULT_KV_CACHE_BYTES`] (but at least one context).
    pub kv_cache_tokens: Option<usize>,
    /// Honour [`FAULT_PANIC_REQUEST_ID`]. Tests only.
    #[doc(hidden)]
    pub fault_injection: bool,
}

/// The default KV budget's cap in bytes.
pub const DEFAULT_KV_CACHE_BYTES: usize = 2 << 30;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 16,
            max_batch: 8,
            prefill_chunk: 256,
            prefill_chunk_running: 8,
            kv_cache_tokens: None,
            fault_injection: false,
        }
    }
}

impl EngineConfig {
    /// The engine's limits for a model with `ctx` positions per sequence and
    /// `bytes_per_token` of KV cache per position.
    pub(crate) fn limits(&self, ctx: usize, bytes_per_token: usize) -> Limits {
        let max_batch = self.max_batch.max(1);
        let default_budget = || {
            let by_memory = DEFAULT_KV_CACHE_BYTES / bytes_per_token.max(1);
            max_batch.saturating_mul(ctx).min(by_memory.max(ctx))
        };
        Limits {
            max_batch,
            prefill_chunk: self.prefill_chunk.max(1),
            prefill_chunk_running: self
                .prefill_chunk_running
                .clamp(1, self.prefill_chunk.max(1)),
            ctx,
            kv_budget: self.kv_cache_tokens.unwrap_or_else(default_budget).max(1),
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
    pub(super) enqueued_at: Instant,
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

    pub(super) fn client_gone(&self) -> bool {
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
    /// Prompt tokens whose KV was reused from an earlier sequence.
    pub cached_prompt_tokens: usize,
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
    /// One engine step: sequences in the forward pass, and its decode and prompt rows.
    fn step(&self, _batch_size: usize, _decode_rows: usize, _prefill_rows: usize) {}
    /// The KV cache's occupancy after a change.
    fn kv_usage(&self, _usage: KvUsage) {}
    /// Prompt tokens a starting request reused from the prefix cache.
    fn prompt_tokens_reused(&self, _n: usize) {}
    /// A request starts running, with this many prompt tokens.
    fn started(&self, _prompt_tokens: usize) {}
    /// A running request ended (every `started` is followed by one `ended`).
    fn ended(&self) {}
}

/// An observer that ignores everything.
pub struct NoObserver;
impl Observer for NoObserver {}

type Loader = Box<dyn FnOnce() -> Result<EngineAssets, String> + Send>;

pub(super) struct Shared {
    pub(super) queue: BoundedQueue<Job>,
    pub(super) cancel_all: AtomicBool,
    /// Some job is being served.
    pub(super) busy: AtomicBool,
    state: watch::Sender<EngineState>,
    config: EngineConfig,
    pub(super) fault_injection: bool,
    pub(super) observer: Arc<dyn Observer>,
    kv_reserved: AtomicUsize,
    kv_cached: AtomicUsize,
    kv_budget: AtomicUsize,
}

impl Shared {
    /// Publishes the KV cache's occupancy to [`Engine::kv_usage`] and the observer.
    pub(super) fn publish_kv(&self, u: KvUsage) {
        self.kv_reserved.store(u.reserved, Ordering::Relaxed);
        self.kv_cached.store(u.cached, Ordering::Relaxed);
        self.kv_budget.store(u.budget, Ordering::Relaxed);
        self.observer.kv_usage(u);
    }
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
            config,
            observer,
            kv_reserved: AtomicUsize::new(0),
            kv_cached: AtomicUsize::new(0),
            kv_budget: AtomicUsize::new(0),
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

    /// Requests waiting now (not counting the running ones).
    pub fn queue_depth(&self) -> usize {
        self.shared.queue.len()
    }

    /// KV-cache positions reserved by running sequences and kept for reuse, of the budget.
    pub fn kv_usage(&self) -> KvUsage {
        KvUsage {
            reserved: self.shared.kv_reserved.load(Ordering::Relaxed),
            cached: self.shared.kv_cached.load(Ordering::Relaxed),
            budget: self.shared.kv_budget.load(Ordering::Relaxed),
        }
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
    let model = &assets.model;
    let ctx = assets.ctx_size.clamp(1, model.config.context_length);
    let limits = shared.config.limits(ctx, model.kv_bytes_per_token());
    let served = Arc::new(Served {
        tokenizer: Arc::clone(&assets.tokenizer),
        chat_template: Arc::clone(&assets.chat_template),
        config: model.config.clone(),
        ctx_size: ctx,
        quantization: model.weights.main_dtype().name().to_string(),
        description: assets.description.clone(),
        max_batch: limits.max_batch,
        prefill_chunk: limits.prefill_chunk,
        kv_cache_tokens: limits.kv_budget,
    });
    shared.state.send_replace(EngineState::Ready(served));
    info!(
        ctx_size = ctx,
        max_batch = limits.max_batch,
        prefill_chunk = limits.prefill_chunk,
        prefill_chunk_running = limits.prefill_chunk_running,
        kv_cache_tokens = limits.kv_budget,
        queue_capacity = shared.queue.capacity(),
        "engine ready"
    );
    batch::run(&shared, &assets, limits);
}

fn fail_all(shared: &Shared, msg: Arc<str>) {
    shared.state.send_replace(EngineState::Failed(msg));
    shared.queue.close();
    for job in shared.queue.drain() {
        let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
    }
}

pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The chosen token's log-probability and the `n` most likely tokens'.
pub(super) fn logprobs_of(logits: &[f32], chosen: u32, n: usize, buf: &mut [f32]) -> Logprobs {
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
