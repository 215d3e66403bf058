//! A request's reply as front-ends report it: the engine's events for one sequence
//! ([`Event`](super::Event)) split into reasoning, answer text and tool calls ([`Reply`]),
//! with the finish reason a turn that called tools ends with. Every front-end (gRPC, HTTP)
//! converts these pieces to its wire format; none parses the output itself.

use super::generate::FinishReason;
use super::job::{Done, TokenOut};
use super::plan::ToolCall;
use inferno_tokenizer::reasoning::{ReplyParser, ReplyPiece};
use inferno_tokenizer::tool_calls::Parsed;

/// What one generated token added to the reply.
#[derive(Debug)]
pub struct TokenPiece {
    /// The token (its text is split below).
    pub token: TokenOut,
    /// Reasoning text that became final with the token.
    pub reasoning: String,
    /// Answer text that became final with the token.
    pub text: String,
    /// Tool calls the token completed, after that text.
    pub calls: Vec<ToolCall>,
}

/// The end of a reply.
#[derive(Debug)]
pub struct Ending {
    /// Reasoning released only at the end.
    pub reasoning: String,
    /// Answer text released only at the end.
    pub text: String,
    /// Tool calls completed at the end.
    pub calls: Vec<ToolCall>,
    /// Every tool call of the reply, in order.
    pub all_calls: Vec<ToolCall>,
    /// The whole reasoning.
    pub reasoning_content: String,
    /// How the generation ended: `ToolCalls` for a turn that ended having called tools;
    /// `None` when it failed.
    pub finish_reason: Option<FinishReason>,
    pub done: Done,
}

/// Splits one sequence's output as it streams.
pub struct Reply {
    parser: ReplyParser,
    /// Whether the reply may hold more than one tool call (OpenAI's `parallel_tool_calls`):
    /// when not, calls after the first are dropped, as vLLM drops them.
    parallel_calls: bool,
    calls: Vec<ToolCall>,
    reasoning: String,
}

impl Reply {
    pub fn new(parser: ReplyParser, parallel_calls: bool) -> Self {
        Self {
            parser,
            parallel_calls,
            calls: Vec::new(),
            reasoning: String::new(),
        }
    }

    /// Splits a piece into reasoning, answer text and the calls it completes.
    fn split(&mut self, mut piece: ReplyPiece) -> (String, String, Vec<ToolCall>) {
        self.reasoning.push_str(&piece.reasoning);
        let mut text = String::new();
        let mut calls = Vec::new();
        for p in piece.answer.drain(..) {
            match p {
                Parsed::Text(t) => text.push_str(&t),
                Parsed::Call(_) if !self.parallel_calls && !self.calls.is_empty() => {}
                Parsed::Call(c) => {
                    let call = ToolCall {
                        id: format!("call_{:016x}", rand::random::<u64>()),
                        name: c.name,
                        arguments: c.arguments,
                    };
                    self.calls.push(call.clone());
                    calls.push(call);
                }
            }
        }
        (piece.reasoning, text, calls)
    }

    /// A generated token.
    pub fn token(&mut self, mut token: TokenOut) -> TokenPiece {
        let text = std::mem::take(&mut token.text);
        let piece = self.parser.push(&text);
        let (reasoning, text, calls) = self.split(piece);
        TokenPiece {
            token,
            reasoning,
            text,
            calls,
        }
    }

    /// The final event of a generation (what is still held is released).
    pub fn done(&mut self, mut done: Done) -> Ending {
        let tail = std::mem::take(&mut done.text);
        let mut piece = self.parser.push(&tail);
        let end = self.parser.finish();
        piece.reasoning.push_str(&end.reasoning);
        piece.answer.extend(end.answer);
        let (reasoning, text, calls) = self.split(piece);
        let mut finish_reason = done.finish_reason;
        if finish_reason == Some(FinishReason::Eos) && !self.calls.is_empty() {
            finish_reason = Some(FinishReason::ToolCalls);
        }
        Ending {
            reasoning,
            text,
            calls,
            all_calls: self.calls.clone(),
            reasoning_content: std::mem::take(&mut self.reasoning),
            finish_reason,
            done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Timings;
    use inferno_tokenizer::reasoning::ReasoningParser;

    fn token(index: usize, text: &str) -> TokenOut {
        TokenOut {
            index,
            id: index as u32,
            text: text.into(),
            logprobs: None,
        }
    }

    fn done(text: &str) -> Done {
        Done {
            finish_reason: Some(FinishReason::Eos),
            text: text.into(),
            prompt_tokens: 3,
            cached_prompt_tokens: 0,
            completion_tokens: 4,
            drafted_tokens: 0,
            accepted_tokens: 0,
            seed: 1,
            timings: Timings::default(),
        }
    }

    #[test]
    fn reasoning_text_and_calls_come_apart_and_calls_end_the_turn_as_such() {
        let mut r = Reply::new(ReplyParser::new(Some(ReasoningParser::new()), true), true);
        let a = r.token(token(0, "<think>\nhm"));
        assert_eq!(a.text, "");
        let b = r.token(token(
            1,
            "m\n</think>\n\nOk. <tool_call>\n{\"name\": \"f\", ",
        ));
        assert_eq!(a.reasoning + &b.reasoning, "hmm");
        assert_eq!(b.text, "Ok. ");
        let c = r.token(token(2, "\"arguments\": {\"x\": 1}}\n</tool_call>"));
        assert_eq!(c.calls.len(), 1);
        assert_eq!(c.calls[0].name, "f");
        assert_eq!(c.calls[0].arguments, "{\"x\":1}");
        assert!(c.calls[0].id.starts_with("call_"));
        let end = r.done(done(""));
        assert_eq!(end.finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(end.all_calls, c.calls);
        assert_eq!(end.reasoning_content, "hmm");
        assert!(end.calls.is_empty());
    }

    #[test]
    fn without_parsing_the_text_passes_through_and_the_tail_is_released() {
        let mut r = Reply::new(ReplyParser::new(None, false), true);
        assert_eq!(r.token(token(0, "<think>a")).text, "<think>a");
        let end = r.done(done("b"));
        assert_eq!(end.text, "b");
        assert_eq!(end.finish_reason, Some(FinishReason::Eos));
        assert!(end.reasoning_content.is_empty());
    }

    #[test]
    fn without_parallel_calls_the_first_call_alone_is_kept() {
        let two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\
                   <tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        for (parallel, names) in [(true, vec!["f", "g"]), (false, vec!["f"])] {
            let mut r = Reply::new(ReplyParser::new(None, true), parallel);
            let streamed = r.token(token(0, two)).calls;
            let end = r.done(done(""));
            let got: Vec<&str> = end.all_calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, names, "parallel {parallel}");
            assert_eq!(streamed, end.all_calls);
            assert_eq!(end.finish_reason, Some(FinishReason::ToolCalls));
        }
    }
}
