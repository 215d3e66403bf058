//! Reasoning in generated text: the `<think> ... </think>` section thinking models (Qwen3,
//! DeepSeek-R1 and their kin) write before their answer, told apart from the answer as the
//! text streams in ([`ReasoningParser`]), and [`ReplyParser`], which splits a reply into
//! reasoning, answer text and tool calls for whoever reports them (the service, the CLI).
//!
//! The rules:
//! - A reasoning section is recognised only at the start of the output (after whitespace):
//!   once answer text has begun, a later `<think>` is part of the answer. Text before a
//!   `<think>` is therefore answer text, and so is the `<think>`.
//! - A prompt that already opened the section (a template whose generation prompt ends in
//!   `<think>`) starts the output inside it ([`ReasoningParser::inside`]).
//! - The tags are dropped, and so is the whitespace around the reasoning and before the
//!   answer (Qwen3 writes `<think>\n...\n</think>\n\n`).
//! - A section never closed makes everything after `<think>` reasoning.
//!
//! Tags may arrive split across pieces (or whole, as one special token's text): text is
//! held back only while it could still be part of a tag or of whitespace to drop.

use super::tool_calls::{Parsed, ToolCallParser};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace (or a possible start of `<think>`) so far.
    Start,
    Reasoning,
    Answer,
}

/// What became final with a piece: reasoning first, then answer text (reasoning never
/// follows the answer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub answer: String,
}

/// Separates the reasoning section from the answer in text that arrives in pieces.
#[derive(Clone, Debug)]
pub struct ReasoningParser {
    state: State,
    /// Text not yet final: a possible `<think>` and the whitespace before it, or a possible
    /// `</think>` and the whitespace before it.
    pending: String,
    /// Whitespace at the start of the current section is dropped.
    trim_start: bool,
}

impl Default for ReasoningParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ReasoningParser {
    /// For output that may open with a reasoning section.
    pub fn new() -> Self {
        Self {
            state: State::Start,
            pending: String::new(),
            trim_start: false,
        }
    }

    /// For output whose prompt already opened the reasoning section.
    pub fn inside() -> Self {
        Self {
            state: State::Reasoning,
            pending: String::new(),
            trim_start: true,
        }
    }

    /// For the text at the end of a prompt (its last few tokens decoded): inside the
    /// section when the prompt ends with an open `<think>`.
    pub fn after_prompt(prompt_tail: &str) -> Self {
        if prompt_tail.trim_end().ends_with(OPEN) {
            Self::inside()
        } else {
            Self::new()
        }
    }

    /// Whether the output is (so far) inside the reasoning section.
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// Feeds the next piece of text; returns what became final.
    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        self.pending.push_str(piece);
        loop {
            match self.state {
                State::Start => {
                    let rest = self.pending.trim_start();
                    if rest.starts_with(OPEN) {
                        let end = self.pending.len() - rest.len() + OPEN.len();
                        self.pending.drain(..end);
                        self.state = State::Reasoning;
                        self.trim_start = true;
                    } else if OPEN.starts_with(rest) {
                        // Whitespace, or a tag still arriving.
                        break;
                    } else {
                        self.state = State::Answer;
                        self.trim_start = false;
                    }
                }
                State::Reasoning => {
                    if self.trim_start && !self.drop_leading_whitespace() {
                        break;
                    }
                    if let Some(at) = self.pending.find(CLOSE) {
                        out.reasoning.push_str(self.pending[..at].trim_end());
                        self.pending.drain(..at + CLOSE.len());
                        self.state = State::Answer;
                        self.trim_start = true;
                        continue;
                    }
                    // Hold back a possible start of `</think>` and the whitespace before it
                    // (dropped if the tag follows).
                    let keep = (1..CLOSE.len())
                        .rev()
                        .find(|&k| self.pending.ends_with(&CLOSE[..k]))
                        .unwrap_or(0);
                    let cut = self.pending[..self.pending.len() - keep].trim_end().len();
                    out.reasoning.push_str(&self.pending[..cut]);
                    self.pending.drain(..cut);
                    break;
                }
                State::Answer => {
                    if self.trim_start && !self.drop_leading_whitespace() {
                        break;
                    }
                    out.answer.push_str(&self.pending);
                    self.pending.clear();
                    break;
                }
            }
        }
        out
    }

    /// Ends the text: a possible tag start still held is text of the section it is in (an
    /// unclosed section is all reasoning); whitespace held before a tag that never came is
    /// dropped with the section's trailing whitespace.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        match self.state {
            State::Start => out.answer.push_str(&self.pending),
            State::Reasoning => {
                let held = if self.trim_start {
                    self.pending.trim()
                } else {
                    self.pending.trim_end()
                };
                out.reasoning.push_str(held);
            }
            State::Answer => {
                if !self.trim_start {
                    out.answer.push_str(&self.pending);
                }
            }
        }
        self.pending.clear();
        self.state = State::Answer;
        self.trim_start = false;
        out
    }

    /// Drops whitespace at the start of `pending`; false when nothing else is left yet.
    fn drop_leading_whitespace(&mut self) -> bool {
        let ws = self.pending.len() - self.pending.trim_start().len();
        self.pending.drain(..ws);
        if self.pending.is_empty() {
            return false;
        }
        self.trim_start = false;
        true
    }
}

/// What a piece of a reply turned into.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyPiece {
    /// Reasoning text that became final (always empty without reasoning separation).
    pub reasoning: String,
    /// Answer text and complete tool calls, in order (calls only with tools).
    pub answer: Vec<Parsed>,
}

/// Splits a reply as it streams: the reasoning section (when asked to separate it), then
/// the answer, in which tool calls are found (when the request has tools).
#[derive(Clone, Debug, Default)]
pub struct ReplyParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
}

impl ReplyParser {
    /// `reasoning`: separate the reasoning section with this parser (`None`: all of the
    /// output is answer); `tools`: find tool calls in the answer.
    pub fn new(reasoning: Option<ReasoningParser>, tools: bool) -> Self {
        Self {
            reasoning,
            tools: tools.then(ToolCallParser::new),
        }
    }

    /// Whether tool calls are looked for.
    pub fn finds_tools(&self) -> bool {
        self.tools.is_some()
    }

    pub fn push(&mut self, piece: &str) -> ReplyPiece {
        let split = match &mut self.reasoning {
            Some(r) => r.push(piece),
            None => Split {
                reasoning: String::new(),
                answer: piece.to_string(),
            },
        };
        self.answer(split, false)
    }

    /// Ends the reply: everything still held is released.
    pub fn finish(&mut self) -> ReplyPiece {
        let split = match &mut self.reasoning {
            Some(r) => r.finish(),
            None => Split::default(),
        };
        self.answer(split, true)
    }

    fn answer(&mut self, split: Split, last: bool) -> ReplyPiece {
        let answer = match &mut self.tools {
            None if split.answer.is_empty() => Vec::new(),
            None => vec![Parsed::Text(split.answer)],
            Some(t) => {
                let mut parsed = t.push(&split.answer);
                if last {
                    parsed.extend(t.finish());
                }
                parsed
            }
        };
        ReplyPiece {
            reasoning: split.reasoning,
            answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::ToolCall;

    /// Feeds the pieces and returns the whole reasoning and answer.
    fn feed(mut p: ReasoningParser, pieces: &[&str]) -> (String, String) {
        let (mut r, mut a) = (String::new(), String::new());
        for piece in pieces {
            let s = p.push(piece);
            // Reasoning never comes after answer text.
            assert!(s.reasoning.is_empty() || a.is_empty(), "{pieces:?}");
            r.push_str(&s.reasoning);
            a.push_str(&s.answer);
        }
        let s = p.finish();
        assert!(s.reasoning.is_empty() || a.is_empty(), "{pieces:?}");
        r.push_str(&s.reasoning);
        a.push_str(&s.answer);
        (r, a)
    }

    fn pair(r: &str, a: &str) -> (String, String) {
        (r.to_string(), a.to_string())
    }

    /// The same text split into two pieces at every char boundary, and one char at a time,
    /// parses as it does whole.
    fn check_splits(make: fn() -> ReasoningParser, text: &str, expected: (String, String)) {
        assert_eq!(feed(make(), &[text]), expected, "whole: {text:?}");
        for (i, _) in text.char_indices().skip(1) {
            assert_eq!(
                feed(make(), &[&text[..i], &text[i..]]),
                expected,
                "{text:?} split at byte {i}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(make(), &pieces), expected, "char by char: {text:?}");
    }

    #[test]
    fn a_qwen3_reply_splits_at_every_byte_offset() {
        let text = "<think>\nThe user wants 2+2 — that is 4.\n</think>\n\nIt is 4.";
        check_splits(
            ReasoningParser::new,
            text,
            pair("The user wants 2+2 — that is 4.", "It is 4."),
        );
        // Leading whitespace before the tag, and text with tag look-alikes inside.
        check_splits(
            ReasoningParser::new,
            "\n <think>a </thin b <think> c</think>d </think> e",
            pair("a </thin b <think> c", "d </think> e"),
        );
    }

    #[test]
    fn a_prompt_that_opened_the_section_starts_inside_it() {
        check_splits(
            ReasoningParser::inside,
            "\nhmm, fine\n</think>\n\nok",
            pair("hmm, fine", "ok"),
        );
        // A closing tag right away: empty reasoning.
        check_splits(ReasoningParser::inside, "</think>ok", pair("", "ok"));
        assert!(ReasoningParser::after_prompt("<|im_start|>assistant\n<think>\n").in_reasoning());
        assert!(!ReasoningParser::after_prompt("<|im_start|>assistant\n").in_reasoning());
        // Qwen3 with thinking off writes an empty, closed section into the prompt.
        assert!(
            !ReasoningParser::after_prompt("assistant\n<think>\n\n</think>\n\n").in_reasoning()
        );
    }

    #[test]
    fn an_unclosed_section_is_all_reasoning() {
        check_splits(
            ReasoningParser::new,
            "<think>still going </thi",
            pair("still going </thi", ""),
        );
        check_splits(ReasoningParser::new, "<think>\n\n", pair("", ""));
        check_splits(ReasoningParser::inside, "no end  ", pair("no end", ""));
    }

    #[test]
    fn text_before_a_think_tag_is_answer_and_so_is_the_tag() {
        check_splits(
            ReasoningParser::new,
            "Sure. <think>x</think>y",
            pair("", "Sure. <think>x</think>y"),
        );
        // No section at all: the text is untouched, whitespace included.
        check_splits(ReasoningParser::new, "  plain\n", pair("", "  plain\n"));
        // Only a tag prefix, or only whitespace, at the end: text.
        check_splits(ReasoningParser::new, "<thi", pair("", "<thi"));
        check_splits(ReasoningParser::new, " \n", pair("", " \n"));
        check_splits(ReasoningParser::new, "<thinking>", pair("", "<thinking>"));
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_be_a_tag() {
        let mut p = ReasoningParser::new();
        assert_eq!(p.push(" <th"), Split::default());
        assert_eq!(p.push("ink>"), Split::default());
        assert!(p.in_reasoning());
        let s = p.push("\nabc <");
        assert_eq!(s.reasoning, "abc");
        let s = p.push("b>");
        assert_eq!(s.reasoning, " <b>");
        let s = p.push("</think>");
        assert_eq!(s, Split::default());
        assert!(!p.in_reasoning());
        let s = p.push("\n\nans");
        assert_eq!(s.answer, "ans");
        assert_eq!(p.push(" wer").answer, " wer");
        assert_eq!(p.finish(), Split::default());
    }

    /// Qwen3's `<think>` and `</think>` are tokens of their own: a reply generated token by
    /// token, decoded as the engine streams it, splits as its text does.
    #[test]
    fn qwen3_think_tokens_streamed_one_by_one() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizer"
        );
        let gguf = inferno_gguf::GgufFile::open(format!("{dir}/qwen3-vocab.gguf")).unwrap();
        let tok = crate::Tokenizer::from_gguf(&gguf).unwrap();
        let reply = "<think>\nZürich is in CET.\n</think>\n\nIt is 13:00 in Zürich.";
        let ids = tok.encode(reply, true).unwrap();
        let open = tok.token_id("<think>").unwrap();
        let close = tok.token_id("</think>").unwrap();
        assert_eq!(ids[0], open);
        assert!(ids.contains(&close));
        let mut dec = tok.stream_decoder();
        let mut p = ReasoningParser::new();
        let (mut r, mut a) = (String::new(), String::new());
        for &id in &ids {
            let s = p.push(&dec.push(id));
            r.push_str(&s.reasoning);
            a.push_str(&s.answer);
        }
        let s = p.push(&dec.finish());
        r.push_str(&s.reasoning);
        a.push_str(&s.answer);
        let s = p.finish();
        r.push_str(&s.reasoning);
        a.push_str(&s.answer);
        assert_eq!(
            (r.as_str(), a.as_str()),
            ("Zürich is in CET.", "It is 13:00 in Zürich.")
        );
    }

    /// Feeds the pieces to `p` and returns the whole reasoning and answer, adjacent answer
    /// texts merged (where one push's text ends and the next begins means nothing to a
    /// reader). Reasoning never comes after answer text.
    fn parse_reply(mut p: ReplyParser, pieces: &[&str]) -> (String, Vec<Parsed>) {
        let mut reasoning = String::new();
        let mut answer: Vec<Parsed> = Vec::new();
        let mut take = |r: ReplyPiece| {
            assert!(r.reasoning.is_empty() || answer.is_empty(), "{pieces:?}");
            reasoning.push_str(&r.reasoning);
            for e in r.answer {
                match (answer.last_mut(), e) {
                    (Some(Parsed::Text(a)), Parsed::Text(b)) => a.push_str(&b),
                    (_, e) => answer.push(e),
                }
            }
        };
        for piece in pieces {
            take(p.push(piece));
        }
        take(p.finish());
        (reasoning, answer)
    }

    #[test]
    fn tool_calls_are_found_in_the_answer_only() {
        let text = "<think>I could write <tool_call>{\"name\": \"x\"}</tool_call> here\
            </think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let run = |pieces: &[&str]| {
            parse_reply(ReplyParser::new(Some(ReasoningParser::new()), true), pieces)
        };
        // After </think> the answer's leading newline is dropped.
        let expected = (
            "I could write <tool_call>{\"name\": \"x\"}</tool_call> here".to_string(),
            vec![Parsed::Call(ToolCall {
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            })],
        );
        assert_eq!(run(&[text]), expected);
        for (i, _) in text.char_indices().skip(1) {
            assert_eq!(run(&[&text[..i], &text[i..]]), expected, "split at {i}");
        }
        // Without separation the reasoning is answer text (and its call-like text is
        // parsed as a call, as before).
        let mut p = ReplyParser::new(None, false);
        let r = p.push(text);
        assert!(r.reasoning.is_empty());
        assert_eq!(r.answer, vec![Parsed::Text(text.into())]);
        assert_eq!(p.finish(), ReplyPiece::default());
    }

    /// The fuzz target's property (`fuzz/fuzz_targets/reply_parser.rs`) on stable Rust:
    /// random replies built from the tags and fragments the parser looks for, in every
    /// mode, parse alike whole, in random pieces and one character at a time.
    #[test]
    fn random_replies_parse_alike_however_they_are_cut() {
        let fragments = [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<tool_",
            "</thi",
            "<",
            "\n",
            " ",
            "x",
            "é",
            "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
            "{\"name\": 3}",
        ];
        let mut rng = inferno_tensor::test_rng::TestRng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: usize| rng.below(n);
        let parse = |mode: usize, pieces: &[&str]| {
            let reasoning = match mode % 3 {
                0 => None,
                1 => Some(ReasoningParser::new()),
                _ => Some(ReasoningParser::inside()),
            };
            parse_reply(ReplyParser::new(reasoning, mode >= 3), pieces)
        };
        for case in 0..3000 {
            let mode = next(6);
            let text: String = (0..next(12))
                .map(|_| fragments[next(fragments.len())])
                .collect();
            let mut cuts: Vec<usize> = (0..next(5))
                .map(|_| next(text.len() + 1))
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([text.len()]) {
                pieces.push(&text[from..c]);
                from = c;
            }
            let whole = parse(mode, &[&text]);
            assert_eq!(
                parse(mode, &pieces),
                whole,
                "case {case}, mode {mode}: {pieces:?}"
            );
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(
                parse(mode, &chars),
                whole,
                "case {case}, mode {mode}: {text:?}"
            );
        }
    }
}
