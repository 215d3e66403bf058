//! Constrained decoding: a response format (JSON schema, any JSON object, regex, Lark
//! grammar) compiled by llguidance over the model's vocabulary ([`GrammarCompiler`]), and
//! the per-step token mask that keeps a sequence's sampling inside it ([`Constraint`]).
//!
//! End-of-generation tokens are part of the mask: they are allowed exactly when the grammar
//! accepts what was generated so far. Once the grammar can take nothing more, the sequence
//! ends.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tokenizer::{TokenType, Tokenizer};

/// What the generated text must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseFormat {
    /// A JSON value valid under this JSON schema (given as JSON text).
    JsonSchema(String),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression in full (Rust `regex` syntax).
    Regex(String),
    /// Text in the language of this grammar (llguidance's Lark dialect, rule `start`).
    Lark(String),
}

impl ResponseFormat {
    /// The format's name as the API spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "json_schema",
            Self::JsonObject => "json_object",
            Self::Regex(_) => "regex",
            Self::Lark(_) => "lark",
        }
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    #[error("response_format json_schema is not valid JSON: {0}")]
    SchemaNotJson(String),
    #[error("response_format json_schema must be a JSON object (got {0})")]
    SchemaNotObject(&'static str),
    #[error("cannot compile the {kind} response format: {message}")]
    Compile { kind: &'static str, message: String },
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocabulary(String),
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

/// Compiles response formats for one model's vocabulary. Built once per model (the token
/// trie and llguidance's token classes take a moment), shared by every request.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

/// JSON is generated compactly with one space after `,` and `:` (as `json.dumps` writes
/// it), with no other whitespace: a small model left free to add whitespace can fill its
/// whole budget with newlines.
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

impl GrammarCompiler {
    /// A compiler over `tokenizer`'s tokens for logits of `vocab` entries (ids past the
    /// tokenizer's vocabulary, padding of the output matrix, are never allowed).
    pub fn new(tokenizer: &Tokenizer, vocab: usize) -> Result<Self, ConstraintError> {
        let n = vocab.max(tokenizer.vocab_size());
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = tokenizer.token_bytes(id).unwrap_or(&[]);
            let word = if tokenizer.token_type(id) == Some(TokenType::Control) {
                // toktrie's convention: special tokens start with 0xFF, a byte no text
                // contains, so no grammar matches them as text.
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(bytes);
                w
            } else {
                bytes.to_vec()
            };
            words.push(word);
        }
        let eog: Vec<u32> = tokenizer
            .eog_ids()
            .iter()
            .copied()
            .filter(|&t| (t as usize) < n)
            .collect();
        let Some(&first_eog) = eog.first() else {
            return Err(ConstraintError::Vocabulary(
                "the model has no end-of-generation token".into(),
            ));
        };
        let info = TokRxInfo::new(n as u32, first_eog);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        // Problems go into the errors returned, not onto the server's stderr.
        factory.quiet();
        Ok(Self { factory, vocab: n })
    }

    /// Compiles `format`, refusing a schema, regex or grammar llguidance cannot use (with
    /// its reason).
    pub fn compile(&self, format: &ResponseFormat) -> Result<Grammar, ConstraintError> {
        let kind = format.kind();
        let grammar = match format {
            ResponseFormat::JsonSchema(text) => {
                let mut schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| ConstraintError::SchemaNotJson(e.to_string()))?;
                if !schema.is_object() {
                    return Err(ConstraintError::SchemaNotObject(json_type_name(&schema)));
                }
                json_options().apply_to(&mut schema);
                TopLevelGrammar::from_json_schema(schema)
            }
            ResponseFormat::JsonObject => {
                let mut schema = serde_json::json!({ "type": "object" });
                json_options().apply_to(&mut schema);
                TopLevelGrammar::from_json_schema(schema)
            }
            ResponseFormat::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ResponseFormat::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let compile_err = |e: String| ConstraintError::Compile {
            kind,
            message: one_line(&e),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| compile_err(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        // Some problems (an unsatisfiable schema, a lexer conflict) only show once the
        // first mask is asked for; asking now keeps them out of the queue.
        matcher
            .compute_mask()
            .map_err(|e| compile_err(e.to_string()))?;
        if let Some(e) = matcher.get_error() {
            return Err(compile_err(e));
        }
        Ok(Grammar {
            matcher,
            kind,
            vocab: self.vocab,
        })
    }
}

/// A Lark grammar for exactly one Hermes-style tool call, `<tool_call>\n{json}\n</tool_call>`,
/// whose JSON is valid under `call_schema` (an object schema of `name` and `arguments`);
/// the JSON is written as [`ResponseFormat::JsonSchema`] writes it.
pub fn tool_call_grammar(call_schema: &serde_json::Value) -> ResponseFormat {
    let mut schema = call_schema.clone();
    if schema.is_object() {
        json_options().apply_to(&mut schema);
    }
    ResponseFormat::Lark(format!(
        "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
    ))
}

/// llguidance's messages can span lines (a caret under the bad spot); errors here are
/// one line, for a status message or a log line.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(" ")
}

fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A compiled response format in its start state; each sequence that uses it starts a
/// [`Constraint`] from a copy (the compiled grammar itself is shared).
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    kind: &'static str,
    vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Grammar {
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// A fresh matcher for one sequence.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.clone(),
            vocab: self.vocab,
            mask_time: Duration::ZERO,
            masks: 0,
        }
    }
}

/// One sequence's position in its grammar.
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    mask_time: Duration,
    masks: usize,
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to −∞ (`logits` may be shorter
    /// or longer than the vocabulary the grammar knows: entries past it are disallowed).
    /// Returns how long computing the mask took.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<Duration, ConstraintError> {
        let t0 = Instant::now();
        let mask = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
        apply_mask(&mask, logits);
        let took = t0.elapsed();
        self.mask_time += took;
        self.masks += 1;
        if mask.is_zero() {
            return Err(ConstraintError::Matcher(
                "the grammar allows no token here".into(),
            ));
        }
        Ok(took)
    }

    /// Advances the grammar by the sampled token.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Matcher(e.to_string()))
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar can take no further token (the sequence should end).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Total time spent computing masks, and how many were computed.
    pub fn mask_stats(&self) -> (Duration, usize) {
        (self.mask_time, self.masks)
    }

    /// The vocabulary size the grammar's masks cover.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// Writes −∞ over every logit whose bit in `mask` is clear. Whole words of allowed tokens
/// are skipped, so a permissive mask costs one pass over the bitset.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_vocab::{VocabBuilder, CONTROL};
    use rand::{Rng, SeedableRng};

    /// Byte tokens, a few multi-byte ones, `<|im_end|>` (end of generation), and logits
    /// padded past the vocabulary as a model's output matrix may be.
    fn compiler() -> (Tokenizer, GrammarCompiler, u32, usize) {
        let mut v = VocabBuilder::new();
        for w in [&b"12"[..], b"{\"", b"\": ", b"true", b"abc", b"\n\n"] {
            v.bytes_token(w);
        }
        let end = v.token("<|im_end|>", CONTROL);
        let tok = v.build();
        let vocab = tok.vocab_size() + 7;
        let c = GrammarCompiler::new(&tok, vocab).unwrap();
        (tok, c, end, vocab)
    }

    /// Samples uniformly among the allowed tokens until end-of-generation or the grammar
    /// finishes; checks that the end token is allowed exactly when the grammar accepts.
    fn walk(tok: &Tokenizer, g: &Grammar, end: u32, vocab: usize, seed: u64) -> String {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut c = g.start();
        let mut logits = vec![0.0f32; vocab];
        let mut ids = Vec::new();
        for _ in 0..200 {
            logits.fill(0.0);
            c.mask_logits(&mut logits).unwrap();
            assert!(logits[tok.vocab_size()..].iter().all(|l| l.is_infinite()));
            assert_eq!(
                logits[end as usize].is_finite(),
                c.is_accepting(),
                "{ids:?}"
            );
            let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i].is_finite()).collect();
            let pick = allowed[rng.random_range(0..allowed.len())] as u32;
            if pick == end {
                break;
            }
            c.commit(pick).unwrap();
            ids.push(pick);
            if c.is_finished() {
                assert!(c.is_accepting());
                break;
            }
        }
        tok.decode(&ids, false).unwrap()
    }

    #[test]
    fn random_walks_stay_inside_a_regex_and_end_only_when_it_matches() {
        let (tok, comp, end, vocab) = compiler();
        let rx = "(ab|12)[0-9]{1,3}(true)?";
        let g = comp.compile(&ResponseFormat::Regex(rx.into())).unwrap();
        let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
        for seed in 0..40 {
            let text = walk(&tok, &g, end, vocab, seed);
            assert!(full.is_match(&text), "{text:?} does not match {rx}");
        }
    }

    #[test]
    fn random_walks_of_a_schema_give_valid_json() {
        let (tok, comp, end, vocab) = compiler();
        let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"},
            "n":{"type":"integer","minimum":1,"maximum":99}},"required":["ok","n"],
            "additionalProperties":false}"#;
        let g = comp
            .compile(&ResponseFormat::JsonSchema(schema.into()))
            .unwrap();
        for seed in 0..20 {
            let text = walk(&tok, &g, end, vocab, seed);
            let v: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v["ok"].is_boolean(), "{text}");
            let n = v["n"].as_i64().unwrap();
            assert!((1..=99).contains(&n), "{text}");
            assert_eq!(v.as_object().unwrap().len(), 2, "{text}");
        }
    }

    #[test]
    fn a_lark_grammar_is_followed() {
        let (tok, comp, end, vocab) = compiler();
        let g = comp
            .compile(&ResponseFormat::Lark(
                "start: item (\",\" item)*\nitem: \"true\" | /[0-9]+/".into(),
            ))
            .unwrap();
        let item = regex::Regex::new("^(true|[0-9]+)$").unwrap();
        for seed in 0..20 {
            let text = walk(&tok, &g, end, vocab, seed);
            assert!(text.split(',').all(|i| item.is_match(i)), "{text:?}");
        }
    }

    #[test]
    fn formats_that_cannot_compile_say_why() {
        let (_, comp, _, _) = compiler();
        let err = |f: ResponseFormat| comp.compile(&f).unwrap_err();
        assert!(matches!(
            err(ResponseFormat::JsonSchema("{not json".into())),
            ConstraintError::SchemaNotJson(_)
        ));
        assert_eq!(
            err(ResponseFormat::JsonSchema("true".into())),
            ConstraintError::SchemaNotObject("a boolean")
        );
        for (f, kind) in [
            (ResponseFormat::Regex("(unclosed".into()), "regex"),
            (ResponseFormat::Lark("start: missing_rule".into()), "lark"),
            (
                ResponseFormat::JsonSchema(r#"{"type":"integer","minimum":5,"maximum":1}"#.into()),
                "json_schema",
            ),
            (
                ResponseFormat::JsonSchema(r#"{"type":"string","format":"no-such"}"#.into()),
                "json_schema",
            ),
        ] {
            match err(f.clone()) {
                ConstraintError::Compile { kind: k, message } => {
                    assert_eq!(k, kind, "{f:?}");
                    assert!(!message.is_empty() && !message.contains('\n'), "{message}");
                    let shown = ConstraintError::Compile { kind: k, message }.to_string();
                    assert!(shown.contains(kind), "{shown}");
                }
                e => panic!("{f:?}: {e:?}"),
            }
        }
    }

    #[test]
    fn mask_clears_exactly_the_disallowed_logits() {
        let mut mask = SimpleVob::alloc(70);
        for t in [0u32, 31, 32, 33, 69] {
            mask.allow_token(t);
        }
        // 72 logits: two past the mask's end, which are disallowed.
        let mut logits = vec![1.0f32; 72];
        apply_mask(&mask, &mut logits);
        for (i, l) in logits.iter().enumerate() {
            let allowed = [0, 31, 32, 33, 69].contains(&i);
            assert_eq!(l.is_finite(), allowed, "token {i}");
        }
        let mut all = SimpleVob::alloc_ones(64);
        all.allow_token(0);
        let mut logits = vec![2.0f32; 64];
        apply_mask(&all, &mut logits);
        assert!(logits.iter().all(|&l| l == 2.0));
    }
}
