//! The engine's limits: as configured ([`EngineConfig`]) and as resolved for the loaded
//! model ([`Limits`]). Three sizes are kept apart here: sequences generated at once
//! (`max_seqs`), prompt tokens one step runs for waiting prompts (`prefill_chunk`), and the
//! token rows of a whole step (`step_rows`, what the batch scratch is sized for).

use super::speculative::Speculation;
use std::time::Duration;

/// The default step-time target while streams decode (`--target-itl-ms`): see
/// docs/decisions/step-time-target.md for the measurements behind it.
pub const DEFAULT_TARGET_ITL: Duration = Duration::from_millis(150);

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Requests that may wait to be admitted into the batch.
    pub queue_capacity: usize,
    /// Sequences generated at once (each engine step runs one token of each).
    pub max_seqs: usize,
    /// Most prompt tokens one engine step runs for a waiting prompt, so a long prompt holds
    /// running streams up by one chunk at a time.
    pub prefill_chunk: usize,
    /// The prefill chunk while other streams are decoding: with a `target_itl`, the fewest
    /// prompt tokens a step runs (so a prompt always advances); without, the chunk itself.
    pub prefill_chunk_running: usize,
    /// What a step may take while streams are decoding: the prompt tokens each step runs
    /// are sized from the measured step costs to keep within it (between
    /// `prefill_chunk_running` and `prefill_chunk`). `None`: a fixed chunk of
    /// `prefill_chunk_running`.
    pub target_itl: Option<Duration>,
    /// KV-cache positions shared by all sequences; `None`: `max_seqs` full contexts, capped
    /// at what fits in the memory the KV cache may take (but at least one context; see
    /// [`super::memory`]).
    pub kv_cache_tokens: Option<usize>,
    /// Speculative decoding (off by default;
    /// [`Method::Draft`](super::speculative::Method::Draft) needs the assets' draft model).
    pub speculation: Speculation,
    /// Honour [`FAULT_PANIC_REQUEST_ID`](super::FAULT_PANIC_REQUEST_ID).
    #[cfg(feature = "fault-injection")]
    pub fault_injection: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 16,
            max_seqs: 8,
            prefill_chunk: 256,
            prefill_chunk_running: 8,
            target_itl: Some(DEFAULT_TARGET_ITL),
            kv_cache_tokens: None,
            speculation: Speculation::off(),
            #[cfg(feature = "fault-injection")]
            fault_injection: false,
        }
    }
}

/// The engine's limits, fixed when it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sequences generated at once.
    pub max_seqs: usize,
    /// Most prompt tokens one step runs for waiting prompts.
    pub prefill_chunk: usize,
    /// The prefill chunk while other sequences are decoding (at most `prefill_chunk`): the
    /// least one step runs with a target, the chunk without.
    pub prefill_chunk_running: usize,
    /// The step-time target while sequences decode ([`EngineConfig::target_itl`]).
    pub target_itl: Option<Duration>,
    /// Positions one sequence may hold (prompt plus completion).
    pub ctx: usize,
    /// KV-cache positions for all sequences (with a draft model, each position of a
    /// sequence holds its draft cache's too).
    pub kv_budget: usize,
    /// Most draft tokens one sequence runs in a step (0 without speculation).
    pub draft_max: usize,
}

impl Limits {
    /// The limits of `config` for a model with `ctx` positions per sequence and
    /// `bytes_per_token` of KV cache per position, whose KV cache may take `kv_memory` bytes.
    pub fn new(config: &EngineConfig, ctx: usize, bytes_per_token: usize, kv_memory: u64) -> Self {
        let max_seqs = config.max_seqs.max(1);
        let default_budget = || {
            let by_memory = kv_memory / bytes_per_token.max(1) as u64;
            let by_memory = usize::try_from(by_memory).unwrap_or(usize::MAX);
            max_seqs.saturating_mul(ctx).min(by_memory.max(ctx))
        };
        Limits {
            max_seqs,
            prefill_chunk: config.prefill_chunk.max(1),
            prefill_chunk_running: config
                .prefill_chunk_running
                .clamp(1, config.prefill_chunk.max(1)),
            target_itl: config.target_itl.filter(|t| !t.is_zero()),
            ctx,
            kv_budget: config.kv_cache_tokens.unwrap_or_else(default_budget).max(1),
            draft_max: config.speculation.max_drafts(),
        }
    }

    /// Token rows one engine step runs at most: one decode token of every sequence and its
    /// drafts, plus a prompt chunk.
    pub fn step_rows(&self) -> usize {
        self.max_seqs * (1 + self.draft_max) + self.prefill_chunk
    }

    /// Rows of logits of several sequences one product gathers: one per sequence, and room
    /// for the drafts of two sequences (beyond that, further blocks).
    pub fn logit_rows(&self) -> usize {
        self.max_seqs + 2 * self.draft_max
    }

    /// KV positions a request reserves while it runs: its prompt plus `max_tokens`, capped
    /// at the context.
    pub fn reservation(&self, prompt_len: usize, max_tokens: usize) -> usize {
        (prompt_len + max_tokens).min(self.ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_kv_budget_is_max_seqs_contexts_capped_by_memory() {
        let config = EngineConfig {
            max_seqs: 4,
            ..EngineConfig::default()
        };
        let g = 1u64 << 30;
        assert_eq!(Limits::new(&config, 100, 64, 2 * g).kv_budget, 400);
        // 2 GiB at 1 MiB per position holds 2048 positions, fewer than 4 contexts of 1000.
        assert_eq!(Limits::new(&config, 1000, 1 << 20, 2 * g).kv_budget, 2048);
        // But never less than one context.
        assert_eq!(Limits::new(&config, 4096, 1 << 30, 2 * g).kv_budget, 4096);
        assert_eq!(Limits::new(&config, 4096, 1 << 20, 0).kv_budget, 4096);
        // An explicit budget is kept whatever the memory.
        let fixed = EngineConfig {
            kv_cache_tokens: Some(1 << 20),
            ..config
        };
        assert_eq!(Limits::new(&fixed, 4096, 1 << 20, 0).kv_budget, 1 << 20);
    }

    #[test]
    fn running_chunk_is_at_most_the_chunk() {
        let config = EngineConfig {
            prefill_chunk: 16,
            prefill_chunk_running: 64,
            kv_cache_tokens: Some(0),
            ..EngineConfig::default()
        };
        let l = Limits::new(&config, 128, 1, 1 << 30);
        assert_eq!(l.prefill_chunk_running, 16);
        assert_eq!(l.kv_budget, 1);
        assert_eq!(l.step_rows(), 8 + 16);
        assert_eq!(l.reservation(100, 50), 128);
        assert_eq!(l.reservation(10, 5), 15);
    }
}
