//! One generation: prefill the prompt, then sample and decode token by token until an end
//! condition, streaming valid UTF-8 text and measuring the run.
//!
//! Traced as a `prefill` span and one `decode_step` span (step, position) per decoded
//! token, at DEBUG level, inside the caller's `request` span when it has one.

use crate::model::{Logits, Model, ModelError, State};
use crate::sampling::{Sampler, SamplingError, SamplingParams};
use crate::tokenizer::Tokenizer;
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
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub time_limit: Option<Duration>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            time_limit: None,
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
    pub completion_tokens: usize,
    pub time_to_first_token_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub per_forward_ms_min: f64,
    pub per_forward_ms_max: f64,
    pub per_forward_ms_mean: f64,
    /// Forward calls measured (the prefill and every decode step).
    pub forward_calls: usize,
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
struct StopScan<'a> {
    stops: &'a [String],
    text: String,
    emitted: usize,
}

impl StopScan<'_> {
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
        for s in self.stops {
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

/// Generates from `prompt` (token ids) with a fresh sequence in `state`, calling `on_token`
/// for every token. `state` must have been made by `model.new_state`.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    state: &mut State,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(TokenEvent<'_>) -> Flow,
) -> Result<Generation, GenerateError> {
    let start = Instant::now();
    let mut sampler = Sampler::new(opts.sampling.clone(), model.config.vocab)?;
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if prompt.len() >= state.capacity() {
        return Err(GenerateError::PromptTooLong {
            prompt: prompt.len(),
            context: state.capacity(),
        });
    }
    state.reset();
    let vocab = model.config.vocab;
    let mut logits = vec![0.0f32; vocab];
    let mut history: Vec<u32> = Vec::with_capacity(prompt.len() + opts.max_tokens);
    history.extend_from_slice(prompt);
    let mut out_tokens = Vec::with_capacity(opts.max_tokens);
    let mut decoder = tokenizer.stream_decoder();
    let mut scan = StopScan {
        stops: &opts.stop,
        text: String::with_capacity(opts.max_tokens * 8),
        emitted: 0,
    };
    let mut forward_ms: Vec<f64> = Vec::with_capacity(opts.max_tokens + 1);

    let t0 = Instant::now();
    {
        let _span = debug_span!("prefill", tokens = prompt.len()).entered();
        model.forward(state, prompt, Logits::Last(&mut logits))?;
    }
    let prefill = t0.elapsed();
    forward_ms.push(prefill.as_secs_f64() * 1e3);
    let mut first_token_at = None;
    let mut decode_start = Instant::now();

    let finish = loop {
        if out_tokens.len() >= opts.max_tokens {
            break FinishReason::Length;
        }
        if opts.time_limit.is_some_and(|tl| start.elapsed() >= tl) {
            break FinishReason::TimeLimit;
        }
        let id = sampler.sample(&logits, &history);
        if first_token_at.is_none() {
            first_token_at = Some(start.elapsed());
            decode_start = Instant::now();
        }
        if !opts.ignore_eos && tokenizer.is_eog(id) {
            break FinishReason::Eos;
        }
        out_tokens.push(id);
        history.push(id);
        let piece = decoder.push(id);
        let (range, stopped) = scan.push(&piece);
        let flow = on_token(TokenEvent {
            id: Some(id),
            text: &scan.text[range],
            logits: &logits,
            index: out_tokens.len() - 1,
        });
        if stopped {
            break FinishReason::StopSequence;
        }
        if flow == Flow::Stop {
            break FinishReason::Cancelled;
        }
        if out_tokens.len() >= opts.max_tokens {
            break FinishReason::Length;
        }
        if state.position() >= state.capacity() {
            break FinishReason::Length;
        }
        let t = Instant::now();
        {
            let _span = debug_span!(
                "decode_step",
                step = out_tokens.len(),
                position = state.position()
            )
            .entered();
            model.forward(state, &[id], Logits::Last(&mut logits))?;
        }
        forward_ms.push(t.elapsed().as_secs_f64() * 1e3);
    };
    let decode_time = decode_start.elapsed();
    // Whatever the stop scan still held back is final now, unless a stop string ended it.
    if finish != FinishReason::StopSequence {
        let tail = decoder.finish();
        scan.text.push_str(&tail);
        let range = scan.flush();
        if !range.is_empty() {
            on_token(TokenEvent {
                id: None,
                text: &scan.text[range],
                logits: &logits,
                index: out_tokens.len(),
            });
        }
    }
    let n_fwd = forward_ms.len();
    let decode_steps = n_fwd.saturating_sub(1);
    let metrics = Metrics {
        prompt_tokens: prompt.len(),
        completion_tokens: out_tokens.len(),
        time_to_first_token_ms: first_token_at.unwrap_or(start.elapsed()).as_secs_f64() * 1e3,
        prefill_tokens_per_second: prompt.len() as f64 / prefill.as_secs_f64().max(1e-9),
        decode_tokens_per_second: if decode_steps > 0 {
            decode_steps as f64 / decode_time.as_secs_f64().max(1e-9)
        } else {
            0.0
        },
        per_forward_ms_min: forward_ms.iter().cloned().fold(f64::INFINITY, f64::min),
        per_forward_ms_max: forward_ms.iter().cloned().fold(0.0, f64::max),
        per_forward_ms_mean: forward_ms.iter().sum::<f64>() / n_fwd.max(1) as f64,
        forward_calls: n_fwd,
    };
    Ok(Generation {
        text: scan.text,
        tokens: out_tokens,
        finish_reason: finish,
        seed: sampler.seed(),
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::StopScan;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut scan = StopScan {
            stops: &stops,
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

    #[test]
    fn no_stops_streams_everything() {
        let (out, _, _) = run(&[], &["héllo", " wörld"]);
        assert_eq!(out, vec!["héllo", " wörld", ""]);
    }
}
