//! What the two front-ends (gRPC and HTTP) share: the engine handle and its state as a
//! handler sees it, the metrics, the handlers' limits, and the pool that runs their CPU work
//! (tokenizing, rendering chats) off the network threads.

use super::metrics::Metrics;
use crate::engine::{Engine, EngineState, Served};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Limits of the handlers, set by the server's configuration.
#[derive(Clone, Debug)]
pub struct HandlerLimits {
    /// `max_tokens` of a request that does not set it.
    pub default_max_tokens: usize,
    /// Largest text a call may ask to tokenize (a Tokenize text, a prompt, or the sum of a
    /// chat's message contents).
    pub max_text_bytes: usize,
    /// Tokenize, Detokenize and prompt preparations that run at once; more wait their turn.
    pub cpu_jobs: usize,
}

/// Why the engine cannot take requests now.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NotReady {
    #[error("the model is still loading")]
    Loading,
    #[error("the model failed to load: {0}")]
    Failed(Arc<str>),
}

/// Why a handler's CPU work did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CpuJobError {
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the request's work failed: {0}")]
    Failed(String),
}

/// The engine and what every handler needs beside it.
pub struct Core {
    pub engine: Arc<Engine>,
    pub metrics: Arc<Metrics>,
    pub default_max_tokens: usize,
    pub max_text_bytes: usize,
    /// Bounds the handlers' CPU work on the blocking threads, over both front-ends.
    cpu_jobs: Arc<Semaphore>,
}

impl Core {
    pub fn new(engine: Arc<Engine>, metrics: Arc<Metrics>, limits: HandlerLimits) -> Self {
        Self {
            engine,
            metrics,
            default_max_tokens: limits.default_max_tokens.max(1),
            max_text_bytes: limits.max_text_bytes,
            cpu_jobs: Arc::new(Semaphore::new(limits.cpu_jobs.max(1))),
        }
    }

    /// The loaded model's tokenizer side and limits.
    pub fn served(&self) -> Result<Arc<Served>, NotReady> {
        match self.engine.state() {
            EngineState::Ready(s) => Ok(s),
            EngineState::Loading => Err(NotReady::Loading),
            EngineState::Failed(e) => Err(NotReady::Failed(e)),
        }
    }

    /// Runs a handler's CPU work (tokenizing, rendering) on a blocking thread, at most
    /// `cpu_jobs` at once: on the runtime's few threads it would stall every stream and
    /// health check while it runs.
    pub async fn cpu_job<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, CpuJobError> {
        let permit = Arc::clone(&self.cpu_jobs)
            .acquire_owned()
            .await
            .map_err(|_| CpuJobError::ShuttingDown)?;
        // The permit goes with the work: a client that leaves does not free it early.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| CpuJobError::Failed(e.to_string()))
    }
}
