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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferno_tokenizer::{TokenType, Tokenizer};

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
    /// Exactly one of `options` (vLLM's choice constraint): a regular expression of their
    /// alternation, each escaped. `None` for no options.
    pub fn choice(options: &[String]) -> Option<Self> {
        if options.is_empty() {
            return None;
        }
        // llguidance parses regular expressions with regex-syntax, whose escaping this is.
        let mut re = String::from("(?:");
        for (i, option) in options.iter().enumerate() {
            if i > 0 {
                re.push('|');
            }
            regex_syntax::escape_into(option, &mut re);
        }
        re.push(')');
        Some(Self::Regex(re))
    }

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
            state: Some(Box::new(MatcherState {
                matcher: self.matcher.clone(),
                mask: None,
                took: Duration::ZERO,
            })),
            worker: None,
            vocab: self.vocab,
            mask_time: Duration::ZERO,
            masks: 0,
            ahead: 0,
        }
    }
}

/// A sequence's matcher, and the mask computed ahead for its next step (if any). Boxed so
/// that handing it to the [`MaskWorker`] and back moves a pointer.
struct MatcherState {
    matcher: Matcher,
    /// The next step's mask, computed by the worker (or the reason it could not be).
    mask: Option<Result<SimpleVob, String>>,
    /// How long computing `mask` took.
    took: Duration,
}

struct MaskJob {
    state: Box<MatcherState>,
    reply: SyncSender<Box<MatcherState>>,
    /// Cleared when the sequence ends, so a mask it no longer needs is not computed.
    wanted: Arc<AtomicBool>,
}

/// Computes grammar masks on a thread of its own: once a sequence has committed its token,
/// its next mask depends on nothing else, so it is computed while the engine runs the next
/// forward pass (which it then waits for only if the mask took longer). One per engine;
/// each constrained sequence has at most one mask in flight.
pub struct MaskWorker {
    jobs: SyncSender<MaskJob>,
}

/// A sequence's way to the [`MaskWorker`], with the channel its states come back on
/// (made once per sequence, used for every token).
struct WorkerLink {
    jobs: SyncSender<MaskJob>,
    reply: SyncSender<Box<MatcherState>>,
    back: Receiver<Box<MatcherState>>,
    wanted: Arc<AtomicBool>,
}

impl Drop for WorkerLink {
    fn drop(&mut self) {
        self.wanted.store(false, Ordering::Release);
    }
}

/// What a sequence holds of a [`MaskWorker`] (cheap to clone).
#[derive(Clone)]
pub struct MaskHandle(SyncSender<MaskJob>);

impl MaskWorker {
    /// Starts the thread; `sequences` is how many sequences may have a mask in flight at
    /// once (more are computed on the caller's thread instead). The thread ends once the
    /// worker and every handle to it are gone.
    pub fn start(sequences: usize) -> std::io::Result<Self> {
        let (jobs, rx) = sync_channel::<MaskJob>(sequences.max(1));
        std::thread::Builder::new()
            .name("inferno-mask".into())
            .spawn(move || {
                for MaskJob {
                    mut state,
                    reply,
                    wanted,
                } in rx
                {
                    if !wanted.load(Ordering::Acquire) {
                        continue;
                    }
                    let t0 = Instant::now();
                    let mask = state.matcher.compute_mask().map_err(|e| e.to_string());
                    state.took = t0.elapsed();
                    state.mask = Some(mask);
                    // The sequence may have ended meanwhile; its state goes with it.
                    let _ = reply.send(state);
                }
            })?;
        Ok(Self { jobs })
    }

    pub fn handle(&self) -> MaskHandle {
        MaskHandle(self.jobs.clone())
    }
}

/// One sequence's position in its grammar.
pub struct Constraint {
    /// `None` while the worker has it.
    state: Option<Box<MatcherState>>,
    worker: Option<WorkerLink>,
    vocab: usize,
    mask_time: Duration,
    masks: usize,
    /// Masks that were computed ahead on the worker.
    ahead: usize,
}

impl Constraint {
    /// Lets the sequence's masks be computed ahead on `worker` ([`Self::prefetch`]).
    pub fn use_worker(&mut self, worker: MaskHandle) {
        let (reply, back) = sync_channel(1);
        self.worker = Some(WorkerLink {
            jobs: worker.0,
            reply,
            back,
            wanted: Arc::new(AtomicBool::new(true)),
        });
    }

    /// Starts computing the next step's mask on the worker, if the sequence has one (and
    /// it has room); [`Self::mask_logits`] waits for it.
    pub fn prefetch(&mut self) {
        let Some(link) = &self.worker else { return };
        let Some(state) = self.state.take() else {
            return;
        };
        let job = MaskJob {
            state,
            reply: link.reply.clone(),
            wanted: Arc::clone(&link.wanted),
        };
        match link.jobs.try_send(job) {
            Ok(()) => {}
            // Computed here when asked for, as without a worker.
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                self.state = Some(job.state)
            }
        }
    }

    /// The matcher, back from the worker if it is there.
    fn state(&mut self) -> Result<&mut MatcherState, ConstraintError> {
        if self.state.is_none() {
            let back = self.worker.as_ref().map(|l| l.back.recv());
            match back {
                Some(Ok(state)) => self.state = Some(state),
                _ => {
                    return Err(ConstraintError::Matcher(
                        "the grammar mask worker stopped".into(),
                    ))
                }
            }
        }
        self.state
            .as_deref_mut()
            .ok_or_else(|| ConstraintError::Matcher("the grammar state is lost".into()))
    }

    /// Sets every logit the grammar does not allow next to −∞ (`logits` may be shorter
    /// or longer than the vocabulary the grammar knows: entries past it are disallowed).
    /// Returns how long computing the mask took (on the worker, for a prefetched one).
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<Duration, ConstraintError> {
        let state = self.state()?;
        let (mask, took, ahead) = match state.mask.take() {
            Some(ready) => (ready.map_err(ConstraintError::Matcher)?, state.took, true),
            None => {
                let t0 = Instant::now();
                let mask = state
                    .matcher
                    .compute_mask()
                    .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
                (mask, t0.elapsed(), false)
            }
        };
        self.ahead += usize::from(ahead);
        apply_mask(&mask, logits);
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
        let state = self.state()?;
        // A mask computed ahead is for the state before this token.
        state.mask = None;
        state
            .matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Matcher(e.to_string()))
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.state()
            .is_ok_and(|s| s.matcher.is_accepting().unwrap_or(false))
    }

    /// Whether the grammar can take no further token (the sequence should end).
    pub fn is_finished(&mut self) -> bool {
        self.state().is_ok_and(|s| s.matcher.is_stopped())
    }

    /// Total time spent computing masks, and how many were computed.
    pub fn mask_stats(&self) -> (Duration, usize) {
        (self.mask_time, self.masks)
    }

    /// How many of the masks were computed ahead on the worker.
    pub fn masks_ahead(&self) -> usize {
        self.ahead
    }

    /// The vocabulary size the grammar's masks cover.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

/// Writes −∞ over every logit whose bit in `mask` is clear. Whole words of allowed tokens
/// are skipped and whole words of disallowed ones filled at once, so both a permissive and
/// a strict mask (a JSON grammar allows a few hundred of 150k tokens) cost about one pass.
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
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
    use inferno_tokenizer::test_vocab::{VocabBuilder, CONTROL};
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
        walk_with(tok, g, end, vocab, seed, None).0
    }

    /// [`walk`], with each next mask computed ahead on `worker` when given.
    fn walk_with(
        tok: &Tokenizer,
        g: &Grammar,
        end: u32,
        vocab: usize,
        seed: u64,
        worker: Option<&MaskWorker>,
    ) -> (String, usize, usize) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut c = g.start();
        if let Some(w) = worker {
            c.use_worker(w.handle());
        }
        let mut logits = vec![0.0f32; vocab];
        let mut ids = Vec::new();
        for step in 0..200 {
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
            // As the engine does: only for a step that will come.
            if step < 199 {
                c.prefetch();
            }
        }
        // One mask per sampled token, whoever computed it.
        let masks = c.mask_stats().1;
        assert!(
            masks == ids.len() || masks == ids.len() + 1,
            "{masks} masks"
        );
        (tok.decode(&ids, false).unwrap(), masks, c.masks_ahead())
    }

    #[test]
    fn masks_computed_ahead_on_the_worker_give_the_same_walks() {
        let (tok, comp, end, vocab) = compiler();
        let rx = "(ab|12)[0-9]{1,3}(true)?";
        let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"}},
            "required":["ok"]}"#;
        // Room for one sequence's mask at a time: two walks side by side also exercise the
        // in-line fallback when the worker's queue is full.
        let worker = MaskWorker::start(1).unwrap();
        for f in [
            ResponseFormat::Regex(rx.into()),
            ResponseFormat::JsonSchema(schema.into()),
        ] {
            let g = comp.compile(&f).unwrap();
            for seed in 0..12 {
                let inline = walk(&tok, &g, end, vocab, seed);
                // Alone, every mask after the first is computed ahead.
                let (text, masks, ahead) = walk_with(&tok, &g, end, vocab, seed, Some(&worker));
                assert_eq!(text, inline, "{f:?} seed {seed}");
                assert_eq!(ahead + 1, masks, "{f:?} seed {seed}");
                let (a, b) = std::thread::scope(|s| {
                    let a = s.spawn(|| walk_with(&tok, &g, end, vocab, seed, Some(&worker)));
                    let b = s.spawn(|| walk_with(&tok, &g, end, vocab, seed, Some(&worker)));
                    (a.join().unwrap().0, b.join().unwrap().0)
                });
                assert_eq!(a, inline, "{f:?} seed {seed}");
                assert_eq!(b, inline, "{f:?} seed {seed}");
            }
        }
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
