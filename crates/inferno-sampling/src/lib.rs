//! Choosing the next token from logits: greedy, or temperature sampling filtered by
//! top-k, top-p and min-p, after a logit bias and the repetition, frequency and presence
//! penalties; reproducible from a seed.
//!
//! The filter order is llama.cpp's: logit bias → penalties → top-k → top-p → min-p →
//! temperature → draw. A [`constraint`] (JSON schema, regex, grammar) masks the logits
//! before all of them.

pub mod constraint;
mod select;

pub use select::argmax;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 chooses greedily; otherwise logits are divided by it before the draw.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens (1 = off).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted from a token's logit once per time it occurs in those recent tokens
    /// (OpenAI's `frequency_penalty`, counted as llama.cpp counts it: over the last
    /// `repeat_last_n` tokens, prompt included). 0 = off.
    #[serde(default)]
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every token that occurs in those recent tokens
    /// (OpenAI's `presence_penalty`). 0 = off.
    #[serde(default)]
    pub presence_penalty: f32,
    /// Added to the logits of these tokens before the penalties (OpenAI's `logit_bias`):
    /// (token, bias) pairs, each bias in [-100, 100] ([`LOGIT_BIAS_RANGE`]). A token the
    /// model does not have is refused when the request is built, and ignored here.
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed for the draw; `None` picks one at random (reported by [`Sampler::seed`]).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        for (field, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            check_number(field, v.into())?;
        }
        for &(_, bias) in &self.logit_bias {
            check_number("logit_bias", bias.into())?;
        }
        Ok(())
    }

    /// The first token `logit_bias` names that a vocabulary of `vocab` tokens lacks.
    pub fn logit_bias_outside(&self, vocab: usize) -> Option<u32> {
        self.logit_bias
            .iter()
            .map(|&(t, _)| t)
            .find(|&t| t as usize >= vocab)
    }
}

/// The biases a `logit_bias` entry may add, as OpenAI's API documents them: -100 all but
/// bans a token, 100 all but forces it.
pub const LOGIT_BIAS_RANGE: std::ops::RangeInclusive<f64> = -100.0..=100.0;

/// Checks one sampling number against its range, on the value as the client sent it: a
/// JSON number is an `f64`, checked before it is narrowed to the `f32` the sampler keeps
/// ([`narrow`]), so that 1.00000001 is refused as a `top_p` rather than rounded to 1. Every
/// range lies within `f32`'s finite values. `field` is the parameter's name, which the
/// error repeats.
pub fn check_number(field: &'static str, value: f64) -> Result<(), SamplingError> {
    const MAX: f64 = f32::MAX as f64;
    let (ok, want) = match field {
        "temperature" => (
            (0.0..=MAX).contains(&value),
            "from 0 to 3.4e38 (a 32-bit float)",
        ),
        "top_p" => (value > 0.0 && value <= 1.0, "in (0, 1]"),
        "min_p" => ((0.0..=1.0).contains(&value), "in [0, 1]"),
        // `repetition_penalty` is the HTTP API's name for it (vLLM's).
        "repeat_penalty" | "repetition_penalty" => (
            value > 0.0 && value <= MAX,
            "greater than 0, at most 3.4e38 (a 32-bit float)",
        ),
        "frequency_penalty" | "presence_penalty" => ((-2.0..=2.0).contains(&value), "in [-2, 2]"),
        "logit_bias" => (LOGIT_BIAS_RANGE.contains(&value), "in [-100, 100]"),
        _ => (false, "a known sampling parameter"),
    };
    if ok {
        Ok(())
    } else {
        Err(SamplingError::Invalid { field, value, want })
    }
}

/// A checked sampling number as the sampler keeps it: the nearest `f32`, except that a
/// number too small for one keeps its sign (the least `f32` of that sign, not zero), so a
/// `top_p` of 1e-50 still means the most likely token alone.
pub fn narrow(value: f64) -> f32 {
    let v = value as f32;
    if v == 0.0 && value != 0.0 {
        f32::from_bits(1).copysign(value as f32)
    } else {
        v
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("invalid {field} {value:?}: must be {want}")]
    Invalid {
        field: &'static str,
        value: f64,
        want: &'static str,
    },
    #[error(
        "the model produced a non-finite logit ({value} for token {token}); \
         its weights are probably corrupt"
    )]
    NonFiniteLogits { token: usize, value: f32 },
    #[error("logits for {needed} rows were needed to verify the drafts, {got} were given")]
    MissingRows { needed: usize, got: usize },
    /// The grammar engine failed on a sequence it had accepted so far (its own fault, not
    /// the request's): a mask it could not compute, or a token its own mask allowed and it
    /// then refused.
    #[error(transparent)]
    Constraint(#[from] constraint::ConstraintError),
}

/// Checks that every logit is a finite number. NaN or infinite logits come from broken
/// weights (or an overflow); sampling them would pick token 0 every time with NaN
/// log-probabilities instead of failing.
pub fn check_logits(logits: &[f32]) -> Result<(), SamplingError> {
    match select::first_non_finite(logits) {
        None => Ok(()),
        Some((token, value)) => Err(SamplingError::NonFiniteLogits { token, value }),
    }
}

/// Samples tokens for one sequence; buffers are sized once for the vocabulary.
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    /// (token, logit or probability) candidates, reused every step.
    cand: Vec<(u32, f32)>,
    /// The logits after the bias and the penalties (empty when neither applies), reused
    /// every step.
    penalized: Vec<f32>,
    /// The radix sort's keys and its second buffer, when top-k keeps every token.
    keys: Vec<u64>,
    keys_tmp: Vec<u64>,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab: usize) -> Result<Self, SamplingError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(rand::random);
        // Top-k holds a few candidates more than k; otherwise every token is one.
        let narrows = select::narrows(params.top_k, vocab);
        let room = if narrows {
            select::top_k_room(params.top_k).min(vocab)
        } else {
            vocab
        };
        let mut s = Self {
            params,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            cand: Vec::with_capacity(room),
            penalized: Vec::new(),
            keys: Vec::new(),
            keys_tmp: Vec::new(),
        };
        if s.adjusts() {
            s.penalized.reserve(vocab);
        }
        if s.params.temperature != 0.0 && !narrows {
            s.keys.reserve(vocab);
            s.keys_tmp.reserve(vocab);
        }
        Ok(s)
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether a bias or a penalty changes the logits.
    fn adjusts(&self) -> bool {
        let p = &self.params;
        !p.logit_bias.is_empty()
            || p.repeat_penalty != 1.0
            || p.frequency_penalty != 0.0
            || p.presence_penalty != 0.0
    }

    /// Sizes the adjusted row for a sampler whose [`Sampler::sample_holding`] will hold
    /// tokens back, so that no step allocates it.
    pub fn reserve_row(&mut self, vocab: usize) {
        self.penalized.reserve(vocab);
    }

    /// Picks the next token. `history` is the sequence so far (prompt and output), used by
    /// the penalties.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_holding(logits, history, &[])
    }

    /// [`Sampler::sample`] with the tokens of `hold` taken out after the bias and the
    /// penalties, unless nothing else could be picked (a grammar that allows only them):
    /// a generation's enders before its `min_tokens`.
    pub fn sample_holding(&mut self, logits: &[f32], history: &[u32], hold: &[u32]) -> u32 {
        let p = &self.params;
        let logits = if self.adjusts() || !hold.is_empty() {
            self.penalized.clear();
            self.penalized.extend_from_slice(logits);
            bias(&mut self.penalized, &p.logit_bias);
            penalize(&mut self.penalized, history, p);
            hold_back(&mut self.penalized, hold);
            &self.penalized[..]
        } else {
            // Read in place: no copy of the row.
            logits
        };
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        if select::narrows(p.top_k, logits.len()) {
            // One pass over the row for the k best, not a list of the whole vocabulary.
            select::top_k(logits, p.top_k, &mut self.cand);
        } else {
            select::sort_all(logits, &mut self.cand, &mut self.keys, &mut self.keys_tmp);
        }
        draw(&mut self.cand, p, &mut self.rng)
    }
}

/// Draws a token from `cand`, the candidates (token, logit) in the sampler's order: the
/// top-p and min-p cuts (probabilities at temperature 1), then the temperature.
fn draw(cand: &mut Vec<(u32, f32)>, p: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    softmax_in_place(cand, 1.0);
    if p.top_p < 1.0 {
        let mut cum = 0.0f32;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            cum += c.1;
            if cum >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        let floor = cand[0].1 * p.min_p;
        let keep = cand.iter().take_while(|c| c.1 >= floor).count();
        cand.truncate(keep.max(1));
    }
    // Back to logits for the temperature: log p differs from the logit by a constant.
    for c in cand.iter_mut() {
        c.1 = c.1.max(f32::MIN_POSITIVE).ln();
    }
    softmax_in_place(cand, p.temperature);
    let r: f32 = rng.random::<f32>();
    let mut cum = 0.0f32;
    for c in cand.iter() {
        cum += c.1;
        if r < cum {
            return c.0;
        }
    }
    cand.last().map(|c| c.0).unwrap_or(0)
}

/// Sets the logits of the tokens of `hold` to −∞ when some other token keeps a finite
/// logit; otherwise leaves the row as it is. `hold` may name a token twice (a stop token
/// that is also end-of-generation).
fn hold_back(logits: &mut [f32], hold: &[u32]) {
    if hold.is_empty() {
        return;
    }
    // Stops at the first finite logit outside `hold`: at once on a row no grammar masked.
    let other_left = (0u32..)
        .zip(logits.iter())
        .any(|(t, l)| l.is_finite() && !hold.contains(&t));
    if other_left {
        for &t in hold {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Adds each (token, bias) of `logit_bias` to its token's logit; a token masked out (−∞)
/// stays out. A checked bias (at most 100 either way) cannot take a finite logit past
/// `f32`'s range: `f32::MAX + 100` rounds back to `f32::MAX`. Tokens beyond the row are
/// passed over.
fn bias(logits: &mut [f32], logit_bias: &[(u32, f32)]) {
    for &(tok, b) in logit_bias {
        if let Some(l) = logits.get_mut(tok as usize) {
            *l += b;
        }
    }
}

/// Applies the repetition, frequency and presence penalties of `p` to `logits` (indexed by
/// token) for the tokens of the last `repeat_last_n` of `history`.
fn penalize(logits: &mut [f32], history: &[u32], p: &SamplingParams) {
    let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
    for (i, &tok) in window.iter().enumerate() {
        // Each distinct token is penalised once, at its first occurrence.
        if window[..i].contains(&tok) {
            continue;
        }
        let Some(l) = logits.get_mut(tok as usize) else {
            continue;
        };
        // A token masked out (−∞) stays out.
        if !l.is_finite() {
            continue;
        }
        if p.repeat_penalty != 1.0 {
            *l = if *l > 0.0 {
                *l / p.repeat_penalty
            } else {
                *l * p.repeat_penalty
            };
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            let count = window[i..].iter().filter(|&&t| t == tok).count();
            *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
        // An extreme penalty (up to 3.4e38) saturates rather than overflowing to ±∞: at −∞
        // a token allowed by a grammar's mask would tie with those the mask took out, and
        // +∞ would make the probabilities NaN.
        *l = l.clamp(f32::MIN, f32::MAX);
    }
}

/// Replaces each candidate's logit by its probability at `temperature`.
fn softmax_in_place(cand: &mut [(u32, f32)], temperature: f32) {
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    let mut sum = 0.0f32;
    for c in cand.iter_mut() {
        c.1 = ((c.1 - max) / temperature).exp();
        sum += c.1;
    }
    for c in cand.iter_mut() {
        c.1 /= sum;
    }
}

/// Natural-log probability of every token, written into `out` (for logprobs reporting).
pub fn log_softmax(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = l - lse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_logits_are_found_by_position() {
        assert_eq!(check_logits(&[0.5, -3.0, 1e30]), Ok(()));
        assert_eq!(check_logits(&[]), Ok(()));
        match check_logits(&[0.5, -3.0, f32::NAN, 1.0]) {
            Err(SamplingError::NonFiniteLogits { token: 2, value }) => assert!(value.is_nan()),
            other => panic!("{other:?}"),
        }
        let e = check_logits(&[0.0, f32::NEG_INFINITY]).unwrap_err();
        assert_eq!(
            e,
            SamplingError::NonFiniteLogits {
                token: 1,
                value: f32::NEG_INFINITY
            }
        );
        assert!(e.to_string().contains("token 1"), "{e}");
    }

    /// Penalties at the ends of their ranges keep a masked-out token out and the others
    /// finite: the tokens a grammar allows, seen before with negative logits, multiplied by a
    /// penalty of 3.4e38, must still beat the tokens the mask set to −∞.
    #[test]
    fn extreme_penalties_saturate_and_keep_the_mask() {
        let ninf = f32::NEG_INFINITY;
        let masked = [ninf, ninf, -2.0, ninf, -1.5, ninf];
        for temperature in [0.0, 1.0] {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature,
                    repeat_penalty: f32::MAX,
                    frequency_penalty: 2.0,
                    presence_penalty: 2.0,
                    seed: Some(7),
                    ..SamplingParams::default()
                },
                masked.len(),
            )
            .unwrap();
            for _ in 0..20 {
                let t = s.sample(&masked, &[2, 4, 4]);
                assert!(
                    t == 2 || t == 4,
                    "temperature {temperature}: picked masked {t}"
                );
            }
        }
        // A tiny penalty divides a positive logit towards +∞; it stays finite, so the
        // probabilities are numbers and the pick is one of the allowed tokens.
        let mut s = Sampler::new(
            SamplingParams {
                repeat_penalty: f32::from_bits(1),
                min_p: 0.0,
                seed: Some(1),
                ..SamplingParams::default()
            },
            4,
        )
        .unwrap();
        for _ in 0..20 {
            let t = s.sample(&[2.0, ninf, 1.0, ninf], &[0, 2]);
            assert!(t == 0 || t == 2, "picked masked {t}");
        }
    }

    #[test]
    fn sampling_numbers_are_checked_as_sent_and_narrowed_keeping_their_sign() {
        assert!(check_number("top_p", 1.0).is_ok());
        // Rounded to 1 as an f32, but out of range as sent.
        assert!(check_number("top_p", 1.000_000_01).is_err());
        assert!(check_number("temperature", -1e-50).is_err());
        assert!(check_number("temperature", 1e39).is_err());
        assert!(check_number("temperature", f64::NAN).is_err());
        assert!(check_number("repeat_penalty", f32::MAX as f64).is_ok());
        assert!(check_number("frequency_penalty", 2.000_000_01).is_err());
        let e = check_number("min_p", 1.5).unwrap_err().to_string();
        assert_eq!(e, "invalid min_p 1.5: must be in [0, 1]");
        let e = check_number("repetition_penalty", 0.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid repetition_penalty 0.0: must be greater than 0"),
            "{e}"
        );
        assert_eq!(narrow(1e-50), f32::from_bits(1));
        assert_eq!(narrow(-1e-50), -f32::from_bits(1));
        assert_eq!(narrow(0.0), 0.0);
        assert_eq!(narrow(0.25), 0.25);
    }

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9, -1.0]
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy(), 6).unwrap();
        assert_eq!(s.sample(&logits(), &[]), 1);
    }

    #[test]
    fn repeat_penalty_moves_greedy_choice() {
        let params = SamplingParams {
            repeat_penalty: 1.5,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(params, 6).unwrap();
        // 3.0 / 1.5 = 2.0 < 2.9
        assert_eq!(s.sample(&logits(), &[1, 1, 1]), 4);
    }

    #[test]
    fn frequency_and_presence_penalties_subtract_per_count_and_once() {
        // Token 1 (3.0) seen twice, token 4 (2.9) once.
        let history = [1, 4, 1];
        let greedy_with = |frequency_penalty, presence_penalty| {
            let params = SamplingParams {
                frequency_penalty,
                presence_penalty,
                ..SamplingParams::greedy()
            };
            Sampler::new(params, 6).unwrap().sample(&logits(), &history)
        };
        assert_eq!(greedy_with(0.0, 0.0), 1);
        // Token 1: 3.0 - 2 * 0.3 = 2.4; token 4: 2.9 - 0.3 = 2.6; token 2 stays at 2.0.
        assert_eq!(greedy_with(0.3, 0.0), 4);
        // Presence alone moves both by the same amount: the order stays.
        assert_eq!(greedy_with(0.0, 0.5), 1);
        // Enough of both puts the unseen token 2 first.
        assert_eq!(greedy_with(0.5, 0.5), 2);
        // A negative penalty favours what was seen.
        assert_eq!(greedy_with(-0.5, 0.0), 1);
        assert!(Sampler::new(
            SamplingParams {
                presence_penalty: 2.5,
                ..SamplingParams::default()
            },
            6
        )
        .is_err());
    }

    #[test]
    fn logit_bias_adds_to_a_token_before_the_penalties() {
        let greedy_with = |logit_bias: Vec<(u32, f32)>, repeat_penalty| {
            let params = SamplingParams {
                logit_bias,
                repeat_penalty,
                ..SamplingParams::greedy()
            };
            Sampler::new(params, 6).unwrap().sample(&logits(), &[2])
        };
        assert_eq!(greedy_with(vec![], 1.0), 1);
        // Token 2: 2.0 + 1.5 = 3.5 beats token 1's 3.0; a ban takes token 1 out.
        assert_eq!(greedy_with(vec![(2, 1.5)], 1.0), 2);
        assert_eq!(greedy_with(vec![(1, -100.0)], 1.0), 4);
        // The bias first, then the penalty: (2.0 + 1.5) / 1.25 = 2.8 < 3.0; the other order
        // would give 2.0 / 1.25 + 1.5 = 3.1 and pick token 2.
        assert_eq!(greedy_with(vec![(2, 1.5)], 1.25), 1);
        // A token the row does not have is passed over.
        assert_eq!(greedy_with(vec![(6, 100.0), (99, 100.0)], 1.0), 1);
        // Forced at any temperature; a masked token stays masked, whatever its bias.
        let ninf = f32::NEG_INFINITY;
        let masked = [ninf, 3.0, ninf, 0.5, 2.9, ninf];
        for temperature in [0.0, 0.7, 2.0] {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature,
                    top_k: 0,
                    min_p: 0.0,
                    logit_bias: vec![(3, 100.0), (0, 100.0)],
                    seed: Some(3),
                    ..SamplingParams::default()
                },
                6,
            )
            .unwrap();
            for _ in 0..20 {
                assert_eq!(s.sample(&masked, &[]), 3, "temperature {temperature}");
            }
        }
        // At the ends of f32's range the sum stays finite.
        let mut row = [f32::MAX, f32::MIN, ninf];
        bias(&mut row, &[(0, 100.0), (1, -100.0), (2, 100.0)]);
        assert_eq!(row, [f32::MAX, f32::MIN, ninf]);
        for bad in [100.5, -101.0, f32::NAN, f32::INFINITY] {
            let p = SamplingParams {
                logit_bias: vec![(1, 0.0), (2, bad)],
                ..SamplingParams::default()
            };
            let e = Sampler::new(p, 6).err().expect("refused").to_string();
            assert!(e.starts_with("invalid logit_bias"), "{e}");
            assert!(e.ends_with("must be in [-100, 100]"), "{e}");
        }
    }

    #[test]
    fn held_tokens_are_not_picked_unless_nothing_else_is_left() {
        let mut s = Sampler::new(SamplingParams::greedy(), 6).unwrap();
        s.reserve_row(6);
        assert_eq!(s.sample_holding(&logits(), &[], &[1]), 4);
        assert_eq!(s.sample_holding(&logits(), &[], &[1, 4, 99]), 2);
        assert_eq!(s.sample_holding(&logits(), &[], &[]), 1);
        // A row (a grammar's) that allows only held tokens keeps them.
        let ninf = f32::NEG_INFINITY;
        // A token named twice is held once: token 4 is still left.
        let two = [ninf, 3.0, ninf, ninf, 2.9, ninf];
        assert_eq!(s.sample_holding(&two, &[], &[1, 1]), 4);
        assert_eq!(
            s.sample_holding(&[ninf, ninf, 0.5, ninf, ninf, ninf], &[], &[2]),
            2
        );
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.5,
                top_k: 0,
                min_p: 0.0,
                seed: Some(9),
                ..SamplingParams::default()
            },
            6,
        )
        .unwrap();
        for _ in 0..50 {
            assert!(![1, 2].contains(&s.sample_holding(&logits(), &[], &[1, 2])));
        }
    }

    #[test]
    fn top_k_one_is_greedy() {
        let params = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: Some(7),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, 6).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&logits(), &[]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_restrict_the_support() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.6,
            min_p: 0.0,
            seed: Some(1),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, 6).unwrap();
        for _ in 0..200 {
            let t = s.sample(&logits(), &[]);
            assert!(t == 1 || t == 4, "token {t} outside the top-p set");
        }
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: Some(1),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, 6).unwrap();
        for _ in 0..200 {
            let t = s.sample(&logits(), &[]);
            assert!([1, 4, 2].contains(&t), "token {t} below min-p");
        }
    }

    #[test]
    fn seed_makes_draws_reproducible() {
        let params = SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(42),
            ..SamplingParams::default()
        };
        let run = || {
            let mut s = Sampler::new(params.clone(), 6).unwrap();
            (0..64)
                .map(|_| s.sample(&logits(), &[]))
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|&t| t != a[0]), "high temperature should vary");
    }

    #[test]
    fn invalid_values_are_refused() {
        for p in [
            SamplingParams {
                temperature: -1.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                min_p: -0.1,
                ..Default::default()
            },
            SamplingParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p, 6).is_err());
        }
    }

    #[test]
    fn log_softmax_normalises() {
        let mut out = vec![0.0; 6];
        log_softmax(&logits(), &mut out);
        let total: f32 = out.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }

    /// The sampler's candidates as first written: every token of the penalized row
    /// listed, partitioned for top-k, sorted (or the first of the largest, greedy); then
    /// [`draw`], as [`Sampler::sample`] draws.
    fn sample_listing_every_token(
        p: &SamplingParams,
        rng: &mut ChaCha8Rng,
        logits: &[f32],
        history: &[u32],
    ) -> u32 {
        let mut row = logits.to_vec();
        bias(&mut row, &p.logit_bias);
        penalize(&mut row, history, p);
        let mut cand: Vec<(u32, f32)> = row
            .iter()
            .copied()
            .enumerate()
            .map(|(i, l)| (i as u32, l))
            .collect();
        if p.temperature == 0.0 {
            let mut best = (0u32, f32::NEG_INFINITY);
            for &(i, l) in &cand {
                if l > best.1 {
                    best = (i, l);
                }
            }
            return best.0;
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, select::by_logit_desc);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(select::by_logit_desc);
        draw(&mut cand, p, rng)
    }

    #[test]
    fn tokens_are_those_of_listing_every_candidate() {
        let mut rng = inferno_tensor::test_rng::TestRng::new(5);
        let vocab = 3000;
        for case in 0..48 {
            let params = SamplingParams {
                temperature: [0.0, 0.3, 0.8, 1.7][case % 4],
                top_k: [0, 1, 40, 64, 700, vocab - 1, vocab][case % 7],
                top_p: [1.0, 0.95, 0.5][case % 3],
                min_p: [0.0, 0.05][case % 2],
                repeat_penalty: [1.0, 1.3][(case / 2) % 2],
                frequency_penalty: [0.0, 0.4][(case / 3) % 2],
                presence_penalty: [0.0, -0.2][(case / 5) % 2],
                logit_bias: match case % 5 {
                    0 => vec![],
                    1 => vec![(7, 100.0), (2999, -100.0)],
                    _ => vec![(3, 2.5), (11, -1.25), (12, 0.0), (40, 6.0)],
                },
                seed: Some(case as u64),
                ..SamplingParams::default()
            };
            let mut sampler = Sampler::new(params.clone(), vocab).unwrap();
            let mut reference = ChaCha8Rng::seed_from_u64(case as u64);
            let mut history: Vec<u32> = (0..20).map(|_| rng.below(vocab) as u32).collect();
            for _ in 0..40 {
                // Logits of a few hundred distinct values (ties), some masked out.
                let logits: Vec<f32> = (0..vocab)
                    .map(|_| match rng.below(10) {
                        0 => f32::NEG_INFINITY,
                        _ => rng.below(400) as f32 / 25.0 - 8.0,
                    })
                    .collect();
                let want = sample_listing_every_token(&params, &mut reference, &logits, &history);
                let got = sampler.sample(&logits, &history);
                assert_eq!(got, want, "case {case}: {params:?}");
                history.push(got);
            }
        }
    }
}
