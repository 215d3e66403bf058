//! Speculative decoding that changes nothing but the speed.
//!
//! A sequence that speculates runs its last token and `k` proposed draft tokens as `1 + k`
//! rows of one step. Each row's logits are exactly those the one-row decode step would give
//! at that position (the kernels compute every row on its own: `tests/verification_rows.rs`),
//! so the sequence's own sampler picks at each position in order, as it would have without
//! speculation ([`Sequence::verify`](super::generate::Sequence::verify)): the drafts are kept
//! while they equal the picks, the first pick that differs is kept too, and the rest is
//! dropped from the KV cache. Every emitted token, logprob and finish reason is the one the
//! sequence emits without speculation; only how many tokens a step yields changes.
//!
//! This module owns where drafts come from and how many to try:
//! - the proposers: [`ngram`] (prompt lookup in the sequence's own tokens), [`draft`] (a
//!   smaller model of the same vocabulary, drafting greedily), or a caller's [`Proposer`];
//! - [`Acceptance`]: each sequence's running acceptance rate, and the back-off of one whose
//!   drafts keep failing;
//! - [`StepCost`]: how a step's time grows with its rows, measured as the engine runs;
//! - [`share_rows`]: how many draft rows each sequence gets in a step — a row is added
//!   where the tokens it is expected to yield for its sequence outweigh what the longer step
//!   costs every sequence in it, so drafting follows acceptance and shrinks as the batch
//!   grows and makes a step compute-bound.

pub mod draft;
pub mod ngram;

use std::sync::Arc;

/// Where draft tokens come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Method {
    #[default]
    Off,
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// sequence's last few tokens in its own prompt and output ([`ngram`]).
    Ngram,
    /// A second, smaller model of the same vocabulary, drafting greedily ([`draft`]).
    Draft,
    /// A caller's [`Proposer`] (one per sequence, from [`Speculation::custom`]), which sizes
    /// its drafts itself: all it proposes runs (within `draft_max`, `max_tokens` and the
    /// cache's room).
    Custom,
}

impl Method {
    /// The names the command line takes.
    pub const NAMES: &[&str] = &["off", "ngram", "draft"];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Ok(Self::Off),
            "ngram" => Ok(Self::Ngram),
            "draft" => Ok(Self::Draft),
            _ => Err(format!(
                "unknown speculative method {name:?} (supported: {})",
                Self::NAMES.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Ngram => "ngram",
            Self::Draft => "draft",
            Self::Custom => "custom",
        }
    }

    /// The most draft tokens one step tries when not told otherwise: lookups are free and
    /// often long (a copied passage), a draft model's tokens cost a forward pass each.
    pub fn default_draft_max(self) -> usize {
        match self {
            Self::Off => 0,
            Self::Ngram | Self::Custom => 16,
            Self::Draft => 8,
        }
    }
}

/// Proposes draft tokens for one sequence. Called on the engine thread before each step
/// in which the sequence may speculate; must not allocate once warm.
pub trait Proposer: Send {
    /// Writes up to `out.len()` tokens expected to follow `tokens` (the prompt and every
    /// token generated so far) to the front of `out`; returns how many.
    fn propose(&mut self, tokens: &[u32], out: &mut [u32]) -> usize;
}

/// Makes one [`Proposer`] per sequence.
pub type ProposerFactory = Arc<dyn Fn() -> Box<dyn Proposer> + Send + Sync>;

/// How an engine (or a single generation) speculates.
#[derive(Clone)]
pub struct Speculation {
    pub method: Method,
    /// Most draft tokens one sequence tries in one step.
    pub draft_max: usize,
    /// The proposers of [`Method::Custom`].
    pub custom: Option<ProposerFactory>,
    /// What a draft row and a draft-model pass cost relative to a step's fixed cost, fixed
    /// instead of measured as the steps run: drafting then depends on acceptance alone, the
    /// same from run to run (tests, comparisons).
    pub costs: Option<(f64, f64)>,
}

impl std::fmt::Debug for Speculation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("method", &self.method)
            .field("draft_max", &self.draft_max)
            .finish_non_exhaustive()
    }
}

impl Default for Speculation {
    fn default() -> Self {
        Self::off()
    }
}

impl Speculation {
    pub fn off() -> Self {
        Self {
            method: Method::Off,
            draft_max: 0,
            custom: None,
            costs: None,
        }
    }

    /// `method` with up to `draft_max` drafts a step (`None`: the method's default).
    pub fn new(method: Method, draft_max: Option<usize>) -> Self {
        Self {
            method,
            draft_max: draft_max.unwrap_or(method.default_draft_max()),
            custom: None,
            costs: None,
        }
    }

    /// The caller's proposers, up to `draft_max` drafts a step.
    pub fn custom(factory: ProposerFactory, draft_max: usize) -> Self {
        Self {
            method: Method::Custom,
            draft_max,
            custom: Some(factory),
            costs: None,
        }
    }

    /// With the costs of [`Speculation::costs`] fixed.
    pub fn with_costs(self, row: f64, draft_pass: f64) -> Self {
        Self {
            costs: Some((row, draft_pass)),
            ..self
        }
    }

    /// The row and draft-pass costs to share rows by: fixed, or from the measurements.
    pub fn costs_now(&self, steps: &StepCost, drafts: &DraftCost) -> (f64, f64) {
        self.costs.unwrap_or_else(|| {
            let extra = match self.method {
                Method::Draft => drafts.relative(steps),
                _ => 0.0,
            };
            (steps.ratio(), extra)
        })
    }

    /// Whether any drafting happens.
    pub fn is_on(&self) -> bool {
        self.method != Method::Off && self.draft_max > 0
    }

    /// Most draft tokens a step may hold for one sequence (0 when off).
    pub fn max_drafts(&self) -> usize {
        if self.is_on() {
            self.draft_max
        } else {
            0
        }
    }
}

/// How the engine speculates, as clients are told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecInfo {
    pub method: Method,
    /// Most drafts a sequence verifies in one step (0 when off).
    pub draft_max: usize,
    /// The draft model's name, for [`Method::Draft`].
    pub draft_model: Option<String>,
}

impl SpecInfo {
    pub fn max_drafts(&self) -> usize {
        if self.method == Method::Off {
            0
        } else {
            self.draft_max
        }
    }
}

/// Counts of one generation's (or one engine's) speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpecCounts {
    /// Draft tokens run through the model for verification.
    pub drafted: usize,
    /// Draft tokens that equalled the sequence's own pick (and were kept).
    pub accepted: usize,
    /// Steps in which the sequence verified at least one draft token.
    pub verifications: usize,
}

/// A sequence's running acceptance rate (the chance that a draft token equals the pick,
/// given the ones before it did), and its back-off.
///
/// Each verification is a run of Bernoulli trials: the accepted drafts are successes, the
/// first rejected one (if any) a failure. Counts decay geometrically per verification so
/// the rate follows the text (a copied passage, then free text). A sequence whose rate
/// makes drafting not worth its rows sits out; after `cooldown` such steps it probes once
/// more at the prior rate, and each failed probe doubles the cooldown.
#[derive(Clone, Debug)]
pub struct Acceptance {
    successes: f64,
    failures: f64,
    prior: f64,
    /// Steps sat out since the last verification.
    idle: u32,
    cooldown: u32,
    /// The rate this step's share was computed at.
    bid_rate: f64,
}

/// How much of the previous counts a verification keeps.
const DECAY: f64 = 0.8;
/// Pseudo-trials of the prior rate a fresh sequence starts with.
const PRIOR_TRIALS: f64 = 2.0;
/// Steps a sequence sits out before its first probe, and the most it ever sits out.
const COOLDOWN_MIN: u32 = 16;
const COOLDOWN_MAX: u32 = 256;

impl Acceptance {
    /// A fresh sequence, assumed to accept at `prior`.
    pub fn new(prior: f64) -> Self {
        Self {
            successes: prior * PRIOR_TRIALS,
            failures: (1.0 - prior) * PRIOR_TRIALS,
            prior,
            idle: 0,
            cooldown: COOLDOWN_MIN,
            bid_rate: prior,
        }
    }

    /// The estimated acceptance rate.
    pub fn rate(&self) -> f64 {
        self.successes / (self.successes + self.failures).max(f64::MIN_POSITIVE)
    }

    /// The rate to share this step's rows by: the estimate, or the prior for a probe when
    /// the sequence has sat out its cooldown.
    pub fn bid(&mut self) -> f64 {
        let r = self.rate();
        self.bid_rate = if self.idle >= self.cooldown {
            r.max(self.prior)
        } else {
            r
        };
        self.bid_rate
    }

    /// Notes a step in which the sequence could have drafted but did not.
    pub fn sat_out(&mut self) {
        self.idle = self.idle.saturating_add(1);
    }

    /// Notes a verification of `drafted` tokens of which the first `accepted` were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let probed = self.idle >= self.cooldown;
        self.successes = self.successes * DECAY + accepted as f64;
        self.failures = self.failures * DECAY + f64::from(u8::from(accepted < drafted));
        self.idle = 0;
        if accepted > 0 {
            self.cooldown = COOLDOWN_MIN;
        } else if probed {
            self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
        }
    }
}

/// How a step's time grows with its rows, `t0 + t1 · rows`, fitted by least squares over
/// recent decode steps (older ones weigh geometrically less, so it follows a change of load).
/// Only the ratio `t1 / t0` matters for sharing rows. The fit is blended with a prior ratio
/// by how much the steps' sizes have varied lately, so a few noisy steps of two rows do not
/// settle it, and where steps stop varying (nobody drafts) it drifts back to the prior and
/// drafting is tried again.
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    sums: [f64; 5],
}

/// Weight each earlier step keeps per new one.
const COST_DECAY: f64 = 0.98;
/// `t1 / t0` before measurements say otherwise: a CPU step of one row is bound by reading
/// the weights, each further row costs a fraction of that in arithmetic.
const PRIOR_RATIO: f64 = 0.3;
/// The prior's weight, in units of the steps' spread (weight × variance of their rows).
const PRIOR_INFO: f64 = 4.0;

impl StepCost {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a decode step of `rows` rows that took `secs`.
    pub fn observe(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let (x, y) = (rows as f64, secs);
        for v in &mut self.sums {
            *v *= COST_DECAY;
        }
        let s = &mut self.sums;
        s[0] += 1.0;
        s[1] += x;
        s[2] += y;
        s[3] += x * x;
        s[4] += x * y;
    }

    /// `t1 / t0`: what one more row costs relative to a step's fixed cost.
    pub fn ratio(&self) -> f64 {
        match self.fit() {
            Some((t0, t1, info)) => {
                let fitted = (t1 / t0).clamp(0.005, 2.0);
                (PRIOR_INFO * PRIOR_RATIO + info * fitted) / (PRIOR_INFO + info)
            }
            None => PRIOR_RATIO,
        }
    }

    /// A step's fixed cost `t0` in seconds, once a step was seen: the mean step split by
    /// [`StepCost::ratio`].
    pub fn fixed_secs(&self) -> Option<f64> {
        let [w, sx, sy, ..] = self.sums;
        (w > 0.0).then(|| sy / w / (1.0 + self.ratio() * sx / w))
    }

    /// `(t0, t1, spread)` by least squares, when the steps varied and the line makes sense
    /// (a step of no rows cannot cost nothing, nor a row less than nothing).
    fn fit(&self) -> Option<(f64, f64, f64)> {
        let [w, sx, sy, sxx, sxy] = self.sums;
        if w <= 0.0 {
            return None;
        }
        let (mx, my) = (sx / w, sy / w);
        let var = sxx / w - mx * mx;
        if var <= 1e-9 {
            return None;
        }
        let t1 = (sxy / w - mx * my) / var;
        let t0 = my - t1 * mx;
        (t0 > 0.0 && t1.is_finite() && t1 >= 0.0).then_some((t0, t1, w * var))
    }
}

/// One sequence's part in sharing a step's draft rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bid {
    /// Its acceptance rate.
    pub rate: f64,
    /// Most drafts it can take this step (what its proposer has, its room, its budget).
    pub cap: usize,
    /// Drafts it gets.
    pub k: usize,
}

/// Shares draft rows among the bids of one step, in which `sharers` sequences run (the
/// decoding ones, whose bids these are, and those prefilling) in `rows` rows, when one
/// more row costs `ratio` of a step's fixed cost (and making its draft `extra`), at most
/// `max_rows` draft rows in all. `bid` finds each item's [`Bid`]; the shares end in their
/// `k`. Returns the draft rows given.
///
/// The `j`-th draft of a sequence accepting at rate `a` yields `a^j` expected tokens, but
/// every row lengthens the step for all its sequences, the ones that draft nothing too. So
/// the rows go where they raise the product of the sequences' rates (proportional fairness):
/// one by one, to the sequence whose expected tokens `E` the next draft raises most, while
/// `ln(1 + a^j / E)` beats `sharers · ln(1 + row / cost)`, what the longer step takes from
/// every sequence in it. A sequence alone in its step gets exactly the rows that raise its
/// tokens per unit of time. In a batch, drafting shrinks as the step's sequences grow: on
/// two Zen 3 cores, eight streams of which a few repeated themselves (97% of drafts
/// accepted) gave the same throughput as without drafts, and the streams that drafted
/// nothing waited 38–65% longer between tokens at the 99th percentile, when rows went
/// wherever they raised the tokens of the whole step per unit of time
/// (docs/decisions/draft-rows-by-step-cost.md).
pub fn share_rows<T>(
    items: &mut [T],
    bid: impl Fn(&mut T) -> &mut Bid,
    sharers: usize,
    rows: usize,
    (ratio, extra): (f64, f64),
    max_rows: usize,
) -> usize {
    let per_row = ratio + extra;
    for it in items.iter_mut() {
        bid(it).k = 0;
    }
    let mut cost = 1.0 + ratio * rows as f64;
    let mut given = 0;
    while given < max_rows {
        // The draft that raises its sequence's expected tokens the most, relatively.
        let mut best: Option<(usize, f64)> = None;
        for (i, it) in items.iter_mut().enumerate() {
            let b = bid(it);
            if b.k >= b.cap {
                continue;
            }
            // E = 1 + a + … + a^k (the certain token and the drafts so far); the next
            // draft adds a^(k+1).
            let (mut expected, mut gain) = (0.0, 1.0);
            for _ in 0..=b.k {
                expected += gain;
                gain *= b.rate;
            }
            let lift = gain / expected;
            if best.is_none_or(|(_, l)| lift > l) {
                best = Some((i, lift));
            }
        }
        let Some((i, lift)) = best else { break };
        if lift.ln_1p() <= sharers as f64 * (per_row / cost).ln_1p() {
            break;
        }
        bid(&mut items[i]).k += 1;
        cost += per_row;
        given += 1;
    }
    given
}

/// What one draft pass costs, relative to a main step's fixed cost: a moving average of the
/// draft passes' time (0 for the proposers that cost nothing).
#[derive(Clone, Copy, Debug, Default)]
pub struct DraftCost {
    secs: Option<f64>,
}

impl DraftCost {
    /// Records `passes` draft passes that took `secs` in all.
    pub fn observe(&mut self, passes: usize, secs: f64) {
        if passes == 0 || !secs.is_finite() {
            return;
        }
        let one = secs / passes as f64;
        self.secs = Some(self.secs.map_or(one, |s| 0.9 * s + 0.1 * one));
    }

    /// A draft pass's cost in units of the main step's fixed cost.
    pub fn relative(&self, main: &StepCost) -> f64 {
        match (self.secs, main.fixed_secs()) {
            (Some(d), Some(t0)) if t0 > 0.0 => d / t0,
            _ => 0.0,
        }
    }
}

/// Speculation for one sequence run on its own ([`generate_speculative`](super::generate::generate_speculative)):
/// its proposer, its acceptance, and the step costs it measures.
pub struct Solo<'d> {
    method: Method,
    max: usize,
    spec: Speculation,
    source: SoloSource<'d>,
    acc: Acceptance,
    cost: StepCost,
    draft_cost: DraftCost,
    drafts: Vec<u32>,
}

enum SoloSource<'d> {
    Propose(Box<dyn Proposer>),
    Draft(Box<SoloDraft<'d>>),
}

/// A draft model with one sequence's cache and buffers.
struct SoloDraft<'d> {
    draft: &'d draft::DraftModel,
    cache: draft::DraftCache,
    scratch: inferno_model::Scratch,
    steps: Vec<inferno_model::SeqStep<'static>>,
}

impl SoloDraft<'_> {
    /// Runs the cache up to `upto` of `tokens` and drafts `out.len()` tokens after them;
    /// returns how many were drafted (none once the draft model failed).
    fn run(&mut self, tokens: &[u32], upto: usize, out: &mut [u32]) -> usize {
        let mut job = [draft::DraftJob {
            cache: &mut self.cache,
            tokens,
            upto,
            want: out.len(),
            out,
        }];
        let steps = std::mem::take(&mut self.steps);
        let (steps, r) = draft::draft_step(self.draft, &mut self.scratch, steps, &mut job);
        self.steps = steps;
        match r {
            Ok(()) => job[0].want,
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; drafting stops");
                0
            }
        }
    }
}

/// The acceptance rate a fresh sequence is assumed to have: a draft model is trained on the
/// same text; a lookup often finds nothing to continue.
pub(crate) fn prior_rate(method: Method) -> f64 {
    match method {
        Method::Draft => 0.7,
        _ => 0.5,
    }
}

impl<'d> Solo<'d> {
    /// Speculation as `spec` says for a sequence of up to `capacity` positions (`draft`:
    /// the draft model, for [`Method::Draft`]); `None` when it is off.
    pub fn new(
        spec: &Speculation,
        draft: Option<&'d draft::DraftModel>,
        capacity: usize,
    ) -> Result<Option<Self>, String> {
        if !spec.is_on() {
            return Ok(None);
        }
        let source = match spec.method {
            Method::Off => return Ok(None),
            Method::Ngram => SoloSource::Propose(Box::new(ngram::NgramProposer)),
            Method::Custom => match &spec.custom {
                Some(f) => SoloSource::Propose(f()),
                None => return Err("custom speculation needs a proposer".into()),
            },
            Method::Draft => {
                let Some(draft) = draft else {
                    return Err("draft speculation needs a draft model (--draft-model)".into());
                };
                SoloSource::Draft(Box::new(SoloDraft {
                    draft,
                    cache: draft.new_cache(capacity),
                    scratch: draft.new_scratch(crate::loader::STATE_ROWS, 0),
                    steps: Vec::with_capacity(1),
                }))
            }
        };
        Ok(Some(Self {
            method: spec.method,
            max: spec.draft_max,
            spec: spec.clone(),
            source,
            acc: Acceptance::new(prior_rate(spec.method)),
            cost: StepCost::new(),
            draft_cost: DraftCost::default(),
            drafts: vec![0; spec.draft_max],
        }))
    }

    pub fn method(&self) -> Method {
        self.method
    }

    /// Most drafts one step may hold.
    pub fn max_drafts(&self) -> usize {
        self.max
    }

    /// Runs what the draft model lacks of `tokens` (its prompt, once the prompt has run).
    pub fn catch_up(&mut self, tokens: &[u32]) {
        if let SoloSource::Draft(d) = &mut self.source {
            while d.cache.behind(tokens.len()) > 0 && !d.cache.is_broken() {
                let synced = tokens.len() - d.cache.behind(tokens.len());
                let upto = (synced + d.scratch.rows()).min(tokens.len());
                d.run(tokens, upto, &mut []);
            }
        }
    }

    /// Drafts to run after `tokens` (the prompt and output so far, the last one not yet
    /// run), at most `limit`; how many is decided by the acceptance so far and the costs.
    pub fn propose(&mut self, tokens: &[u32], limit: usize) -> &[u32] {
        let cap = self.max.min(limit);
        if cap == 0 {
            return &[];
        }
        let (ratio, extra) = self.spec.costs_now(&self.cost, &self.draft_cost);
        let mut bid = Bid {
            rate: self.acc.bid(),
            cap,
            k: 0,
        };
        let k = match &mut self.source {
            SoloSource::Propose(p) => {
                bid.cap = p.propose(tokens, &mut self.drafts[..cap]).min(cap);
                if self.method == Method::Custom {
                    // A caller's proposer sizes its drafts itself.
                    return &self.drafts[..bid.cap];
                }
                share_rows(
                    std::slice::from_mut(&mut bid),
                    |b| b,
                    1,
                    1,
                    (ratio, 0.0),
                    cap,
                );
                bid.k
            }
            SoloSource::Draft(d) => {
                bid.cap = bid.cap.min(d.cache.room(tokens.len()));
                if d.cache.behind(tokens.len()) > d.scratch.rows() {
                    bid.cap = 0;
                }
                share_rows(
                    std::slice::from_mut(&mut bid),
                    |b| b,
                    1,
                    1,
                    (ratio, extra),
                    cap,
                );
                let t = std::time::Instant::now();
                let got = d.run(tokens, tokens.len(), &mut self.drafts[..bid.k]);
                self.draft_cost.observe(got, t.elapsed().as_secs_f64());
                got
            }
        };
        if k == 0 && bid.cap > 0 {
            self.acc.sat_out();
        }
        &self.drafts[..k]
    }

    /// Records a step of `rows` rows that took `secs`, which verified `drafted` drafts of
    /// which `accepted` were kept.
    pub fn observe(&mut self, rows: usize, secs: f64, drafted: usize, accepted: usize) {
        self.cost.observe(rows, secs);
        self.acc.record(drafted, accepted);
        if let SoloSource::Draft(d) = &mut self.source {
            d.cache.settle(accepted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(rates: &[f64], caps: &[usize], rows: usize, ratio: f64) -> Vec<usize> {
        let mut bids: Vec<Bid> = rates
            .iter()
            .zip(caps)
            .map(|(&rate, &cap)| Bid { rate, cap, k: 0 })
            .collect();
        share_rows(
            &mut bids,
            |b| b,
            rates.len(),
            rows,
            (ratio, 0.0),
            usize::MAX,
        );
        bids.iter().map(|b| b.k).collect()
    }

    #[test]
    fn drafts_follow_acceptance_and_shrink_as_the_batch_grows() {
        // Alone, a sequence accepting 95% drafts long; 50% only one token; 20% none.
        let alone = |rate| shares(&[rate], &[16], 1, 0.3)[0];
        assert!(alone(0.95) >= 8, "{}", alone(0.95));
        assert!(alone(0.5) <= 2 && alone(0.5) >= 1);
        assert_eq!(alone(0.2), 0);
        // Nearly free rows (a bandwidth-bound device): long drafts even at 50%.
        assert!(shares(&[0.5], &[16], 1, 0.01)[0] >= 4);
        // Eight sequences at 90%: each gets fewer rows than one alone.
        let eight = shares(&[0.9; 8], &[16; 8], 8, 0.3);
        let one = shares(&[0.9], &[16], 1, 0.3)[0];
        assert!(eight.iter().all(|&k| k < one), "{eight:?} vs {one}");
        // The better acceptor gets the rows first; caps hold.
        let mixed = shares(&[0.95, 0.6], &[3, 16], 2, 0.3);
        assert_eq!(mixed[0], 3);
        assert!(mixed[1] <= 1);
    }

    #[test]
    fn alone_a_sequence_gets_the_rows_that_raise_its_tokens_per_unit_of_time() {
        // Brute force: the draft count that maximizes (1 + a + … + a^k) / (1 + ratio·(1 + k)).
        for rate in [0.3f64, 0.5, 0.7, 0.9, 0.97, 1.0] {
            for ratio in [0.01, 0.1, 0.24, 0.5] {
                let yield_of = |k: usize| {
                    let tokens: f64 = (0..=k).map(|j| rate.powi(j as i32)).sum();
                    tokens / (1.0 + ratio * (1 + k) as f64)
                };
                let best = (0..=16)
                    .max_by(|&a, &b| yield_of(a).total_cmp(&yield_of(b)))
                    .unwrap();
                let k = shares(&[rate], &[16], 1, ratio)[0];
                assert!(
                    (yield_of(k) - yield_of(best)).abs() < 1e-12,
                    "rate {rate} ratio {ratio}: {k} drafts, best {best}"
                );
            }
        }
    }

    #[test]
    fn a_drafting_sequence_does_not_slow_a_full_batch_for_its_own_tokens() {
        // A stream repeating itself (97% of drafts accepted) among seven with nothing to
        // draft, at the row cost measured on two Zen 3 cores: alone it drafts long; in the
        // batch the step's other seven would pay for each row, so it gets one at most.
        let alone = shares(&[0.97], &[16], 1, 0.24)[0];
        assert!(alone >= 8, "{alone}");
        let mut rates = [0.0; 8];
        let mut caps = [0; 8];
        (rates[0], caps[0]) = (0.97, 16);
        let batch = shares(&rates, &caps, 8, 0.24);
        assert!(
            batch[0] <= 1 && batch[1..].iter().all(|&k| k == 0),
            "{batch:?}"
        );
        // Prefilling sequences count too: one decoding stream beside seven prompts.
        let mut one = [Bid {
            rate: 0.97,
            cap: 16,
            k: 0,
        }];
        share_rows(&mut one, |b| b, 8, 64, (0.24, 0.0), usize::MAX);
        assert!(one[0].k < alone, "{} vs {alone}", one[0].k);
    }

    #[test]
    fn a_failing_sequence_backs_off_and_probes_ever_later() {
        let mut a = Acceptance::new(0.5);
        for _ in 0..5 {
            a.bid();
            a.record(2, 0);
        }
        assert!(a.rate() < 0.1, "{}", a.rate());
        // It sits out COOLDOWN_MIN steps at its low rate, then bids the prior once.
        for _ in 0..COOLDOWN_MIN {
            assert!(a.bid() < 0.1);
            a.sat_out();
        }
        assert_eq!(a.bid(), 0.5);
        a.record(1, 0);
        // The failed probe doubles the wait.
        for _ in 0..2 * COOLDOWN_MIN {
            assert!(a.bid() < 0.1);
            a.sat_out();
        }
        assert_eq!(a.bid(), 0.5);
        // A success resets it and lifts the rate.
        a.record(4, 4);
        assert!(a.rate() > 0.4);
    }

    #[test]
    fn the_step_cost_ratio_is_fitted_from_steps_of_several_sizes() {
        let mut c = StepCost::new();
        assert_eq!(c.ratio(), PRIOR_RATIO);
        // t = 10 + 2·rows: ratio 0.2.
        for i in 0..400 {
            let rows = 1 + (i % 9);
            c.observe(rows, 10.0 + 2.0 * rows as f64);
        }
        assert!((c.ratio() - 0.2).abs() < 0.01, "{}", c.ratio());
        // Steps that stop varying (nobody drafts) let it drift back to the prior.
        for _ in 0..400 {
            c.observe(1, 12.0);
        }
        assert!((c.ratio() - PRIOR_RATIO).abs() < 0.01, "{}", c.ratio());
        assert_eq!(Method::parse("NGRAM"), Ok(Method::Ngram));
        assert!(Method::parse("eagle")
            .unwrap_err()
            .contains("off, ngram, draft"));
    }
}
