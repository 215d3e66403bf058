//! A request as the engine thread serves it ([`Job`]) and what the engine sends back for it
//! ([`Event`]: tokens, the final [`Done`], or a [`JobError`]), with the [`Outcome`] each
//! request is counted as.

use super::generate::{FinishReason, GenerateOptions};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most alternatives a request may ask for per token.
pub const MAX_LOGPROBS: usize = 20;

/// A request id that, with [`EngineConfig::fault_injection`](super::EngineConfig) on, makes
/// the engine panic after the request's first token. Only built with the `fault-injection`
/// feature, which the tests turn on.
#[cfg(feature = "fault-injection")]
pub const FAULT_PANIC_REQUEST_ID: &str = "__inferno_fault_panic__";

/// The front-end a request came through, for its metrics and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Grpc,
    Http,
}

impl Protocol {
    /// The label value metrics and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::Http => "http",
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
    /// The front-end it came through.
    pub protocol: Protocol,
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
            protocol: Protocol::default(),
            enqueued_at: Instant::now(),
        }
    }

    pub(super) fn client_gone(&self) -> bool {
        self.events.is_closed()
    }

    pub(super) fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
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
    /// Speculative decoding: draft tokens verified, and those kept (0 and 0 without).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
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
