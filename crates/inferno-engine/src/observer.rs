//! What the engine thread measures, reported to an [`Observer`] (the service's metrics
//! implement it; [`NoObserver`] ignores everything).

use super::job::{Outcome, Protocol};
use super::kv_pool::KvUsage;
use super::speculative::Method;
use std::time::Duration;

/// Receives the engine's measurements. Called on the engine thread, so each call must be
/// cheap.
pub trait Observer: Send + Sync {
    fn queue_wait(&self, _wait: Duration) {}
    fn time_to_first_token(&self, _ttft: Duration) {}
    /// Time between two consecutive tokens of one request (a decode step and its sampling).
    fn decode_step(&self, _step: Duration) {}
    fn tokens_generated(&self, _n: usize) {}
    /// A request ended (or was refused after it was queued), through `protocol`.
    fn finished(&self, _outcome: Outcome, _protocol: Protocol) {}
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
    /// A request constrained by a response format started running.
    fn constrained_request(&self) {}
    /// The grammar mask of one sampled token of a constrained request took this long.
    fn grammar_mask(&self, _took: Duration) {}
    /// Sampling waited this long for that mask (computed ahead while the forward pass
    /// ran) and applied it.
    fn grammar_mask_wait(&self, _took: Duration) {}
    /// A sequence verified `drafted` draft tokens proposed by `method`; `accepted` were kept.
    fn speculated(&self, _method: Method, _drafted: usize, _accepted: usize) {}
}

/// An observer that ignores everything.
pub struct NoObserver;
impl Observer for NoObserver {}
