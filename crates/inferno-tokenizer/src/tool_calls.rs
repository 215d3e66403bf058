//! Tool calls in generated text: the Hermes-style blocks Qwen2.5 and Qwen3 chat templates
//! teach their models to write,
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! found in a stream of text pieces as they come ([`ToolCallParser`]). Text outside the
//! blocks passes through (held back only while it could be the start of a block); a block
//! is reported as one [`ToolCall`] once it is closed and its JSON parses. A block whose
//! JSON is not a call, or that is never closed, is given back as text: the caller loses
//! nothing the model wrote but the whitespace that only separates calls (the newline
//! between two blocks, or after the last), which is layout, not text: OpenAI's and vLLM's
//! replies have no content there.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call the model asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text (an object, as the model wrote it, re-serialized
    /// compactly).
    pub arguments: String,
}

/// What a piece of generated text turned into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Ordinary text (final: never part of a call).
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// Finds tool-call blocks in text that arrives in pieces.
#[derive(Clone, Debug, Default)]
pub struct ToolCallParser {
    /// Text not yet reported: a possible start of `<tool_call>` outside a block, or the
    /// whole block so far (from its opening tag) inside one.
    pending: String,
    in_block: bool,
    calls: usize,
    /// Only whitespace has come since the last call.
    after_call: bool,
    /// That whitespace, held: dropped when a call or the end follows, given back before
    /// anything else.
    gap: String,
}

impl ToolCallParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Whether the parser is inside a block (text that may still become a call).
    pub fn in_call(&self) -> bool {
        self.in_block
    }

    /// Feeds the next piece of text; returns what became final, in order.
    pub fn push(&mut self, piece: &str) -> Vec<Parsed> {
        let mut out = Vec::new();
        self.pending.push_str(piece);
        loop {
            if self.in_block {
                let Some(end) = self.pending.find(CLOSE) else {
                    break;
                };
                let block_end = end + CLOSE.len();
                let body = &self.pending[OPEN.len()..end];
                match parse_call(body) {
                    Some(call) => {
                        self.calls += 1;
                        self.gap.clear();
                        self.after_call = true;
                        out.push(Parsed::Call(call));
                    }
                    None => {
                        self.release(&mut out, block_end);
                        continue;
                    }
                }
                self.pending.drain(..block_end);
                self.in_block = false;
            } else if let Some(start) = self.pending.find(OPEN) {
                self.release(&mut out, start);
                self.in_block = true;
            } else {
                // Hold back the longest suffix that could begin an opening tag.
                let keep = (1..OPEN.len())
                    .rev()
                    .find(|&k| self.pending.ends_with(&OPEN[..k]))
                    .unwrap_or(0);
                self.release(&mut out, self.pending.len() - keep);
                break;
            }
        }
        out
    }

    /// Ends the text: whatever is still held (a possible tag start, an unclosed block) is
    /// text, but whitespace after the last call.
    pub fn finish(&mut self) -> Vec<Parsed> {
        let mut out = Vec::new();
        self.in_block = false;
        let len = self.pending.len();
        self.release(&mut out, len);
        self.gap.clear();
        out
    }

    /// Gives the first `len` bytes of what is held as text (a malformed block's too, which
    /// leaves the block), holding them instead while they are whitespace after a call.
    fn release(&mut self, out: &mut Vec<Parsed>, len: usize) {
        let text = &self.pending[..len];
        if self.after_call && !self.in_block && text.trim().is_empty() {
            self.gap.push_str(text);
        } else {
            push_text(out, &self.gap);
            self.gap.clear();
            push_text(out, text);
            self.after_call = false;
        }
        self.pending.drain(..len);
        self.in_block = false;
    }
}

fn push_text(out: &mut Vec<Parsed>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(Parsed::Text(t)) = out.last_mut() {
        t.push_str(text);
    } else {
        out.push(Parsed::Text(text.to_string()));
    }
}

/// A block's JSON as a call: an object with a string `name` and object `arguments`
/// (missing arguments are none; arguments given as a JSON string holding an object are
/// accepted, as some models write them).
fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?.to_string();
    let arguments = match obj.get("arguments") {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => {
            let inner: Value = serde_json::from_str(s).ok()?;
            inner.is_object().then_some(inner)?
        }
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return None,
    };
    Some(ToolCall {
        name,
        arguments: serde_json::to_string(&arguments).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(pieces: &[&str]) -> Vec<Parsed> {
        let mut p = ToolCallParser::new();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(p.push(piece));
        }
        out.extend(p.finish());
        // Adjacent texts from different pushes are one text to the reader.
        let mut merged: Vec<Parsed> = Vec::new();
        for e in out {
            match (merged.last_mut(), e) {
                (Some(Parsed::Text(a)), Parsed::Text(b)) => a.push_str(&b),
                (_, e) => merged.push(e),
            }
        }
        merged
    }

    fn call(name: &str, arguments: &str) -> Parsed {
        Parsed::Call(ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        })
    }

    const TWO: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
        {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \
        \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";

    #[test]
    fn several_calls_in_one_turn() {
        assert_eq!(
            feed(&[TWO]),
            vec![
                Parsed::Text("Let me check.\n".into()),
                call("get_weather", r#"{"city":"Paris","unit":"c"}"#),
                call("get_time", r#"{"tz":"Europe/Paris"}"#),
            ]
        );
    }

    /// Whitespace between calls and after the last is no text; text after a call is, with
    /// the whitespace before it, and so is a malformed block, every split alike.
    #[test]
    fn whitespace_that_only_separates_calls_is_dropped() {
        let f = "<tool_call>{\"name\": \"f\"}</tool_call>";
        let cases = [
            (
                format!("{f}\n \n{f}\n\n"),
                vec![call("f", "{}"), call("f", "{}")],
            ),
            (
                format!("{f}\n\nDone.\n{f}"),
                vec![
                    call("f", "{}"),
                    Parsed::Text("\n\nDone.\n".into()),
                    call("f", "{}"),
                ],
            ),
            (
                format!("{f}\n<tool_call>{{oops}}</tool_call>\n"),
                vec![
                    call("f", "{}"),
                    Parsed::Text("\n<tool_call>{oops}</tool_call>\n".into()),
                ],
            ),
            (
                format!("{f}\n<tool_call>{{\"name\""),
                vec![
                    call("f", "{}"),
                    Parsed::Text("\n<tool_call>{\"name\"".into()),
                ],
            ),
            (
                format!("{f}\n<tool"),
                vec![call("f", "{}"), Parsed::Text("\n<tool".into())],
            ),
            (
                format!(" \n{f}"),
                vec![Parsed::Text(" \n".into()), call("f", "{}")],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(feed(&[&text]), want, "{text:?}");
            for (i, _) in text.char_indices().skip(1) {
                assert_eq!(
                    feed(&[&text[..i], &text[i..]]),
                    want,
                    "{text:?} split at {i}"
                );
            }
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(feed(&pieces), want, "{text:?} by characters");
        }
    }

    #[test]
    fn calls_split_across_pieces_at_every_point_parse_the_same() {
        let whole = feed(&[TWO]);
        // Every split into two pieces, and the text one character at a time.
        for (i, _) in TWO.char_indices().skip(1) {
            assert_eq!(feed(&[&TWO[..i], &TWO[i..]]), whole, "split at {i}");
        }
        let chars: Vec<String> = TWO.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(feed(&pieces), whole);
    }

    #[test]
    fn text_is_released_as_soon_as_it_cannot_start_a_call() {
        let mut p = ToolCallParser::new();
        assert_eq!(p.push("a <tool"), vec![Parsed::Text("a ".into())]);
        assert_eq!(p.push("box> b"), vec![Parsed::Text("<toolbox> b".into())]);
        assert_eq!(p.push("<tool_call>{\"na"), vec![]);
        assert!(p.in_call());
        assert_eq!(
            p.push("me\": \"f\"}</tool_call>tail"),
            vec![call("f", "{}"), Parsed::Text("tail".into())]
        );
        assert_eq!(p.calls(), 1);
        assert_eq!(p.finish(), vec![]);
    }

    #[test]
    fn malformed_blocks_come_back_as_text() {
        for bad in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }</tool_call>",
            "<tool_call>not json at all</tool_call>",
            "<tool_call>[1, 2]</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>",
        ] {
            let text = format!("before {bad} after");
            assert_eq!(feed(&[&text]), vec![Parsed::Text(text.clone())], "{bad}");
        }
        // Never closed: all of it is text at the end, even a well-formed call.
        let open = "x <tool_call>{\"name\": \"f\", \"arguments\": {}}";
        assert_eq!(feed(&[open]), vec![Parsed::Text(open.into())]);
        // A malformed block does not hide a good one after it.
        assert_eq!(
            feed(&["<tool_call>{oops}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>"]),
            vec![
                Parsed::Text("<tool_call>{oops}</tool_call>".into()),
                call("g", "{}")
            ]
        );
    }

    #[test]
    fn arguments_given_as_a_json_string_are_unwrapped() {
        assert_eq!(
            feed(&["<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>"]),
            vec![call("f", r#"{"q":1}"#)]
        );
    }
}
