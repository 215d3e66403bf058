//! What the engine handle ([`super::Engine`]) and the engine thread share: the queue, the
//! flags the thread reads between steps, the published KV occupancy, the life-cycle state
//! and the observer.

use super::job::Job;
use super::kv_pool::KvUsage;
use super::observer::Observer;
use super::queue::BoundedQueue;
use super::request::EngineState;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

pub(super) struct Shared {
    queue: BoundedQueue<Job>,
    cancel_all: AtomicBool,
    /// Some job is being served.
    busy: AtomicBool,
    state: watch::Sender<EngineState>,
    observer: Arc<dyn Observer>,
    /// Honour the fault-injection request id.
    #[cfg(feature = "fault-injection")]
    fault_injection: bool,
    kv_reserved: AtomicUsize,
    kv_cached: AtomicUsize,
    kv_budget: AtomicUsize,
}

impl Shared {
    pub(super) fn new(
        queue_capacity: usize,
        observer: Arc<dyn Observer>,
        #[cfg(feature = "fault-injection")] fault_injection: bool,
    ) -> Self {
        let (state, _) = watch::channel(EngineState::Loading);
        Self {
            queue: BoundedQueue::new(queue_capacity.max(1)),
            cancel_all: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            state,
            observer,
            #[cfg(feature = "fault-injection")]
            fault_injection,
            kv_reserved: AtomicUsize::new(0),
            kv_cached: AtomicUsize::new(0),
            kv_budget: AtomicUsize::new(0),
        }
    }

    pub(super) fn queue(&self) -> &BoundedQueue<Job> {
        &self.queue
    }

    pub(super) fn observer(&self) -> &dyn Observer {
        self.observer.as_ref()
    }

    pub(super) fn state(&self) -> &watch::Sender<EngineState> {
        &self.state
    }

    /// Whether the job is the one that makes the engine panic (fault injection, tests).
    #[cfg(feature = "fault-injection")]
    pub(super) fn injects_panic(&self, job: &Job) -> bool {
        self.fault_injection && job.request_id == super::job::FAULT_PANIC_REQUEST_ID
    }

    /// Asks the engine thread to end every running and queued job.
    pub(super) fn cancel_all(&self) {
        self.cancel_all.store(true, Ordering::SeqCst);
    }

    /// Whether every job is being cancelled (the server is shutting down).
    pub(super) fn cancelling(&self) -> bool {
        self.cancel_all.load(Ordering::SeqCst)
    }

    pub(super) fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::SeqCst);
    }

    pub(super) fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Publishes the KV cache's occupancy to [`Shared::kv_usage`] and the observer.
    pub(super) fn publish_kv(&self, u: KvUsage) {
        self.kv_reserved.store(u.reserved, Ordering::Relaxed);
        self.kv_cached.store(u.cached, Ordering::Relaxed);
        self.kv_budget.store(u.budget, Ordering::Relaxed);
        self.observer.kv_usage(u);
    }

    /// The occupancy last published.
    pub(super) fn kv_usage(&self) -> KvUsage {
        KvUsage {
            reserved: self.kv_reserved.load(Ordering::Relaxed),
            cached: self.kv_cached.load(Ordering::Relaxed),
            budget: self.kv_budget.load(Ordering::Relaxed),
        }
    }
}
