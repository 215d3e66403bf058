//! One generation: prefill the prompt, then sample and decode token by token until an end
//! condition, streaming valid UTF-8 text and measuring the run.
//!
//! The sampling side of a generation is a [`Sequence`], which the engine thread also drives
//! for each sequence of a batch; [`generate`] runs one sequence on its own, traced as a
//! `prefill` span and one `decode_step` span (step, position) per decoded token, at DEBUG
//! level, inside the caller's span when it has one.

use super::speculative::{Solo, SpecCounts};
use inferno_model::{Logits, Model, ModelError, State};
use inferno_sampling::constraint::{Constraint, Grammar, MaskHandle, MaskWorker};
use inferno_sampling::{Sampler, SamplingError, SamplingParams};
use inferno_tokenizer::{StreamDecoder, Tokenizer};
use serde::Serialize;
use std::time::{Duration, Instant};
use tracing::debug_span;

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Eos,
    /// The text reached one of the stop strings (which is not included).
    StopSequence,
    /// `max_tokens` were generated, or the context is full.
    Length,
    /// The caller asked to stop.
    Cancelled,
    /// The request's time limit passed.
    TimeLimit,
    /// The turn ended with tool calls (set by whoever parses them, never by the engine).
    ToolCalls,
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub time_limit: Option<Duration>,
    /// The grammar the output must follow (a compiled response format); the sequence ends
    /// when the grammar is complete and can take nothing more, and end-of-generation tokens
    /// are allowed exactly when it accepts (whatever `ignore_eos` says).
    pub grammar: Option<Grammar>,
    /// Whether this generation may speculate when its engine does (it never changes the
    /// output, only the speed; off, each step runs one token).
    pub speculate: bool,
    /// Tokens generated before the tokens that end a generation (end-of-generation, and
    /// `stop_token_ids`) may be sampled (vLLM's `min_tokens`); stop strings still end it,
    /// and so does a grammar that allows nothing else. 0: off.
    pub min_tokens: usize,
    /// Tokens that end the generation when sampled, as end-of-generation does (not part of
    /// the output), with [`FinishReason::StopSequence`] (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            time_limit: None,
            grammar: None,
            speculate: true,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
        }
    }
}

/// What the caller learns about each generated token.
pub struct TokenEvent<'a> {
    /// The token, or `None` for the last event, which only releases held-back text.
    pub id: Option<u32>,
    /// New text that is now final: valid UTF-8, never part of a stop string. May be empty
    /// while a character or a possible stop string is incomplete.
    pub text: &'a str,
    /// The distribution the token was drawn from (raw logits), for logprobs.
    pub logits: &'a [f32],
    pub index: usize,
    /// For a constrained sequence's token: how long its grammar mask took to compute, and
    /// how long sampling waited for it and applied it.
    pub mask: Option<(Duration, Duration)>,
}

/// The caller's answer to each token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Metrics {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from an earlier sequence instead of computed.
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub per_forward_ms_min: f64,
    pub per_forward_ms_max: f64,
    pub per_forward_ms_mean: f64,
    /// Forward calls measured (the prefill and every decode step).
    pub forward_calls: usize,
    /// Grammar masks computed (one per sampled token of a constrained sequence, else 0),
    /// and their time per token.
    pub masks: usize,
    pub mask_ms_mean: f64,
    pub mask_ms_p99: f64,
    pub mask_ms_max: f64,
    /// Speculative decoding: draft tokens run through the model for verification, those
    /// kept (each equal to the token the sequence picked), and the steps that verified any.
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub verify_steps: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub seed: u64,
    pub metrics: Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
}

/// Holds back text that could still turn into a stop string, and finds the stop.
struct StopScan {
    stops: Vec<String>,
    text: String,
    emitted: usize,
}

impl StopScan {
    /// Appends `delta`; returns the range of newly final text and whether a stop matched.
    fn push(&mut self, delta: &str) -> (std::ops::Range<usize>, bool) {
        let search_from = self
            .emitted
            .saturating_sub(self.stops.iter().map(|s| s.len()).max().unwrap_or(0));
        self.text.push_str(delta);
        let hit = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                let from = floor_char_boundary(&self.text, search_from);
                self.text[from..].find(s.as_str()).map(|i| from + i)
            })
            .min();
        if let Some(at) = hit {
            let range = self.emitted..at.max(self.emitted);
            self.text.truncate(at.max(self.emitted));
            self.emitted = self.text.len();
            return (range, true);
        }
        // Longest suffix of the text that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > hold && self.text.ends_with(&s[..k]) {
                    hold = k;
                }
            }
        }
        let end = (self.text.len() - hold).max(self.emitted);
        let range = self.emitted..end;
        self.emitted = end;
        (range, false)
    }

    fn flush(&mut self) -> std::ops::Range<usize> {
        let r = self.emitted..self.text.len();
        self.emitted = self.text.len();
        r
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// What a sequence does after a token: feed it back, or end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run this token through the model next; its logits come back to [`Sequence::advance`].
    Feed(u32),
    Finished(FinishReason),
}

/// One generation's sampling side: everything but the forward pass. It takes the logits
/// after each forward call, samples, streams text and decides when to stop; whoever runs
/// the model ([`generate`] for one sequence, the engine thread for a batch) feeds it.
pub struct Sequence<'t> {
    tokenizer: &'t Tokenizer,
    opts: GenerateOptions,
    sampler: Sampler,
    /// The prompt, then every generated token.
    history: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens whose KV came from a cache instead of being computed.
    cached_prompt: usize,
    out_tokens: Vec<u32>,
    decoder: StreamDecoder<'t>,
    scan: StopScan,
    start: Instant,
    prefill: Duration,
    decode_ms: Vec<f64>,
    first_token_at: Option<Duration>,
    decode_start: Instant,
    /// The grammar's state, for a constrained sequence.
    constraint: Option<Constraint>,
    /// The logits with the grammar's mask applied (sized once; empty when unconstrained).
    masked: Vec<f32>,
    /// The tokens that would end the generation (end-of-generation where it ends it, and
    /// `stop_token_ids`): held back until `min_tokens` are generated (empty without).
    enders: Vec<u32>,
    /// Each mask's computation time, in ms.
    mask_ms: Vec<f64>,
    last_mask: Option<(Duration, Duration)>,
    /// Logits per row.
    vocab: usize,
    /// Tokens picked after the first (the decode rate's numerator).
    decode_picks: usize,
    /// What speculation drafted and how much of it was kept.
    spec: SpecCounts,
}

/// What one verification did: the step the sequence takes next, the rows whose input tokens
/// stay in its cache (the last token and the accepted drafts), and how many drafts were
/// accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    pub step: Step,
    pub rows: usize,
    pub accepted: usize,
}

impl<'t> Sequence<'t> {
    /// Starts a generation from `prompt` for a sequence of `context` positions. Its clock
    /// (time to first token, time limit) starts now.
    pub fn new(
        tokenizer: &'t Tokenizer,
        vocab: usize,
        prompt: &[u32],
        opts: GenerateOptions,
        context: usize,
    ) -> Result<Self, GenerateError> {
        let start = Instant::now();
        let mut sampler = Sampler::new(opts.sampling.clone(), vocab)?;
        // Only a sequence with a `min_tokens` holds its enders back.
        let mut enders = Vec::new();
        if opts.min_tokens > 0 {
            enders.extend_from_slice(&opts.stop_token_ids);
            if opts.grammar.is_some() || !opts.ignore_eos {
                enders.extend_from_slice(tokenizer.eog_ids());
            }
            sampler.reserve_row(vocab);
        }
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if prompt.len() >= context {
            return Err(GenerateError::PromptTooLong {
                prompt: prompt.len(),
                context,
            });
        }
        let mut history = Vec::with_capacity(prompt.len() + opts.max_tokens);
        history.extend_from_slice(prompt);
        let constraint = opts.grammar.as_ref().map(Grammar::start);
        let (masked, mask_ms) = if constraint.is_some() {
            (
                Vec::with_capacity(vocab),
                Vec::with_capacity(opts.max_tokens),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(Self {
            constraint,
            masked,
            enders,
            mask_ms,
            last_mask: None,
            vocab,
            decode_picks: 0,
            spec: SpecCounts::default(),
            tokenizer,
            sampler,
            prompt_len: prompt.len(),
            cached_prompt: 0,
            out_tokens: Vec::with_capacity(opts.max_tokens),
            decoder: tokenizer.stream_decoder(),
            scan: StopScan {
                stops: opts.stop.clone(),
                text: String::with_capacity(opts.max_tokens * 8),
                emitted: 0,
            },
            decode_ms: Vec::with_capacity(opts.max_tokens),
            history,
            opts,
            start,
            prefill: Duration::ZERO,
            first_token_at: None,
            decode_start: start,
        })
    }

    pub fn prompt(&self) -> &[u32] {
        &self.history[..self.prompt_len]
    }

    /// The prompt and every token generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.history
    }

    pub fn completion_tokens(&self) -> usize {
        self.out_tokens.len()
    }

    pub fn options(&self) -> &GenerateOptions {
        &self.opts
    }

    /// Whether a grammar constrains this sequence.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// How long the grammar mask used by the last [`Self::advance`] took to compute, and
    /// how long that call waited for it and applied it, once (constrained sequences;
    /// `None` when that call used none).
    pub fn take_mask_time(&mut self) -> Option<(Duration, Duration)> {
        self.last_mask.take()
    }

    /// Notes that the first `n` prompt tokens' KV was reused rather than computed.
    pub fn set_cached_prompt_tokens(&mut self, n: usize) {
        self.cached_prompt = n.min(self.prompt_len);
    }

    pub fn cached_prompt_tokens(&self) -> usize {
        self.cached_prompt
    }

    /// Counts a forward call (or the share of a batched one) that ran prompt tokens.
    pub fn record_prefill(&mut self, took: Duration) {
        self.prefill += took;
    }

    /// Counts a forward call that ran a generated token.
    pub fn record_decode(&mut self, took: Duration) {
        self.decode_ms.push(took.as_secs_f64() * 1e3);
    }

    /// Takes the logits that followed the last token run, picks the next token and reports
    /// it to `on_token`. `room` says whether the sequence's cache can take another token.
    pub fn advance(
        &mut self,
        logits: &[f32],
        room: bool,
        mut on_token: impl FnMut(TokenEvent<'_>) -> Flow,
    ) -> Result<Step, SamplingError> {
        let step = self.pick(logits, room, &mut on_token)?;
        if matches!(step, Step::Feed(_)) {
            self.prefetch_mask();
        }
        Ok(step)
    }

    /// Takes the logits of a step that ran the last token and then `drafts` (one row each,
    /// `(1 + drafts.len()) × vocab` values) and picks, row by row, the token the sequence
    /// would have picked after each one-row step: its sampler, penalties, grammar and stop
    /// conditions see exactly the tokens kept. A draft is kept while it equals the pick
    /// before it; the first pick that differs (or the pick after the last draft) is the
    /// token to run next. Rows after that are never looked at, so the random draws are
    /// those of the run without drafts. `room` is how many more positions the cache can
    /// take after the first row. Each picked token is reported to `on_token`.
    pub fn verify(
        &mut self,
        logits: &[f32],
        drafts: &[u32],
        room: usize,
        mut on_token: impl FnMut(TokenEvent<'_>) -> Flow,
    ) -> Result<Verified, SamplingError> {
        let vocab = self.vocab;
        let needed = drafts.len() + 1;
        let got = logits.len() / vocab.max(1);
        if got < needed {
            return Err(SamplingError::MissingRows { needed, got });
        }
        let mut accepted = 0;
        let done = |s: &mut Self, step, rows, accepted| {
            if !drafts.is_empty() {
                s.spec.drafted += drafts.len();
                s.spec.accepted += accepted;
                s.spec.verifications += 1;
            }
            Ok(Verified {
                step,
                rows,
                accepted,
            })
        };
        for (i, row) in logits.chunks_exact(vocab).take(needed).enumerate() {
            inferno_sampling::check_logits(row)?;
            let before = self.out_tokens.len();
            let step = self.pick(row, room > i, &mut on_token)?;
            let draft = drafts.get(i).copied();
            match step {
                Step::Feed(id) if draft == Some(id) => accepted += 1,
                Step::Feed(_) => {
                    self.prefetch_mask();
                    return done(self, step, i + 1, accepted);
                }
                Step::Finished(_) => {
                    // A token that ended the sequence (a stop string) may still be a kept draft.
                    let kept =
                        self.out_tokens.len() > before && self.out_tokens.last() == draft.as_ref();
                    return done(self, step, i + 1, accepted + usize::from(kept));
                }
            }
        }
        // Every row's pick was a draft: impossible, the last row has none.
        Err(SamplingError::MissingRows {
            needed: needed + 1,
            got,
        })
    }

    /// Starts computing the next step's grammar mask (constrained sequences), while the
    /// forward pass of the token just picked runs.
    fn prefetch_mask(&mut self) {
        if let Some(c) = &mut self.constraint {
            c.prefetch();
        }
    }

    /// Picks the next token from one row of logits (see [`Self::advance`]).
    fn pick(
        &mut self,
        logits: &[f32],
        room: bool,
        on_token: &mut impl FnMut(TokenEvent<'_>) -> Flow,
    ) -> Result<Step, SamplingError> {
        if self.out_tokens.len() >= self.opts.max_tokens {
            return Ok(Step::Finished(FinishReason::Length));
        }
        if self
            .opts
            .time_limit
            .is_some_and(|tl| self.start.elapsed() >= tl)
        {
            return Ok(Step::Finished(FinishReason::TimeLimit));
        }
        self.last_mask = None;
        let logits = match &mut self.constraint {
            None => logits,
            Some(c) => {
                let _span = debug_span!("grammar_mask").entered();
                let t0 = Instant::now();
                self.masked.clear();
                self.masked.extend_from_slice(logits);
                match c.mask_logits(&mut self.masked) {
                    Ok(took) => {
                        self.mask_ms.push(took.as_secs_f64() * 1e3);
                        self.last_mask = Some((took, t0.elapsed()));
                    }
                    // The grammar admitted every token sampled so far, so this is
                    // llguidance's failure, not the request's: the request fails with it,
                    // rather than end as if complete with text the format may not accept.
                    Err(e) => return Err(e.into()),
                }
                &self.masked[..]
            }
        };
        let hold: &[u32] = if self.out_tokens.len() < self.opts.min_tokens {
            &self.enders
        } else {
            &[]
        };
        let id = self.sampler.sample_holding(logits, &self.history, hold);
        if self.first_token_at.is_none() {
            self.first_token_at = Some(self.start.elapsed());
            self.decode_start = Instant::now();
        } else {
            self.decode_picks += 1;
        }
        let constrained = self.constraint.is_some();
        if (constrained || !self.opts.ignore_eos) && self.tokenizer.is_eog(id) {
            return Ok(Step::Finished(FinishReason::Eos));
        }
        if self.opts.stop_token_ids.contains(&id) {
            return Ok(Step::Finished(FinishReason::StopSequence));
        }
        // Whether the grammar is now complete and takes nothing more.
        let mut grammar_done = false;
        if let Some(c) = &mut self.constraint {
            // A token its own mask allowed: a refusal is the grammar engine's failure too.
            c.commit(id)?;
            grammar_done = c.is_finished();
        }
        self.out_tokens.push(id);
        self.history.push(id);
        let piece = self.decoder.push(id);
        let (range, stopped) = self.scan.push(&piece);
        let flow = on_token(TokenEvent {
            id: Some(id),
            text: &self.scan.text[range],
            logits,
            index: self.out_tokens.len() - 1,
            mask: self.last_mask,
        });
        Ok(if stopped {
            Step::Finished(FinishReason::StopSequence)
        } else if flow == Flow::Stop {
            Step::Finished(FinishReason::Cancelled)
        } else if grammar_done {
            Step::Finished(FinishReason::Eos)
        } else if self.out_tokens.len() >= self.opts.max_tokens || !room {
            Step::Finished(FinishReason::Length)
        } else {
            Step::Feed(id)
        })
    }

    /// Has the grammar's masks computed ahead on `worker`, each while the forward pass of
    /// its step runs (no effect on an unconstrained sequence).
    pub fn use_mask_worker(&mut self, worker: MaskHandle) {
        if let Some(c) = &mut self.constraint {
            c.use_worker(worker);
        }
    }

    /// Ends the generation: releases the text the stop scan still held (unless a stop
    /// string ended it) through `on_token`, and measures the run.
    pub fn finish(
        self,
        finish: FinishReason,
        logits: &[f32],
        mut on_token: impl FnMut(TokenEvent<'_>) -> Flow,
    ) -> Generation {
        let Sequence {
            sampler,
            mut scan,
            mut decoder,
            out_tokens,
            prefill,
            decode_ms,
            decode_start,
            first_token_at,
            start,
            prompt_len,
            cached_prompt,
            mut mask_ms,
            decode_picks,
            spec,
            ..
        } = self;
        let decode_time = decode_start.elapsed();
        if finish != FinishReason::StopSequence {
            let tail = decoder.finish();
            scan.text.push_str(&tail);
            let range = scan.flush();
            if !range.is_empty() {
                on_token(TokenEvent {
                    id: None,
                    text: &scan.text[range],
                    logits,
                    index: out_tokens.len(),
                    mask: None,
                });
            }
        }
        let prefill_ms = prefill.as_secs_f64() * 1e3;
        let forward_ms = || std::iter::once(prefill_ms).chain(decode_ms.iter().copied());
        let n_fwd = 1 + decode_ms.len();
        let computed = prompt_len - cached_prompt;
        let metrics = Metrics {
            prompt_tokens: prompt_len,
            cached_prompt_tokens: cached_prompt,
            completion_tokens: out_tokens.len(),
            time_to_first_token_ms: first_token_at.unwrap_or(start.elapsed()).as_secs_f64() * 1e3,
            prefill_tokens_per_second: computed as f64 / prefill.as_secs_f64().max(1e-9),
            // Tokens picked after the first, over the time since it: one per decode step
            // without speculation, up to one per row with it.
            decode_tokens_per_second: if decode_picks > 0 {
                decode_picks as f64 / decode_time.as_secs_f64().max(1e-9)
            } else {
                0.0
            },
            per_forward_ms_min: forward_ms().fold(f64::INFINITY, f64::min),
            per_forward_ms_max: forward_ms().fold(0.0, f64::max),
            per_forward_ms_mean: forward_ms().sum::<f64>() / n_fwd as f64,
            forward_calls: n_fwd,
            masks: mask_ms.len(),
            mask_ms_mean: mask_ms.iter().sum::<f64>() / mask_ms.len().max(1) as f64,
            mask_ms_p99: percentile(&mut mask_ms, 0.99),
            mask_ms_max: mask_ms.iter().copied().fold(0.0, f64::max),
            drafted_tokens: spec.drafted,
            accepted_tokens: spec.accepted,
            verify_steps: spec.verifications,
        };
        Generation {
            text: scan.text,
            tokens: out_tokens,
            finish_reason: finish,
            seed: sampler.seed(),
            metrics,
        }
    }
}

/// The `q` quantile of `v` (nearest rank; 0 when empty); sorts `v`.
fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Generates from `prompt` (token ids) with a fresh sequence in `state`, calling `on_token`
/// for every token. `state` must have been made by `model.new_state`.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: impl FnMut(TokenEvent<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    generate_speculative(model, tokenizer, state, prompt, opts, None, on_token)
}

/// [`generate`], speculating as `spec` says (unless `opts.speculate` is off): each step runs
/// the last token and the drafts `spec` proposes, and [`Sequence::verify`] keeps what the
/// sequence would have picked anyway, so the output is [`generate`]'s exactly. Each step
/// that verifies drafts is a `verify` span (DEBUG; method, drafted, accepted).
pub fn generate_speculative(
    model: &Model,
    tokenizer: &Tokenizer,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut spec: Option<&mut Solo<'_>>,
    mut on_token: impl FnMut(TokenEvent<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    let vocab = model.config.vocab;
    let mut seq = Sequence::new(tokenizer, vocab, prompt, opts.clone(), state.capacity())?;
    // Without a thread for it (none could start), masks are computed in line.
    let masks = seq
        .is_constrained()
        .then(|| MaskWorker::start(1).ok())
        .flatten();
    if let Some(w) = &masks {
        seq.use_mask_worker(w.handle());
    }
    if !opts.speculate {
        spec = None;
    }
    let max = spec.as_ref().map_or(0, |s| s.max_drafts());
    state.reset();
    let mut logits = vec![0.0f32; (1 + max) * vocab];
    // The token to run next and its drafts.
    let mut run = vec![0u32; 1 + max];

    let t0 = Instant::now();
    {
        let _span = debug_span!("prefill", tokens = prompt.len()).entered();
        model.forward(state, prompt, Logits::Last(&mut logits[..vocab]))?;
    }
    seq.record_prefill(t0.elapsed());
    if let Some(s) = spec.as_deref_mut() {
        s.catch_up(prompt);
    }

    // Drafts run in the last step, and that step's time.
    let mut k = 0;
    let mut took = None;
    let finish = loop {
        let room = state.capacity() - state.position() + k;
        let verified = {
            let span = match (&spec, k) {
                (Some(s), 1..) => debug_span!(
                    "verify",
                    method = s.method().name(),
                    drafted = k,
                    accepted = tracing::field::Empty
                ),
                _ => tracing::Span::none(),
            };
            let _e = span.enter();
            let v = seq.verify(
                &logits[..(1 + k) * vocab],
                &run[1..1 + k],
                room,
                &mut on_token,
            )?;
            span.record("accepted", v.accepted);
            v
        };
        if let Some(s) = spec.as_deref_mut() {
            if let Some(t) = took.take() {
                s.observe(1 + k, t, k, verified.accepted);
            }
        }
        // Rejected drafts leave the cache.
        state.truncate(state.position() - (1 + k) + verified.rows);
        match verified.step {
            Step::Finished(reason) => break reason,
            Step::Feed(id) => {
                run[0] = id;
                k = 0;
                if let Some(s) = spec.as_deref_mut() {
                    // Drafts past max_tokens or the cache would never be kept.
                    let left = opts.max_tokens.saturating_sub(seq.completion_tokens() + 1);
                    let room = state.capacity() - state.position() - 1;
                    let drafts = s.propose(seq.tokens(), left.min(room));
                    k = drafts.len();
                    run[1..1 + k].copy_from_slice(drafts);
                }
                let t = Instant::now();
                {
                    let _span = debug_span!(
                        "decode_step",
                        step = seq.completion_tokens(),
                        position = state.position(),
                        drafts = k
                    )
                    .entered();
                    model.forward(
                        state,
                        &run[..1 + k],
                        Logits::All(&mut logits[..(1 + k) * vocab]),
                    )?;
                }
                seq.record_decode(t.elapsed());
                took = Some(t.elapsed().as_secs_f64());
            }
        }
    };
    Ok(seq.finish(finish, &logits[..vocab], on_token))
}

#[cfg(test)]
mod tests {
    use super::StopScan;
    use super::{FinishReason, Flow, GenerateOptions, Sequence, Step, Verified};
    use inferno_sampling::{SamplingError, SamplingParams};
    use inferno_tokenizer::test_vocab::{VocabBuilder, CONTROL};
    use inferno_tokenizer::Tokenizer;

    fn vocab() -> (Tokenizer, u32) {
        let mut v = VocabBuilder::new();
        let end = v.token("<|im_end|>", CONTROL);
        (v.build(), end)
    }

    /// Rows of logits whose greedy picks are `picks` (a NaN row where `None`: a row that
    /// must never be looked at).
    fn rows(vocab: usize, picks: &[Option<u32>]) -> Vec<f32> {
        let mut out = vec![0.0f32; picks.len() * vocab];
        for (r, p) in picks.iter().enumerate() {
            let row = &mut out[r * vocab..(r + 1) * vocab];
            match p {
                Some(id) => row[*id as usize] = 5.0,
                None => row.fill(f32::NAN),
            }
        }
        out
    }

    /// Verifies `drafts` against rows picking `picks`; returns the outcome and the text.
    fn verify(
        opts: GenerateOptions,
        drafts: &[u8],
        picks: &[Option<u32>],
        room: usize,
    ) -> (Result<Verified, SamplingError>, String) {
        let (tok, _) = vocab();
        let n = tok.vocab_size();
        let mut seq = Sequence::new(&tok, n, &[104, 105], opts, 64).unwrap();
        let drafts: Vec<u32> = drafts.iter().map(|&b| u32::from(b)).collect();
        let mut text = String::new();
        let v = seq.verify(&rows(n, picks), &drafts, room, |ev| {
            text.push_str(ev.text);
            Flow::Continue
        });
        (v, text)
    }

    fn opts(max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_tokens,
            sampling: SamplingParams::greedy(),
            ..GenerateOptions::default()
        }
    }

    fn p(b: u8) -> Option<u32> {
        Some(u32::from(b))
    }

    #[test]
    fn drafts_are_kept_while_they_equal_the_picks_and_later_rows_are_never_read() {
        // Picks a, b, c against drafts a, b, x: two kept, c runs next; the last row (NaN)
        // is never looked at.
        let (v, text) = verify(opts(10), b"abx", &[p(b'a'), p(b'b'), p(b'c'), None], 10);
        let want = Verified {
            step: Step::Feed(u32::from(b'c')),
            rows: 3,
            accepted: 2,
        };
        assert_eq!(v.unwrap(), want);
        assert_eq!(text, "abc");
        // Every draft right: the row after the last draft picks the next token.
        let (v, _) = verify(opts(10), b"ab", &[p(b'a'), p(b'b'), p(b'z')], 10);
        let v = v.unwrap();
        assert_eq!(
            (v.step, v.rows, v.accepted),
            (Step::Feed(u32::from(b'z')), 3, 2)
        );
        // Too few rows for the drafts is an error, not a guess.
        let (v, _) = verify(opts(10), b"ab", &[p(b'a'), p(b'b')], 10);
        assert!(matches!(
            v,
            Err(SamplingError::MissingRows { needed: 3, got: 2 })
        ));
    }

    #[test]
    fn the_sequence_ends_inside_a_verification_exactly_where_it_would_alone() {
        // max_tokens 2: ends after the second token, a kept draft.
        let (v, text) = verify(opts(2), b"abc", &[p(b'a'), p(b'b'), None, None], 10);
        let v = v.unwrap();
        assert_eq!(
            (v.step, v.rows, v.accepted),
            (Step::Finished(FinishReason::Length), 2, 2)
        );
        assert_eq!(text, "ab");
        // A stop string completed by a kept draft: the text stops before it.
        let stop = GenerateOptions {
            stop: vec!["bc".into()],
            ..opts(10)
        };
        let (v, text) = verify(stop, b"abcd", &[p(b'a'), p(b'b'), p(b'c'), None, None], 10);
        let v = v.unwrap();
        assert_eq!(
            (v.step, v.rows, v.accepted),
            (Step::Finished(FinishReason::StopSequence), 3, 3)
        );
        assert_eq!(text, "a");
        // The cache fills up: a row sees the room it would have seen alone.
        let (v, _) = verify(opts(10), b"ab", &[p(b'a'), p(b'b'), None], 1);
        let v = v.unwrap();
        assert_eq!((v.step, v.rows), (Step::Finished(FinishReason::Length), 2));
        // End of generation picked where a draft stood: not a token, not kept.
        let (_, end) = vocab();
        let (v, _) = verify(opts(10), b"ab", &[p(b'a'), Some(end), None], 10);
        let v = v.unwrap();
        assert_eq!(
            (v.step, v.rows, v.accepted),
            (Step::Finished(FinishReason::Eos), 2, 1)
        );
    }

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut scan = StopScan {
            stops,
            text: String::new(),
            emitted: 0,
        };
        let mut out = Vec::new();
        for p in pieces {
            let (r, stop) = scan.push(p);
            out.push(scan.text[r].to_string());
            if stop {
                return (out, true, scan.text);
            }
        }
        let r = scan.flush();
        out.push(scan.text[r].to_string());
        (out, false, scan.text)
    }

    #[test]
    fn stop_string_across_pieces_is_cut_and_never_emitted() {
        let (out, stopped, text) = run(&["END"], &["hello E", "N", "D more"]);
        assert!(stopped);
        assert_eq!(text, "hello ");
        assert_eq!(out.concat(), "hello ");
        assert!(out.iter().all(|p| !p.contains('E')));
    }

    #[test]
    fn held_back_prefix_is_released_when_it_diverges() {
        let (out, stopped, text) = run(&["END"], &["a E", "x"]);
        assert!(!stopped);
        assert_eq!(text, "a Ex");
        assert_eq!(out, vec!["a ", "Ex", ""]);
    }

    /// Random replies over a small alphabet, random stop strings and random cuts into
    /// pieces, against a direct statement of the rule: generation ends after the first
    /// piece whose text holds a stop string, cut where the earliest such string starts;
    /// after any other piece, everything is released but the longest end of the text that
    /// could still grow into a stop string.
    #[test]
    fn stop_scan_matches_its_rule_on_random_replies() {
        let alphabet = ["a", "b", "ab", "é", "\n"];
        let mut rng = inferno_tensor::test_rng::TestRng::new(0x2545_f491_4f6c_dd1d);
        let mut next = |n: usize| rng.below(n);
        for case in 0..4000 {
            let stops: Vec<String> = (0..1 + next(3))
                .map(|_| (0..1 + next(3)).map(|_| alphabet[next(5)]).collect())
                .collect();
            let pieces: Vec<String> = (0..1 + next(8))
                .map(|_| (0..next(4)).map(|_| alphabet[next(5)]).collect())
                .collect();
            let refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let prefs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (out, stopped, _) = run(&refs, &prefs);

            let mut text = String::new();
            let mut want = None;
            for (i, piece) in pieces.iter().enumerate() {
                text.push_str(piece);
                let cut = stops.iter().filter_map(|s| text.find(s.as_str())).min();
                if let Some(cut) = cut {
                    want = Some((i, cut));
                    break;
                }
                // What may be held back after this piece.
                let hold = stops
                    .iter()
                    .flat_map(|s| s.char_indices().skip(1).map(|(k, _)| &s[..k]))
                    .filter(|p| text.ends_with(p))
                    .map(str::len)
                    .max()
                    .unwrap_or(0);
                let released: String = out[..=i].concat();
                assert_eq!(
                    released,
                    text[..text.len() - hold],
                    "case {case}: {stops:?} {pieces:?} after piece {i}"
                );
            }
            match want {
                Some((i, cut)) => {
                    assert!(stopped, "case {case}: {stops:?} {pieces:?}");
                    assert_eq!(out.len(), i + 1, "case {case}: stopped at piece {i}");
                    assert_eq!(
                        out.concat(),
                        text[..cut],
                        "case {case}: {stops:?} {pieces:?}"
                    );
                }
                None => {
                    assert!(!stopped, "case {case}: {stops:?} {pieces:?}");
                    assert_eq!(out.concat(), text, "case {case}");
                }
            }
        }
    }

    #[test]
    fn no_stops_streams_everything() {
        let (out, _, _) = run(&[], &["héllo", " wörld"]);
        assert_eq!(out, vec!["héllo", " wörld", ""]);
    }
}
