//! Fuzz target: the parser that splits a streamed reply into reasoning, answer text and tool
//! calls (`ReplyParser`). The engine feeds it one token's text at a time, so however a reply
//! is cut into pieces it must come out the same as when fed whole; without reasoning it
//! must give back untouched any reply that holds no call; reasoning never follows answer
//! text.
//!
//! Input: the first byte chooses the reasoning mode (none, may open a section, opened by
//! the prompt) and whether tool calls are looked for; in the rest, a NUL byte cuts a piece
//! and bytes from 0xF0 stand for fragments of the tags and JSON the parser looks for, so
//! the fuzzer reaches them without guessing them byte by byte.

#![no_main]

use inferno::tokenizer::reasoning::{ReasoningParser, ReplyParser};
use inferno::tokenizer::tool_calls::Parsed;
use libfuzzer_sys::fuzz_target;

const FRAGMENTS: [&str; 16] = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": [2]}\"}",
    "{\"name\": 3}",
    "\n",
    " ",
    "<",
    "</",
    "<tool_",
    "</thi",
    "é",
    "\u{3000}",
    "{",
];

/// The reply's pieces, in order.
fn pieces(data: &[u8]) -> Vec<String> {
    let mut out = vec![Vec::new()];
    for &b in data {
        match b {
            0 => out.push(Vec::new()),
            0xF0.. => out
                .last_mut()
                .expect("never empty")
                .extend_from_slice(FRAGMENTS[usize::from(b - 0xF0)].as_bytes()),
            _ => out.last_mut().expect("never empty").push(b),
        }
    }
    // Lossy per piece: the engine's pieces are whole characters too.
    out.iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// What a reply parsed to: the reasoning, and the answer with adjacent texts merged.
fn parse(make: &dyn Fn() -> ReplyParser, pieces: &[String]) -> (String, Vec<Parsed>) {
    let mut p = make();
    let mut reasoning = String::new();
    let mut answer: Vec<Parsed> = Vec::new();
    let mut take = |r: inferno::tokenizer::reasoning::ReplyPiece| {
        assert!(
            r.reasoning.is_empty() || answer.is_empty(),
            "reasoning after answer text: {pieces:?}"
        );
        reasoning.push_str(&r.reasoning);
        for e in r.answer {
            match (answer.last_mut(), e) {
                (Some(Parsed::Text(a)), Parsed::Text(b)) => a.push_str(&b),
                (_, Parsed::Text(b)) if b.is_empty() => {}
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

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tools = mode & 4 != 0;
    let make = move || {
        let reasoning = match mode & 3 {
            0 => None,
            1 => Some(ReasoningParser::new()),
            _ => Some(ReasoningParser::inside()),
        };
        ReplyParser::new(reasoning, tools)
    };
    let pieces = pieces(rest);
    let whole = [pieces.concat()];
    let split = parse(&make, &pieces);
    assert_eq!(split, parse(&make, &whole), "pieces {pieces:?}");
    // One character at a time, as a reply of one-character tokens streams.
    let chars: Vec<String> = whole[0].chars().map(String::from).collect();
    assert_eq!(split, parse(&make, &chars), "chars of {pieces:?}");
    // Without reasoning, text that holds no call comes back untouched: a malformed or
    // unclosed block is given back as it was written.
    if mode & 3 == 0 && split.1.iter().all(|e| matches!(e, Parsed::Text(_))) {
        let text: String = split
            .1
            .iter()
            .filter_map(|e| match e {
                Parsed::Text(t) => Some(t.as_str()),
                Parsed::Call(_) => None,
            })
            .collect();
        assert_eq!(text, whole[0]);
    }
});
