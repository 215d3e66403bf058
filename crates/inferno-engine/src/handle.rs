//! The engine thread: one OS thread that loads and owns the model, its backend stack and
//! every sequence's KV cache, and serves queued generation requests in batches
//! (the step loop), streaming each request's tokens back through its own channel.
//!
//! Callers never touch the model. They [`Engine::submit`] a [`Job`] (refused at once when
//! the bounded queue is full) and read [`Event`]s from the job's channel. A
//! request whose receiver is dropped (the client went away) stops within one engine step,
//! and one still queued is dropped before its prefill. A panic while serving fails only the
//! requests it hit; the thread frees their caches and goes on with the others.

use super::job::{Event, Job, JobError, Outcome};
use super::kv_pool::KvUsage;
use super::limits::{EngineConfig, Limits};
use super::loader::EngineAssets;
use super::memory::gib;
use super::observer::Observer;
use super::queue::PushError;
use super::request::{EngineState, Served};
use super::shared::Shared;
use super::speculative::{Method, SpecInfo};
use super::step_loop::{self, panic_message};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::watch;
use tracing::{error, info};

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

type Loader = Box<dyn FnOnce() -> Result<EngineAssets, String> + Send>;

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
        let shared = Arc::new(Shared::new(
            config.queue_capacity,
            observer,
            #[cfg(feature = "fault-injection")]
            config.fault_injection,
        ));
        let thread_shared = Arc::clone(&shared);
        let loader: Loader = Box::new(loader);
        let thread = std::thread::Builder::new()
            .name("inferno-engine".into())
            .spawn(move || engine_main(thread_shared, config, loader))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Follows the engine's state (loading, ready, failed).
    pub fn subscribe(&self) -> watch::Receiver<EngineState> {
        self.shared.state().subscribe()
    }

    pub fn state(&self) -> EngineState {
        self.shared.state().borrow().clone()
    }

    pub fn queue_capacity(&self) -> usize {
        self.shared.queue().capacity()
    }

    /// Requests waiting now (not counting the running ones).
    pub fn queue_depth(&self) -> usize {
        self.shared.queue().len()
    }

    /// KV-cache positions reserved by running sequences and kept for reuse, of the budget.
    pub fn kv_usage(&self) -> KvUsage {
        self.shared.kv_usage()
    }

    /// No job is running and none is queued.
    pub fn is_idle(&self) -> bool {
        !self.shared.is_busy() && self.shared.queue().is_empty()
    }

    /// Whether a job submitted now would be refused for lack of room: a cheap check before
    /// the work of preparing one. [`submit`](Self::submit) still decides.
    pub fn queue_full(&self) -> bool {
        self.shared.queue().is_full(|j| self.shed_if_gone(j))
    }

    /// Queues a job, or refuses it at once.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        match &*self.shared.state().borrow() {
            EngineState::Loading => return Err(SubmitError::Loading),
            EngineState::Failed(e) => return Err(SubmitError::LoadFailed(Arc::clone(e))),
            EngineState::Ready(_) => {}
        }
        // A full queue first sheds requests whose clients have gone.
        match self.shared.queue().try_push(job, |j| self.shed_if_gone(j)) {
            Ok(()) => Ok(()),
            Err(PushError::Full { capacity, .. }) => Err(SubmitError::QueueFull { capacity }),
            Err(PushError::Closed(_)) => Err(SubmitError::ShuttingDown),
        }
    }

    /// Queues several jobs together, adjacent in the queue so that they are admitted into
    /// the same batch when there is room (a request's `n` choices), or refuses them all.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        match &*self.shared.state().borrow() {
            EngineState::Loading => return Err(SubmitError::Loading),
            EngineState::Failed(e) => return Err(SubmitError::LoadFailed(Arc::clone(e))),
            EngineState::Ready(_) => {}
        }
        match self
            .shared
            .queue()
            .try_push_all(jobs, |j| self.shed_if_gone(j))
        {
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
            self.shared
                .observer()
                .finished(Outcome::Cancelled, job.protocol);
        }
        gone
    }

    /// Stops accepting jobs; queued and running ones still complete.
    pub fn close(&self) {
        self.shared.queue().close();
    }

    pub fn is_closed(&self) -> bool {
        self.shared.queue().is_closed()
    }

    /// Ends the running job and every queued one with [`JobError::ShuttingDown`].
    pub fn cancel_all(&self) {
        self.shared.cancel_all();
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

fn engine_main(shared: Arc<Shared>, config: EngineConfig, loader: Loader) {
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
    let kv = assets.kv;
    let spec = &config.speculation;
    if spec.method == Method::Draft && assets.draft.is_none() {
        let msg = "speculative decoding with a draft model needs one (--draft-model)";
        error!("{msg}");
        fail_all(&shared, msg.into());
        return;
    }
    // A sequence's draft cache takes its positions from the same budget.
    let draft_bytes = match (&assets.draft, spec.method) {
        (Some(d), Method::Draft) => d.model.kv_bytes_per_token(),
        _ => 0,
    };
    let limits = Limits::new(&config, ctx, kv.bytes_per_token + draft_bytes, kv.available);
    let speculative = SpecInfo {
        method: if spec.is_on() {
            spec.method
        } else {
            Method::Off
        },
        draft_max: limits.draft_max,
        draft_model: match spec.method {
            Method::Draft => assets.draft.as_ref().map(|d| d.name.clone()),
            _ => None,
        },
    };
    let served = Arc::new(Served {
        tokenizer: Arc::clone(&assets.tokenizer),
        chat_template: Arc::clone(&assets.chat_template),
        config: model.config.clone(),
        quantization: model.weights.main_dtype().name().to_string(),
        description: assets.description.clone(),
        limits,
        kv,
        speculative: speculative.clone(),
        grammars: Default::default(),
    });
    shared.state().send_replace(EngineState::Ready(served));
    info!(
        ctx_size = ctx,
        model_context_length = model.config.context_length,
        max_seqs = limits.max_seqs,
        prefill_chunk = limits.prefill_chunk,
        prefill_chunk_running = limits.prefill_chunk_running,
        target_itl_ms = limits.target_itl.map(|t| t.as_secs_f64() * 1e3),
        kv_cache_tokens = limits.kv_budget,
        cache_type_k = %kv.types.0,
        cache_type_v = %kv.types.1,
        kv_bytes_per_token = kv.bytes_per_token,
        kv_cache_gib = format!("{:.3}", gib(kv.bytes(limits.kv_budget))),
        kv_memory_gib = format!("{:.2}", gib(kv.available)),
        queue_capacity = shared.queue().capacity(),
        speculative = speculative.method.name(),
        draft_max = speculative.max_drafts(),
        draft_model = speculative.draft_model.as_deref().unwrap_or(""),
        "engine ready"
    );
    step_loop::run(&shared, &assets, limits, spec);
}

fn fail_all(shared: &Shared, msg: Arc<str>) {
    shared.state().send_replace(EngineState::Failed(msg));
    shared.queue().close();
    for job in shared.queue().drain() {
        let _ = job.events.send(Event::Failed(JobError::ShuttingDown));
    }
}
