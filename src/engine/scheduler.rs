//! The engine's decisions, apart from the code that carries them out (the runner): whether
//! the job at the head of the queue starts, waits or is refused ([`admission`]); whether a
//! running sequence must stop ([`stop_cause`]); and each step's plan ([`plan`]): which
//! sequences decode a token and how many prompt tokens each waiting prompt runs.
//!
//! A prompt chunk lengthens the step every running stream waits on: while any stream is
//! decoding the plan takes the smaller chunk (`prefill_chunk_running`) so their
//! inter-token latency stays even; with none running, the large one (`prefill_chunk`) so the
//! prompt's first token comes soon. Waiting prompts share the chunk in arrival order, so
//! several short prompts start in one step instead of one step each.

use super::job::Job;
use super::kv_pool::{Fit, KvPool};
use super::limits::Limits;
use std::time::Instant;

/// What to do with the job at the head of the queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Verdict {
    /// Not yet: the KV budget has no room for it now.
    Wait,
    Start,
    /// Its client went away while it was queued.
    Gone,
    Shutdown,
    Expired,
    /// It can never fit the KV budget.
    Never,
}

/// Decides the fate of a queued job: it starts when the KV budget has room for its prompt
/// plus `max_tokens`.
pub(super) fn admission(
    job: &Job,
    shutdown: bool,
    now: Instant,
    pool: &KvPool,
    limits: &Limits,
) -> Verdict {
    if job.client_gone() {
        Verdict::Gone
    } else if shutdown {
        Verdict::Shutdown
    } else if job.expired(now) {
        Verdict::Expired
    } else {
        let need = limits.reservation(job.prompt.len(), job.options.max_tokens);
        match pool.fit(&job.prompt, need) {
            Fit::Now => Verdict::Start,
            Fit::Later => Verdict::Wait,
            Fit::Never => Verdict::Never,
        }
    }
}

/// Why a running sequence was stopped from outside.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum StopCause {
    ClientGone,
    Deadline,
    Shutdown,
}

/// Whether a running sequence must stop now, and why.
pub(super) fn stop_cause(job: &Job, shutdown: bool, now: Instant) -> Option<StopCause> {
    if job.client_gone() {
        Some(StopCause::ClientGone)
    } else if shutdown {
        Some(StopCause::Shutdown)
    } else if job.expired(now) {
        Some(StopCause::Deadline)
    } else {
        None
    }
}

/// What a sequence does in the current step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Role {
    Idle,
    Decode,
    /// Runs this many prompt tokens.
    Prefill(usize),
}

/// A running sequence as the scheduler sees it: how far its prompt has run, and its role
/// in the current step.
#[derive(Clone, Debug)]
pub(super) struct Slot {
    prompt_len: usize,
    /// Prompt tokens whose keys and values are in the cache.
    prefilled: usize,
    decoding: bool,
    role: Role,
}

impl Slot {
    /// A sequence whose cache already holds `cached` of its `prompt_len` prompt tokens.
    pub(super) fn new(prompt_len: usize, cached: usize) -> Self {
        Self {
            prompt_len,
            prefilled: cached,
            decoding: false,
            role: Role::Idle,
        }
    }

    pub(super) fn role(&self) -> Role {
        self.role
    }

    pub(super) fn prefilled(&self) -> usize {
        self.prefilled
    }

    /// Whether this step's rows are the last of the prompt (its logits are needed).
    pub(super) fn finishes_prompt(&self) -> bool {
        matches!(self.role, Role::Prefill(n) if self.prefilled + n == self.prompt_len)
    }

    /// Records that the step ran; returns whether the sequence now has logits to sample
    /// (it decoded, or its prompt is done).
    pub(super) fn ran(&mut self) -> bool {
        match self.role {
            Role::Idle => false,
            Role::Decode => true,
            Role::Prefill(n) => {
                self.prefilled += n;
                self.prefilled == self.prompt_len
            }
        }
    }

    /// The sequence sampled a token to feed: from now on it decodes.
    pub(super) fn start_decoding(&mut self) {
        self.decoding = true;
    }
}

/// The rows of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepPlan {
    /// Sequences in the forward pass.
    pub seqs: usize,
    pub decode_rows: usize,
    pub prefill_rows: usize,
}

/// Gives every running sequence its role in the next step (`slot` finds each one's
/// [`Slot`]): every decoding sequence runs its token, and the waiting prompts, oldest
/// first, share the prompt chunk.
pub(super) fn plan<T>(
    limits: &Limits,
    seqs: &mut [T],
    slot: impl Fn(&mut T) -> &mut Slot,
) -> StepPlan {
    let chunk = if seqs.iter_mut().any(|s| slot(s).decoding) {
        limits.prefill_chunk_running
    } else {
        limits.prefill_chunk
    };
    let mut p = StepPlan {
        seqs: 0,
        decode_rows: 0,
        prefill_rows: 0,
    };
    for s in seqs.iter_mut() {
        let s = slot(s);
        s.role = if s.decoding {
            p.decode_rows += 1;
            Role::Decode
        } else if p.prefill_rows < chunk {
            let n = (s.prompt_len - s.prefilled).min(chunk - p.prefill_rows);
            p.prefill_rows += n;
            Role::Prefill(n)
        } else {
            Role::Idle
        };
        if s.role != Role::Idle {
            p.seqs += 1;
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Event, GenerateOptions};
    use tokio::sync::mpsc;

    fn limits() -> Limits {
        Limits {
            max_seqs: 8,
            prefill_chunk: 10,
            prefill_chunk_running: 3,
            ctx: 100,
            kv_budget: 1000,
            draft_max: 0,
        }
    }

    fn roles(slots: &[Slot]) -> Vec<Role> {
        slots.iter().map(Slot::role).collect()
    }

    fn job(max_tokens: usize) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let opts = GenerateOptions {
            max_tokens,
            ..Default::default()
        };
        (Job::new("j".into(), vec![1, 2, 3], opts, tx), rx)
    }

    #[test]
    fn admission_and_stops_follow_client_deadline_shutdown_and_budget() {
        let now = Instant::now();
        let pool = KvPool::new(100);
        let l = limits();
        let (j, rx) = job(10);
        assert_eq!(admission(&j, false, now, &pool, &l), Verdict::Start);
        assert_eq!(admission(&j, true, now, &pool, &l), Verdict::Shutdown);
        assert_eq!(stop_cause(&j, false, now), None);
        assert_eq!(stop_cause(&j, true, now), Some(StopCause::Shutdown));
        // 3 + 200 positions, capped at the context (100), fit the budget of 100 exactly.
        let (big, _rx) = job(200);
        assert_eq!(admission(&big, false, now, &pool, &l), Verdict::Start);
        assert_eq!(
            admission(&big, false, now, &KvPool::new(99), &l),
            Verdict::Never
        );
        let (mut late, _rx) = job(10);
        late.deadline = Some(now);
        assert_eq!(admission(&late, false, now, &pool, &l), Verdict::Expired);
        assert_eq!(stop_cause(&late, false, now), Some(StopCause::Deadline));
        drop(rx);
        assert_eq!(admission(&j, true, now, &pool, &l), Verdict::Gone);
        assert_eq!(stop_cause(&j, true, now), Some(StopCause::ClientGone));
    }

    #[test]
    fn waiting_prompts_share_the_chunk_oldest_first() {
        let mut slots = vec![Slot::new(4, 0), Slot::new(8, 0), Slot::new(5, 0)];
        let p = plan(&limits(), &mut slots, |s| s);
        assert_eq!(
            roles(&slots),
            [Role::Prefill(4), Role::Prefill(6), Role::Idle]
        );
        assert_eq!(
            p,
            StepPlan {
                seqs: 2,
                decode_rows: 0,
                prefill_rows: 10
            }
        );
        assert!(slots[0].finishes_prompt());
        assert!(!slots[1].finishes_prompt());
        assert!(slots[0].ran());
        assert!(!slots[1].ran());
        assert!(!slots[2].ran());
        assert_eq!(slots[1].prefilled(), 6);
    }

    #[test]
    fn decoding_sequences_shrink_the_chunk() {
        let mut slots = vec![Slot::new(2, 0), Slot::new(20, 5)];
        slots[0].start_decoding();
        let p = plan(&limits(), &mut slots, |s| s);
        assert_eq!(roles(&slots), [Role::Decode, Role::Prefill(3)]);
        assert_eq!(
            p,
            StepPlan {
                seqs: 2,
                decode_rows: 1,
                prefill_rows: 3
            }
        );
        assert!(slots[0].ran());
        assert!(!slots[1].ran());
        assert_eq!(slots[1].prefilled(), 8);
    }
}
